// Package anthropic converts between ctxfold views and the Anthropic Messages API
// (POST /v1/messages): [NewRequest] turns a [ctxfold.View] into the request body, with a prompt
// cache breakpoint at the end of the view's stable prefix, and [ParseResponse] turns the response
// body into the messages to append and the usage to report. The types are plain JSON shapes; no
// Anthropic SDK is needed.
package anthropic

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
)

// Request is a Messages request body.
type Request struct {
	Model     string           `json:"model"`
	MaxTokens int64            `json:"max_tokens"`
	System    []Block          `json:"system,omitempty"`
	Messages  []Message        `json:"messages"`
	Tools     []map[string]any `json:"tools,omitempty"`
}

// Message is one turn: "user" (text and tool_result blocks) or "assistant" (text and tool_use).
type Message struct {
	Role    string  `json:"role"`
	Content []Block `json:"content"`
}

// Block is a content block: text (Text), tool_use (ID, Name, Input), tool_result (ToolUseID,
// Content), or in responses thinking (Thinking).
type Block struct {
	Type         string          `json:"type"`
	Text         string          `json:"text,omitempty"`
	ID           string          `json:"id,omitempty"`
	Name         string          `json:"name,omitempty"`
	Input        json.RawMessage `json:"input,omitempty"`
	ToolUseID    string          `json:"tool_use_id,omitempty"`
	Content      *string         `json:"content,omitempty"`
	Thinking     string          `json:"thinking,omitempty"`
	CacheControl *CacheControl   `json:"cache_control,omitempty"`
}

// CacheControl marks a prompt cache breakpoint.
type CacheControl struct {
	Type string `json:"type"`
}

// Options are the request fields the view does not carry.
type Options struct {
	// Model is the model to call.
	Model string
	// MaxTokens bounds the answer (required by the API).
	MaxTokens int64
	// Tools are the tools in Messages format (add ctxfold.ToolDefinitions(ctxfold.FormatAnthropic)
	// to let the model read folded results).
	Tools []map[string]any
}

// NewRequest returns the request for a view: system messages as the system blocks, the others as
// alternating turns (tool calls as tool_use blocks, consecutive tool results as tool_result
// blocks of one user turn), and cache_control {"type": "ephemeral"} on the last block of the
// view's stable prefix (its first StablePrefixMessages messages), so the provider caches exactly
// what the next request repeats. Reasoning is not sent back: Anthropic only takes signed thinking
// blocks.
func NewRequest(view *ctxfold.View, opts Options) *Request {
	req := &Request{Model: opts.Model, MaxTokens: opts.MaxTokens, Tools: opts.Tools}
	breakpoint := blockAt{turn: -1, block: -1} // the last block of the stable prefix so far
	for i, m := range view.Messages {
		var added blockAt
		switch m.GetRole() {
		case ctxfold.RoleSystem:
			req.System = append(req.System, Block{Type: "text", Text: m.GetContent()})
			added = blockAt{turn: -1, block: len(req.System) - 1}
		case ctxfold.RoleTool:
			content := m.GetContent()
			added = req.appendBlocks("user", true, Block{Type: "tool_result", ToolUseID: m.GetToolCallId(), Content: &content})
		case ctxfold.RoleAssistant:
			var blocks []Block
			if m.GetContent() != "" {
				blocks = append(blocks, Block{Type: "text", Text: m.GetContent()})
			}
			for _, call := range m.GetToolCalls() {
				blocks = append(blocks, Block{Type: "tool_use", ID: call.GetId(), Name: call.GetName(), Input: toolInput(call.GetArguments())})
			}
			added = req.appendBlocks("assistant", false, blocks...)
		default:
			added = req.appendBlocks("user", false, Block{Type: "text", Text: m.GetContent()})
		}
		if int64(i) < view.StablePrefixMessages && added.block >= 0 {
			breakpoint = added
		}
	}
	switch {
	case breakpoint.block < 0:
	case breakpoint.turn < 0:
		req.System[breakpoint.block].CacheControl = &CacheControl{Type: "ephemeral"}
	default:
		req.Messages[breakpoint.turn].Content[breakpoint.block].CacheControl = &CacheControl{Type: "ephemeral"}
	}
	return req
}

// blockAt locates a block: in System (turn -1) or in Messages[turn]; block -1 is none.
type blockAt struct{ turn, block int }

// appendBlocks adds blocks as a new turn, or to the last turn when both are tool results (one user
// turn answers all calls of an assistant turn), and returns where the last block went.
func (r *Request) appendBlocks(role string, toolResult bool, blocks ...Block) blockAt {
	if len(blocks) == 0 {
		return blockAt{turn: -1, block: -1}
	}
	last := len(r.Messages) - 1
	if toolResult && last >= 0 && isToolResults(r.Messages[last].Content) {
		r.Messages[last].Content = append(r.Messages[last].Content, blocks...)
	} else {
		r.Messages = append(r.Messages, Message{Role: role, Content: blocks})
	}
	last = len(r.Messages) - 1
	return blockAt{turn: last, block: len(r.Messages[last].Content) - 1}
}

func isToolResults(blocks []Block) bool {
	for _, b := range blocks {
		if b.Type != "tool_result" {
			return false
		}
	}
	return len(blocks) > 0
}

// toolInput is the tool_use input: the model's JSON arguments when they are an object, else an
// empty object (the API takes objects only).
func toolInput(arguments string) json.RawMessage {
	var object map[string]json.RawMessage
	if json.Unmarshal([]byte(arguments), &object) != nil || object == nil {
		return json.RawMessage(`{}`)
	}
	return json.RawMessage(arguments)
}

// Response is the part of a Messages response the agent loop needs.
type Response struct {
	Content    []Block `json:"content"`
	StopReason string  `json:"stop_reason"`
	Usage      Usage   `json:"usage"`
}

// Usage is the token accounting of a response; the input is split in three.
type Usage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

// ParseResponse decodes a Messages response body into one assistant message to append (text
// blocks as content, tool_use blocks as tool calls, thinking as reasoning_content) and the usage:
// input is input_tokens + cache_read_input_tokens + cache_creation_input_tokens, cached is
// cache_read_input_tokens, the finish reason is stop_reason.
func ParseResponse(body []byte) (*ctxfold.Turn, error) {
	var resp Response
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("anthropic: decode response: %w", err)
	}
	return resp.Turn(), nil
}

// Turn converts a decoded response.
func (r *Response) Turn() *ctxfold.Turn {
	var text, thinking []string
	msg := &ctxfold.Message{Role: ctxfold.RoleAssistant}
	for _, b := range r.Content {
		switch b.Type {
		case "text":
			text = append(text, b.Text)
		case "tool_use":
			msg.ToolCalls = append(msg.ToolCalls, ctxfold.NewToolCall(b.ID, b.Name, string(b.Input)))
		case "thinking":
			thinking = append(thinking, b.Thinking)
		}
	}
	msg.Content, msg.ReasoningContent = strings.Join(text, ""), strings.Join(thinking, "\n\n")
	u := r.Usage
	return &ctxfold.Turn{
		Messages: []*ctxfold.Message{msg},
		Usage: ctxfold.Usage{
			InputTokens:       u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens,
			CachedInputTokens: u.CacheReadInputTokens,
			OutputTokens:      u.OutputTokens,
			FinishReason:      r.StopReason,
		},
	}
}

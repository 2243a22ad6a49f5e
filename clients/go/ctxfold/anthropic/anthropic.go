// Package anthropic converts between ctxfold views and the Anthropic Messages API
// (POST /v1/messages): [NewRequest] turns a [ctxfold.View] into the request body, with a prompt
// cache breakpoint at the end of the view's stable prefix, and [ParseResponse] turns the response
// body into the messages to append and the usage to report. The types are plain JSON shapes; no
// Anthropic SDK is needed.
package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
)

// Request is a Messages request body: the adapter fills System and Messages from the view, the
// caller's Options the rest.
type Request struct {
	Model     string           `json:"model,omitempty"`
	MaxTokens int64            `json:"max_tokens,omitempty"`
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

// NewRequest returns the request for a view: a leading system message as the system block, the
// other messages as turns (user text and later system messages as text blocks, assistant text and
// a tool_use block per call, tool results as tool_result blocks; consecutive messages of the same
// role form one turn) and cache_control {"type": "ephemeral"} on the last block of the view's
// stable prefix (its first StablePrefixMessages messages), so the provider caches exactly what the
// next request repeats. It fails when a tool call's arguments are not a JSON object (the API takes
// objects only). Thinking is not sent back: its signature is not kept in the transcript.
func NewRequest(view *ctxfold.View, opts Options) (*Request, error) {
	req := &Request{Model: opts.Model, MaxTokens: opts.MaxTokens, Tools: opts.Tools}
	breakpoint := blockAt{turn: -1, block: -1} // the last block of the stable prefix so far
	for i, m := range view.Messages {
		added := blockAt{turn: -1, block: -1}
		switch {
		case i == 0 && m.GetRole() == ctxfold.RoleSystem:
			req.System = []Block{{Type: "text", Text: m.GetContent()}}
			added.block = 0
		case m.GetRole() == ctxfold.RoleTool:
			content := m.GetContent()
			added = req.appendBlocks("user", Block{Type: "tool_result", ToolUseID: m.GetToolCallId(), Content: &content})
		case m.GetRole() == ctxfold.RoleAssistant:
			var blocks []Block
			if m.GetContent() != "" {
				blocks = append(blocks, Block{Type: "text", Text: m.GetContent()})
			}
			for _, call := range m.GetToolCalls() {
				input, err := toolInput(call.GetArguments())
				if err != nil {
					return nil, fmt.Errorf("anthropic: tool call %s (%s): %w", call.GetId(), call.GetName(), err)
				}
				blocks = append(blocks, Block{Type: "tool_use", ID: call.GetId(), Name: call.GetName(), Input: input})
			}
			added = req.appendBlocks("assistant", blocks...)
		default:
			added = req.appendBlocks("user", Block{Type: "text", Text: m.GetContent()})
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
	return req, nil
}

// blockAt locates a block: in System (turn -1) or in Messages[turn]; block -1 is none.
type blockAt struct{ turn, block int }

// appendBlocks adds blocks to the last turn when it has the same role, else as a new turn, and
// returns where the last block went (none for no blocks).
func (r *Request) appendBlocks(role string, blocks ...Block) blockAt {
	if len(blocks) == 0 {
		return blockAt{turn: -1, block: -1}
	}
	if last := len(r.Messages) - 1; last >= 0 && r.Messages[last].Role == role {
		r.Messages[last].Content = append(r.Messages[last].Content, blocks...)
	} else {
		r.Messages = append(r.Messages, Message{Role: role, Content: blocks})
	}
	last := len(r.Messages) - 1
	return blockAt{turn: last, block: len(r.Messages[last].Content) - 1}
}

// toolInput is the tool_use input: the model's JSON arguments, which must be an object ({} when
// empty).
func toolInput(arguments string) (json.RawMessage, error) {
	if strings.TrimSpace(arguments) == "" {
		return json.RawMessage(`{}`), nil
	}
	var object map[string]json.RawMessage
	if err := json.Unmarshal([]byte(arguments), &object); err != nil || object == nil {
		return nil, fmt.Errorf("the arguments %.80q are not a JSON object", arguments)
	}
	return json.RawMessage(arguments), nil
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
// blocks joined with a newline as content, tool_use blocks as tool calls whose arguments are the
// input as compact JSON, thinking blocks joined with a newline as reasoning_content) and the usage:
// input is input_tokens + cache_read_input_tokens + cache_creation_input_tokens, cached is
// cache_read_input_tokens, the finish reason is stop_reason.
func ParseResponse(body []byte) (*ctxfold.Turn, error) {
	var resp Response
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("anthropic: decode response: %w", err)
	}
	return resp.Turn()
}

// Turn converts a decoded response.
func (r *Response) Turn() (*ctxfold.Turn, error) {
	var text, thinking []string
	msg := &ctxfold.Message{Role: ctxfold.RoleAssistant}
	for _, b := range r.Content {
		switch b.Type {
		case "text":
			text = append(text, b.Text)
		case "tool_use":
			arguments, err := compactInput(b.Input)
			if err != nil {
				return nil, fmt.Errorf("anthropic: tool_use %s input: %w", b.ID, err)
			}
			msg.ToolCalls = append(msg.ToolCalls, ctxfold.NewToolCall(b.ID, b.Name, arguments))
		case "thinking":
			thinking = append(thinking, b.Thinking)
		}
	}
	msg.Content, msg.ReasoningContent = strings.Join(text, "\n"), strings.Join(thinking, "\n")
	u := r.Usage
	return &ctxfold.Turn{
		Messages: []*ctxfold.Message{msg},
		Usage: ctxfold.Usage{
			InputTokens:       u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens,
			CachedInputTokens: u.CacheReadInputTokens,
			OutputTokens:      u.OutputTokens,
			FinishReason:      r.StopReason,
		},
	}, nil
}

// compactInput is a tool_use input as compact JSON, keys in the order received ({} when absent).
func compactInput(input json.RawMessage) (string, error) {
	if len(input) == 0 {
		return "{}", nil
	}
	var out bytes.Buffer
	if err := json.Compact(&out, input); err != nil {
		return "", err
	}
	return out.String(), nil
}

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
	"github.com/ctxfold/ctxfold/clients/go/internal/adapt"
	"github.com/ctxfold/ctxfold/clients/go/internal/jsontext"
)

// Request is a Messages request body: the adapter fills System and Messages from the view, the
// caller's Options the rest.
type Request struct {
	Model     string            `json:"model,omitempty"`
	MaxTokens int64             `json:"max_tokens,omitempty"`
	System    []Block           `json:"system,omitempty"`
	Messages  []Message         `json:"messages"`
	Tools     []json.RawMessage `json:"tools,omitempty"`
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
	// Tools are the tools given to the session, in Messages format (its config's Tools()); the
	// read_tool_result definition is added when the view hides a result and they lack it.
	Tools []json.RawMessage
}

// NewRequest returns the request for a view: a leading system message as the system block, the
// other messages as turns (user text and later system messages as text blocks, assistant text and
// a tool_use block per call, tool results as tool_result blocks; consecutive messages of the same
// role form one turn) and cache_control {"type": "ephemeral"} on the last block of the view's
// stable prefix (its first StablePrefixMessages messages), so the provider caches exactly what the
// next request repeats, and the session's tools (see Options.Tools). It fails when a tool call's
// arguments are not a JSON object (the API takes objects only; an [*ctxfold.Error] with
// ReasonInvalidMessage). Thinking is not sent back: its signature is not kept in the transcript.
func NewRequest(view *ctxfold.View, opts Options) (*Request, error) {
	tools, _ := ctxfold.OfferedTools(opts.Tools, view, ctxfold.FormatAnthropic) // a known format never fails
	req := &Request{Model: opts.Model, MaxTokens: opts.MaxTokens, Tools: tools}
	breakpoint := blockAt{turn: -1, block: -1} // the last block of the stable prefix so far
	for i, m := range view.Messages {
		added := blockAt{turn: -1, block: -1}
		switch {
		case i == 0 && m.Role == ctxfold.RoleSystem:
			req.System = []Block{{Type: "text", Text: m.Content}}
			added.block = 0
		case m.Role == ctxfold.RoleTool:
			content := m.Content
			added = req.appendBlocks("user", Block{Type: "tool_result", ToolUseID: m.ToolCallID, Content: &content})
		case m.Role == ctxfold.RoleAssistant:
			var blocks []Block
			if m.Content != "" {
				blocks = append(blocks, Block{Type: "text", Text: m.Content})
			}
			for _, call := range m.ToolCalls {
				input, ok := toolInput(call.Arguments)
				if !ok {
					return nil, adapt.Unconvertible("anthropic", "tool call %s (%s): the arguments %.80q are not a JSON object",
						call.ID, call.Name, call.Arguments)
				}
				blocks = append(blocks, Block{Type: "tool_use", ID: call.ID, Name: call.Name, Input: input})
			}
			added = req.appendBlocks("assistant", blocks...)
		default:
			added = req.appendBlocks("user", Block{Type: "text", Text: m.Content})
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
func toolInput(arguments string) (json.RawMessage, bool) {
	if strings.TrimSpace(arguments) == "" {
		return json.RawMessage(`{}`), true
	}
	var object map[string]json.RawMessage
	if err := json.Unmarshal([]byte(arguments), &object); err != nil || object == nil {
		return nil, false
	}
	return json.RawMessage(arguments), true
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
// input written as the JSON every ctxfold SDK writes, thinking blocks joined with a newline as
// reasoning_content) and the usage:
// input is input_tokens + cache_read_input_tokens + cache_creation_input_tokens, cached is
// cache_read_input_tokens, the finish reason is stop_reason.
func ParseResponse(body []byte) (*ctxfold.ProviderTurn, error) {
	var resp Response
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("anthropic: decode response: %w", err)
	}
	return resp.ProviderTurn()
}

// ProviderTurn converts a decoded response.
func (r *Response) ProviderTurn() (*ctxfold.ProviderTurn, error) {
	var text, thinking []string
	msg := ctxfold.Message{Role: ctxfold.RoleAssistant}
	for _, b := range r.Content {
		switch b.Type {
		case "text":
			text = append(text, b.Text)
		case "tool_use":
			arguments, err := inputArguments(b.Input)
			if err != nil {
				return nil, adapt.Unconvertible("anthropic", "tool_use %s input: %v", b.ID, err)
			}
			msg.ToolCalls = append(msg.ToolCalls, ctxfold.NewToolCall(b.ID, b.Name, arguments))
		case "thinking":
			thinking = append(thinking, b.Thinking)
		}
	}
	msg.Content, msg.ReasoningContent = strings.Join(text, "\n"), strings.Join(thinking, "\n")
	u := r.Usage
	return &ctxfold.ProviderTurn{
		Messages: []ctxfold.Message{msg},
		Usage: ctxfold.Usage{
			InputTokens:       u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens,
			CachedInputTokens: u.CacheReadInputTokens,
			OutputTokens:      u.OutputTokens,
			FinishReason:      r.StopReason,
		},
	}, nil
}

// inputArguments is a tool_use input as tool call arguments: the JSON every ctxfold SDK writes,
// keys in the order received ({} when absent).
func inputArguments(input json.RawMessage) (string, error) {
	if len(input) == 0 {
		return "{}", nil
	}
	written, err := jsontext.Normalize(input)
	return string(written), err
}

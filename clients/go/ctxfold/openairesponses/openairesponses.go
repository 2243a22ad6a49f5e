// Package openairesponses converts between ctxfold views and the OpenAI Responses API
// (POST /v1/responses): [NewRequest] turns a [ctxfold.View] into the request body and
// [ParseResponse] turns the response body into the messages to append and the usage to report.
// The types are plain JSON shapes; no OpenAI SDK is needed.
package openairesponses

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
)

// Request is a Responses request body: the adapter fills Instructions, Input, Tools and
// PromptCacheKey from the view and the session's tools, the caller's Options the rest. The
// conversation is sent whole every time (no previous_response_id): ctxfold owns the context.
type Request struct {
	Model           string            `json:"model,omitempty"`
	Instructions    string            `json:"instructions,omitempty"`
	Input           []InputItem       `json:"input"`
	Tools           []json.RawMessage `json:"tools,omitempty"`
	PromptCacheKey  string            `json:"prompt_cache_key,omitempty"`
	MaxOutputTokens int64             `json:"max_output_tokens,omitempty"`
}

// InputItem is an item of the request's input: a message (Role, Content), a function_call
// (CallID, Name, Arguments) or a function_call_output (CallID, Output).
type InputItem struct {
	Type      string  `json:"type"`
	Role      string  `json:"role,omitempty"`
	Content   *string `json:"content,omitempty"`
	CallID    string  `json:"call_id,omitempty"`
	Name      string  `json:"name,omitempty"`
	Arguments string  `json:"arguments,omitempty"`
	Output    *string `json:"output,omitempty"`
}

// OutputItem is an item of the response's output: a message (Content), a function_call (CallID,
// Name, Arguments) or reasoning (Summary).
type OutputItem struct {
	Type      string        `json:"type"`
	Content   []ContentPart `json:"content"`
	CallID    string        `json:"call_id"`
	Name      string        `json:"name"`
	Arguments string        `json:"arguments"`
	Summary   []ContentPart `json:"summary"`
}

// ContentPart is a piece of an output message (output_text, refusal) or of a reasoning summary
// (summary_text).
type ContentPart struct {
	Type    string `json:"type"`
	Text    string `json:"text"`
	Refusal string `json:"refusal"`
}

// Options are the request fields the view does not carry.
type Options struct {
	// Model is the model to call.
	Model string
	// Tools are the tools given to the session, in Responses format (its config's Tools()); the
	// read_tool_result definition is added when the view hides a result and they lack it.
	Tools []json.RawMessage
	// MaxOutputTokens bounds the answer (0 = not sent).
	MaxOutputTokens int64
}

// NewRequest returns the request for a view: a leading system message as instructions, every
// other message as input items in order (a message item for its text, left out for an assistant
// message that only calls tools; a function_call per tool call; a function_call_output per tool
// result), the session's tools (see Options.Tools) and the view's prompt_cache_key. Reasoning is
// not sent back: Responses only takes its own encrypted reasoning items.
func NewRequest(view *ctxfold.View, opts Options) *Request {
	tools, _ := ctxfold.OfferedTools(opts.Tools, view, ctxfold.FormatOpenAIResponses) // a known format never fails
	req := &Request{Model: opts.Model, Tools: tools, PromptCacheKey: view.PromptCacheKey, MaxOutputTokens: opts.MaxOutputTokens}
	for i, m := range view.Messages {
		switch {
		case i == 0 && m.Role == ctxfold.RoleSystem:
			req.Instructions = m.Content
		case m.Role == ctxfold.RoleTool:
			output := m.Content
			req.Input = append(req.Input, InputItem{Type: "function_call_output", CallID: m.ToolCallID, Output: &output})
		default:
			if m.Content != "" || len(m.ToolCalls) == 0 {
				req.Input = append(req.Input, message(roles[m.Role], m.Content))
			}
			for _, call := range m.ToolCalls {
				req.Input = append(req.Input, InputItem{Type: "function_call", CallID: call.ID, Name: call.Name, Arguments: call.Arguments})
			}
		}
	}
	return req
}

var roles = map[ctxfold.Role]string{ctxfold.RoleSystem: "system", ctxfold.RoleUser: "user", ctxfold.RoleAssistant: "assistant"}

func message(role, content string) InputItem {
	return InputItem{Type: "message", Role: role, Content: &content}
}

// Response is the part of a Responses response the agent loop needs.
type Response struct {
	Status string       `json:"status"`
	Output []OutputItem `json:"output"`
	Usage  Usage        `json:"usage"`
}

// Usage is the token accounting of a response.
type Usage struct {
	InputTokens        int64 `json:"input_tokens"`
	OutputTokens       int64 `json:"output_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// ParseResponse decodes a Responses response body into one assistant message to append (the
// output_text and refusal parts of its message items joined with a newline, a tool call per
// function_call, the reasoning summary texts joined with a newline as reasoning_content) and the
// usage, with the response status as the finish reason.
func ParseResponse(body []byte) (*ctxfold.ProviderTurn, error) {
	var resp Response
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("openairesponses: decode response: %w", err)
	}
	return resp.ProviderTurn(), nil
}

// ProviderTurn converts a decoded response.
func (r *Response) ProviderTurn() *ctxfold.ProviderTurn {
	var text, reasoning []string
	msg := ctxfold.Message{Role: ctxfold.RoleAssistant}
	for _, item := range r.Output {
		switch item.Type {
		case "message":
			for _, part := range item.Content {
				switch part.Type {
				case "output_text":
					text = append(text, part.Text)
				case "refusal":
					text = append(text, part.Refusal)
				}
			}
		case "function_call":
			msg.ToolCalls = append(msg.ToolCalls, ctxfold.NewToolCall(item.CallID, item.Name, item.Arguments))
		case "reasoning":
			for _, part := range item.Summary {
				if part.Type == "summary_text" {
					reasoning = append(reasoning, part.Text)
				}
			}
		}
	}
	msg.Content, msg.ReasoningContent = strings.Join(text, "\n"), strings.Join(reasoning, "\n")
	return &ctxfold.ProviderTurn{
		Messages: []ctxfold.Message{msg},
		Usage: ctxfold.Usage{
			InputTokens:       r.Usage.InputTokens,
			CachedInputTokens: r.Usage.InputTokensDetails.CachedTokens,
			OutputTokens:      r.Usage.OutputTokens,
			FinishReason:      r.Status,
		},
	}
}

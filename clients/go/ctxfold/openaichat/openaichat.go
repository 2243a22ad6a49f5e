// Package openaichat converts between ctxfold views and the OpenAI Chat Completions API
// (POST /v1/chat/completions): [NewRequest] turns a [ctxfold.View] into the request body and
// [ParseResponse] turns the response body into the messages to append and the usage to report.
// The types are plain JSON shapes; no OpenAI SDK is needed.
package openaichat

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
)

// Request is a Chat Completions request body: the adapter fills Messages and PromptCacheKey from
// the view, the caller's Options the rest.
type Request struct {
	Model               string           `json:"model,omitempty"`
	Messages            []Message        `json:"messages"`
	Tools               []map[string]any `json:"tools,omitempty"`
	PromptCacheKey      string           `json:"prompt_cache_key,omitempty"`
	MaxCompletionTokens int64            `json:"max_completion_tokens,omitempty"`
}

// Message is one message of a request (or of a transcript kept in this format).
type Message struct {
	Role string `json:"role"`
	// Content is null for an assistant message that only calls tools.
	Content          *string    `json:"content"`
	Name             string     `json:"name,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string     `json:"tool_call_id,omitempty"`
	ReasoningContent string     `json:"reasoning_content,omitempty"`
}

// ToolCall is a function call of an assistant message.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and carries the JSON arguments the model wrote.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Options are the request fields the view does not carry.
type Options struct {
	// Model is the model to call.
	Model string
	// Tools are the function tools in Chat Completions format (add ctxfold.ToolDefinitions(
	// ctxfold.FormatOpenAIChat) to let the model read folded results).
	Tools []map[string]any
	// MaxCompletionTokens bounds the answer (0 = not sent).
	MaxCompletionTokens int64
	// SendReasoning sends the messages' reasoning_content back (for providers that take it).
	SendReasoning bool
}

var roles = map[ctxfold.Role]string{
	ctxfold.RoleSystem: "system", ctxfold.RoleUser: "user", ctxfold.RoleAssistant: "assistant", ctxfold.RoleTool: "tool",
}

// NewRequest returns the request for a view: its messages in order (the system prompt first,
// assistant tool calls with content null when there is no text, tool results as "tool" messages,
// name when set) and its prompt_cache_key. Reasoning is sent back only with SendReasoning.
func NewRequest(view *ctxfold.View, opts Options) *Request {
	req := &Request{
		Model: opts.Model, Tools: opts.Tools, PromptCacheKey: view.PromptCacheKey,
		MaxCompletionTokens: opts.MaxCompletionTokens, Messages: make([]Message, 0, len(view.Messages)),
	}
	for _, m := range view.Messages {
		out := Message{Role: roles[m.GetRole()], ToolCallID: m.GetToolCallId()}
		if m.GetRole() != ctxfold.RoleTool {
			out.Name = m.GetName()
		}
		if opts.SendReasoning {
			out.ReasoningContent = m.GetReasoningContent()
		}
		if content := m.GetContent(); content != "" || len(m.GetToolCalls()) == 0 {
			out.Content = &content
		}
		for _, call := range m.GetToolCalls() {
			out.ToolCalls = append(out.ToolCalls, ToolCall{
				ID: call.GetId(), Type: "function", Function: FunctionCall{Name: call.GetName(), Arguments: call.GetArguments()},
			})
		}
		req.Messages = append(req.Messages, out)
	}
	return req
}

// FromMessages converts Chat Completions messages (a transcript recorded or kept in this format)
// to ctxfold messages to append. Roles other than system, user, assistant and tool ("developer")
// count as system.
func FromMessages(msgs []Message) []*ctxfold.Message {
	out := make([]*ctxfold.Message, len(msgs))
	for i, m := range msgs {
		out[i] = fromMessage(m)
	}
	return out
}

func fromMessage(m Message) *ctxfold.Message {
	role := ctxfold.RoleSystem
	for r, name := range roles {
		if name == m.Role {
			role = r
		}
	}
	msg := &ctxfold.Message{Role: role, Name: m.Name, ToolCallId: m.ToolCallID, ReasoningContent: m.ReasoningContent}
	if m.Content != nil {
		msg.Content = *m.Content
	}
	for _, call := range m.ToolCalls {
		msg.ToolCalls = append(msg.ToolCalls, ctxfold.NewToolCall(call.ID, call.Function.Name, call.Function.Arguments))
	}
	return msg
}

// Response is the part of a Chat Completions response the agent loop needs.
type Response struct {
	Choices []Choice `json:"choices"`
	Usage   Usage    `json:"usage"`
}

// Choice is one completion; the loop uses the first.
type Choice struct {
	Message      ResponseMessage `json:"message"`
	FinishReason string          `json:"finish_reason"`
}

// ResponseMessage is the message of a choice. Content is a string, a list of content parts or null.
type ResponseMessage struct {
	Content          json.RawMessage `json:"content"`
	Refusal          string          `json:"refusal"`
	ToolCalls        []ToolCall      `json:"tool_calls"`
	ReasoningContent string          `json:"reasoning_content"`
}

// text is the message's content (text parts joined with a newline), or its refusal when empty.
func (m *ResponseMessage) text() (string, error) {
	var text string
	if len(m.Content) > 0 && string(m.Content) != "null" {
		if err := json.Unmarshal(m.Content, &text); err != nil {
			var parts []struct{ Type, Text string }
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return "", fmt.Errorf("openaichat: content is neither text nor parts: %w", err)
			}
			var texts []string
			for _, part := range parts {
				if part.Type == "text" {
					texts = append(texts, part.Text)
				}
			}
			text = strings.Join(texts, "\n")
		}
	}
	if text == "" {
		return m.Refusal, nil
	}
	return text, nil
}

// Usage is the token accounting of a response.
type Usage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// ParseResponse decodes a Chat Completions response body into the assistant message to append
// (the first choice's content, or its refusal; tool calls with their arguments as received;
// reasoning_content where the provider returns it) and the usage.
func ParseResponse(body []byte) (*ctxfold.Turn, error) {
	var resp Response
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("openaichat: decode response: %w", err)
	}
	return resp.Turn()
}

// Turn converts a decoded response.
func (r *Response) Turn() (*ctxfold.Turn, error) {
	if len(r.Choices) == 0 {
		return nil, errors.New("openaichat: the response has no choices")
	}
	choice := r.Choices[0]
	text, err := choice.Message.text()
	if err != nil {
		return nil, err
	}
	msg := fromMessage(Message{Role: "assistant", Content: &text, ToolCalls: choice.Message.ToolCalls, ReasoningContent: choice.Message.ReasoningContent})
	return &ctxfold.Turn{
		Messages: []*ctxfold.Message{msg},
		Usage: ctxfold.Usage{
			InputTokens:       r.Usage.PromptTokens,
			CachedInputTokens: r.Usage.PromptTokensDetails.CachedTokens,
			OutputTokens:      r.Usage.CompletionTokens,
			FinishReason:      choice.FinishReason,
		},
	}, nil
}

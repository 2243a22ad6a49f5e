// Package openaichat converts between ctxfold views and the OpenAI Chat Completions API
// (POST /v1/chat/completions): [NewRequest] turns a [ctxfold.View] into the request body,
// [ParseResponse] turns the response body into the messages to append and the usage to report,
// and [FromMessages] turns recorded Chat messages into messages to append. The types are plain
// JSON shapes; no OpenAI SDK is needed.
package openaichat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/internal/adapt"
	"github.com/ctxfold/ctxfold/clients/go/internal/jsontext"
)

// Request is a Chat Completions request body: the adapter fills Messages, Tools and
// PromptCacheKey from the view and the session's tools, the caller's Options the rest.
type Request struct {
	Model               string            `json:"model,omitempty"`
	Messages            []Message         `json:"messages"`
	Tools               []json.RawMessage `json:"tools,omitempty"`
	PromptCacheKey      string            `json:"prompt_cache_key,omitempty"`
	MaxCompletionTokens int64             `json:"max_completion_tokens,omitempty"`
}

// Message is one message of a request, or of a transcript kept in this format. Content is text:
// it is written as null for an assistant message that only calls tools, and read from a string,
// text parts (joined with a newline) or null.
type Message struct {
	Role             string
	Content          string
	Name             string
	ToolCalls        []ToolCall
	ToolCallID       string
	ReasoningContent string
}

// wireMessage is Message as JSON.
type wireMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	Name             string          `json:"name,omitempty"`
	ToolCalls        []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallID       string          `json:"tool_call_id,omitempty"`
	ReasoningContent string          `json:"reasoning_content,omitempty"`
}

// MarshalJSON writes content as null for an assistant message that only calls tools. It escapes
// no HTML itself, so the caller's encoder decides (json.Marshal escapes < > &, an Encoder with
// SetEscapeHTML(false) does not).
func (m Message) MarshalJSON() ([]byte, error) {
	var content any
	if m.Content != "" || len(m.ToolCalls) == 0 {
		content = m.Content
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(struct {
		Role             string     `json:"role"`
		Content          any        `json:"content"`
		Name             string     `json:"name,omitempty"`
		ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
		ToolCallID       string     `json:"tool_call_id,omitempty"`
		ReasoningContent string     `json:"reasoning_content,omitempty"`
	}{m.Role, content, m.Name, m.ToolCalls, m.ToolCallID, m.ReasoningContent}); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// UnmarshalJSON reads content as a string, text parts or null.
func (m *Message) UnmarshalJSON(data []byte) error {
	var wire wireMessage
	if err := json.Unmarshal(data, &wire); err != nil {
		return err
	}
	text, err := contentText(wire.Content)
	if err != nil {
		return err
	}
	*m = Message{wire.Role, text, wire.Name, wire.ToolCalls, wire.ToolCallID, wire.ReasoningContent}
	return nil
}

// contentText is a message's content as text: a string, its text parts joined with a newline, or
// "" for null.
func contentText(content json.RawMessage) (string, error) {
	if len(content) == 0 || string(content) == "null" {
		return "", nil
	}
	var text string
	if err := json.Unmarshal(content, &text); err == nil {
		return text, nil
	}
	var parts []struct{ Type, Text string }
	if err := json.Unmarshal(content, &parts); err != nil {
		return "", fmt.Errorf("openaichat: content is neither text nor parts: %w", err)
	}
	var texts []string
	for _, part := range parts {
		if part.Type == "text" && part.Text != "" {
			texts = append(texts, part.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
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

// UnmarshalJSON reads arguments given as a string, or as an object (written as the JSON every
// ctxfold SDK writes).
func (f *FunctionCall) UnmarshalJSON(data []byte) error {
	var wire struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(data, &wire); err != nil {
		return err
	}
	f.Name, f.Arguments = wire.Name, ""
	switch {
	case len(wire.Arguments) == 0 || string(wire.Arguments) == "null":
		return nil
	case wire.Arguments[0] == '"':
		return json.Unmarshal(wire.Arguments, &f.Arguments)
	}
	written, err := jsontext.Normalize(wire.Arguments)
	f.Arguments = string(written)
	return err
}

// Options are the request fields the view does not carry.
type Options struct {
	// Model is the model to call.
	Model string
	// Tools are the tools given to the session, in Chat Completions format (its config's Tools());
	// the read_tool_result definition is added when the view hides a result and they lack it.
	Tools []json.RawMessage
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
// name when set), the session's tools (see Options.Tools) and its prompt_cache_key. Reasoning is
// sent back only with SendReasoning.
func NewRequest(view *ctxfold.View, opts Options) *Request {
	tools, _ := ctxfold.OfferedTools(opts.Tools, view, ctxfold.FormatOpenAIChat) // a known format never fails
	req := &Request{
		Model: opts.Model, Tools: tools, PromptCacheKey: view.PromptCacheKey,
		MaxCompletionTokens: opts.MaxCompletionTokens, Messages: make([]Message, 0, len(view.Messages)),
	}
	for _, m := range view.Messages {
		out := Message{Role: roles[m.Role], ToolCallID: m.ToolCallID, Content: m.Content}
		if m.Role != ctxfold.RoleTool {
			out.Name = m.Name
		}
		if opts.SendReasoning {
			out.ReasoningContent = m.ReasoningContent
		}
		for _, call := range m.ToolCalls {
			out.ToolCalls = append(out.ToolCalls, ToolCall{
				ID: call.ID, Type: "function", Function: FunctionCall{Name: call.Name, Arguments: call.Arguments},
			})
		}
		req.Messages = append(req.Messages, out)
	}
	return req
}

// FromMessages converts Chat Completions messages (a transcript recorded or kept in this format)
// to ctxfold messages to append: roles one to one ("developer" as system), content, tool calls,
// tool_call_id, reasoning_content and name. Another role is an [*ctxfold.Error] with
// ReasonInvalidMessage.
func FromMessages(msgs []Message) ([]ctxfold.Message, error) {
	out := make([]ctxfold.Message, len(msgs))
	for i, m := range msgs {
		role, ok := fromRoles[m.Role]
		if !ok {
			return nil, adapt.Unconvertible("openaichat", "message %d: role %q is not system, developer, user, assistant or tool", i, m.Role)
		}
		out[i] = fromMessage(role, m)
	}
	return out, nil
}

var fromRoles = map[string]ctxfold.Role{
	"system": ctxfold.RoleSystem, "developer": ctxfold.RoleSystem, "user": ctxfold.RoleUser,
	"assistant": ctxfold.RoleAssistant, "tool": ctxfold.RoleTool,
}

func fromMessage(role ctxfold.Role, m Message) ctxfold.Message {
	msg := ctxfold.Message{Role: role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID, ReasoningContent: m.ReasoningContent}
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
func ParseResponse(body []byte) (*ctxfold.ProviderTurn, error) {
	var resp Response
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("openaichat: decode response: %w", err)
	}
	return resp.ProviderTurn()
}

// ProviderTurn converts a decoded response.
func (r *Response) ProviderTurn() (*ctxfold.ProviderTurn, error) {
	if len(r.Choices) == 0 {
		return nil, adapt.Unconvertible("openaichat", "the response has no choices")
	}
	choice := r.Choices[0]
	text, err := contentText(choice.Message.Content)
	if err != nil {
		return nil, adapt.Unconvertible("openaichat", "%v", err)
	}
	if text == "" {
		text = choice.Message.Refusal
	}
	msg := fromMessage(ctxfold.RoleAssistant, Message{Content: text, ToolCalls: choice.Message.ToolCalls, ReasoningContent: choice.Message.ReasoningContent})
	return &ctxfold.ProviderTurn{
		Messages: []ctxfold.Message{msg},
		Usage: ctxfold.Usage{
			InputTokens:       r.Usage.PromptTokens,
			CachedInputTokens: r.Usage.PromptTokensDetails.CachedTokens,
			OutputTokens:      r.Usage.CompletionTokens,
			FinishReason:      choice.FinishReason,
		},
	}, nil
}

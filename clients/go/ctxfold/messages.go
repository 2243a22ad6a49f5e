package ctxfold

import "github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"

// Aliases of the generated types most callers touch, so simple programs need only this package.
type (
	// Message is a message of the transcript or of a view.
	Message = ctxfoldv1.Message
	// ToolCall is one tool call of an assistant message.
	ToolCall = ctxfoldv1.ToolCall
	// FoldProgress is one maintenance progress event of Prepare or Compact.
	FoldProgress = ctxfoldv1.FoldProgress
	// SessionInfo is the server's description of a session.
	SessionInfo = ctxfoldv1.Session
)

// SystemMessage returns a system message.
func SystemMessage(content string) *Message {
	return &Message{Role: ctxfoldv1.Role_ROLE_SYSTEM, Content: content}
}

// UserMessage returns a user turn.
func UserMessage(content string) *Message {
	return &Message{Role: ctxfoldv1.Role_ROLE_USER, Content: content}
}

// AssistantMessage returns a model answer with optional tool calls.
func AssistantMessage(content string, calls ...*ToolCall) *Message {
	return &Message{Role: ctxfoldv1.Role_ROLE_ASSISTANT, Content: content, ToolCalls: calls}
}

// NewToolCall returns a tool call; arguments is the JSON text the model wrote.
func NewToolCall(id, name, arguments string) *ToolCall {
	return &ToolCall{Id: id, Name: name, Arguments: arguments}
}

// ToolResultMessage returns the result of the tool call callID.
func ToolResultMessage(callID, content string) *Message {
	return &Message{Role: ctxfoldv1.Role_ROLE_TOOL, ToolCallId: callID, Content: content}
}

package ctxfold

import "github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"

// Aliases of the generated message types callers touch, so programs need only this package. The
// enums (Role, Action, FoldStage, CacheState, NotFoldedReason, ErrorReason) are re-exported in
// enums_gen.go.
type (
	// Message is a message of the transcript or of a view.
	Message = ctxfoldv1.Message
	// ToolCall is one tool call of an assistant message.
	ToolCall = ctxfoldv1.ToolCall
	// FoldProgress is one maintenance progress event of Prepare or Compact.
	FoldProgress = ctxfoldv1.FoldProgress
	// SessionInfo is the server's description of a session.
	SessionInfo = ctxfoldv1.Session
	// SessionConfig is a session's configuration (see [NewSessionConfig]).
	SessionConfig = ctxfoldv1.SessionConfig
	// Checkpoint is a committed fold with its summary.
	Checkpoint = ctxfoldv1.Checkpoint
)

// SystemMessage returns a system message.
func SystemMessage(content string) *Message {
	return &Message{Role: RoleSystem, Content: content}
}

// UserMessage returns a user turn.
func UserMessage(content string) *Message {
	return &Message{Role: RoleUser, Content: content}
}

// AssistantMessage returns a model answer with optional tool calls.
func AssistantMessage(content string, calls ...*ToolCall) *Message {
	return &Message{Role: RoleAssistant, Content: content, ToolCalls: calls}
}

// NewToolCall returns a tool call; arguments is the JSON text the model wrote.
func NewToolCall(id, name, arguments string) *ToolCall {
	return &ToolCall{Id: id, Name: name, Arguments: arguments}
}

// ToolResultMessage returns the result of the tool call callID.
func ToolResultMessage(callID, content string) *Message {
	return &Message{Role: RoleTool, ToolCallId: callID, Content: content}
}

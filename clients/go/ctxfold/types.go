package ctxfold

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// The results of this package are plain Go values converted from the generated messages (which
// stay reachable through each type's Proto method and [Client.Raw]). They are snapshots: a value
// never changes after a call returned it. The enums (Role, Action, FoldStage, ...) are the
// generated ones, re-exported in enums_gen.go.

// ToolCall is one tool call of an assistant message.
type ToolCall struct {
	// ID is the provider's id of the call; the tool result names it in ToolCallID.
	ID string
	// Name is the function name.
	Name string
	// Arguments are the arguments as the model wrote them (usually a JSON object).
	Arguments string
}

// Message is a message of the transcript or of a view. Role, Content, ToolCalls, ToolCallID,
// ReasoningContent, Pinned and Name are the caller's; the server sets the rest.
type Message struct {
	// ID is the canonical message's id; in a view, the id of the message it renders (empty for the
	// summary and for the system prompt of the session's config).
	ID string
	// Seq is the position in the session's transcript, from 1.
	Seq  int64
	Role Role
	// Content is the text. A tool result above the session's tool_content_max_bytes is shown as
	// its bounded head and tail with a marker naming ResultRef.
	Content   string
	ToolCalls []ToolCall
	// ToolCallID is, for RoleTool, the call this result answers.
	ToolCallID       string
	ReasoningContent string
	// Pinned messages are kept verbatim by every fold.
	Pinned bool
	// ResultRef is the reference ReadToolResult reads this message's whole stored text by, where
	// the server set one.
	ResultRef string
	// RawBytes is, for tool results, the size of the raw result in UTF-8 bytes.
	RawBytes int64
	// Truncated reports that Content is bounded and shorter than the raw result.
	Truncated bool
	// Summary marks the checkpoint summary message of a view.
	Summary bool
	// Pruned marks a message a view shows as head, marker and tail.
	Pruned bool
	// Name is an optional participant or tool name, passed through to the provider.
	Name string
	// Tokens is the estimate of the message as rendered.
	Tokens int64
	// Abandoned marks a message on a branch a Rewind left.
	Abandoned bool
	// CreateTime is when the message was appended (zero when unset).
	CreateTime time.Time
}

// SystemMessage returns a system message.
func SystemMessage(content string) Message { return Message{Role: RoleSystem, Content: content} }

// UserMessage returns a user turn.
func UserMessage(content string) Message { return Message{Role: RoleUser, Content: content} }

// AssistantMessage returns a model answer with optional tool calls.
func AssistantMessage(content string, calls ...ToolCall) Message {
	return Message{Role: RoleAssistant, Content: content, ToolCalls: calls}
}

// NewToolCall returns a tool call; arguments is the JSON text the model wrote.
func NewToolCall(id, name, arguments string) ToolCall {
	return ToolCall{ID: id, Name: name, Arguments: arguments}
}

// ToolResultMessage returns the result of the tool call callID.
func ToolResultMessage(callID, content string) Message {
	return Message{Role: RoleTool, ToolCallID: callID, Content: content}
}

// Proto returns the message as the generated type.
func (m Message) Proto() *ctxfoldv1.Message {
	out := &ctxfoldv1.Message{
		Id: m.ID, Seq: m.Seq, Role: m.Role, Content: m.Content, ToolCallId: m.ToolCallID,
		ReasoningContent: m.ReasoningContent, Pinned: m.Pinned, ResultRef: m.ResultRef, RawBytes: m.RawBytes,
		Truncated: m.Truncated, Summary: m.Summary, Pruned: m.Pruned, Name: m.Name, Tokens: m.Tokens,
		Abandoned: m.Abandoned, CreateTime: stamp(m.CreateTime),
	}
	for _, call := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, &ctxfoldv1.ToolCall{Id: call.ID, Name: call.Name, Arguments: call.Arguments})
	}
	return out
}

// MessageFromProto converts a generated message.
func MessageFromProto(m *ctxfoldv1.Message) Message {
	out := Message{
		ID: m.GetId(), Seq: m.GetSeq(), Role: m.GetRole(), Content: m.GetContent(), ToolCallID: m.GetToolCallId(),
		ReasoningContent: m.GetReasoningContent(), Pinned: m.GetPinned(), ResultRef: m.GetResultRef(),
		RawBytes: m.GetRawBytes(), Truncated: m.GetTruncated(), Summary: m.GetSummary(), Pruned: m.GetPruned(),
		Name: m.GetName(), Tokens: m.GetTokens(), Abandoned: m.GetAbandoned(), CreateTime: timeOf(m.GetCreateTime()),
	}
	for _, call := range m.GetToolCalls() {
		out.ToolCalls = append(out.ToolCalls, ToolCall{ID: call.GetId(), Name: call.GetName(), Arguments: call.GetArguments()})
	}
	return out
}

func messagesFromProto(ms []*ctxfoldv1.Message) []Message {
	out := make([]Message, len(ms))
	for i, m := range ms {
		out[i] = MessageFromProto(m)
	}
	return out
}

func messagesProto(ms []Message) []*ctxfoldv1.Message {
	out := make([]*ctxfoldv1.Message, len(ms))
	for i, m := range ms {
		out[i] = m.Proto()
	}
	return out
}

// SessionInfo is a session as the server described it when a call returned it.
type SessionInfo struct {
	ID string
	// Config is the effective configuration, defaults filled in.
	Config SessionConfig
	// HeadSeq is the seq of the newest live message (0 for an empty session).
	HeadSeq int64
	// CheckpointID is the head checkpoint ("" when nothing was folded).
	CheckpointID string
	CreateTime   time.Time
	UpdateTime   time.Time
	// ForkedFromSessionID and ForkedAtSeq name the source of a fork.
	ForkedFromSessionID string
	ForkedAtSeq         int64
}

// Proto returns the session as the generated type.
func (s SessionInfo) Proto() *ctxfoldv1.Session {
	return &ctxfoldv1.Session{
		Id: s.ID, Config: s.Config.Proto(), HeadSeq: s.HeadSeq, CheckpointId: s.CheckpointID,
		CreateTime: stamp(s.CreateTime), UpdateTime: stamp(s.UpdateTime),
		ForkedFromSessionId: s.ForkedFromSessionID, ForkedAtSeq: s.ForkedAtSeq,
	}
}

// SessionInfoFromProto converts a generated session.
func SessionInfoFromProto(s *ctxfoldv1.Session) SessionInfo {
	return SessionInfo{
		ID: s.GetId(), Config: SessionConfigFromProto(s.GetConfig()), HeadSeq: s.GetHeadSeq(),
		CheckpointID: s.GetCheckpointId(), CreateTime: timeOf(s.GetCreateTime()), UpdateTime: timeOf(s.GetUpdateTime()),
		ForkedFromSessionID: s.GetForkedFromSessionId(), ForkedAtSeq: s.GetForkedAtSeq(),
	}
}

// FoldProgress is one maintenance progress event of Prepare or Compact.
type FoldProgress struct {
	Stage FoldStage
	// PassIndex is the 1-based fold pass (0 outside passes); PassesPlanned the passes planned.
	PassIndex, PassesPlanned int32
	// TokensBefore and TokensAfter are the request estimates around the step.
	TokensBefore, TokensAfter int64
	// CheckpointID is the checkpoint a committed pass installed.
	CheckpointID string
	// Message describes the step for a person.
	Message string
	// SummaryDelta is, for FoldStageSummaryDelta, the next piece of the summary text.
	SummaryDelta string
	// Summarizer is the summarizer of the step (for a fallback: the fallback).
	Summarizer string
}

// Proto returns the event as the generated type.
func (p FoldProgress) Proto() *ctxfoldv1.FoldProgress {
	return &ctxfoldv1.FoldProgress{
		Stage: p.Stage, PassIndex: p.PassIndex, PassesPlanned: p.PassesPlanned, TokensBefore: p.TokensBefore,
		TokensAfter: p.TokensAfter, CheckpointId: p.CheckpointID, Message: p.Message, SummaryDelta: p.SummaryDelta,
		Summarizer: p.Summarizer,
	}
}

func progressFromProto(p *ctxfoldv1.FoldProgress) FoldProgress {
	return FoldProgress{
		Stage: p.GetStage(), PassIndex: p.GetPassIndex(), PassesPlanned: p.GetPassesPlanned(),
		TokensBefore: p.GetTokensBefore(), TokensAfter: p.GetTokensAfter(), CheckpointID: p.GetCheckpointId(),
		Message: p.GetMessage(), SummaryDelta: p.GetSummaryDelta(), Summarizer: p.GetSummarizer(),
	}
}

// Checkpoint is a committed fold with its summary.
type Checkpoint struct {
	ID string
	// ParentID is the checkpoint this one folded ("" for the first fold of a chain).
	ParentID string
	// PositionSeq is the seq of the last message the checkpoint covers.
	PositionSeq   int64
	Summary       string
	SummaryTokens int64
	// KeptMessageIDs are the covered messages the view keeps verbatim.
	KeptMessageIDs []string
	// FoldedResultsRef is the checkpoint's folded-results index, readable with ReadToolResult.
	FoldedResultsRef string
	Summarizer       string
	CreateTime       time.Time
	// OnHeadChain reports whether the session's head checkpoint is this one or descends from it.
	OnHeadChain bool
}

// Proto returns the checkpoint as the generated type.
func (c Checkpoint) Proto() *ctxfoldv1.Checkpoint {
	return &ctxfoldv1.Checkpoint{
		Id: c.ID, ParentId: c.ParentID, PositionSeq: c.PositionSeq, Summary: c.Summary, SummaryTokens: c.SummaryTokens,
		KeptMessageIds: c.KeptMessageIDs, FoldedResultsRef: c.FoldedResultsRef, Summarizer: c.Summarizer,
		CreateTime: stamp(c.CreateTime), OnHeadChain: c.OnHeadChain,
	}
}

func checkpointFromProto(c *ctxfoldv1.Checkpoint) Checkpoint {
	return Checkpoint{
		ID: c.GetId(), ParentID: c.GetParentId(), PositionSeq: c.GetPositionSeq(), Summary: c.GetSummary(),
		SummaryTokens: c.GetSummaryTokens(), KeptMessageIDs: c.GetKeptMessageIds(), FoldedResultsRef: c.GetFoldedResultsRef(),
		Summarizer: c.GetSummarizer(), CreateTime: timeOf(c.GetCreateTime()), OnHeadChain: c.GetOnHeadChain(),
	}
}

func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func stamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

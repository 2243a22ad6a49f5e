package ctxfold

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"iter"

	"google.golang.org/grpc/codes"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// The largest pages the server serves: ListSessions and ListMessages, ListCheckpoints.
const (
	MaxPageSize           = 1000
	MaxCheckpointPageSize = 100
)

// Session is a handle on one server session: cheap to make ([Client.OpenSession]) and safe for
// concurrent use. It holds no state that calls change: [Session.Info] is the session as it was
// when the handle was made, and every call returns what it produced. The last whole view of each
// session is held by the Client (see [WithViewCacheSessions]), so every handle on a session shares
// it for deltas.
type Session struct {
	client *Client
	id     string
	info   *SessionInfo
}

func (c *Client) newSession(info *ctxfoldv1.Session) *Session {
	snapshot := SessionInfoFromProto(info)
	return &Session{client: c, id: snapshot.ID, info: &snapshot}
}

// OpenSession returns a handle on an existing session without calling the server.
func (c *Client) OpenSession(id string) *Session {
	return &Session{client: c, id: id}
}

// CreateSession creates a session with cfg (see [NewSessionConfig]).
func (c *Client) CreateSession(ctx context.Context, cfg *SessionConfig) (*Session, error) {
	if cfg == nil {
		return nil, withOp("CreateSession", invalidConfig("context_window", "is required: give a config"))
	}
	if err := cfg.checkRanges(true); err != nil {
		return nil, err
	}
	ctx, cancel := c.unaryContext(ctx)
	defer cancel()
	resp, err := c.raw.CreateSession(ctx, &ctxfoldv1.CreateSessionRequest{Config: cfg.Proto()})
	if err != nil {
		return nil, AsError("CreateSession", err)
	}
	return c.newSession(resp.GetSession()), nil
}

// GetSession reads a session and returns a handle on it.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	info, err := c.OpenSession(id).Refresh(ctx)
	if err != nil {
		return nil, err
	}
	return &Session{client: c, id: id, info: info}, nil
}

// DeleteSession deletes a session and everything only it refers to, and forgets its held view.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	if err := requireSessionID("DeleteSession", id); err != nil {
		return err
	}
	ctx, cancel := c.unaryContext(ctx)
	defer cancel()
	_, err := c.raw.DeleteSession(ctx, &ctxfoldv1.DeleteSessionRequest{SessionId: id})
	c.views.forget(id)
	return AsError("DeleteSession", err)
}

// requireSessionID refuses an empty session id before any call, as the server would.
func requireSessionID(op, id string) error {
	if id == "" {
		return withOp(op, invalidArgument(ReasonSessionIdRequired, "session_id", "session_id is required"))
	}
	return nil
}

// ListOption tunes the list iterators.
type ListOption func(*listSettings)

type listSettings struct {
	pageSize         int32
	includeAbandoned bool
}

// PageSize sets how many items each underlying list call fetches (0 = the server's default, at
// most [MaxPageSize]; [MaxCheckpointPageSize] for checkpoints).
func PageSize(n int32) ListOption { return func(s *listSettings) { s.pageSize = n } }

// IncludeAbandoned also lists what Rewind abandoned ([Session.Messages], [Session.Checkpoints]).
func IncludeAbandoned() ListOption { return func(s *listSettings) { s.includeAbandoned = true } }

// listOptions applies opts and checks the page size against the server's maximum.
func listOptions(op string, maximum int32, opts []ListOption) (listSettings, error) {
	var s listSettings
	for _, opt := range opts {
		opt(&s)
	}
	if s.pageSize < 0 || s.pageSize > maximum {
		return s, withOp(op, invalidArgument(ReasonInvalidPageSize, "page_size", "page_size must be within [0, %d], got %d", maximum, s.pageSize))
	}
	return s, nil
}

// failed is an iterator that yields one error.
func failed[T any](err error) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		yield(zero, err)
	}
}

// Sessions iterates over the caller's sessions, newest first, fetching pages as needed. The
// iteration stops after yielding an error.
//
//	for info, err := range client.Sessions(ctx) { ... }
func (c *Client) Sessions(ctx context.Context, opts ...ListOption) iter.Seq2[SessionInfo, error] {
	s, err := listOptions("ListSessions", MaxPageSize, opts)
	if err != nil {
		return failed[SessionInfo](err)
	}
	return paginate("ListSessions", func(token string) ([]SessionInfo, string, error) {
		cctx, cancel := c.unaryContext(ctx)
		defer cancel()
		resp, err := c.raw.ListSessions(cctx, &ctxfoldv1.ListSessionsRequest{PageSize: s.pageSize, PageToken: token})
		if err != nil {
			return nil, "", AsError("ListSessions", err)
		}
		infos := make([]SessionInfo, len(resp.GetSessions()))
		for i, info := range resp.GetSessions() {
			infos[i] = SessionInfoFromProto(info)
		}
		return infos, resp.GetNextPageToken(), nil
	})
}

// paginate iterates over every item of a paged list RPC (op names it in errors).
func paginate[T any](op string, page func(token string) ([]T, string, error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		token, seen := "", map[string]bool{}
		for {
			items, next, err := page(token)
			if err != nil {
				yield(zero, err)
				return
			}
			if next != "" && seen[next] {
				yield(zero, sdkError(op, codes.Internal, ReasonProtocolViolation, "the server repeated the page token %q", next))
				return
			}
			seen[next] = true
			for _, item := range items {
				if !yield(item, nil) {
					return
				}
			}
			if next == "" {
				return
			}
			token = next
		}
	}
}

// ID returns the session id.
func (s *Session) ID() string { return s.id }

// Client returns the client the session belongs to.
func (s *Session) Client() *Client { return s.client }

// Info returns the session as it was when this handle was made (by CreateSession, GetSession or
// Fork; nil for a handle from OpenSession). It is a snapshot: later calls do not change it, they
// return what they produced ([Session.Refresh] reads the session now).
func (s *Session) Info() *SessionInfo {
	if s.info == nil {
		return nil
	}
	info := *s.info
	return &info
}

// HeldView returns the last whole view the client holds for this session and its version (nil, 0
// before the first Prepare, after a Rewind or once evicted).
func (s *Session) HeldView() ([]Message, int64) {
	if v := s.client.views.get(s.id); v != nil {
		return v.Messages, v.ViewVersion
	}
	return nil, 0
}

// ForgetView drops the held view, so the next Prepare asks for the whole view.
func (s *Session) ForgetView() { s.client.views.forget(s.id) }

// Refresh reads the session from the server.
func (s *Session) Refresh(ctx context.Context) (*SessionInfo, error) {
	if err := requireSessionID("GetSession", s.id); err != nil {
		return nil, err
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.GetSession(ctx, &ctxfoldv1.GetSessionRequest{SessionId: s.id})
	if err != nil {
		return nil, AsError("GetSession", err)
	}
	info := SessionInfoFromProto(resp.GetSession())
	return &info, nil
}

// Delete deletes the session (see [Client.DeleteSession]).
func (s *Session) Delete(ctx context.Context) error {
	return s.client.DeleteSession(ctx, s.id)
}

// Append appends messages to the canonical transcript (all or none) and returns them with their
// ids, seqs and, for tool results, result refs. Tool results must answer the pending calls of the
// last assistant message. The call carries a fresh request id, so it is idempotent on the server.
func (s *Session) Append(ctx context.Context, msgs ...Message) ([]Message, error) {
	return s.AppendWithRequestID(ctx, "", msgs...)
}

// AppendWithRequestID is Append with the caller's idempotency key (empty = a fresh UUIDv4): a
// retried call with the same key returns the messages the first call appended instead of
// appending again.
func (s *Session) AppendWithRequestID(ctx context.Context, requestID string, msgs ...Message) ([]Message, error) {
	if err := requireSessionID("AppendMessages", s.id); err != nil {
		return nil, err
	}
	if requestID == "" {
		requestID = newRequestID()
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.AppendMessages(ctx, &ctxfoldv1.AppendMessagesRequest{
		SessionId: s.id, Messages: messagesProto(msgs), RequestId: requestID,
	})
	if err != nil {
		return nil, AsError("AppendMessages", err)
	}
	return messagesFromProto(resp.GetMessages()), nil
}

// Messages iterates over the canonical transcript in seq order, fetching pages as needed.
func (s *Session) Messages(ctx context.Context, opts ...ListOption) iter.Seq2[Message, error] {
	ls, err := listOptions("ListMessages", MaxPageSize, opts)
	if err == nil {
		err = requireSessionID("ListMessages", s.id)
	}
	if err != nil {
		return failed[Message](err)
	}
	return paginate("ListMessages", func(token string) ([]Message, string, error) {
		cctx, cancel := s.client.unaryContext(ctx)
		defer cancel()
		resp, err := s.client.raw.ListMessages(cctx, &ctxfoldv1.ListMessagesRequest{
			SessionId: s.id, PageSize: ls.pageSize, PageToken: token, IncludeAbandoned: ls.includeAbandoned,
		})
		if err != nil {
			return nil, "", AsError("ListMessages", err)
		}
		return messagesFromProto(resp.GetMessages()), resp.GetNextPageToken(), nil
	})
}

// Usage is what the provider reported for one request (the adapters' responses carry it).
type Usage struct {
	InputTokens       int64
	CachedInputTokens int64
	OutputTokens      int64
	// FinishReason is the provider's finish reason (stop, length, tool_calls, ...).
	FinishReason string
}

// UsageResult is the server's answer to [Session.ObserveUsage].
type UsageResult struct {
	// Calibration is the session's calibration factor after this observation (reported / estimated).
	Calibration float64
	// CalibrationAccepted reports whether this observation changed the calibration (it is ignored
	// when out of bounds).
	CalibrationAccepted bool
}

// ObserveUsage records the provider's usage of the request made from the view of this version
// (View.ViewVersion; 0 = the last view held for the session). It feeds statistics and the
// token-estimate calibration only. When a provider reports no usage, View.EstimatedInputTokens
// stands in for the input (never View.EstimatedTokens, which includes the reserved output).
func (s *Session) ObserveUsage(ctx context.Context, viewVersion int64, u Usage) (*UsageResult, error) {
	if err := requireSessionID("ObserveUsage", s.id); err != nil {
		return nil, err
	}
	if viewVersion == 0 {
		_, viewVersion = s.HeldView()
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.ObserveUsage(ctx, &ctxfoldv1.ObserveUsageRequest{
		SessionId:         s.id,
		ViewVersion:       viewVersion,
		InputTokens:       u.InputTokens,
		CachedInputTokens: u.CachedInputTokens,
		OutputTokens:      u.OutputTokens,
		FinishReason:      u.FinishReason,
	})
	if err != nil {
		return nil, AsError("ObserveUsage", err)
	}
	return &UsageResult{Calibration: resp.GetCalibration(), CalibrationAccepted: resp.GetCalibrationAccepted()}, nil
}

// ForkPoint says where [Session.Fork] cuts the transcript: [ForkAtHead] or [ForkAtSeq].
type ForkPoint struct {
	seq    int64
	atHead bool
}

// ForkAtHead forks with every live message of the source.
func ForkAtHead() ForkPoint { return ForkPoint{atHead: true} }

// ForkAtSeq forks with the source's messages up to and including seq (>= 1).
func ForkAtSeq(seq int64) ForkPoint { return ForkPoint{seq: seq} }

// Fork creates a new session holding this session's transcript up to the fork point. Each
// override replaces the source's config value.
func (s *Session) Fork(ctx context.Context, at ForkPoint, overrides ...ConfigOption) (*Session, error) {
	if !at.atHead && at.seq < 1 {
		return nil, withOp("Fork", invalidArgument(ReasonSeqOutOfRange, "at_seq", "ForkAtSeq(%d): the seq must be >= 1 (use ForkAtHead for the head)", at.seq))
	}
	if err := requireSessionID("Fork", s.id); err != nil {
		return nil, err
	}
	cfg := &SessionConfig{}
	if err := cfg.apply(overrides, false); err != nil {
		return nil, err
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.Fork(ctx, &ctxfoldv1.ForkRequest{SessionId: s.id, AtSeq: at.seq, Config: cfg.Proto()})
	if err != nil {
		return nil, AsError("Fork", err)
	}
	return s.client.newSession(resp.GetSession()), nil
}

// Rewind moves the session head back to toSeq (0 = empty); later messages become abandoned. The
// held view is dropped, so the next Prepare returns the whole view. It returns the session after
// the rewind; the handle's Info stays what it was.
func (s *Session) Rewind(ctx context.Context, toSeq int64) (*SessionInfo, error) {
	if toSeq < 0 {
		return nil, withOp("Rewind", invalidArgument(ReasonSeqOutOfRange, "to_seq", "to_seq must be >= 0 (0 = empty), got %d", toSeq))
	}
	if err := requireSessionID("Rewind", s.id); err != nil {
		return nil, err
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.Rewind(ctx, &ctxfoldv1.RewindRequest{SessionId: s.id, ToSeq: toSeq})
	if err != nil {
		return nil, AsError("Rewind", err)
	}
	s.ForgetView()
	info := SessionInfoFromProto(resp.GetSession())
	return &info, nil
}

// storedSeq refuses a seq that names no stored message (below 1), before any call.
func storedSeq(op string, seq int64) error {
	if seq < 1 {
		return withOp(op, invalidArgument(ReasonSeqOutOfRange, "seq", "not the seq of a stored message: %d", seq))
	}
	return nil
}

// Edit replaces the message at seq with msg: it rewinds to seq-1 (abandoning that message and all
// later ones) and appends msg, returning the new message (with its id and seq).
func (s *Session) Edit(ctx context.Context, seq int64, msg Message) (*Message, error) {
	return s.EditWithRequestID(ctx, "", seq, msg)
}

// EditWithRequestID is Edit with the append's idempotency key (empty = a fresh UUIDv4).
func (s *Session) EditWithRequestID(ctx context.Context, requestID string, seq int64, msg Message) (*Message, error) {
	if err := storedSeq("Edit", seq); err != nil {
		return nil, err
	}
	if _, err := s.Rewind(ctx, seq-1); err != nil {
		return nil, err
	}
	appended, err := s.AppendWithRequestID(ctx, requestID, msg)
	if err != nil {
		return nil, err
	}
	return &appended[0], nil
}

// Retry discards the assistant answer at answerSeq (and everything after it) and prepares again,
// returning the view to send to the model for a new answer.
func (s *Session) Retry(ctx context.Context, answerSeq int64, opts ...PrepareOption) (*View, error) {
	if err := storedSeq("Retry", answerSeq); err != nil {
		return nil, err
	}
	if _, err := s.Rewind(ctx, answerSeq-1); err != nil {
		return nil, err
	}
	return s.Prepare(ctx, opts...)
}

// ContextState returns the session's context state document (schema version 3): the server's
// bookkeeping, for diagnostics.
func (s *Session) ContextState(ctx context.Context) (*ContextState, error) {
	if err := requireSessionID("GetContextState", s.id); err != nil {
		return nil, err
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.GetContextState(ctx, &ctxfoldv1.GetContextStateRequest{SessionId: s.id})
	if err != nil {
		return nil, AsError("GetContextState", err)
	}
	var state ContextState
	if err := json.Unmarshal([]byte(resp.GetStateJson()), &state); err != nil {
		return nil, sdkError("GetContextState", codes.Internal, ReasonProtocolViolation, "the context state is not a JSON object: %v", err)
	}
	return &state, nil
}

// Checkpoints iterates over the session's checkpoints, newest first, with their summaries
// ([IncludeAbandoned] adds those of abandoned branches).
func (s *Session) Checkpoints(ctx context.Context, opts ...ListOption) iter.Seq2[Checkpoint, error] {
	ls, err := listOptions("ListCheckpoints", MaxCheckpointPageSize, opts)
	if err == nil {
		err = requireSessionID("ListCheckpoints", s.id)
	}
	if err != nil {
		return failed[Checkpoint](err)
	}
	return paginate("ListCheckpoints", func(token string) ([]Checkpoint, string, error) {
		cctx, cancel := s.client.unaryContext(ctx)
		defer cancel()
		resp, err := s.client.raw.ListCheckpoints(cctx, &ctxfoldv1.ListCheckpointsRequest{
			SessionId: s.id, PageSize: ls.pageSize, PageToken: token, IncludeAbandoned: ls.includeAbandoned,
		})
		if err != nil {
			return nil, "", AsError("ListCheckpoints", err)
		}
		checkpoints := make([]Checkpoint, len(resp.GetCheckpoints()))
		for i, c := range resp.GetCheckpoints() {
			checkpoints[i] = checkpointFromProto(c)
		}
		return checkpoints, resp.GetNextPageToken(), nil
	})
}

// GetCheckpoint reads one checkpoint of the session.
func (s *Session) GetCheckpoint(ctx context.Context, checkpointID string) (*Checkpoint, error) {
	if err := requireSessionID("GetCheckpoint", s.id); err != nil {
		return nil, err
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.GetCheckpoint(ctx, &ctxfoldv1.GetCheckpointRequest{SessionId: s.id, CheckpointId: checkpointID})
	if err != nil {
		return nil, AsError("GetCheckpoint", err)
	}
	checkpoint := checkpointFromProto(resp.GetCheckpoint())
	return &checkpoint, nil
}

// newRequestID returns a random UUIDv4, the idempotency key of a call the caller gave none.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics if the OS cannot supply)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

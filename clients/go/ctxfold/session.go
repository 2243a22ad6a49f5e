package ctxfold

import (
	"context"
	"errors"
	"iter"
	"sync"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// Session is a handle on one server session. Besides the session RPCs it keeps the last full view
// returned by Prepare or Compact, so that Prepare can ask for deltas and still hand the caller the
// whole view. A Session is safe for concurrent use, though one agent loop per session is the
// intended use.
type Session struct {
	client *Client
	id     string

	mu          sync.Mutex
	info        *SessionInfo
	view        []*Message
	viewVersion int64
}

func (c *Client) newSession(info *SessionInfo) *Session {
	return &Session{client: c, id: info.GetId(), info: info}
}

// OpenSession returns a handle on an existing session without calling the server.
func (c *Client) OpenSession(id string) *Session {
	return &Session{client: c, id: id}
}

// CreateSession creates a session with cfg (see [NewSessionConfig]).
func (c *Client) CreateSession(ctx context.Context, cfg *ctxfoldv1.SessionConfig) (*Session, error) {
	if cfg == nil {
		return nil, errors.New("ctxfold: CreateSession needs a config (context_window is required)")
	}
	ctx, cancel := c.unaryContext(ctx)
	defer cancel()
	resp, err := c.raw.CreateSession(ctx, &ctxfoldv1.CreateSessionRequest{Config: cfg})
	if err != nil {
		return nil, AsError("CreateSession", err)
	}
	return c.newSession(resp.GetSession()), nil
}

// GetSession reads a session and returns a handle on it.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	s := c.OpenSession(id)
	if _, err := s.Refresh(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// DeleteSession deletes a session and everything only it refers to.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	ctx, cancel := c.unaryContext(ctx)
	defer cancel()
	_, err := c.raw.DeleteSession(ctx, &ctxfoldv1.DeleteSessionRequest{SessionId: id})
	return AsError("DeleteSession", err)
}

// ListOption tunes the list iterators.
type ListOption func(*listSettings)

type listSettings struct {
	pageSize         int32
	includeAbandoned bool
}

// PageSize sets how many items each underlying list call fetches (1..1000; server default 100).
func PageSize(n int32) ListOption { return func(s *listSettings) { s.pageSize = n } }

// IncludeAbandoned also lists messages abandoned by Rewind ([Session.Messages] only).
func IncludeAbandoned() ListOption { return func(s *listSettings) { s.includeAbandoned = true } }

func listOptions(opts []ListOption) listSettings {
	var s listSettings
	for _, opt := range opts {
		opt(&s)
	}
	return s
}

// Sessions iterates over the caller's sessions, newest first, fetching pages as needed. The
// iteration stops after yielding an error.
//
//	for info, err := range client.Sessions(ctx) { ... }
func (c *Client) Sessions(ctx context.Context, opts ...ListOption) iter.Seq2[*SessionInfo, error] {
	s := listOptions(opts)
	return paginate(func(token string) ([]*SessionInfo, string, error) {
		cctx, cancel := c.unaryContext(ctx)
		defer cancel()
		resp, err := c.raw.ListSessions(cctx, &ctxfoldv1.ListSessionsRequest{PageSize: s.pageSize, PageToken: token})
		if err != nil {
			return nil, "", AsError("ListSessions", err)
		}
		return resp.GetSessions(), resp.GetNextPageToken(), nil
	})
}

func paginate[T any](page func(token string) ([]T, string, error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		token := ""
		for {
			items, next, err := page(token)
			if err != nil {
				var zero T
				yield(zero, err)
				return
			}
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

// Info returns the session as last returned by the server (nil for a handle from OpenSession that
// made no call yet). See [Session.Refresh].
func (s *Session) Info() *SessionInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

func (s *Session) setInfo(info *SessionInfo) {
	if info == nil {
		return
	}
	s.mu.Lock()
	s.info = info
	s.mu.Unlock()
}

// View returns the last full view this handle holds and its version (nil, 0 before the first
// Prepare or after a Rewind).
func (s *Session) View() ([]*Message, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.view, s.viewVersion
}

// ForgetView drops the held view, so the next Prepare asks for the whole view.
func (s *Session) ForgetView() {
	s.mu.Lock()
	s.view, s.viewVersion = nil, 0
	s.mu.Unlock()
}

// Refresh reads the session from the server.
func (s *Session) Refresh(ctx context.Context) (*SessionInfo, error) {
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.GetSession(ctx, &ctxfoldv1.GetSessionRequest{SessionId: s.id})
	if err != nil {
		return nil, AsError("GetSession", err)
	}
	s.setInfo(resp.GetSession())
	return resp.GetSession(), nil
}

// Delete deletes the session.
func (s *Session) Delete(ctx context.Context) error {
	return s.client.DeleteSession(ctx, s.id)
}

// Append appends messages to the canonical transcript (all or none) and returns them with their
// ids and seqs. Tool results must answer the pending calls of the last assistant message.
func (s *Session) Append(ctx context.Context, msgs ...*Message) ([]*Message, error) {
	return s.AppendWithRequestID(ctx, "", msgs...)
}

// AppendWithRequestID is Append with an idempotency key: a retried call with the same key returns
// the messages the first call appended instead of appending again.
func (s *Session) AppendWithRequestID(ctx context.Context, requestID string, msgs ...*Message) ([]*Message, error) {
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.AppendMessages(ctx, &ctxfoldv1.AppendMessagesRequest{
		SessionId: s.id, Messages: msgs, RequestId: requestID,
	})
	if err != nil {
		return nil, AsError("AppendMessages", err)
	}
	s.setInfo(resp.GetSession())
	return resp.GetMessages(), nil
}

// Messages iterates over the canonical transcript in seq order, fetching pages as needed.
func (s *Session) Messages(ctx context.Context, opts ...ListOption) iter.Seq2[*Message, error] {
	ls := listOptions(opts)
	return paginate(func(token string) ([]*Message, string, error) {
		cctx, cancel := s.client.unaryContext(ctx)
		defer cancel()
		resp, err := s.client.raw.ListMessages(cctx, &ctxfoldv1.ListMessagesRequest{
			SessionId: s.id, PageSize: ls.pageSize, PageToken: token, IncludeAbandoned: ls.includeAbandoned,
		})
		if err != nil {
			return nil, "", AsError("ListMessages", err)
		}
		return resp.GetMessages(), resp.GetNextPageToken(), nil
	})
}

// Usage is what the provider reported for one request.
type Usage struct {
	// ViewVersion is the PreparedContext.ViewVersion that was sent; 0 = the last view this handle
	// prepared.
	ViewVersion       int64
	InputTokens       int64
	CachedInputTokens int64
	OutputTokens      int64
	// FinishReason is the provider's finish reason (stop, length, tool_calls, ...).
	FinishReason string
}

// ObserveUsage records the provider's usage for a prepared view (statistics and calibration only).
func (s *Session) ObserveUsage(ctx context.Context, u Usage) (*ctxfoldv1.ObserveUsageResponse, error) {
	if u.ViewVersion == 0 {
		_, u.ViewVersion = s.View()
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.ObserveUsage(ctx, &ctxfoldv1.ObserveUsageRequest{
		SessionId:         s.id,
		ViewVersion:       u.ViewVersion,
		InputTokens:       u.InputTokens,
		CachedInputTokens: u.CachedInputTokens,
		OutputTokens:      u.OutputTokens,
		FinishReason:      u.FinishReason,
	})
	if err != nil {
		return nil, AsError("ObserveUsage", err)
	}
	return resp, nil
}

// Fork creates a new session holding this session's transcript up to and including atSeq
// (0 = the current head). Each override replaces the source's config value.
func (s *Session) Fork(ctx context.Context, atSeq int64, overrides ...ConfigOption) (*Session, error) {
	cfg := &ctxfoldv1.SessionConfig{}
	if err := applyConfig(cfg, overrides); err != nil {
		return nil, err
	}
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.Fork(ctx, &ctxfoldv1.ForkRequest{SessionId: s.id, AtSeq: atSeq, Config: cfg})
	if err != nil {
		return nil, AsError("Fork", err)
	}
	return s.client.newSession(resp.GetSession()), nil
}

// Rewind moves the session head back to toSeq (0 = empty); later messages become abandoned. The
// held view is dropped, so the next Prepare returns the whole view.
func (s *Session) Rewind(ctx context.Context, toSeq int64) (*SessionInfo, error) {
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.Rewind(ctx, &ctxfoldv1.RewindRequest{SessionId: s.id, ToSeq: toSeq})
	if err != nil {
		return nil, AsError("Rewind", err)
	}
	s.ForgetView()
	s.setInfo(resp.GetSession())
	return resp.GetSession(), nil
}

// Edit replaces the message at seq with msg: it rewinds to seq-1 (abandoning that message and all
// later ones) and prepares with msg appended, returning the new view.
func (s *Session) Edit(ctx context.Context, seq int64, msg *Message, opts ...PrepareOption) (*PreparedContext, error) {
	if seq < 1 {
		return nil, errors.New("ctxfold: Edit needs the seq (>= 1) of the message to replace")
	}
	if _, err := s.Rewind(ctx, seq-1); err != nil {
		return nil, err
	}
	return s.Prepare(ctx, append([]PrepareOption{WithAppend(msg)}, opts...)...)
}

// Retry discards the assistant answer at answerSeq (and everything after it) and prepares again,
// returning the view to send to the model for a new answer. Extra messages can still be appended
// with [WithAppend].
func (s *Session) Retry(ctx context.Context, answerSeq int64, opts ...PrepareOption) (*PreparedContext, error) {
	if answerSeq < 1 {
		return nil, errors.New("ctxfold: Retry needs the seq (>= 1) of the answer to discard")
	}
	if _, err := s.Rewind(ctx, answerSeq-1); err != nil {
		return nil, err
	}
	return s.Prepare(ctx, opts...)
}

// ContextState returns the session's projection state ("sidecar", schema version 3) as JSON.
func (s *Session) ContextState(ctx context.Context) (string, error) {
	ctx, cancel := s.client.unaryContext(ctx)
	defer cancel()
	resp, err := s.client.raw.GetContextState(ctx, &ctxfoldv1.GetContextStateRequest{SessionId: s.id})
	if err != nil {
		return "", AsError("GetContextState", err)
	}
	return resp.GetStateJson(), nil
}

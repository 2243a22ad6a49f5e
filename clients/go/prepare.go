package ctxfold

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// ErrNoResult is returned (wrapped) when a Prepare or Compact stream ends without its result.
var ErrNoResult = errors.New("ctxfold: stream ended without a result")

// PreparedContext is the view to send to the model, with what the server said about it.
type PreparedContext struct {
	// Messages is the whole view (system, at most one summary, kept messages, recent tail), with a
	// delta answer already applied to the previous view. Messages are shared with the Session's
	// held view: treat them as read-only.
	Messages []*Message
	// Received is what the server sent: the whole view, or only the new tail when Delta is true.
	Received []*Message
	// Delta is true when the server answered with only the messages after the held view.
	Delta bool
	// ViewVersion identifies this view: pass it to ObserveUsage (done by default).
	ViewVersion int64
	// EstimatedTokens is the server's estimate of the whole request.
	EstimatedTokens int64
	// Action is the maintenance this call performed (NONE, PRUNED or FOLDED).
	Action ctxfoldv1.Action
	// CacheState is the provider cache state judged before this request.
	CacheState ctxfoldv1.CacheState
	// PromptCacheKey is the prompt-cache key to send with the request.
	PromptCacheKey string
	// CheckpointID is the head checkpoint rendered in the view (empty when nothing was folded).
	CheckpointID string
	// StablePrefixMessages is the number of leading messages identical to the previous view.
	StablePrefixMessages int64
	// TriggerTokens is compact_ratio × context_window.
	TriggerTokens int64
	// HardLimitTokens is context_window − max_output_tokens − 256.
	HardLimitTokens int64
	// Appended are the messages this call appended, with ids and seqs.
	Appended []*Message
	// Progress are the maintenance events streamed before the result, in order.
	Progress []*FoldProgress
	// Raw is the result message as received.
	Raw *ctxfoldv1.PreparedContext
}

// Folded reports whether this call folded history into a summary checkpoint.
func (p *PreparedContext) Folded() bool { return p.Action == ctxfoldv1.Action_ACTION_FOLDED }

// Summary returns the view's summary message, or nil when the view has none.
func (p *PreparedContext) Summary() *Message {
	for _, m := range p.Messages {
		if m.GetSummary() {
			return m
		}
	}
	return nil
}

// PrepareOption tunes [Session.Prepare] (and [Session.Edit], [Session.Retry]).
type PrepareOption interface{ applyPrepare(*prepareSettings) }

// CompactOption tunes [Session.Compact].
type CompactOption interface{ applyCompact(*progressSettings) }

// ProgressOption is accepted by both Prepare and Compact.
type ProgressOption interface {
	PrepareOption
	CompactOption
}

type progressSettings struct {
	callback func(*FoldProgress)
	channel  chan<- *FoldProgress
}

type prepareSettings struct {
	progressSettings
	append    []*Message
	overflow  bool
	requestID string
	fullView  bool
}

type prepareOption func(*prepareSettings)

func (f prepareOption) applyPrepare(s *prepareSettings) { f(s) }

type progressOption func(*progressSettings)

func (f progressOption) applyPrepare(s *prepareSettings)  { f(&s.progressSettings) }
func (f progressOption) applyCompact(s *progressSettings) { f(s) }

// WithAppend appends messages (the new user turn, tool results, ...) before preparing.
func WithAppend(msgs ...*Message) PrepareOption {
	return prepareOption(func(s *prepareSettings) { s.append = append(s.append, msgs...) })
}

// WithOverflow tells the server the provider rejected the last view as too long: it maintains
// even below the trigger (at most one prune and one summary).
func WithOverflow() PrepareOption {
	return prepareOption(func(s *prepareSettings) { s.overflow = true })
}

// WithRequestID sets the idempotency key of the append.
func WithRequestID(id string) PrepareOption {
	return prepareOption(func(s *prepareSettings) { s.requestID = id })
}

// WithFullView asks for the whole view instead of a delta against the held view.
func WithFullView() PrepareOption {
	return prepareOption(func(s *prepareSettings) { s.fullView = true })
}

// WithProgress calls fn for every progress event, in order, before the call returns.
func WithProgress(fn func(*FoldProgress)) ProgressOption {
	return progressOption(func(s *progressSettings) { s.callback = fn })
}

// WithProgressChan sends every progress event on ch. Sends block until received (or the context
// ends), so drain ch concurrently; the channel is not closed by this package.
func WithProgressChan(ch chan<- *FoldProgress) ProgressOption {
	return progressOption(func(s *progressSettings) { s.channel = ch })
}

// Prepare appends the messages given with [WithAppend], lets the server run maintenance when the
// view reaches the trigger, and returns the view to send to the model. Progress events are
// delivered to [WithProgress] / [WithProgressChan] as they stream and are also collected in
// PreparedContext.Progress.
//
// The handle asks for a delta against the view it holds and applies it, so Messages is always the
// whole view.
func (s *Session) Prepare(ctx context.Context, opts ...PrepareOption) (*PreparedContext, error) {
	var ps prepareSettings
	for _, opt := range opts {
		opt.applyPrepare(&ps)
	}
	baseView, baseVersion := s.View()
	if ps.fullView {
		baseView, baseVersion = nil, 0
	}
	req := &ctxfoldv1.PrepareRequest{
		SessionId:        s.id,
		Append:           ps.append,
		Overflow:         ps.overflow,
		KnownViewVersion: baseVersion,
		RequestId:        ps.requestID,
	}
	result, progress, err := s.prepareOnce(ctx, req, &ps.progressSettings)
	if err != nil {
		return nil, err
	}
	prepared := newPrepared(result, progress)
	if result.GetDelta() {
		full, ok := applyDelta(baseView, baseVersion, result)
		if !ok {
			// The delta does not extend the view we hold: ask for the whole view once, appending
			// nothing (the append above is done).
			again := &ctxfoldv1.PrepareRequest{SessionId: s.id}
			result2, progress2, err := s.prepareOnce(ctx, again, &ps.progressSettings)
			if err != nil {
				return nil, err
			}
			appended := prepared.Appended
			prepared = newPrepared(result2, append(progress, progress2...))
			prepared.Appended = appended
			full = result2.GetMessages()
		}
		prepared.Messages = full
	}
	s.remember(prepared)
	return prepared, nil
}

func (s *Session) prepareOnce(ctx context.Context, req *ctxfoldv1.PrepareRequest, ps *progressSettings) (*ctxfoldv1.PreparedContext, []*FoldProgress, error) {
	ctx, cancel := s.client.streamContext(ctx)
	defer cancel()
	stream, err := s.client.raw.Prepare(ctx, req)
	if err != nil {
		return nil, nil, AsError("Prepare", err)
	}
	return consume(ctx, "Prepare", stream, ps)
}

// Compact folds history into a summary checkpoint now, even below the trigger (no prune). focus
// adds instructions on what the summary should keep in view. The handle's held view is replaced by
// the returned whole view.
func (s *Session) Compact(ctx context.Context, focus string, opts ...CompactOption) (*PreparedContext, error) {
	var ps progressSettings
	for _, opt := range opts {
		opt.applyCompact(&ps)
	}
	ctx, cancel := s.client.streamContext(ctx)
	defer cancel()
	stream, err := s.client.raw.Compact(ctx, &ctxfoldv1.CompactRequest{SessionId: s.id, Focus: focus})
	if err != nil {
		return nil, AsError("Compact", err)
	}
	result, progress, err := consume(ctx, "Compact", stream, &ps)
	if err != nil {
		return nil, err
	}
	prepared := newPrepared(result, progress)
	if result.GetDelta() { // not expected: Compact sends no known view version
		s.ForgetView()
		return prepared, nil
	}
	s.remember(prepared)
	return prepared, nil
}

// applyDelta returns base + the delta messages when result is a delta against base.
func applyDelta(base []*Message, baseVersion int64, result *ctxfoldv1.PreparedContext) ([]*Message, bool) {
	if baseVersion == 0 {
		return nil, false
	}
	tail := result.GetMessages()
	if int64(len(base)+len(tail)) != result.GetViewMessageCount() {
		return nil, false
	}
	full := make([]*Message, 0, len(base)+len(tail))
	full = append(full, base...)
	full = append(full, tail...)
	return full, true
}

func newPrepared(r *ctxfoldv1.PreparedContext, progress []*FoldProgress) *PreparedContext {
	return &PreparedContext{
		Messages:             r.GetMessages(),
		Received:             r.GetMessages(),
		Delta:                r.GetDelta(),
		ViewVersion:          r.GetViewVersion(),
		EstimatedTokens:      r.GetEstimatedTokens(),
		Action:               r.GetAction(),
		CacheState:           r.GetCacheState(),
		PromptCacheKey:       r.GetPromptCacheKey(),
		CheckpointID:         r.GetCheckpointId(),
		StablePrefixMessages: r.GetStablePrefixMessages(),
		TriggerTokens:        r.GetTriggerTokens(),
		HardLimitTokens:      r.GetHardLimitTokens(),
		Appended:             r.GetAppended(),
		Progress:             progress,
		Raw:                  r,
	}
}

// remember keeps p's whole view as the base for the next delta.
func (s *Session) remember(p *PreparedContext) {
	s.mu.Lock()
	s.view, s.viewVersion = p.Messages, p.ViewVersion
	s.mu.Unlock()
}

type foldEvent interface {
	GetProgress() *ctxfoldv1.FoldProgress
	GetResult() *ctxfoldv1.PreparedContext
}

// consume reads a Prepare or Compact stream: progress events, then exactly one result.
func consume[E any, P interface {
	*E
	foldEvent
}](ctx context.Context, op string, stream grpc.ServerStreamingClient[E], ps *progressSettings) (*ctxfoldv1.PreparedContext, []*FoldProgress, error) {
	var (
		result   *ctxfoldv1.PreparedContext
		progress []*FoldProgress
	)
	for {
		received, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, progress, AsError(op, err)
		}
		event := P(received)
		if p := event.GetProgress(); p != nil {
			progress = append(progress, p)
			if ps.callback != nil {
				ps.callback(p)
			}
			if ps.channel != nil {
				select {
				case ps.channel <- p:
				case <-ctx.Done():
					return nil, progress, AsError(op, ctx.Err())
				}
			}
		}
		if r := event.GetResult(); r != nil {
			result = r
		}
	}
	if result == nil {
		return nil, progress, fmt.Errorf("ctxfold: %s: %w", op, ErrNoResult)
	}
	return result, progress, nil
}

package ctxfold

import (
	"context"
	"errors"
	"io"
	"iter"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// View is the whole provider-visible context to send to the model, with what the server said
// about it. Prepare, Compact and Retry return it; the adapters convert it to provider requests.
type View struct {
	// Messages is the whole view: system, at most one summary, kept messages, the recent tail. A
	// delta answer is already applied. The slice is shared with the held view: do not modify it.
	Messages []Message
	// EstimatedTokens is the server's estimate of the whole request, the reserved max_output_tokens
	// included: what the trigger and the hard limit compare.
	EstimatedTokens int64
	// EstimatedInputTokens is the input alone (EstimatedTokens without max_output_tokens): compare
	// it with the input tokens the provider reports, or report it when a provider reports none.
	EstimatedInputTokens int64
	// ViewVersion identifies this view: ObserveUsage reports against it.
	ViewVersion int64
	// Action is the maintenance this call performed (ActionNone, ActionPruned or ActionFolded).
	Action Action
	// CacheState is the provider cache state judged before this request.
	CacheState CacheState
	// PromptCacheKey is the prompt-cache key to send with the request.
	PromptCacheKey string
	// CheckpointID is the head checkpoint rendered in the view (empty when nothing was folded).
	CheckpointID string
	// StablePrefixMessages is the number of leading messages identical to the previous view.
	StablePrefixMessages int64
	// ViewMessageCount is the number of messages of the whole view (len(Messages)).
	ViewMessageCount int64
	// TriggerTokens is compact_ratio × context_window.
	TriggerTokens int64
	// HardLimitTokens is context_window − max_output_tokens − 256.
	HardLimitTokens int64
	// Appended are the messages this call appended, with ids and seqs.
	Appended []Message
	// NotFoldedReason says why nothing was folded when folding was asked for or needed.
	NotFoldedReason NotFoldedReason
	// NotFoldedDetail explains NotFoldedReason for a person.
	NotFoldedDetail string
	// CandidateSummary is, for a Compact dry run, the summary the fold would install.
	CandidateSummary string
	// FoldedResultsRef is the folded-results index of the head checkpoint, readable with
	// ReadToolResult (and by the model through the read_tool_result tool).
	FoldedResultsRef string
	// Progress are the maintenance events streamed before the result, in order.
	Progress []FoldProgress
	// Delta reports that the server sent only the messages after the held view (already applied).
	Delta bool
}

// Folded reports whether this call folded history into a summary checkpoint.
func (v *View) Folded() bool { return v.Action == ActionFolded }

// Summary returns the view's summary message, or nil when the view has none.
func (v *View) Summary() *Message {
	for i := range v.Messages {
		if v.Messages[i].Summary {
			return &v.Messages[i]
		}
	}
	return nil
}

// Proto returns the view as the generated PreparedContext (the whole view, never a delta).
func (v *View) Proto() *ctxfoldv1.PreparedContext {
	return &ctxfoldv1.PreparedContext{
		Messages: messagesProto(v.Messages), EstimatedTokens: v.EstimatedTokens,
		EstimatedInputTokens: v.EstimatedInputTokens, ViewVersion: v.ViewVersion, Action: v.Action,
		CacheState: v.CacheState, PromptCacheKey: v.PromptCacheKey, CheckpointId: v.CheckpointID,
		StablePrefixMessages: v.StablePrefixMessages, ViewMessageCount: v.ViewMessageCount,
		TriggerTokens: v.TriggerTokens, HardLimitTokens: v.HardLimitTokens, Appended: messagesProto(v.Appended),
		NotFoldedReason: v.NotFoldedReason, NotFoldedDetail: v.NotFoldedDetail,
		CandidateSummary: v.CandidateSummary, FoldedResultsRef: v.FoldedResultsRef,
	}
}

// ViewFromProto returns the View of a whole (not delta) PreparedContext, e.g. one read with
// [Client.Raw] or stored by the caller.
func ViewFromProto(r *ctxfoldv1.PreparedContext) *View {
	return newView(r, messagesFromProto(r.GetMessages()), nil)
}

func newView(r *ctxfoldv1.PreparedContext, messages []Message, progress []FoldProgress) *View {
	return &View{
		Messages: messages, EstimatedTokens: r.GetEstimatedTokens(), EstimatedInputTokens: r.GetEstimatedInputTokens(),
		ViewVersion: r.GetViewVersion(), Action: r.GetAction(), CacheState: r.GetCacheState(),
		PromptCacheKey: r.GetPromptCacheKey(), CheckpointID: r.GetCheckpointId(),
		StablePrefixMessages: r.GetStablePrefixMessages(), ViewMessageCount: r.GetViewMessageCount(),
		TriggerTokens: r.GetTriggerTokens(), HardLimitTokens: r.GetHardLimitTokens(),
		Appended: messagesFromProto(r.GetAppended()), NotFoldedReason: r.GetNotFoldedReason(),
		NotFoldedDetail: r.GetNotFoldedDetail(), CandidateSummary: r.GetCandidateSummary(),
		FoldedResultsRef: r.GetFoldedResultsRef(), Progress: progress,
	}
}

// Event is one item of [Session.PrepareEvents] and [Session.CompactEvents]: a progress event, or
// (last) the whole view.
type Event struct {
	// Progress is set for a maintenance progress event.
	Progress *FoldProgress
	// View is set on the last event.
	View *View
}

// PrepareOption tunes [Session.Prepare] (and [Session.PrepareEvents], [Session.Retry]).
type PrepareOption interface{ applyPrepare(*prepareSettings) }

// CompactOption tunes [Session.Compact] and [Session.CompactEvents].
type CompactOption interface{ applyCompact(*compactSettings) }

// ProgressOption is accepted by both Prepare and Compact.
type ProgressOption interface {
	PrepareOption
	CompactOption
}

type progressSettings struct {
	callback func(FoldProgress)
	channel  chan<- FoldProgress
}

type prepareSettings struct {
	progressSettings
	append    []Message
	overflow  bool
	requestID string
}

type compactSettings struct {
	progressSettings
	focus      string
	keepTokens int64
	dryRun     bool
}

type prepareOption func(*prepareSettings)

func (f prepareOption) applyPrepare(s *prepareSettings) { f(s) }

type compactOption func(*compactSettings)

func (f compactOption) applyCompact(s *compactSettings) { f(s) }

type progressOption func(*progressSettings)

func (f progressOption) applyPrepare(s *prepareSettings) { f(&s.progressSettings) }
func (f progressOption) applyCompact(s *compactSettings) { f(&s.progressSettings) }

// WithAppend appends messages (the new user turn, tool results, ...) before preparing.
func WithAppend(msgs ...Message) PrepareOption {
	return prepareOption(func(s *prepareSettings) { s.append = append(s.append, msgs...) })
}

// WithOverflow tells the server the provider rejected the last view as too long: it maintains
// even below the trigger (at most one prune and one summary).
func WithOverflow() PrepareOption {
	return prepareOption(func(s *prepareSettings) { s.overflow = true })
}

// WithRequestID sets the idempotency key of the append (default: a fresh UUIDv4 per call).
func WithRequestID(id string) PrepareOption {
	return prepareOption(func(s *prepareSettings) { s.requestID = id })
}

// Focus adds instructions on what the Compact summary should keep in view.
func Focus(text string) CompactOption {
	return compactOption(func(s *compactSettings) { s.focus = text })
}

// KeepTokens keeps about this many tokens of the newest history verbatim (0 = the minimal kept set).
func KeepTokens(n int64) CompactOption {
	return compactOption(func(s *compactSettings) { s.keepTokens = n })
}

// DryRun makes Compact return the candidate view and summary without installing anything.
func DryRun() CompactOption {
	return compactOption(func(s *compactSettings) { s.dryRun = true })
}

// WithProgress calls fn for every progress event, in order, before the call returns.
func WithProgress(fn func(FoldProgress)) ProgressOption {
	return progressOption(func(s *progressSettings) { s.callback = fn })
}

// WithProgressChan sends every progress event on ch. Sends block until received (or the context
// ends), so drain ch concurrently; the channel is not closed by this package.
func WithProgressChan(ch chan<- FoldProgress) ProgressOption {
	return progressOption(func(s *progressSettings) { s.channel = ch })
}

// Prepare appends the messages given with [WithAppend], lets the server run maintenance when the
// view reaches the trigger, and returns the whole view to send to the model. Progress events go
// to [WithProgress] / [WithProgressChan] as they stream and are collected in View.Progress.
//
// The client sends the version of the view it holds for the session and applies a delta answer.
// When it cannot (the held view was evicted or does not line up), it prepares once more without
// appending and returns that whole view: the append is never repeated.
func (s *Session) Prepare(ctx context.Context, opts ...PrepareOption) (*View, error) {
	var ps prepareSettings
	for _, opt := range opts {
		opt.applyPrepare(&ps)
	}
	return s.prepare(ctx, &ps, ps.progressSettings.deliver(ctx))
}

// PrepareEvents is Prepare as a stream: the progress events as they arrive, then one event with the
// whole view. The iteration stops after yielding an error; stopping it early cancels the call (the
// append may already be done: prepare again without it).
//
//	for ev, err := range session.PrepareEvents(ctx, ctxfold.WithAppend(msg)) { ... }
func (s *Session) PrepareEvents(ctx context.Context, opts ...PrepareOption) iter.Seq2[Event, error] {
	var ps prepareSettings
	for _, opt := range opts {
		opt.applyPrepare(&ps)
	}
	return events(ctx, func(ctx context.Context, onProgress func(FoldProgress) error) (*View, error) {
		return s.prepare(ctx, &ps, onProgress)
	})
}

func (s *Session) prepare(ctx context.Context, ps *prepareSettings, onProgress func(FoldProgress) error) (*View, error) {
	if err := requireSessionID("Prepare", s.id); err != nil {
		return nil, err
	}
	requestID := ps.requestID
	if requestID == "" {
		requestID = newRequestID()
	}
	baseView, baseVersion := s.HeldView()
	result, progress, err := s.prepareOnce(ctx, &ctxfoldv1.PrepareRequest{
		SessionId: s.id, Append: messagesProto(ps.append), Overflow: ps.overflow, KnownViewVersion: baseVersion, RequestId: requestID,
	}, onProgress)
	if err != nil {
		return nil, err
	}
	appended, messages := result.GetAppended(), messagesFromProto(result.GetMessages())
	if result.GetDelta() {
		full, ok := applyDelta(baseView, result)
		if !ok {
			// The delta does not extend the view we hold: ask for the whole view once, appending
			// nothing (the append above is done); Appended stays what the first call appended.
			again, more, err := s.prepareOnce(ctx, &ctxfoldv1.PrepareRequest{SessionId: s.id}, onProgress)
			if err != nil {
				return nil, err
			}
			if again.GetDelta() {
				return nil, sdkError("Prepare", codes.Internal, ReasonProtocolViolation, "the server answered a request for the whole view with a delta")
			}
			result, progress, full = again, append(progress, more...), messagesFromProto(again.GetMessages())
		}
		messages = full
	}
	if int64(len(messages)) != result.GetViewMessageCount() {
		return nil, sdkError("Prepare", codes.Internal, ReasonProtocolViolation,
			"the whole view has %d messages, the server counts %d", len(messages), result.GetViewMessageCount())
	}
	view := newView(result, messages, progress)
	view.Appended, view.Delta = messagesFromProto(appended), result.GetDelta()
	s.client.views.put(s.id, view)
	return view, nil
}

func (s *Session) prepareOnce(ctx context.Context, req *ctxfoldv1.PrepareRequest, onProgress func(FoldProgress) error) (*ctxfoldv1.PreparedContext, []FoldProgress, error) {
	ctx, cancel := s.client.streamContext(ctx)
	defer cancel()
	stream, err := s.client.raw.Prepare(ctx, req)
	if err != nil {
		return nil, nil, AsError("Prepare", err)
	}
	return consume("Prepare", stream, onProgress)
}

// Compact folds history into a summary checkpoint now, even below the trigger (no prune); see
// [Focus], [KeepTokens] and [DryRun]. View.NotFoldedReason says why nothing was folded; a fold that
// fails is an error (ReasonCompactFailed). The client's held view becomes the returned one.
func (s *Session) Compact(ctx context.Context, opts ...CompactOption) (*View, error) {
	var cs compactSettings
	for _, opt := range opts {
		opt.applyCompact(&cs)
	}
	return s.compact(ctx, &cs, cs.progressSettings.deliver(ctx))
}

// CompactEvents is Compact as a stream, like [Session.PrepareEvents].
func (s *Session) CompactEvents(ctx context.Context, opts ...CompactOption) iter.Seq2[Event, error] {
	var cs compactSettings
	for _, opt := range opts {
		opt.applyCompact(&cs)
	}
	return events(ctx, func(ctx context.Context, onProgress func(FoldProgress) error) (*View, error) {
		return s.compact(ctx, &cs, onProgress)
	})
}

func (s *Session) compact(ctx context.Context, cs *compactSettings, onProgress func(FoldProgress) error) (*View, error) {
	if cs.keepTokens < 0 {
		return nil, withOp("Compact", invalidArgument(ReasonInvalidRequest, "keep_tokens", "keep_tokens must be >= 0, got %d", cs.keepTokens))
	}
	if err := requireSessionID("Compact", s.id); err != nil {
		return nil, err
	}
	ctx, cancel := s.client.streamContext(ctx)
	defer cancel()
	stream, err := s.client.raw.Compact(ctx, &ctxfoldv1.CompactRequest{
		SessionId: s.id, Focus: cs.focus, KeepTokens: cs.keepTokens, DryRun: cs.dryRun,
	})
	if err != nil {
		return nil, AsError("Compact", err)
	}
	result, progress, err := consume("Compact", stream, onProgress)
	if err != nil {
		return nil, err
	}
	if result.GetDelta() || int64(len(result.GetMessages())) != result.GetViewMessageCount() { // Compact sends no known view
		return nil, sdkError("Compact", codes.Internal, ReasonProtocolViolation,
			"the whole view has %d messages (delta %v), the server counts %d", len(result.GetMessages()), result.GetDelta(), result.GetViewMessageCount())
	}
	view := newView(result, messagesFromProto(result.GetMessages()), progress)
	if !cs.dryRun {
		s.client.views.put(s.id, view)
	}
	return view, nil
}

// applyDelta returns base + the delta messages when they make the whole view the server counts.
func applyDelta(base []Message, result *ctxfoldv1.PreparedContext) ([]Message, bool) {
	tail := result.GetMessages()
	if len(base) == 0 || int64(len(base)+len(tail)) != result.GetViewMessageCount() {
		return nil, false
	}
	full := make([]Message, 0, len(base)+len(tail))
	return append(append(full, base...), messagesFromProto(tail)...), true
}

// deliver returns the progress hook of Prepare and Compact for the callback and channel options.
func (ps progressSettings) deliver(ctx context.Context) func(FoldProgress) error {
	return func(p FoldProgress) error {
		if ps.callback != nil {
			ps.callback(p)
		}
		if ps.channel != nil {
			select {
			case ps.channel <- p:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
}

// errStopped ends a stream whose consumer stopped iterating.
var errStopped = errors.New("ctxfold: iteration stopped")

// events turns a call with a progress hook into an iterator of progress events and the view.
func events(ctx context.Context, call func(context.Context, func(FoldProgress) error) (*View, error)) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		view, err := call(ctx, func(p FoldProgress) error {
			if !yield(Event{Progress: &p}, nil) {
				return errStopped
			}
			return nil
		})
		switch {
		case errors.Is(err, errStopped):
		case err != nil:
			yield(Event{}, err)
		default:
			yield(Event{View: view}, nil)
		}
	}
}

type foldEvent interface {
	GetProgress() *ctxfoldv1.FoldProgress
	GetResult() *ctxfoldv1.PreparedContext
}

// consume reads a Prepare or Compact stream: progress events, then exactly one result.
func consume[E any, P interface {
	*E
	foldEvent
}](op string, stream grpc.ServerStreamingClient[E], onProgress func(FoldProgress) error) (*ctxfoldv1.PreparedContext, []FoldProgress, error) {
	var (
		result   *ctxfoldv1.PreparedContext
		progress []FoldProgress
	)
	for {
		received, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, progress, AsError(op, err)
		}
		if result != nil {
			return nil, progress, sdkError(op, codes.Internal, ReasonProtocolViolation, "the stream went on after its result")
		}
		event := P(received)
		if raw := event.GetProgress(); raw != nil {
			p := progressFromProto(raw)
			progress = append(progress, p)
			if err := onProgress(p); err != nil {
				if errors.Is(err, errStopped) {
					return nil, progress, err
				}
				return nil, progress, AsError(op, err)
			}
		}
		result = event.GetResult()
	}
	if result == nil {
		return nil, progress, sdkError(op, codes.Unavailable, ReasonStreamEndedWithoutResult, "the stream ended without a result")
	}
	return result, progress, nil
}

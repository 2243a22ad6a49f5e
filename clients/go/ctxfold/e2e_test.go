package ctxfold_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
	"github.com/ctxfold/ctxfold/clients/go/internal/testserver"
)

func dial(t *testing.T, addr string, opts ...ctxfold.Option) *ctxfold.Client {
	t.Helper()
	opts = append([]ctxfold.Option{ctxfold.WithDefaultTimeout(30 * time.Second), ctxfold.WithStreamTimeout(60 * time.Second)}, opts...)
	client, err := ctxfold.New(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

func newSession(t *testing.T, client *ctxfold.Client, window int64, opts ...ctxfold.ConfigOption) *ctxfold.Session {
	t.Helper()
	cfg, err := ctxfold.NewSessionConfig(window, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := client.CreateSession(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// errOf drops the value of a (value, error) result.
func errOf(_ any, err error) error { return err }

// mustErr returns err as a *ctxfold.Error, failing the test when it is nil or another type.
func mustErr(t *testing.T, err error) *ctxfold.Error {
	t.Helper()
	if err == nil {
		t.Fatal("call succeeded, want an error")
	}
	var e *ctxfold.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %T %v is not a *ctxfold.Error", err, err)
	}
	return e
}

// listing returns n bytes or so of varied fake `ls -l` lines.
func listing(seed, size int) string {
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "-rw-r--r-- 1 dev dev %6d Nov %2d src/pkg%d/file_%d_%d.go\n", (seed*7919+i*104729)%90000, i%28+1, seed, i, (i*seed)%97)
	}
	return b.String()
}

func liveMessages(t *testing.T, s *ctxfold.Session, opts ...ctxfold.ListOption) []ctxfold.Message {
	t.Helper()
	var out []ctxfold.Message
	for m, err := range s.Messages(context.Background(), opts...) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestE2E runs the SDK against one real server.
func TestE2E(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	client := dial(t, srv.Addr)
	ctx := context.Background()

	t.Run("SessionLifecycle", func(t *testing.T) {
		s := newSession(t, client, 8000, ctxfold.MaxOutputTokens(256), ctxfold.SystemPrompt("be brief"), ctxfold.Model("m1"))
		info := s.Info()
		if info.ID == "" || info.HeadSeq != 0 {
			t.Fatalf("new session %v", info)
		}
		if cfg := info.Config; cfg.CompactRatio != 0.8 || cfg.ToolContentMaxBytes != 32768 || cfg.Summarizer != "extractive" {
			t.Errorf("defaults not filled in: %v", cfg)
		}

		appended := must[[]ctxfold.Message](t)(s.Append(ctx,
			ctxfold.UserMessage("hello"), ctxfold.AssistantMessage("hi"), ctxfold.UserMessage("list files"),
			ctxfold.AssistantMessage("", ctxfold.NewToolCall("c1", "ls", `{}`)), ctxfold.ToolResultMessage("c1", "a.go\nb.go\n"),
		))
		if len(appended) != 5 || appended[0].Seq != 1 || appended[4].Seq != 5 || appended[4].ResultRef == "" {
			t.Fatalf("appended %v", appended)
		}

		got := must[*ctxfold.SessionInfo](t)(s.Refresh(ctx))
		if got.HeadSeq != 5 {
			t.Errorf("head seq %d, want 5", got.HeadSeq)
		}
		reopened := must[*ctxfold.Session](t)(client.GetSession(ctx, s.ID()))
		if reopened.Info().Config.Model != "m1" {
			t.Errorf("GetSession config %v", reopened.Info().Config)
		}

		// Pages of 2 through 5 messages.
		msgs := liveMessages(t, s, ctxfold.PageSize(2))
		if len(msgs) != 5 {
			t.Fatalf("listed %d messages, want 5", len(msgs))
		}
		for i, m := range msgs {
			if m.Seq != int64(i+1) || m.ID != appended[i].ID {
				t.Errorf("message %d: seq %d id %s", i, m.Seq, m.ID)
			}
		}
		// Stopping early fetches nothing more and yields no error.
		n := 0
		for _, err := range s.Messages(ctx, ctxfold.PageSize(1)) {
			if err != nil {
				t.Fatal(err)
			}
			n++
			if n == 2 {
				break
			}
		}

		prepared := must[*ctxfold.View](t)(s.Prepare(ctx))
		if prepared.Action != ctxfoldv1.Action_ACTION_NONE || len(prepared.Messages) != 6 || prepared.Messages[0].Role != ctxfoldv1.Role_ROLE_SYSTEM {
			t.Errorf("prepare: action %s, %d messages", prepared.Action, len(prepared.Messages))
		}
		usage := must[*ctxfold.UsageResult](t)(s.ObserveUsage(ctx, 0, ctxfold.Usage{ // 0: the held view
			InputTokens: prepared.EstimatedInputTokens, OutputTokens: 12, FinishReason: "stop",
		}))
		if usage.Calibration <= 0 {
			t.Errorf("calibration %v", usage.Calibration)
		}

		state := must[*ctxfold.ContextState](t)(s.ContextState(ctx))
		if state.SchemaVersion != 3 || len(state.Views) == 0 || state.Views[len(state.Views)-1].Version != prepared.ViewVersion {
			t.Errorf("context state %+v", state)
		}

		// Fork at seq 3 with an override; the fork outlives its source.
		fork := must[*ctxfold.Session](t)(s.Fork(ctx, ctxfold.ForkAtSeq(3), ctxfold.Model("m2")))
		if fi := fork.Info(); fi.HeadSeq != 3 || fi.ForkedFromSessionID != s.ID() || fi.Config.Model != "m2" || fi.Config.SystemPrompt != "be brief" {
			t.Errorf("fork %v", fi)
		}

		found := false
		for info, err := range client.Sessions(ctx, ctxfold.PageSize(1)) {
			if err != nil {
				t.Fatal(err)
			}
			found = found || info.ID == s.ID()
		}
		if !found {
			t.Errorf("session %s not listed", s.ID())
		}

		if err := s.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		e := mustErr(t, errOf(s.Refresh(ctx)))
		if e.Reason != ctxfold.ReasonSessionNotFound {
			t.Errorf("after delete: %v", e)
		}
		if got := liveMessages(t, fork); len(got) != 3 || got[2].Content != "list files" {
			t.Errorf("fork after source delete has %d messages", len(got))
		}
	})

	t.Run("ErrorMapping", func(t *testing.T) {
		_, err := client.OpenSession("s_does_not_exist").Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("x")))
		var e *ctxfold.Error
		if !errors.As(err, &e) {
			t.Fatalf("error %T %v is not a *ctxfold.Error", err, err)
		}
		if e.Code != codes.NotFound || e.Reason != ctxfold.ReasonSessionNotFound || e.Domain != ctxfold.ErrorDomain || e.Op != "Prepare" {
			t.Errorf("mapped error %+v", e)
		}
		if e.Metadata["session_id"] != "s_does_not_exist" {
			t.Errorf("metadata %v", e.Metadata)
		}
		if status.Code(err) != codes.NotFound || !ctxfold.HasReason(err, ctxfold.ReasonSessionNotFound) {
			t.Errorf("status.Code / HasReason do not see the error")
		}
		if !errors.Is(fmt.Errorf("wrapped: %w", err), &ctxfold.Error{Reason: ctxfold.ReasonSessionNotFound}) {
			t.Errorf("errors.Is with a reason sentinel failed")
		}

		// A config only the server can judge (the output does not fit below the trigger) answers
		// INVALID_ARGUMENT / INVALID_CONFIG from the server; one out of range never leaves the SDK.
		cfg := must[*ctxfold.SessionConfig](t)(ctxfold.NewSessionConfig(4000, ctxfold.MaxOutputTokens(3900)))
		ce := mustErr(t, errOf(client.CreateSession(ctx, cfg)))
		if ce.Code != codes.InvalidArgument || ce.Reason != ctxfold.ReasonInvalidConfig || ce.Domain != ctxfold.ErrorDomain {
			t.Errorf("bad config: %v", ce)
		}
		_, err = ctxfold.NewSessionConfig(4000, ctxfold.CompactRatio(2))
		if local := mustErr(t, err); local.Reason != ctxfold.ReasonInvalidConfig || local.Domain != ctxfold.ClientErrorDomain {
			t.Errorf("out of range: %v", local)
		}

		// Nothing but tool results may follow a pending tool call.
		s := newSession(t, client, 8000)
		must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.UserMessage("go"), ctxfold.AssistantMessage("", ctxfold.NewToolCall("c1", "ls", "{}"))))
		pe := mustErr(t, errOf(s.Append(ctx, ctxfold.UserMessage("too early"))))
		if pe.Reason != ctxfold.ReasonToolResultsPending || pe.Code != codes.FailedPrecondition {
			t.Errorf("pending tool results: %v", pe)
		}
	})

	t.Run("DeltaHandling", func(t *testing.T) {
		s := newSession(t, client, 100000, ctxfold.SystemPrompt("sys"))
		first := must[*ctxfold.View](t)(s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("u1"))))
		if first.Delta || len(first.Messages) != 2 {
			t.Fatalf("first prepare: delta %v, %d messages", first.Delta, len(first.Messages))
		}
		var last *ctxfold.View
		for i := 1; i <= 3; i++ {
			must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.AssistantMessage(fmt.Sprintf("a%d", i))))
			last = must[*ctxfold.View](t)(s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage(fmt.Sprintf("u%d", i+1)))))
			if !last.Delta || len(last.Messages) != 2+2*i {
				t.Fatalf("prepare %d: delta %v, view %d", i, last.Delta, len(last.Messages))
			}
			if len(last.Appended) != 1 || last.Appended[0].Content != fmt.Sprintf("u%d", i+1) {
				t.Errorf("appended %v", last.Appended)
			}
		}
		// The assembled view equals the whole view a client holding no view gets.
		full := must[*ctxfold.View](t)(dial(t, srv.Addr).OpenSession(s.ID()).Prepare(ctx))
		if full.Delta || !sameView(full.Messages, last.Messages) {
			t.Fatalf("assembled view differs from the whole view:\n%v\n%v", contents(last.Messages), contents(full.Messages))
		}
		if view, version := s.HeldView(); version != last.ViewVersion || len(view) != 8 {
			t.Errorf("held view version %d (want %d), %d messages", version, last.ViewVersion, len(view))
		}

		// Another client rewinds and rewrites the tail behind this client's back: the next prepare
		// must still give the right whole view (the server refuses the stale base).
		other := dial(t, srv.Addr).OpenSession(s.ID())
		must[*ctxfold.SessionInfo](t)(other.Rewind(ctx, 2))
		must[[]ctxfold.Message](t)(other.Append(ctx, ctxfold.UserMessage("u2-new"), ctxfold.AssistantMessage("a2-new"), ctxfold.UserMessage("u3-new"), ctxfold.AssistantMessage("a3-new")))
		after := must[*ctxfold.View](t)(s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("u4-new"))))
		want := []string{"sys", "u1", "a1", "u2-new", "a2-new", "u3-new", "a3-new", "u4-new"}
		if got := contents(after.Messages); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("view after a foreign rewind = %v, want %v", got, want)
		}

		// Without a held view (forgotten), the next prepare is whole.
		s.ForgetView()
		again := must[*ctxfold.View](t)(s.Prepare(ctx))
		if again.Delta || len(again.Messages) != 8 {
			t.Errorf("after ForgetView: delta %v, %d messages", again.Delta, len(again.Messages))
		}
	})

	t.Run("CompactWithProgressChannel", func(t *testing.T) {
		// Below the trigger (0.8 × 8000), so only the manual Compact folds.
		s := newSession(t, client, 8000, ctxfold.SystemPrompt("sys"))
		must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.UserMessage("inspect the repo")))
		for i := 1; i <= 6; i++ {
			call := fmt.Sprintf("c%d", i)
			must[[]ctxfold.Message](t)(s.Append(ctx,
				ctxfold.AssistantMessage("", ctxfold.NewToolCall(call, "ls", fmt.Sprintf(`{"dir":"pkg%d"}`, i))),
				ctxfold.ToolResultMessage(call, listing(i, 1500))))
		}
		before := must[*ctxfold.View](t)(s.Prepare(ctx))
		if before.Action != ctxfoldv1.Action_ACTION_NONE {
			t.Fatalf("prepare below the trigger did %s", before.Action)
		}
		ch := make(chan ctxfold.FoldProgress)
		received := make(chan []ctxfold.FoldProgress)
		go func() {
			var got []ctxfold.FoldProgress
			for p := range ch {
				got = append(got, p)
			}
			received <- got
		}()
		compacted, err := s.Compact(ctx, ctxfold.Focus("keep the file names"), ctxfold.WithProgressChan(ch))
		close(ch)
		events := <-received
		if err != nil {
			t.Fatal(err)
		}
		if !compacted.Folded() || compacted.Summary() == nil || compacted.CheckpointID == "" {
			t.Fatalf("compact: action %s, checkpoint %q", compacted.Action, compacted.CheckpointID)
		}
		if compacted.EstimatedTokens >= before.EstimatedTokens {
			t.Errorf("compact did not shrink the view: %d -> %d", before.EstimatedTokens, compacted.EstimatedTokens)
		}
		if len(events) == 0 || len(events) != len(compacted.Progress) || events[len(events)-1].Stage != ctxfoldv1.FoldStage_FOLD_STAGE_PASS_COMMITTED {
			t.Errorf("progress over the channel: %d events (%d collected)", len(events), len(compacted.Progress))
		}
		// The held view is the compacted one: the next prepare is a delta on top of it.
		next := must[*ctxfold.View](t)(s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("thanks"))))
		if !next.Delta || len(next.Messages) != len(compacted.Messages)+1 || next.Summary() == nil {
			t.Errorf("prepare after compact: delta %v, %d messages", next.Delta, len(next.Messages))
		}
	})

	t.Run("ReadToolResultRoundTrip", func(t *testing.T) {
		s := newSession(t, client, 200000)
		var b strings.Builder
		for i := 0; b.Len() < 80*1024; i++ {
			fmt.Fprintf(&b, "%05d héllo wörld — 日本語のテキスト 🚀🧪 Ελληνικά ✓\n", i)
		}
		raw := b.String()
		sum := sha256.Sum256([]byte(raw))
		must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.UserMessage("dump"), ctxfold.AssistantMessage("", ctxfold.NewToolCall("big", "dump", "{}"))))
		stored := must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.ToolResultMessage("big", raw)))[0]
		if !stored.Truncated || stored.RawBytes != int64(len(raw)) || stored.ResultRef == "" {
			t.Fatalf("stored tool result: truncated %v, raw bytes %d (want %d), ref %q", stored.Truncated, stored.RawBytes, len(raw), stored.ResultRef)
		}
		if len(stored.Content) > 32768 || !strings.Contains(stored.Content, stored.ResultRef) || !utf8.ValidString(stored.Content) {
			t.Errorf("bounded content: %d bytes, names ref %v", len(stored.Content), strings.Contains(stored.Content, stored.ResultRef))
		}

		whole := must[*ctxfold.ToolResult](t)(s.ReadToolResult(ctx, stored.ResultRef, ctxfold.PageBytes(5000)))
		if whole.Text != raw || whole.SHA256 != hex.EncodeToString(sum[:]) || whole.TotalBytes != int64(len(raw)) {
			t.Fatalf("round trip: %d bytes (want %d), sha %s", len(whole.Text), len(raw), whole.SHA256)
		}
		byCall := must[*ctxfold.ToolResult](t)(s.ReadToolResultByCallID(ctx, "big"))
		if byCall.Text != raw || byCall.ResultRef != stored.ResultRef {
			t.Errorf("by call id: %d bytes, ref %s", len(byCall.Text), byCall.ResultRef)
		}
		pages := 0
		for page, err := range s.ToolResultPages(ctx, stored.ResultRef) {
			if err != nil {
				t.Fatal(err)
			}
			if !utf8.ValidString(page.Data) {
				t.Errorf("page at %d is not whole UTF-8", page.Offset)
			}
			pages++
		}
		if pages < 4 {
			t.Errorf("%d default-size pages", pages)
		}
		// An offset inside a multi-byte character is refused with its reason.
		mid := strings.Index(raw, "é") + 1
		var e *ctxfold.Error
		for _, err := range s.ToolResultPages(ctx, stored.ResultRef, ctxfold.FromOffset(int64(mid))) {
			e = mustErr(t, err)
		}
		if e.Reason != ctxfold.ReasonOffsetNotCharBoundary {
			t.Errorf("mid-character offset: %v", e)
		}
	})

	t.Run("ToolDispatcher", func(t *testing.T) {
		s := newSession(t, client, 64000)
		raw := strings.Repeat("0123456789abcdef", 2500) // 40000 bytes
		must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.UserMessage("dump"), ctxfold.AssistantMessage("", ctxfold.NewToolCall("big", "dump", "{}"))))
		ref := must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.ToolResultMessage("big", raw)))[0].ResultRef
		dispatch := func(name, arguments string) string {
			t.Helper()
			content, handled, err := s.DispatchToolCall(ctx, name, arguments)
			if err != nil || !handled {
				t.Fatalf("%s(%s): handled %v, %v", name, arguments, handled, err)
			}
			return content
		}

		if got := dispatch(ctxfold.ToolContextBudget, ""); !strings.HasPrefix(got, "error: no context prepared") {
			t.Errorf("budget before any prepare: %q", got)
		}
		view := must[*ctxfold.View](t)(s.Prepare(ctx))
		var budget map[string]int64
		if err := json.Unmarshal([]byte(dispatch(ctxfold.ToolContextBudget, "{}")), &budget); err != nil ||
			budget["estimated_tokens"] != view.EstimatedTokens || budget["trigger_tokens"] != view.TriggerTokens {
			t.Errorf("budget %v (%v), view %d / %d", budget, err, view.EstimatedTokens, view.TriggerTokens)
		}

		// The model pages through the result by following the footers.
		var text strings.Builder
		footer := regexp.MustCompile(`\n\n\[read_tool_result: bytes \d+-(\d+) of 40000; call read_tool_result with result_ref "([^"]+)" and offset (\d+) for more\]$`)
		offset, calls := "0", 0
		for {
			calls++
			answer := dispatch(ctxfold.ToolReadToolResult, fmt.Sprintf(`{"result_ref": %q, "offset": %s}`, ref, offset))
			m := footer.FindStringSubmatch(answer)
			if m == nil {
				text.WriteString(answer)
				break
			}
			if m[2] != ref || m[1] != m[3] {
				t.Fatalf("footer %q", m[0])
			}
			text.WriteString(strings.TrimSuffix(answer, m[0]))
			offset = m[3]
		}
		if text.String() != raw || calls != 3 {
			t.Errorf("paged %d bytes in %d calls, want 40000 in 3", text.Len(), calls)
		}

		mistakes := map[string]string{
			`{"result_ref": "r_unknown"}`:                           "RESULT_REF_NOT_FOUND",
			fmt.Sprintf(`{"result_ref": %q, "offset": 99999}`, ref): "OFFSET_OUT_OF_RANGE",
			fmt.Sprintf(`{"result_ref": %q, "offset": -1}`, ref):    `"offset" must be a non-negative integer`,
			fmt.Sprintf(`{"result_ref": %q, "offset": 1.5}`, ref):   `"offset" must be a non-negative integer`,
			`{"offset": 0}`:   `"result_ref" (a string from the context) is required`,
			`{"result_ref": `: "not JSON",
			`["r_1"]`:         "expected a JSON object",
		}
		for arguments, want := range mistakes {
			if got := dispatch(ctxfold.ToolReadToolResult, arguments); !strings.HasPrefix(got, "error: ") || !strings.Contains(got, want) {
				t.Errorf("arguments %s: answer %q, want an error naming %s", arguments, got, want)
			}
		}
		if _, handled, err := s.DispatchToolCall(ctx, "list_files", "{}"); handled || err != nil {
			t.Errorf("another tool: handled %v, %v", handled, err)
		}
		// A failure that is not the model's is an error, not an answer.
		gone := client.OpenSession("s_does_not_exist")
		if _, _, err := gone.DispatchToolCall(ctx, ctxfold.ToolReadToolResult, `{"result_ref": "r_1"}`); !ctxfold.HasReason(err, ctxfold.ReasonSessionNotFound) {
			t.Errorf("unknown session: %v", err)
		}
		if tail := dispatch(ctxfold.ToolReadToolResult, fmt.Sprintf(`{"result_ref": %q, "offset": 39990}`, ref)); tail != raw[39990:] {
			t.Errorf("the last page %q", tail)
		}
	})

	t.Run("EditAndRetry", func(t *testing.T) {
		s := newSession(t, client, 100000, ctxfold.SystemPrompt("sys"))
		must[*ctxfold.View](t)(s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("question one"))))
		must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.AssistantMessage("answer one")))
		must[*ctxfold.View](t)(s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("question two"))))
		bad := must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.AssistantMessage("a bad answer")))[0]

		// Retry: drop the bad answer (seq 4) and prepare the same request again.
		retried := must[*ctxfold.View](t)(s.Retry(ctx, bad.Seq))
		if got := contents(retried.Messages); strings.Join(got, "|") != "sys|question one|answer one|question two" {
			t.Fatalf("retry view %v", got)
		}
		good := must[[]ctxfold.Message](t)(s.Append(ctx, ctxfold.AssistantMessage("a good answer")))[0]
		if good.Seq != bad.Seq {
			t.Errorf("new answer seq %d, want %d", good.Seq, bad.Seq)
		}

		// Edit: replace question two (seq 3).
		edited := must[*ctxfold.Message](t)(s.Edit(ctx, 3, ctxfold.UserMessage("question two, rephrased")))
		if edited.Seq != 3 || edited.ID == "" || edited.Content != "question two, rephrased" {
			t.Errorf("edit returned %v", edited)
		}
		view := must[*ctxfold.View](t)(s.Prepare(ctx))
		if got := contents(view.Messages); strings.Join(got, "|") != "sys|question one|answer one|question two, rephrased" {
			t.Fatalf("view after edit %v", got)
		}
		if info := must[*ctxfold.SessionInfo](t)(s.Refresh(ctx)); info.HeadSeq != 3 {
			t.Errorf("head seq after edit %d", info.HeadSeq)
		}

		// Abandoned messages stay listable.
		var abandoned []string
		for _, m := range liveMessages(t, s, ctxfold.IncludeAbandoned()) {
			if m.Abandoned {
				abandoned = append(abandoned, m.Content)
			}
		}
		want := "question two|a bad answer|a good answer"
		if got := strings.Join(sortedCopy(abandoned), "|"); got != strings.Join(sortedCopy(strings.Split(want, "|")), "|") {
			t.Errorf("abandoned = %v, want %s", abandoned, want)
		}
		if live := liveMessages(t, s); len(live) != 3 {
			t.Errorf("%d live messages, want 3", len(live))
		}
	})

	t.Run("ExplicitTraceparentAccepted", func(t *testing.T) {
		// The server honours W3C trace context; a call carrying one (explicit or from a span) works.
		tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
		sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
		spanCtx := trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
		s := newSession(t, client, 8000)
		must[*ctxfold.View](t)(s.Prepare(spanCtx, ctxfold.WithAppend(ctxfold.UserMessage("traced"))))
		must[*ctxfold.SessionInfo](t)(s.Refresh(ctxfold.ContextWithTraceparent(ctx, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "")))
	})
}

// TestBearerTokenAuth runs against a server with an auth tokens file: two tenants.
func TestBearerTokenAuth(t *testing.T) {
	const tokenA, tokenB = "token-tenant-a-0123456789", "token-tenant-b-0123456789"
	srv := testserver.Start(t, testserver.Options{Tokens: map[string]string{tokenA: "tenant-a", tokenB: "tenant-b"}})
	ctx := context.Background()

	anonymous := dial(t, srv.Addr)
	cfg := must[*ctxfold.SessionConfig](t)(ctxfold.NewSessionConfig(8000))
	e := mustErr(t, errOf(anonymous.CreateSession(ctx, cfg)))
	if e.Code != codes.Unauthenticated || e.Reason != ctxfold.ReasonUnauthenticated {
		t.Errorf("without a token: %v", e)
	}
	wrong := dial(t, srv.Addr, ctxfold.WithBearerToken("not-a-valid-token-at-all"))
	if e := mustErr(t, errOf(wrong.CreateSession(ctx, cfg))); e.Code != codes.Unauthenticated {
		t.Errorf("with a wrong token: %v", e)
	}

	a := dial(t, srv.Addr, ctxfold.WithBearerToken(tokenA))
	b := dial(t, srv.Addr, ctxfold.WithBearerToken(tokenB))
	sa := must[*ctxfold.Session](t)(a.CreateSession(ctx, cfg))
	prepared := must[*ctxfold.View](t)(sa.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("secret of tenant a"))))
	if len(prepared.Messages) != 1 {
		t.Errorf("prepared %d messages", len(prepared.Messages))
	}
	// Tenant b sees nothing of tenant a.
	if e := mustErr(t, errOf(b.GetSession(ctx, sa.ID()))); e.Reason != ctxfold.ReasonSessionNotFound {
		t.Errorf("other tenant's session: %v", e)
	}
	for info, err := range b.Sessions(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if info.ID == sa.ID() {
			t.Errorf("tenant b lists tenant a's session")
		}
	}
}

// TestMutualTLS runs against a server that requires client certificates.
func TestMutualTLS(t *testing.T) {
	files := testserver.GenerateTLS(t)
	srv := testserver.Start(t, testserver.Options{TLSCert: files.ServerCert, TLSKey: files.ServerKey, TLSClientCA: files.CA})
	ctx := context.Background()
	cfg := must[*ctxfold.SessionConfig](t)(ctxfold.NewSessionConfig(8000))

	client := dial(t, srv.Addr, ctxfold.WithTLSFiles(files.CA, files.ClientCert, files.ClientKey))
	s := must[*ctxfold.Session](t)(client.CreateSession(ctx, cfg))
	must[*ctxfold.View](t)(s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("over mTLS"))))

	noCert := dial(t, srv.Addr, ctxfold.WithTLSFiles(files.CA, "", ""), ctxfold.WithDefaultTimeout(10*time.Second))
	if e := mustErr(t, errOf(noCert.CreateSession(ctx, cfg))); e.Code != codes.Unavailable {
		t.Errorf("without a client certificate: %v", e)
	}
	plain := dial(t, srv.Addr, ctxfold.WithDefaultTimeout(10*time.Second))
	if _, err := plain.CreateSession(ctx, cfg); err == nil {
		t.Errorf("plaintext call to a TLS server succeeded")
	}
}

func contents(msgs []ctxfold.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Content
	}
	return out
}

func sameView(a, b []ctxfold.Message) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i].Proto(), b[i].Proto()) {
			return false
		}
	}
	return true
}

func sortedCopy(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return out
}

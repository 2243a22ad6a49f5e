package ctxfold_test

// What the SDK decides without the server: argument checks (clients/README.md, "Argument
// checks"), context errors, snapshots, the Chat message JSON shape.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/ctxfold/openaichat"
	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

// refused fails unless err is the SDK's own INVALID_ARGUMENT error with this reason.
func refused(t *testing.T, what string, err error, reason ctxfold.ErrorReason) {
	t.Helper()
	var e *ctxfold.Error
	if !errors.As(err, &e) || e.Code != codes.InvalidArgument || e.Reason != reason || e.Domain != ctxfold.ClientErrorDomain {
		t.Errorf("%s: %v, want INVALID_ARGUMENT %s in %s", what, err, reason, ctxfold.ClientErrorDomain)
	}
}

func firstErr[T any](items iter.Seq2[T, error]) error {
	for _, err := range items {
		return err
	}
	return nil
}

func TestConfigRangesAreCheckedAsTheServerChecksThem(t *testing.T) {
	for name, opts := range map[string][]ctxfold.ConfigOption{
		"context_window":         {ctxfold.ContextWindow(-5)},
		"compact_ratio":          {ctxfold.CompactRatio(0.99)},
		"tail_ratio":             {ctxfold.TailRatio(0.6)},
		"prefold_ratio":          {ctxfold.PrefoldRatio(0.05)},
		"max_output_tokens":      {ctxfold.MaxOutputTokens(-1)},
		"summary_max_tokens":     {ctxfold.SummaryMaxTokens(-1)},
		"cache_ttl_seconds":      {ctxfold.CacheTTL(-time.Second)},
		"tool_content_max_bytes": {ctxfold.ToolContentMaxBytes(100)},
		"tools_json":             {ctxfold.ToolsJSON("[not json")},
	} {
		_, err := ctxfold.NewSessionConfig(8000, opts...)
		refused(t, name, err, ctxfold.ReasonInvalidConfig)
		var e *ctxfold.Error
		if errors.As(err, &e) && e.Metadata["field"] != name {
			t.Errorf("%s: field %q", name, e.Metadata["field"])
		}
	}
	_, err := ctxfold.NewSessionConfig(-5)
	refused(t, "NewSessionConfig(-5)", err, ctxfold.ReasonInvalidConfig)
	if _, err := ctxfold.NewSessionConfig(1, ctxfold.CompactRatio(0.95), ctxfold.TailRatio(0.5), ctxfold.ToolContentMaxBytes(4096)); err != nil {
		t.Errorf("the ends of the ranges: %v", err)
	}
}

func TestPrefoldRatioZeroIsSentAndUnsetIsNot(t *testing.T) {
	off, err := ctxfold.NewSessionConfig(8000, ctxfold.PrefoldRatio(0))
	if err != nil {
		t.Fatal(err)
	}
	if p := off.Proto().PrefoldRatio; p == nil || *p != 0 {
		t.Errorf("PrefoldRatio(0) sent as %v, want an explicit 0 (off)", p)
	}
	unset, _ := ctxfold.NewSessionConfig(8000)
	if unset.Proto().PrefoldRatio != nil {
		t.Errorf("an unset PrefoldRatio was sent")
	}
	if back := ctxfold.SessionConfigFromProto(off.Proto()); back.PrefoldRatio == nil || *back.PrefoldRatio != 0 {
		t.Errorf("round trip lost the explicit 0: %v", back.PrefoldRatio)
	}
	for _, ratio := range []float64{-0.1, 0.0999, 1, math.NaN()} {
		_, err := ctxfold.NewSessionConfig(8000, ctxfold.PrefoldRatio(ratio))
		refused(t, fmt.Sprintf("PrefoldRatio(%v)", ratio), err, ctxfold.ReasonInvalidConfig)
	}
	if _, err := ctxfold.NewSessionConfig(8000, ctxfold.PrefoldRatio(0.10)); err != nil {
		t.Errorf("PrefoldRatio(0.10), the low end: %v", err)
	}
}

func TestRequestArgumentsAreRefusedBeforeAnyCall(t *testing.T) {
	f := &fakeServer{prepare: func(*ctxfoldv1.PrepareRequest, func(*ctxfoldv1.PrepareResponse) error) error {
		t.Error("a refused Prepare reached the server")
		return nil
	}}
	client := startFake(t, f)
	ctx := context.Background()
	s := client.OpenSession("s1")

	_, err := client.OpenSession("").Prepare(ctx)
	refused(t, "an empty session id", err, ctxfold.ReasonSessionIdRequired)
	refused(t, "PageSize(1001)", firstErr(client.Sessions(ctx, ctxfold.PageSize(1001))), ctxfold.ReasonInvalidPageSize)
	refused(t, "PageSize(-1)", firstErr(s.Messages(ctx, ctxfold.PageSize(-1))), ctxfold.ReasonInvalidPageSize)
	refused(t, "checkpoints PageSize(101)", firstErr(s.Checkpoints(ctx, ctxfold.PageSize(101))), ctxfold.ReasonInvalidPageSize)
	_, err = s.ReadToolResult(ctx, "")
	refused(t, "no result named", err, ctxfold.ReasonResultRefRequired)
	_, err = s.ReadToolResult(ctx, "tr_1", ctxfold.PageBytes(3))
	refused(t, "PageBytes(3)", err, ctxfold.ReasonLimitOutOfRange)
	refused(t, "FromOffset(-1)", firstErr(s.ToolResultPages(ctx, "tr_1", ctxfold.FromOffset(-1))), ctxfold.ReasonOffsetOutOfRange)
	_, err = s.Fork(ctx, ctxfold.ForkAtSeq(0)) // never the head by accident
	refused(t, "ForkAtSeq(0)", err, ctxfold.ReasonSeqOutOfRange)
	_, err = s.Compact(ctx, ctxfold.KeepTokens(-1))
	refused(t, "KeepTokens(-1)", err, ctxfold.ReasonInvalidRequest)
	_, err = s.Rewind(ctx, -1)
	refused(t, "Rewind(-1)", err, ctxfold.ReasonSeqOutOfRange)
	_, err = s.Edit(ctx, 0, ctxfold.UserMessage("x"))
	refused(t, "Edit(0)", err, ctxfold.ReasonSeqOutOfRange)
	_, err = s.Retry(ctx, 0)
	refused(t, "Retry(0)", err, ctxfold.ReasonSeqOutOfRange)
	_, err = ctxfold.ToolDefinitions("openai_chat_v2")
	refused(t, "an unknown tool format", err, ctxfold.ReasonInvalidClientArgument)
	if len(f.reads) != 0 || f.listCalls != 0 {
		t.Errorf("refused calls reached the server: %d reads, %d lists", len(f.reads), f.listCalls)
	}
}

// Text that is not UTF-8 (a lone surrogate's bytes, a string cut inside a character) is refused
// before any call with the reason the server gives a NUL: gRPC would fail it as INTERNAL, unnamed.
func TestTextThatIsNotUTF8IsRefusedBeforeAnyCall(t *testing.T) {
	f := &fakeServer{prepare: func(*ctxfoldv1.PrepareRequest, func(*ctxfoldv1.PrepareResponse) error) error {
		t.Error("a refused Prepare reached the server")
		return nil
	}}
	client := startFake(t, f)
	ctx := context.Background()
	s := client.OpenSession("s1")
	surrogate, cut := "x\xed\xa0\x80y", string([]byte("😀")[:3])
	field := func(err error) string {
		var e *ctxfold.Error
		if errors.As(err, &e) {
			return e.Metadata["field"]
		}
		return ""
	}
	_, err := s.Append(ctx, ctxfold.UserMessage("fine"), ctxfold.UserMessage(surrogate))
	refused(t, "a lone surrogate in an appended message", err, ctxfold.ReasonInvalidText)
	if got := field(err); got != "messages[1].content" {
		t.Errorf("field %q, want messages[1].content", got)
	}
	call := ctxfold.AssistantMessage("", ctxfold.NewToolCall("c1", "bash", `{"cmd": "`+cut+`"}`))
	_, err = s.Prepare(ctx, ctxfold.WithAppend(call))
	refused(t, "a cut character in tool call arguments", err, ctxfold.ReasonInvalidText)
	if got := field(err); got != "append[0].tool_calls[0].arguments" {
		t.Errorf("field %q, want append[0].tool_calls[0].arguments", got)
	}
}

func TestClientOptionsAreChecked(t *testing.T) {
	for what, opts := range map[string][]ctxfold.Option{
		"a token with whitespace":     {ctxfold.WithBearerToken("two words")},
		"a negative deadline":         {ctxfold.WithDefaultTimeout(-time.Second)},
		"a negative view cache":       {ctxfold.WithViewCacheSessions(-1)},
		"a certificate without key":   {ctxfold.WithTLSFiles("", "cert.pem", "")},
		"a CA file that is not there": {ctxfold.WithTLSFiles("/nonexistent/ca.pem", "", "")},
	} {
		_, err := ctxfold.New("127.0.0.1:1", opts...)
		refused(t, what, err, ctxfold.ReasonInvalidClientArgument)
	}
	_, err := ctxfold.New("")
	refused(t, "no address", err, ctxfold.ReasonInvalidClientArgument)
}

// A deadline or a cancellation is a status (gRPC's), and matches the context's errors too.
func TestContextErrorsMatchTheirSentinels(t *testing.T) {
	s := startFake(t, &fakeServer{}).OpenSession("s1")
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err := s.Refresh(expired)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "DEADLINE_EXCEEDED") {
		t.Errorf("past deadline: %v", err)
	}
	canceled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	_, err = s.Refresh(canceled)
	if !errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "CANCELLED") {
		t.Errorf("canceled: %v", err)
	}
	if ctxfold.CodeName(codes.NotFound) != "NOT_FOUND" || ctxfold.CodeName(codes.Canceled) != "CANCELLED" {
		t.Errorf("code names %s %s", ctxfold.CodeName(codes.NotFound), ctxfold.CodeName(codes.Canceled))
	}
}

// What a call returned never changes: a handle's Info is the session when the handle was made.
func TestSessionInfoIsASnapshot(t *testing.T) {
	f := &fakeServer{}
	client := startFake(t, f)
	ctx := context.Background()
	s, err := client.GetSession(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	before := s.Info()
	before.HeadSeq = 99 // the caller's copy
	rewound, err := s.Rewind(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Info(); got.HeadSeq != 7 || rewound.HeadSeq != 2 {
		t.Errorf("after Rewind: handle head %d (want 7, as when it was made), Rewind's %d (want 2)", got.HeadSeq, rewound.HeadSeq)
	}
}

func TestChatMessagesReadNullAndPartsAsText(t *testing.T) {
	var recorded []openaichat.Message
	err := json.Unmarshal([]byte(`[
		{"role": "developer", "content": "Be brief."},
		{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]},
		{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
			"function": {"name": "f", "arguments": {"z": 1.0, "a": "<"}}}]}]`), &recorded)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := openaichat.FromMessages(recorded)
	if err != nil {
		t.Fatal(err)
	}
	if msgs[0].Role != ctxfold.RoleSystem || msgs[1].Content != "a\nb" || msgs[2].Content != "" ||
		msgs[2].ToolCalls[0].Arguments != `{"z":1,"a":"<"}` {
		t.Errorf("converted %+v", msgs)
	}
	written, _ := json.Marshal(recorded[2])
	if !strings.Contains(string(written), `"content":null`) {
		t.Errorf("a tool-only assistant message is written with null content: %s", written)
	}
	_, err = openaichat.FromMessages([]openaichat.Message{{Role: "function"}})
	var e *ctxfold.Error
	if !errors.As(err, &e) || e.Reason != ctxfold.ReasonInvalidMessage {
		t.Errorf("an unknown role: %v", err)
	}
}

package ctxfold_test

// Unit tests against an in-process fake server (no ctxfold server needed).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ctxfold/ctxfold/clients/go/ctxfold"
	"github.com/ctxfold/ctxfold/clients/go/ctxfoldv1"
)

type fakeServer struct {
	ctxfoldv1.UnimplementedContextServiceServer

	mu          sync.Mutex
	md          metadata.MD
	hadDeadline bool
	prepares    []*ctxfoldv1.PrepareRequest
	reads       []*ctxfoldv1.ReadToolResultRequest
	listCalls   int
	listToken   string
	appends     []*ctxfoldv1.AppendMessagesRequest

	getSession func() (*ctxfoldv1.GetSessionResponse, error)
	prepare    func(req *ctxfoldv1.PrepareRequest, send func(*ctxfoldv1.PrepareResponse) error) error
	read       func(req *ctxfoldv1.ReadToolResultRequest) (*ctxfoldv1.ReadToolResultResponse, error)
}

func (f *fakeServer) record(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.md, _ = metadata.FromIncomingContext(ctx)
	_, f.hadDeadline = ctx.Deadline()
}

func (f *fakeServer) GetSession(ctx context.Context, req *ctxfoldv1.GetSessionRequest) (*ctxfoldv1.GetSessionResponse, error) {
	f.record(ctx)
	if f.getSession != nil {
		return f.getSession()
	}
	return &ctxfoldv1.GetSessionResponse{Session: &ctxfoldv1.Session{Id: req.GetSessionId(), HeadSeq: 7}}, nil
}

func (f *fakeServer) Prepare(req *ctxfoldv1.PrepareRequest, stream grpc.ServerStreamingServer[ctxfoldv1.PrepareResponse]) error {
	f.record(stream.Context())
	f.mu.Lock()
	f.prepares = append(f.prepares, req)
	f.mu.Unlock()
	return f.prepare(req, stream.Send)
}

func (f *fakeServer) AppendMessages(_ context.Context, req *ctxfoldv1.AppendMessagesRequest) (*ctxfoldv1.AppendMessagesResponse, error) {
	f.mu.Lock()
	f.appends = append(f.appends, req)
	f.mu.Unlock()
	return &ctxfoldv1.AppendMessagesResponse{Messages: req.GetMessages()}, nil
}

func (f *fakeServer) Rewind(_ context.Context, req *ctxfoldv1.RewindRequest) (*ctxfoldv1.RewindResponse, error) {
	return &ctxfoldv1.RewindResponse{Session: &ctxfoldv1.Session{Id: req.GetSessionId(), HeadSeq: req.GetToSeq()}}, nil
}

func (f *fakeServer) ReadToolResult(_ context.Context, req *ctxfoldv1.ReadToolResultRequest) (*ctxfoldv1.ReadToolResultResponse, error) {
	f.mu.Lock()
	f.reads = append(f.reads, req)
	f.mu.Unlock()
	return f.read(req)
}

func (f *fakeServer) ListSessions(_ context.Context, req *ctxfoldv1.ListSessionsRequest) (*ctxfoldv1.ListSessionsResponse, error) {
	f.mu.Lock()
	f.listCalls++
	f.mu.Unlock()
	if f.listToken != "" { // a broken server: the same next token on every page
		return &ctxfoldv1.ListSessionsResponse{Sessions: []*ctxfoldv1.Session{{Id: "s"}}, NextPageToken: f.listToken}, nil
	}
	// Three pages: s1 s2 | s3 s4 | s5.
	pages := map[string]*ctxfoldv1.ListSessionsResponse{
		"":   {Sessions: []*ctxfoldv1.Session{{Id: "s1"}, {Id: "s2"}}, NextPageToken: "p2"},
		"p2": {Sessions: []*ctxfoldv1.Session{{Id: "s3"}, {Id: "s4"}}, NextPageToken: "p3"},
		"p3": {Sessions: []*ctxfoldv1.Session{{Id: "s5"}}},
	}
	page, ok := pages[req.GetPageToken()]
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "bad token")
	}
	return page, nil
}

func startFake(t *testing.T, f *fakeServer, opts ...ctxfold.Option) *ctxfold.Client {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	ctxfoldv1.RegisterContextServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })
	client, err := ctxfold.New("passthrough:///bufnet", append([]ctxfold.Option{ctxfold.WithDialOptions(dialer)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

func result(r *ctxfoldv1.PreparedContext) *ctxfoldv1.PrepareResponse {
	return &ctxfoldv1.PrepareResponse{Event: &ctxfoldv1.PrepareResponse_Result{Result: r}}
}

func progress(stage ctxfoldv1.FoldStage) *ctxfoldv1.PrepareResponse {
	return &ctxfoldv1.PrepareResponse{Event: &ctxfoldv1.PrepareResponse_Progress{Progress: &ctxfoldv1.FoldProgress{Stage: stage}}}
}

func msg(content string) *ctxfoldv1.Message {
	return &ctxfoldv1.Message{Role: ctxfoldv1.Role_ROLE_USER, Content: content}
}

func TestMetadataTokenTraceAndDeadline(t *testing.T) {
	f := &fakeServer{prepare: func(_ *ctxfoldv1.PrepareRequest, send func(*ctxfoldv1.PrepareResponse) error) error {
		return send(result(&ctxfoldv1.PreparedContext{ViewVersion: 1}))
	}}
	client := startFake(t, f, ctxfold.WithBearerToken("secret-token-0123456789"), ctxfold.WithDefaultTimeout(5*time.Second))
	s := client.OpenSession("s1")

	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	ctx = metadata.AppendToOutgoingContext(ctx, "x-caller", "kept")

	if _, err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	get := func(key string) string {
		f.mu.Lock()
		defer f.mu.Unlock()
		if v := f.md.Get(key); len(v) == 1 {
			return v[0]
		}
		return ""
	}
	if got := get("authorization"); got != "Bearer secret-token-0123456789" {
		t.Errorf("authorization = %q", got)
	}
	if got := get("traceparent"); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("traceparent from the active span = %q", got)
	}
	if get("x-caller") != "kept" {
		t.Errorf("caller metadata lost")
	}
	if !f.hadDeadline {
		t.Errorf("unary call without the default deadline")
	}

	// An explicit traceparent wins over the span's.
	explicit := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	if _, err := s.Refresh(ctxfold.ContextWithTraceparent(ctx, explicit, "vendor=1")); err != nil {
		t.Fatal(err)
	}
	if get("traceparent") != explicit || get("tracestate") != "vendor=1" {
		t.Errorf("explicit trace context = %q %q", get("traceparent"), get("tracestate"))
	}

	// No span, no explicit value: no traceparent. Streams get their own default deadline.
	if _, err := s.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	if get("traceparent") != "" || !f.hadDeadline {
		t.Errorf("prepare without a span: traceparent %q, deadline %v", get("traceparent"), f.hadDeadline)
	}
	if ua := get("user-agent"); !strings.HasPrefix(ua, "ctxfold-go/"+ctxfold.Version+" ") {
		t.Errorf("user agent %q does not name the SDK and its version", ua)
	}
	// Raw generated calls carry the token too.
	if _, err := client.Raw().GetSession(context.Background(), &ctxfoldv1.GetSessionRequest{SessionId: "s1"}); err != nil {
		t.Fatal(err)
	}
	if get("authorization") == "" {
		t.Errorf("raw call without authorization")
	}
}

func TestStreamTimeout(t *testing.T) {
	f := &fakeServer{prepare: func(_ *ctxfoldv1.PrepareRequest, send func(*ctxfoldv1.PrepareResponse) error) error {
		return send(result(&ctxfoldv1.PreparedContext{ViewVersion: 1}))
	}}
	client := startFake(t, f, ctxfold.WithStreamTimeout(time.Minute))
	if _, err := client.OpenSession("s1").Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !f.hadDeadline {
		t.Errorf("prepare without the stream deadline")
	}
}

func TestErrorDetailsMapping(t *testing.T) {
	st, err := status.New(codes.FailedPrecondition, "two results answer call c1").WithDetails(&errdetails.ErrorInfo{
		Reason: "RESULT_REF_AMBIGUOUS", Domain: "ctxfold.dev", Metadata: map[string]string{"tool_call_id": "c1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{getSession: func() (*ctxfoldv1.GetSessionResponse, error) { return nil, st.Err() }}
	client := startFake(t, f)
	_, err = client.GetSession(context.Background(), "s1")
	var e *ctxfold.Error
	if !errors.As(err, &e) {
		t.Fatalf("%T is not *ctxfold.Error", err)
	}
	if e.Code != codes.FailedPrecondition || e.Reason != ctxfold.ReasonResultRefAmbiguous || e.Domain != "ctxfold.dev" ||
		e.Metadata["tool_call_id"] != "c1" || e.Message != "two results answer call c1" || e.Op != "GetSession" {
		t.Errorf("mapped %+v", e)
	}
	if want := "ctxfold: GetSession: FAILED_PRECONDITION RESULT_REF_AMBIGUOUS: two results answer call c1"; e.Error() != want {
		t.Errorf("Error() = %q", e.Error())
	}
	if got, _ := status.FromError(err); len(got.Details()) != 1 {
		t.Errorf("status details lost")
	}
	if !errors.Is(err, &ctxfold.Error{Code: codes.FailedPrecondition}) || errors.Is(err, &ctxfold.Error{Reason: ctxfold.ReasonSessionNotFound}) {
		t.Errorf("errors.Is with sentinels")
	}

	// A status without details maps with an empty reason.
	f.getSession = func() (*ctxfoldv1.GetSessionResponse, error) { return nil, status.Error(codes.Unavailable, "down") }
	_, err = client.GetSession(context.Background(), "s1")
	if !errors.As(err, &e) || e.Code != codes.Unavailable || e.Reason != ctxfold.ReasonUnspecified || e.Metadata == nil {
		t.Errorf("no details: %+v", e)
	}
	if ctxfold.AsError("X", nil) != nil {
		t.Errorf("AsError(nil) != nil")
	}
	if err := ctxfold.AsError("X", context.DeadlineExceeded); status.Code(err) != codes.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("context error: %v", err)
	}
}

func TestPrepareDeltaAndFallback(t *testing.T) {
	sys := &ctxfoldv1.Message{Role: ctxfoldv1.Role_ROLE_SYSTEM, Content: "sys"}
	var calls int
	f := &fakeServer{}
	f.prepare = func(req *ctxfoldv1.PrepareRequest, send func(*ctxfoldv1.PrepareResponse) error) error {
		calls++
		switch calls {
		case 1: // whole view
			return send(result(&ctxfoldv1.PreparedContext{Messages: []*ctxfoldv1.Message{sys, msg("u1")}, ViewVersion: 10, ViewMessageCount: 2}))
		case 2: // a good delta
			_ = send(progress(ctxfoldv1.FoldStage_FOLD_STAGE_PRUNED))
			return send(result(&ctxfoldv1.PreparedContext{Messages: []*ctxfoldv1.Message{msg("a1"), msg("u2")}, ViewVersion: 11, ViewMessageCount: 4, Delta: true}))
		case 3: // a delta that does not fit the held view
			return send(result(&ctxfoldv1.PreparedContext{Messages: []*ctxfoldv1.Message{msg("x")}, ViewVersion: 12, ViewMessageCount: 9, Delta: true,
				Appended: []*ctxfoldv1.Message{msg("u3")}}))
		default: // the whole view again
			return send(result(&ctxfoldv1.PreparedContext{Messages: []*ctxfoldv1.Message{sys, msg("u1"), msg("a1"), msg("u2"), msg("u3")}, ViewVersion: 12, ViewMessageCount: 5}))
		}
	}
	s := startFake(t, f).OpenSession("s1")
	ctx := context.Background()
	if _, err := s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("u1"))); err != nil {
		t.Fatal(err)
	}
	var seen []ctxfoldv1.FoldStage
	p2, err := s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("u2")), ctxfold.WithRequestID("r2"),
		ctxfold.WithProgress(func(p ctxfold.FoldProgress) { seen = append(seen, p.Stage) }))
	if err != nil {
		t.Fatal(err)
	}
	if got := contents(p2.Messages); len(got) != 4 || got[2] != "a1" || !p2.Delta || len(p2.Appended) != 0 {
		t.Errorf("delta applied: %v", got)
	}
	if len(seen) != 1 || len(p2.Progress) != 1 {
		t.Errorf("progress callback saw %v", seen)
	}
	if req := f.prepares[1]; req.GetKnownViewVersion() != 10 || req.GetRequestId() != "r2" {
		t.Errorf("second request %v", req)
	}
	if id := f.prepares[0].GetRequestId(); !uuidV4.MatchString(id) {
		t.Errorf("a prepare with an append and no request id sent %q, want a fresh UUIDv4", id)
	}

	p3, err := s.Prepare(ctx, ctxfold.WithAppend(ctxfold.UserMessage("u3")), ctxfold.WithOverflow())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.prepares) != 4 {
		t.Fatalf("%d prepare calls, want 4 (with the fallback)", len(f.prepares))
	}
	if fb := f.prepares[3]; fb.GetKnownViewVersion() != 0 || len(fb.GetAppend()) != 0 || fb.GetOverflow() {
		t.Errorf("fallback request %v must append nothing, ask for no second overflow and for the whole view", fb)
	}
	if got := contents(p3.Messages); len(got) != 5 || got[4] != "u3" || p3.Delta || len(p3.Appended) != 1 {
		t.Errorf("after fallback: %v delta %v appended %v", got, p3.Delta, p3.Appended)
	}
	if _, version := s.HeldView(); version != 12 {
		t.Errorf("held version %d", version)
	}
	// Another handle on the same session shares the client's held view.
	if _, version := s.Client().OpenSession(s.ID()).HeldView(); version != 12 {
		t.Errorf("a second handle sees held version %d", version)
	}
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestAppendRequestIDs: every append carries an idempotency key, the caller's or a fresh UUIDv4.
func TestAppendRequestIDs(t *testing.T) {
	f := &fakeServer{}
	s := startFake(t, f).OpenSession("s1")
	ctx := context.Background()
	for range 2 {
		if _, err := s.Append(ctx, ctxfold.UserMessage("x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AppendWithRequestID(ctx, "mine", ctxfold.UserMessage("y")); err != nil {
		t.Fatal(err)
	}
	first, second, mine := f.appends[0].GetRequestId(), f.appends[1].GetRequestId(), f.appends[2].GetRequestId()
	if !uuidV4.MatchString(first) || !uuidV4.MatchString(second) || first == second || mine != "mine" {
		t.Errorf("request ids %q %q %q", first, second, mine)
	}
}

// TestViewCacheEvictsLeastRecentlyUsed: with room for two sessions, preparing a third evicts the
// least recently used one, whose next Prepare then asks for the whole view.
func TestViewCacheEvictsLeastRecentlyUsed(t *testing.T) {
	f := &fakeServer{prepare: func(req *ctxfoldv1.PrepareRequest, send func(*ctxfoldv1.PrepareResponse) error) error {
		return send(result(&ctxfoldv1.PreparedContext{Messages: []*ctxfoldv1.Message{msg(req.GetSessionId())}, ViewVersion: 5, ViewMessageCount: 1}))
	}}
	client := startFake(t, f, ctxfold.WithViewCacheSessions(2))
	ctx := context.Background()
	prepare := func(id string) int64 {
		t.Helper()
		if _, err := client.OpenSession(id).Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		return f.prepares[len(f.prepares)-1].GetKnownViewVersion()
	}
	prepare("a")
	prepare("b")
	if known := prepare("a"); known != 5 { // a is now the most recently used
		t.Errorf("a held: known version %d, want 5", known)
	}
	prepare("c") // evicts b
	if known := prepare("b"); known != 0 {
		t.Errorf("b was evicted but Prepare sent known version %d", known)
	}
	if known := prepare("a"); known != 0 { // b's re-entry evicted a (c was used more recently)
		t.Errorf("a after two newer sessions: known version %d, want 0", known)
	}
}

func TestPrepareWithoutResult(t *testing.T) {
	f := &fakeServer{prepare: func(_ *ctxfoldv1.PrepareRequest, send func(*ctxfoldv1.PrepareResponse) error) error {
		_ = send(progress(ctxfoldv1.FoldStage_FOLD_STAGE_PLANNED))
		return send(progress(ctxfoldv1.FoldStage_FOLD_STAGE_PASS_FAILED))
	}}
	n := 0
	_, err := startFake(t, f).OpenSession("s1").Prepare(context.Background(), ctxfold.WithProgress(func(ctxfold.FoldProgress) { n++ }))
	var e *ctxfold.Error
	if !errors.As(err, &e) || e.Reason != ctxfold.ReasonStreamEndedWithoutResult || e.Code != codes.Unavailable || n != 2 {
		t.Errorf("err %v after %d progress events", err, n)
	}
	// The SDK raised it, not the server: the client domain of clients/README.md.
	if e.Domain != "client.ctxfold.dev" {
		t.Errorf("SDK-raised error in domain %q", e.Domain)
	}
}

// TestProtocolViolations: a server that breaks the protocol gets PROTOCOL_VIOLATION (INTERNAL),
// never a wrong result.
func TestProtocolViolations(t *testing.T) {
	f := &fakeServer{}
	client := startFake(t, f)
	ctx := context.Background()
	violation := func(what string, err error) {
		t.Helper()
		var e *ctxfold.Error
		if !errors.As(err, &e) || e.Reason != ctxfold.ReasonProtocolViolation || e.Code != codes.Internal || e.Domain != ctxfold.ClientErrorDomain {
			t.Errorf("%s: %v, want PROTOCOL_VIOLATION", what, err)
		}
	}
	f.prepare = func(_ *ctxfoldv1.PrepareRequest, send func(*ctxfoldv1.PrepareResponse) error) error {
		_ = send(result(&ctxfoldv1.PreparedContext{ViewVersion: 1}))
		return send(progress(ctxfoldv1.FoldStage_FOLD_STAGE_PLANNED))
	}
	_, err := client.OpenSession("s1").Prepare(ctx)
	violation("an event after the result", err)

	f.prepare = func(_ *ctxfoldv1.PrepareRequest, send func(*ctxfoldv1.PrepareResponse) error) error {
		return send(result(&ctxfoldv1.PreparedContext{Messages: []*ctxfoldv1.Message{msg("a")}, ViewVersion: 1, ViewMessageCount: 3}))
	}
	_, err = client.OpenSession("s1").Prepare(ctx)
	violation("a whole view of 1 message counted 3", err)

	f.listToken = "same"
	for _, err := range client.Sessions(ctx) {
		if err != nil {
			violation("a repeated page token", err)
		}
	}
}

func TestReadToolResultChecks(t *testing.T) {
	data := "héllo wörld, 日本語 🚀"
	sum := sha256.Sum256([]byte(data))
	announced := hex.EncodeToString(sum[:])
	page := func(req *ctxfoldv1.ReadToolResultRequest) (*ctxfoldv1.ReadToolResultResponse, error) {
		end := min(int(req.GetOffset())+8, len(data))
		for end < len(data) && (data[end]&0xC0) == 0x80 { // end on a character boundary
			end--
		}
		return &ctxfoldv1.ReadToolResultResponse{
			Data: data[req.GetOffset():end], Offset: req.GetOffset(), NextOffset: int64(end), TotalBytes: int64(len(data)),
			Sha256: announced, Complete: end == len(data), ResultRef: "tr_1",
		}, nil
	}
	f := &fakeServer{read: page}
	s := startFake(t, f).OpenSession("s1")
	ctx := context.Background()

	got, err := s.ReadToolResultByCallID(ctx, "c1", ctxfold.PageBytes(8))
	if err != nil {
		t.Fatal(err)
	}
	if got.Text != data || len(f.reads) < 3 || got.ResultRef != "tr_1" || got.SHA256 != announced {
		t.Errorf("read %q in %d pages", got.Text, len(f.reads))
	}
	if f.reads[0].GetToolCallId() != "c1" || f.reads[1].GetResultRef() != "tr_1" || f.reads[1].GetLimit() != 8 {
		t.Errorf("requests: %v then %v", f.reads[0], f.reads[1])
	}

	announced = "0000"
	_, err = s.ReadToolResult(ctx, "tr_1")
	var e *ctxfold.Error
	if !errors.As(err, &e) || e.Reason != ctxfold.ReasonResultChecksumMismatch || e.Code != codes.DataLoss {
		t.Errorf("wrong sha256: %v", err)
	}
	f.read = func(req *ctxfoldv1.ReadToolResultRequest) (*ctxfoldv1.ReadToolResultResponse, error) {
		return &ctxfoldv1.ReadToolResultResponse{Offset: req.GetOffset(), NextOffset: req.GetOffset(), TotalBytes: 10}, nil
	}
	if _, err := s.ReadToolResult(ctx, "tr_1"); !ctxfold.HasReason(err, ctxfold.ReasonProtocolViolation) {
		t.Errorf("a page that does not advance: %v", err)
	}
}

func TestSessionsIterator(t *testing.T) {
	f := &fakeServer{}
	client := startFake(t, f)
	var ids []string
	for info, err := range client.Sessions(context.Background(), ctxfold.PageSize(2)) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	if len(ids) != 5 || ids[4] != "s5" || f.listCalls != 3 {
		t.Errorf("ids %v in %d calls", ids, f.listCalls)
	}
	f.listCalls = 0
	for range client.Sessions(context.Background()) {
		break
	}
	if f.listCalls != 1 {
		t.Errorf("stopping early made %d calls", f.listCalls)
	}
}

func TestSessionConfigBuilder(t *testing.T) {
	cfg, err := ctxfold.NewSessionConfig(128000,
		ctxfold.CompactRatio(0.7), ctxfold.TailRatio(0.2), ctxfold.MaxOutputTokens(4096), ctxfold.SummaryMaxTokens(2000),
		ctxfold.ToolContentMaxBytes(8192), ctxfold.SystemPrompt("sys"), ctxfold.Summarizer("gpt"),
		ctxfold.CacheTTL(5*time.Minute), ctxfold.PromptCacheKey("k"), ctxfold.Model("gpt-x"),
		ctxfold.Tools([]map[string]string{{"type": "function"}}), ctxfold.DisableTaskAnchor(),
	)
	if err != nil {
		t.Fatal(err)
	}
	want := ctxfold.SessionConfig{
		ContextWindow: 128000, CompactRatio: 0.7, TailRatio: 0.2, MaxOutputTokens: 4096, SummaryMaxTokens: 2000,
		ToolContentMaxBytes: 8192, SystemPrompt: "sys", Summarizer: "gpt", CacheTTL: 5 * time.Minute, PromptCacheKey: "k",
		Model: "gpt-x", ToolsJSON: `[{"type":"function"}]`, DisableTaskAnchor: true,
	}
	if *cfg != want {
		t.Errorf("config %+v", cfg)
	}
	if proto := cfg.Proto(); proto.GetCacheTtlSeconds() != 300 || ctxfold.SessionConfigFromProto(proto) != want {
		t.Errorf("proto round trip %v", proto)
	}
	if _, err := ctxfold.NewSessionConfig(1000, ctxfold.ToolsJSON("[not json")); err == nil {
		t.Errorf("invalid tools JSON accepted")
	}
	if _, err := ctxfold.NewSessionConfig(1000, ctxfold.Tools(func() {})); err == nil {
		t.Errorf("unmarshalable tools accepted")
	}
	if _, err := ctxfold.New("127.0.0.1:1", ctxfold.WithTLSFiles("", "cert.pem", "")); err == nil {
		t.Errorf("client certificate without key accepted")
	}
}

func TestGlobalPropagatorAlsoInjects(t *testing.T) {
	previous := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.Baggage{})
	t.Cleanup(func() { otel.SetTextMapPropagator(previous) })

	f := &fakeServer{}
	client := startFake(t, f)
	member, _ := baggage.NewMember("tenant", "acme")
	bag, _ := baggage.New(member)
	if _, err := client.OpenSession("s1").Refresh(baggage.ContextWithBaggage(context.Background(), bag)); err != nil {
		t.Fatal(err)
	}
	if got := f.md.Get("baggage"); len(got) != 1 || got[0] != "tenant=acme" {
		t.Errorf("baggage = %v", got)
	}

	// WithPropagator(nil) injects nothing.
	quiet := startFake(t, f, ctxfold.WithPropagator(nil))
	if _, err := quiet.OpenSession("s1").Refresh(baggage.ContextWithBaggage(context.Background(), bag)); err != nil {
		t.Fatal(err)
	}
	if got := f.md.Get("baggage"); len(got) != 0 {
		t.Errorf("baggage with a nil propagator = %v", got)
	}
}

func TestPrefoldRatioIsReadWithPresenceAndTheBackgroundStagesByName(t *testing.T) {
	var answered *float64
	f := &fakeServer{getSession: func() (*ctxfoldv1.GetSessionResponse, error) {
		return &ctxfoldv1.GetSessionResponse{Session: &ctxfoldv1.Session{Id: "s1", Config: &ctxfoldv1.SessionConfig{ContextWindow: 8000, PrefoldRatio: answered}}}, nil
	}}
	f.prepare = func(_ *ctxfoldv1.PrepareRequest, send func(*ctxfoldv1.PrepareResponse) error) error {
		for _, stage := range []ctxfoldv1.FoldStage{ctxfold.FoldStageBackgroundStarted, ctxfold.FoldStagePreparedInstalled, ctxfold.FoldStageBackgroundRunning} {
			_ = send(progress(stage))
		}
		return send(result(&ctxfoldv1.PreparedContext{Messages: []*ctxfoldv1.Message{msg("u1")}, ViewVersion: 1, ViewMessageCount: 1}))
	}
	client := startFake(t, f)
	ctx := context.Background()
	ratio := func(v float64) *float64 { return &v }
	for _, want := range []*float64{ratio(0), ratio(0.75), nil} {
		answered = want
		s, err := client.GetSession(ctx, "s1")
		if err != nil {
			t.Fatal(err)
		}
		got := s.Info().Config.PrefoldRatio
		if (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Errorf("the server said %v, the config reads %v", want, got)
		}
	}
	var stages []string
	if _, err := client.OpenSession("s1").Prepare(ctx, ctxfold.WithProgress(func(p ctxfold.FoldProgress) { stages = append(stages, p.Stage.String()) })); err != nil {
		t.Fatal(err)
	}
	if want := "FOLD_STAGE_BACKGROUND_STARTED FOLD_STAGE_PREPARED_INSTALLED FOLD_STAGE_BACKGROUND_RUNNING"; strings.Join(stages, " ") != want {
		t.Errorf("stages %v, want %s", stages, want)
	}
}

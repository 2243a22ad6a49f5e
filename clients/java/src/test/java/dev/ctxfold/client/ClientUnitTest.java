package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Any;
import com.google.rpc.Code;
import com.google.rpc.ErrorInfo;
import com.google.rpc.RetryInfo;
import dev.ctxfold.v1.AppendMessagesRequest;
import dev.ctxfold.v1.AppendMessagesResponse;
import dev.ctxfold.v1.ContextServiceGrpc;
import dev.ctxfold.v1.ErrorReason;
import dev.ctxfold.v1.ForkRequest;
import dev.ctxfold.v1.ForkResponse;
import dev.ctxfold.v1.FoldStage;
import dev.ctxfold.v1.GetSessionRequest;
import dev.ctxfold.v1.GetSessionResponse;
import dev.ctxfold.v1.ListSessionsRequest;
import dev.ctxfold.v1.ListSessionsResponse;
import dev.ctxfold.v1.PrepareRequest;
import dev.ctxfold.v1.PrepareResponse;
import dev.ctxfold.v1.ReadToolResultRequest;
import dev.ctxfold.v1.ReadToolResultResponse;
import dev.ctxfold.v1.RewindRequest;
import dev.ctxfold.v1.RewindResponse;
import io.grpc.Context;
import io.grpc.Grpc;
import io.grpc.InsecureServerCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerInterceptors;
import io.grpc.Status;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanContext;
import io.opentelemetry.api.trace.TraceFlags;
import io.opentelemetry.api.trace.TraceState;
import io.opentelemetry.context.Scope;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Flow;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** The client layer against an in-process fake of the service. */
class ClientUnitTest {
  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
  private static final Metadata.Key<String> TRACEPARENT =
      Metadata.Key.of("traceparent", Metadata.ASCII_STRING_MARSHALLER);

  private final List<Metadata> headers = new CopyOnWriteArrayList<>();
  private final List<PrepareRequest> prepares = new CopyOnWriteArrayList<>();
  private final List<ReadToolResultRequest> reads = new CopyOnWriteArrayList<>();
  private final List<AppendMessagesRequest> appends = new CopyOnWriteArrayList<>();
  private final List<ForkRequest> forks = new CopyOnWriteArrayList<>();
  private final List<Boolean> hadDeadline = new CopyOnWriteArrayList<>();
  private Server server;
  private ManagedChannel channel;
  private Fake fake;

  /** A scriptable fake of the service. */
  private class Fake extends ContextServiceGrpc.ContextServiceImplBase {
    List<PrepareResponse> prepareScript = List.of();
    List<List<PrepareResponse>> prepareScripts = new ArrayList<>();
    com.google.rpc.Status failure;
    String toolData = "";
    String toolSha = "";
    boolean loopPageTokens;
    /** Prepare answers nothing and counts down {@code prepareCancelled} when its call is cancelled. */
    boolean holdPrepare;
    final java.util.concurrent.CountDownLatch prepareHeld = new java.util.concurrent.CountDownLatch(1);
    final java.util.concurrent.CountDownLatch prepareCancelled = new java.util.concurrent.CountDownLatch(1);

    @Override
    public void rewind(RewindRequest request, StreamObserver<RewindResponse> out) {
      out.onNext(RewindResponse.newBuilder().setSession(dev.ctxfold.v1.Session.newBuilder().setId("s1")).build());
      out.onCompleted();
    }

    @Override
    public void getSession(GetSessionRequest request, StreamObserver<GetSessionResponse> out) {
      hadDeadline.add(Context.current().getDeadline() != null);
      if (failure != null) {
        out.onError(StatusProto.toStatusRuntimeException(failure));
        return;
      }
      out.onNext(GetSessionResponse.newBuilder()
          .setSession(dev.ctxfold.v1.Session.newBuilder().setId(request.getSessionId())).build());
      out.onCompleted();
    }

    @Override
    public void listSessions(ListSessionsRequest request, StreamObserver<ListSessionsResponse> out) {
      int page = request.getPageToken().isEmpty() ? 0 : Integer.parseInt(request.getPageToken());
      ListSessionsResponse.Builder r = ListSessionsResponse.newBuilder();
      for (int i = 0; i < 2; i++) {
        r.addSessions(dev.ctxfold.v1.Session.newBuilder().setId("s" + (page * 2 + i)));
      }
      if (page < 2) {
        r.setNextPageToken(Integer.toString(loopPageTokens ? 1 : page + 1));
      }
      out.onNext(r.build());
      out.onCompleted();
    }

    @Override
    public void appendMessages(AppendMessagesRequest request, StreamObserver<AppendMessagesResponse> out) {
      appends.add(request);
      out.onNext(AppendMessagesResponse.newBuilder().addAllMessages(request.getMessagesList()).build());
      out.onCompleted();
    }

    @Override
    public void fork(ForkRequest request, StreamObserver<ForkResponse> out) {
      forks.add(request);
      out.onNext(ForkResponse.newBuilder().setSession(dev.ctxfold.v1.Session.newBuilder().setId("fork")).build());
      out.onCompleted();
    }

    @Override
    public void prepare(PrepareRequest request, StreamObserver<PrepareResponse> out) {
      prepares.add(request);
      if (holdPrepare) {
        ((ServerCallStreamObserver<PrepareResponse>) out).setOnCancelHandler(prepareCancelled::countDown);
        prepareHeld.countDown();
        return;
      }
      List<PrepareResponse> script = prepareScripts.isEmpty() ? prepareScript : prepareScripts.remove(0);
      for (PrepareResponse r : script) {
        out.onNext(r);
      }
      out.onCompleted();
    }

    @Override
    public void readToolResult(ReadToolResultRequest request, StreamObserver<ReadToolResultResponse> out) {
      reads.add(request);
      byte[] all = toolData.getBytes(StandardCharsets.UTF_8);
      int from = (int) request.getOffset();
      int to = Math.min(all.length, from + (int) request.getLimit());
      out.onNext(ReadToolResultResponse.newBuilder()
          .setData(new String(all, from, to - from, StandardCharsets.UTF_8))
          .setOffset(from)
          .setNextOffset(to)
          .setTotalBytes(all.length)
          .setSha256(toolSha)
          .setComplete(to == all.length)
          .setResultRef("ref_1")
          .build());
      out.onCompleted();
    }
  }

  @BeforeEach
  void start() throws Exception {
    String name = InProcessServerBuilder.generateName();
    fake = new Fake();
    server = InProcessServerBuilder.forName(name).directExecutor()
        .addService(ServerInterceptors.intercept(fake, capture())).build().start();
    channel = InProcessChannelBuilder.forName(name).directExecutor().build();
  }

  private ServerInterceptor capture() {
    return new ServerInterceptor() {
      @Override
      public <ReqT, RespT> ServerCall.Listener<ReqT> interceptCall(
          ServerCall<ReqT, RespT> call, Metadata md, ServerCallHandler<ReqT, RespT> next) {
        headers.add(md);
        return next.startCall(call, md);
      }
    };
  }

  @AfterEach
  void stop() throws Exception {
    channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
  }

  private CtxfoldClient client() {
    return CtxfoldClient.builder().channel(channel).build();
  }

  private static PrepareResponse progress(FoldStage stage) {
    return PrepareResponse.newBuilder().setProgress(dev.ctxfold.v1.FoldProgress.newBuilder().setStage(stage)).build();
  }

  private static PrepareResponse result(long version, boolean delta, long count, String... contents) {
    dev.ctxfold.v1.PreparedContext.Builder r = dev.ctxfold.v1.PreparedContext.newBuilder()
        .setViewVersion(version).setDelta(delta).setViewMessageCount(count);
    for (String c : contents) {
      r.addMessages(Messages.user(c).toProto());
    }
    return PrepareResponse.newBuilder().setResult(r).build();
  }

  private static List<String> contents(List<Message> messages) {
    return messages.stream().map(Message::content).collect(Collectors.toList());
  }

  // ---- metadata -------------------------------------------------------------------------------

  @Test
  void sendsBearerTokenAndActiveTraceContext() {
    CtxfoldClient c = CtxfoldClient.builder().channel(channel).bearerToken("secret-token-123456").build();
    SpanContext span = SpanContext.create("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331",
        TraceFlags.getSampled(), TraceState.getDefault());
    try (Scope ignored = Span.wrap(span).makeCurrent()) {
      c.getSession("s1");
    }
    Metadata md = headers.get(0);
    assertEquals("Bearer secret-token-123456", md.get(AUTHORIZATION));
    assertEquals("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", md.get(TRACEPARENT));
  }

  @Test
  void noTraceContextWithoutASpanOrWhenDisabled() {
    client().getSession("s1");
    assertNull(headers.get(0).get(TRACEPARENT));
    assertNull(headers.get(0).get(AUTHORIZATION));

    CtxfoldClient off = CtxfoldClient.builder().channel(channel).propagateTraceContext(false).build();
    SpanContext span = SpanContext.create("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331",
        TraceFlags.getSampled(), TraceState.getDefault());
    try (Scope ignored = Span.wrap(span).makeCurrent()) {
      off.getSession("s1");
    }
    assertNull(headers.get(1).get(TRACEPARENT));
  }

  @Test
  void explicitTraceparentWins() {
    String explicit = "00-11111111111111111111111111111111-2222222222222222-01";
    SpanContext span = SpanContext.create("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331",
        TraceFlags.getSampled(), TraceState.getDefault());
    try (Scope ignored = Span.wrap(span).makeCurrent()) {
      client().withTraceparent(explicit).getSession("s1");
    }
    assertEquals(List.of(explicit), iterable(headers.get(0).getAll(TRACEPARENT)));
    CtxfoldException bad = assertThrows(CtxfoldException.class, () -> client().withTraceparent("not-a-traceparent"));
    assertTrue(bad.is(ErrorReason.INVALID_CLIENT_ARGUMENT));
  }

  private static List<String> iterable(Iterable<String> values) {
    List<String> out = new ArrayList<>();
    values.forEach(out::add);
    return out;
  }

  @Test
  void unaryCallsHaveADeadlineByDefault() {
    client().getSession("s1");
    CtxfoldClient.builder().channel(channel).unaryDeadline(null).build().getSession("s1");
    client().withoutDeadline().getSession("s1");
    client().withDeadline(Duration.ofSeconds(5)).getSession("s1");
    assertEquals(List.of(true, false, false, true), hadDeadline);
  }

  @Test
  void theUserAgentNamesTheSdkAndItsVersion() throws Exception {
    Server tcp = Grpc.newServerBuilderForPort(0, InsecureServerCredentials.create())
        .addService(ServerInterceptors.intercept(fake, capture())).build().start();
    try (CtxfoldClient c = CtxfoldClient.connect("127.0.0.1:" + tcp.getPort())) {
      c.getSession("s1");
    } finally {
      tcp.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
    String userAgent = headers.get(0).get(Metadata.Key.of("user-agent", Metadata.ASCII_STRING_MARSHALLER));
    assertTrue(userAgent.startsWith("ctxfold-java/" + CtxfoldClient.version() + " "), userAgent);
    assertTrue(CtxfoldClient.version().matches("\\d+\\.\\d+\\.\\d+.*"), CtxfoldClient.version());
  }

  // ---- errors ---------------------------------------------------------------------------------

  @Test
  void errorInfoBecomesCtxfoldException() {
    fake.failure = com.google.rpc.Status.newBuilder()
        .setCode(Code.NOT_FOUND_VALUE)
        .setMessage("session 's9' not found")
        .addDetails(Any.pack(ErrorInfo.newBuilder()
            .setReason("SESSION_NOT_FOUND").setDomain("ctxfold.dev").putMetadata("session_id", "s9").build()))
        .build();
    CtxfoldException e = assertThrows(CtxfoldException.class, () -> client().getSession("s9"));
    assertEquals(Status.Code.NOT_FOUND, e.code());
    assertEquals("SESSION_NOT_FOUND", e.reason());
    assertTrue(e.is(ErrorReason.SESSION_NOT_FOUND));
    assertEquals(ErrorReason.SESSION_NOT_FOUND, e.errorReason());
    assertTrue(e.retryDelay().isEmpty());
    assertEquals("ctxfold.dev", e.domain(), "the server's domain, as sent");
    assertEquals("s9", e.metadata().get("session_id"));
    assertEquals("session 's9' not found", e.statusMessage());
    assertEquals("NOT_FOUND [SESSION_NOT_FOUND]: session 's9' not found", e.getMessage());
  }

  @Test
  void retryInfoBecomesTheRetryDelay() {
    fake.failure = com.google.rpc.Status.newBuilder()
        .setCode(Code.RESOURCE_EXHAUSTED_VALUE)
        .setMessage("busy")
        .addDetails(Any.pack(ErrorInfo.newBuilder().setReason("SESSION_BUSY").setDomain("ctxfold.dev").build()))
        .addDetails(Any.pack(RetryInfo.newBuilder()
            .setRetryDelay(com.google.protobuf.Duration.newBuilder().setSeconds(1).setNanos(500_000_000)).build()))
        .build();
    CtxfoldException e = assertThrows(CtxfoldException.class, () -> client().getSession("s1"));
    assertTrue(e.is(ErrorReason.SESSION_BUSY));
    assertEquals(Duration.ofMillis(1500), e.retryDelay().orElseThrow());
  }

  @Test
  void statusWithoutDetailsHasNoReason() {
    fake.failure = com.google.rpc.Status.newBuilder().setCode(Code.UNAVAILABLE_VALUE).setMessage("down").build();
    CtxfoldException e = assertThrows(CtxfoldException.class, () -> client().getSession("s1"));
    assertEquals(Status.Code.UNAVAILABLE, e.code());
    assertEquals("", e.reason());
    assertEquals(ErrorReason.ERROR_REASON_UNSPECIFIED, e.errorReason());
    assertTrue(e.metadata().isEmpty());
    CtxfoldException same = CtxfoldException.from(e);
    assertSame(e, same);
    assertEquals(Status.Code.UNKNOWN, CtxfoldException.from(new IllegalStateException("x")).code());
  }

  // ---- prepare --------------------------------------------------------------------------------

  @Test
  void progressIsDeliveredInOrderAndTheDeltaApplied() {
    CtxfoldClient c = client();
    fake.prepareScripts.add(List.of(progress(FoldStage.FOLD_STAGE_PLANNED),
        progress(FoldStage.FOLD_STAGE_PASS_COMMITTED), result(10, false, 2, "a", "b")));
    fake.prepareScripts.add(List.of(result(11, true, 3, "c")));
    List<FoldStage> seen = new ArrayList<>();
    View first = c.prepare("s1", PrepareOptions.builder()
        .append(Messages.user("a"))
        .onProgress(p -> seen.add(p.stage()))
        .build());
    assertEquals(List.of(FoldStage.FOLD_STAGE_PLANNED, FoldStage.FOLD_STAGE_PASS_COMMITTED), seen);
    assertEquals(2, first.progress().size());
    assertEquals(List.of("a", "b"), contents(first.messages()));
    assertEquals(0, prepares.get(0).getKnownViewVersion());
    assertEquals(1, prepares.get(0).getAppendCount());

    View second = c.prepare("s1", Messages.user("c"));
    assertEquals(10, prepares.get(1).getKnownViewVersion(), "the held view's version is sent");
    assertTrue(second.delta());
    assertEquals(List.of("c"), contents(second.received()));
    assertEquals(List.of("a", "b", "c"), contents(second.messages()));
  }

  @Test
  void aDeltaThatDoesNotFitIsReplacedByTheWholeView() {
    CtxfoldClient c = client();
    fake.prepareScripts.add(List.of(result(10, false, 2, "a", "b")));
    PrepareResponse delta = result(11, true, 5, "x"); // claims 4 known messages: not ours
    fake.prepareScripts.add(List.of(delta.toBuilder().setResult(delta.getResult().toBuilder()
        .addAppended(Messages.user("x").toProto())).build()));
    fake.prepareScripts.add(List.of(result(11, false, 3, "a", "b", "x")));
    c.prepare("s1");
    View ctx = c.prepare("s1", PrepareOptions.builder().append(Messages.user("x")).overflow(true).build());
    assertEquals(List.of("a", "b", "x"), contents(ctx.messages()));
    assertEquals(List.of("x"), contents(ctx.appended()), "the view says what the call appended, as in every SDK");
    assertEquals(3, prepares.size());
    assertEquals(0, prepares.get(2).getKnownViewVersion());
    assertEquals(0, prepares.get(2).getAppendCount(), "the refetch appends nothing again");
    assertFalse(prepares.get(2).getOverflow(), "the refetch asks for no second overflow maintenance");
  }

  @Test
  void aStreamWithoutResultFails() {
    fake.prepareScript = List.of(progress(FoldStage.FOLD_STAGE_PLANNED));
    CtxfoldException e = assertThrows(CtxfoldException.class, () -> client().prepare("s1"));
    assertEquals(Status.Code.UNAVAILABLE, e.code());
    assertTrue(e.is(ErrorReason.STREAM_ENDED_WITHOUT_RESULT));
    assertEquals("client.ctxfold.dev", e.domain(), "raised by the SDK itself, not the server");
  }

  @Test
  void aThrowingListenerPropagates() {
    fake.prepareScript = List.of(progress(FoldStage.FOLD_STAGE_PLANNED), result(1, false, 0));
    IllegalStateException boom = new IllegalStateException("listener failed");
    IllegalStateException thrown = assertThrows(IllegalStateException.class, () -> client().prepare("s1",
        PrepareOptions.builder().onProgress(p -> {
          throw boom;
        }).build()));
    assertSame(boom, thrown);
  }

  @Test
  void useDeltaFalseSendsNoKnownVersion() {
    CtxfoldClient c = client();
    fake.prepareScripts.add(List.of(result(10, false, 1, "a")));
    fake.prepareScripts.add(List.of(result(10, false, 1, "a")));
    c.prepare("s1");
    c.prepare("s1", PrepareOptions.builder().useDelta(false).build());
    assertEquals(0, prepares.get(1).getKnownViewVersion());
  }

  @Test
  void viewCacheIsBounded() {
    CtxfoldClient c = CtxfoldClient.builder().channel(channel).maxCachedViews(1).build();
    for (int i = 0; i < 4; i++) {
      fake.prepareScripts.add(List.of(result(10 + i, false, 1, "a")));
    }
    c.prepare("s1");
    c.prepare("s2"); // evicts s1's view
    c.prepare("s1");
    c.prepare("s1");
    assertEquals(List.of(0L, 0L, 0L, 12L),
        prepares.stream().map(PrepareRequest::getKnownViewVersion).collect(Collectors.toList()));
  }

  // ---- paging and tool results ----------------------------------------------------------------

  @Test
  void pagedIteratesAllPagesLazily() {
    Paged<Session> all = client().listSessions(2);
    assertEquals(List.of("s0", "s1", "s2", "s3", "s4", "s5"),
        all.stream().map(Session::id).collect(Collectors.toList()));
    assertEquals(3, headers.size(), "three pages");
    int pages = 0;
    for (Paged.Page<Session> page : all.pages()) {
      assertEquals(2, page.items().size());
      pages++;
    }
    assertEquals(3, pages);
    headers.clear();
    assertEquals("s0", client().listSessions().iterator().next().id());
    assertEquals(1, headers.size(), "only the first page is fetched");
  }

  @Test
  void readToolResultPagesAndChecksTheDigest() {
    StringBuilder text = new StringBuilder();
    while (text.length() < 60_000) {
      text.append("abc");
    }
    fake.toolData = text.toString();
    fake.toolSha = Engine.sha256Hex(fake.toolData.getBytes(StandardCharsets.UTF_8));
    ToolResult r = client().readToolResultOfCall("s1", "call_1");
    assertEquals(fake.toolData, r.text());
    assertEquals("ref_1", r.resultRef());
    assertEquals(4, reads.size(), "16384-byte pages by default: " + reads);
    assertEquals(16_384, reads.get(0).getLimit());
    assertEquals("call_1", reads.get(0).getToolCallId());
    assertEquals("ref_1", reads.get(1).getResultRef(), "later pages name the result by its ref");

    fake.toolSha = "0".repeat(64);
    CtxfoldException e = assertThrows(CtxfoldException.class, () -> client().readToolResult("s1", "ref_1"));
    assertEquals(Status.Code.DATA_LOSS, e.code());
    assertTrue(e.is(ErrorReason.RESULT_CHECKSUM_MISMATCH));
    assertEquals(CtxfoldException.CLIENT_DOMAIN, e.domain());
  }

  // ---- request ids, fork, async ---------------------------------------------------------------

  @Test
  void appendAndPrepareAlwaysSendARequestId() {
    CtxfoldClient c = client();
    fake.prepareScript = List.of(result(1, false, 1, "a"));
    c.appendMessages("s1", Messages.user("a"));
    c.appendMessages("s1", List.of(Messages.user("b")), "mine");
    c.prepare("s1", Messages.user("c"));
    String generated = appends.get(0).getRequestId();
    assertTrue(generated.matches("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"), generated);
    assertEquals("mine", appends.get(1).getRequestId());
    assertTrue(!prepares.get(0).getRequestId().isEmpty() && !prepares.get(0).getRequestId().equals(generated));
  }

  @Test
  void clientSettingsAndArgumentsAreRefusedBeforeAnyCall() {
    for (org.junit.jupiter.api.function.Executable bad : List.<org.junit.jupiter.api.function.Executable>of(
        () -> CtxfoldClient.builder().build(),
        () -> CtxfoldClient.builder().bearerToken("two words"),
        () -> CtxfoldClient.builder().maxCachedViews(-1),
        () -> CtxfoldClient.builder().unaryDeadline(Duration.ZERO),
        () -> ToolFormat.of("openai_chat_v2"))) {
      CtxfoldException e = assertThrows(CtxfoldException.class, bad);
      assertTrue(e.is(ErrorReason.INVALID_CLIENT_ARGUMENT) && CtxfoldException.CLIENT_DOMAIN.equals(e.domain()), e.toString());
    }
    CtxfoldClient c = client();
    assertTrue(assertThrows(CtxfoldException.class, () -> c.listSessions(1001).toList()).is(ErrorReason.INVALID_PAGE_SIZE));
    assertTrue(assertThrows(CtxfoldException.class, () -> c.getSession("")).is(ErrorReason.SESSION_ID_REQUIRED));
    assertTrue(assertThrows(CtxfoldException.class, () -> c.readToolResult("s1", "tr_1", 3)).is(ErrorReason.LIMIT_OUT_OF_RANGE));
    assertTrue(assertThrows(CtxfoldException.class, () -> c.readToolResultOfCall("s1", "", 4096))
        .is(ErrorReason.RESULT_REF_REQUIRED));
    assertTrue(assertThrows(CtxfoldException.class, () -> c.rewind("s1", -1)).is(ErrorReason.SEQ_OUT_OF_RANGE));
    assertTrue(assertThrows(CtxfoldException.class, () -> c.retry("s1", 0)).is(ErrorReason.SEQ_OUT_OF_RANGE));
    assertTrue(assertThrows(CtxfoldException.class, () -> CompactOptions.builder().keepTokens(-1))
        .is(ErrorReason.INVALID_REQUEST));
    assertTrue(forks.isEmpty() && prepares.isEmpty(), "nothing reached the server");
  }

  @Test
  void textThatIsNotUnicodeIsRefusedBeforeAnyCallNamingTheField() {
    // protobuf-java writes a lone surrogate as '?': the server would store other text than the agent's.
    String cut = "\uD83D\uDE00".substring(0, 1);
    CtxfoldClient c = client();
    CtxfoldException appended = assertThrows(CtxfoldException.class,
        () -> c.appendMessages("s1", Messages.user("fine"), Messages.user("log " + cut)));
    assertTrue(appended.is(ErrorReason.INVALID_TEXT) && CtxfoldException.CLIENT_DOMAIN.equals(appended.domain()),
        appended.toString());
    assertEquals(Status.Code.INVALID_ARGUMENT, appended.code());
    assertEquals("messages[1].content", appended.metadata().get("field"));
    Message call = Messages.assistant("", Messages.toolCall("c1", "bash", "{\"cmd\": \"" + cut + "\"}"));
    CtxfoldException prepared = assertThrows(CtxfoldException.class,
        () -> c.prepare("s1", PrepareOptions.appending(call)));
    assertEquals("append[0].tool_calls[0].arguments", prepared.metadata().get("field"));
    assertTrue(appends.isEmpty() && prepares.isEmpty(), "nothing reached the server");
  }

  @Test
  void forkAtHeadIsExplicit() {
    CtxfoldClient c = client();
    c.forkAtHead("s1");
    c.fork("s1", 3);
    assertEquals(List.of(0L, 3L), forks.stream().map(ForkRequest::getAtSeq).collect(Collectors.toList()));
    CtxfoldException zero = assertThrows(CtxfoldException.class, () -> c.fork("s1", 0));
    assertTrue(zero.is(ErrorReason.SEQ_OUT_OF_RANGE), "a seq of 0 is never the head");
  }

  @Test
  void theAsyncClientSharesTheViewCacheAndDeliversProgress() {
    CtxfoldClient c = client();
    fake.prepareScripts.add(List.of(progress(FoldStage.FOLD_STAGE_PLANNED), result(10, false, 2, "a", "b")));
    fake.prepareScripts.add(List.of(result(11, true, 3, "c")));
    List<FoldStage> seen = new CopyOnWriteArrayList<>();
    CompletableFuture<View> first = c.async().prepare("s1",
        PrepareOptions.builder().onProgress(p -> seen.add(p.stage())).build());
    assertEquals(List.of("a", "b"), contents(first.join().messages()));
    assertEquals(List.of(FoldStage.FOLD_STAGE_PLANNED), seen);
    View second = c.prepare("s1", Messages.user("c"));
    assertEquals(10, prepares.get(1).getKnownViewVersion(), "the blocking client sees the async view");
    assertEquals(List.of("a", "b", "c"), contents(second.messages()));

    fake.failure = com.google.rpc.Status.newBuilder().setCode(Code.NOT_FOUND_VALUE)
        .addDetails(Any.pack(ErrorInfo.newBuilder().setReason("SESSION_NOT_FOUND").build())).build();
    Throwable failed = assertThrows(java.util.concurrent.CompletionException.class,
        () -> c.async().getSession("s1").join()).getCause();
    assertTrue(((CtxfoldException) failed).is(ErrorReason.SESSION_NOT_FOUND));
  }

  // ---- cancellation ---------------------------------------------------------------------------

  @Test
  void cancellingAFutureCancelsItsCall() throws Exception {
    fake.holdPrepare = true;
    CompletableFuture<View> view = client().async().prepare("s1", PrepareOptions.defaults());
    assertTrue(fake.prepareHeld.await(5, TimeUnit.SECONDS));
    view.cancel(true);
    assertTrue(fake.prepareCancelled.await(5, TimeUnit.SECONDS), "the Prepare call went on after Future.cancel");
  }

  @Test
  void cancellingAFutureCancelsTheCallOfALaterStep() throws Exception {
    fake.holdPrepare = true; // retry = rewind, then prepare: the prepare starts in the rewind's callback
    CompletableFuture<View> view = client().async().retry("s1", 2, p -> { });
    assertTrue(fake.prepareHeld.await(5, TimeUnit.SECONDS));
    view.cancel(true);
    assertTrue(fake.prepareCancelled.await(5, TimeUnit.SECONDS), "the Prepare call went on after Future.cancel");
  }

  @Test
  void interruptingABlockingCallCancelsItsCallAndKeepsTheInterrupt() throws Exception {
    fake.holdPrepare = true;
    Thread caller = Thread.currentThread();
    Thread interrupter = new Thread(() -> {
      try {
        fake.prepareHeld.await(5, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        return;
      }
      caller.interrupt();
    });
    interrupter.start();
    CtxfoldException e = assertThrows(CtxfoldException.class, () -> client().prepare("s1"));
    assertEquals(Status.Code.CANCELLED, e.code());
    assertTrue(Thread.interrupted(), "the caller's interrupt status is kept");
    assertTrue(fake.prepareCancelled.await(5, TimeUnit.SECONDS), "the Prepare call went on after the interrupt");
  }

  @Test
  void prepareEventsStreamProgressThenTheResult() {
    fake.prepareScript = List.of(progress(FoldStage.FOLD_STAGE_PLANNED),
        progress(FoldStage.FOLD_STAGE_PASS_COMMITTED), result(10, false, 1, "a"));
    List<FoldEvent> events = new ArrayList<>();
    for (FoldEvent event : client().prepareEvents("s1", PrepareOptions.defaults())) { // no cast, no close
      events.add(event);
    }
    assertEquals(3, events.size());
    assertEquals(FoldStage.FOLD_STAGE_PLANNED, ((FoldEvent.Progress) events.get(0)).progress().stage());
    assertEquals(List.of("a"), contents(((FoldEvent.Result) events.get(2)).view().messages()));
  }

  @Test
  void thePublisherEmitsProgressThenTheResultThenCompletes() {
    fake.prepareScript = List.of(progress(FoldStage.FOLD_STAGE_PLANNED), result(10, false, 1, "a"));
    List<Object> seen = new CopyOnWriteArrayList<>();
    CompletableFuture<Void> done = new CompletableFuture<>();
    client().async().prepareEvents("s1", PrepareOptions.defaults()).subscribe(new Flow.Subscriber<FoldEvent>() {
      @Override
      public void onSubscribe(Flow.Subscription subscription) {
        subscription.request(Long.MAX_VALUE);
      }

      @Override
      public void onNext(FoldEvent item) {
        seen.add(item instanceof FoldEvent.Progress p ? p.progress().stage() : "result");
      }

      @Override
      public void onError(Throwable throwable) {
        done.completeExceptionally(throwable);
      }

      @Override
      public void onComplete() {
        done.complete(null);
      }
    });
    done.orTimeout(10, TimeUnit.SECONDS).join();
    assertEquals(List.of(FoldStage.FOLD_STAGE_PLANNED, "result"), seen);
  }

  @Test
  void cancellingTheSubscriptionOfAnEventPublisherCancelsItsCall() throws Exception {
    fake.holdPrepare = true;
    CompletableFuture<Flow.Subscription> subscribed = new CompletableFuture<>();
    client().async().prepareEvents("s1", PrepareOptions.defaults()).subscribe(new Flow.Subscriber<FoldEvent>() {
      @Override
      public void onSubscribe(Flow.Subscription subscription) {
        subscribed.complete(subscription);
      }

      @Override
      public void onNext(FoldEvent item) { }

      @Override
      public void onError(Throwable throwable) { }

      @Override
      public void onComplete() { }
    });
    assertTrue(fake.prepareHeld.await(5, TimeUnit.SECONDS));
    subscribed.get(5, TimeUnit.SECONDS).cancel();
    assertTrue(fake.prepareCancelled.await(5, TimeUnit.SECONDS), "the Prepare call went on after the subscriber left");
  }

  @Test
  void theViewCacheHolds256SessionsByDefault() {
    CtxfoldClient c = client();
    for (int i = 0; i < 258; i++) {
      fake.prepareScripts.add(List.of(result(10 + i, false, 1, "a")));
    }
    for (int i = 0; i < 257; i++) {
      c.prepare("s" + i);
    }
    assertTrue(c.lastView("s0").isEmpty(), "the least recently used view was evicted");
    assertTrue(c.lastView("s1").isPresent());
    assertEquals(256, java.util.stream.IntStream.range(0, 257).filter(i -> c.lastView("s" + i).isPresent()).count());
  }

  // ---- the server breaking the protocol -------------------------------------------------------

  private static void assertProtocolViolation(org.junit.jupiter.api.function.Executable call) {
    CtxfoldException e = assertThrows(CtxfoldException.class, call);
    assertEquals(Status.Code.INTERNAL, e.code());
    assertTrue(e.is(ErrorReason.PROTOCOL_VIOLATION), e.toString());
    assertEquals(CtxfoldException.CLIENT_DOMAIN, e.domain());
  }

  @Test
  void aRepeatedPageTokenIsAProtocolViolation() {
    fake.loopPageTokens = true;
    assertProtocolViolation(() -> client().listSessions().toList());
    Throwable async = assertThrows(java.util.concurrent.CompletionException.class,
        () -> client().async().listSessions().toList().join()).getCause();
    assertTrue(((CtxfoldException) async).is(ErrorReason.PROTOCOL_VIOLATION), async.toString());
  }

  @Test
  void aStreamGoingOnAfterItsResultIsAProtocolViolation() {
    fake.prepareScript = List.of(result(1, false, 1, "a"), progress(FoldStage.FOLD_STAGE_PLANNED));
    assertProtocolViolation(() -> client().prepare("s1"));
  }

  @Test
  void aWholeViewWhoseCountDisagreesIsAProtocolViolation() {
    fake.prepareScript = List.of(result(1, false, 3, "a"));
    assertProtocolViolation(() -> client().prepare("s1"));
  }
}

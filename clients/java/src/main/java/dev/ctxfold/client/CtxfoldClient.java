package dev.ctxfold.client;

import dev.ctxfold.v1.AppendMessagesRequest;
import dev.ctxfold.v1.CompactRequest;
import dev.ctxfold.v1.CompactResponse;
import dev.ctxfold.v1.ContextServiceGrpc;
import dev.ctxfold.v1.CreateSessionRequest;
import dev.ctxfold.v1.DeleteSessionRequest;
import dev.ctxfold.v1.FoldProgress;
import dev.ctxfold.v1.ForkRequest;
import dev.ctxfold.v1.GetContextStateRequest;
import dev.ctxfold.v1.GetSessionRequest;
import dev.ctxfold.v1.ListMessagesRequest;
import dev.ctxfold.v1.ListMessagesResponse;
import dev.ctxfold.v1.ListSessionsRequest;
import dev.ctxfold.v1.ListSessionsResponse;
import dev.ctxfold.v1.Message;
import dev.ctxfold.v1.ObserveUsageRequest;
import dev.ctxfold.v1.ObserveUsageResponse;
import dev.ctxfold.v1.PrepareRequest;
import dev.ctxfold.v1.PrepareResponse;
import dev.ctxfold.v1.ReadToolResultRequest;
import dev.ctxfold.v1.ReadToolResultResponse;
import dev.ctxfold.v1.RewindRequest;
import dev.ctxfold.v1.Session;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import io.grpc.stub.AbstractStub;
import io.grpc.stub.MetadataUtils;
import io.opentelemetry.api.OpenTelemetry;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.function.Supplier;
import java.util.regex.Pattern;

/**
 * A client of the ctxfold {@code ContextService}.
 *
 * <pre>{@code
 * try (CtxfoldClient client = CtxfoldClient.builder()
 *     .target("127.0.0.1:50051")
 *     .bearerToken(System.getenv("CTXFOLD_TOKEN"))
 *     .defaultDeadline(Duration.ofSeconds(30))
 *     .build()) {
 *   Session session = client.createSession(SessionConfig.builder().contextWindow(128_000).build());
 *   PreparedContext ctx = client.prepare(session.getId(), PrepareOptions.appending(Messages.user("hi")));
 *   // send ctx.messages() to the model ...
 * }
 * }</pre>
 *
 * <p>All methods block and are thread-safe. Failures are thrown as the unchecked
 * {@link CtxfoldException} carrying the gRPC code and the server's ErrorInfo reason and metadata.
 *
 * <p>The client keeps, per session, the last full view it received (for the 1024 most recently
 * used sessions by default, see {@link Builder#maxCachedViews}); {@code prepare} sends its version
 * as {@code known_view_version} so the server may answer with only the new messages, and puts the
 * full view back together ({@link PreparedContext#messages()}).
 *
 * <p>{@link #withDeadline(Duration)} and {@link #withTraceparent(String)} return lightweight
 * views of the same client (same connection and view cache); close the client they came from.
 */
public final class CtxfoldClient implements AutoCloseable {
  /** Largest page ReadToolResult serves. */
  public static final int MAX_TOOL_RESULT_PAGE = 24_576;

  private static final Pattern TRACEPARENT =
      Pattern.compile("[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}");

  private final Shared shared;
  private final Duration deadline;
  private final String traceparent;
  private final String tracestate;
  private final boolean root;

  /** Connection and view cache, shared by a client and the views derived from it. */
  private static final class Shared {
    final Channel channel;
    final ManagedChannel owned;
    final Map<String, View> views;

    Shared(Channel channel, ManagedChannel owned, int maxViews) {
      this.channel = channel;
      this.owned = owned;
      // The most recently used sessions' views; the oldest is dropped past maxViews (its next
      // prepare then asks for the whole view).
      this.views = Collections.synchronizedMap(new LinkedHashMap<>(16, 0.75f, true) {
        private static final long serialVersionUID = 1L;

        @Override
        protected boolean removeEldestEntry(Map.Entry<String, View> eldest) {
          return size() > maxViews;
        }
      });
    }
  }

  /** The last full view received for a session. */
  private record View(long version, List<Message> messages) {}

  private CtxfoldClient(Shared shared, Duration deadline, String traceparent, String tracestate, boolean root) {
    this.shared = shared;
    this.deadline = deadline;
    this.traceparent = traceparent;
    this.tracestate = tracestate;
    this.root = root;
  }

  public static Builder builder() {
    return new Builder();
  }

  /** A plaintext client of {@code target} ({@code host:port}) with default settings. */
  public static CtxfoldClient connect(String target) {
    return builder().target(target).build();
  }

  // ---- derived views --------------------------------------------------------------------------

  /** The same client with another deadline for each call (a whole Prepare stream counts as one). */
  public CtxfoldClient withDeadline(Duration deadline) {
    if (deadline != null && (deadline.isNegative() || deadline.isZero())) {
      throw new IllegalArgumentException("deadline must be positive");
    }
    return new CtxfoldClient(shared, deadline, traceparent, tracestate, false);
  }

  /** The same client with no deadline. */
  public CtxfoldClient withoutDeadline() {
    return new CtxfoldClient(shared, null, traceparent, tracestate, false);
  }

  /**
   * The same client sending this W3C {@code traceparent} on every call instead of the active
   * OpenTelemetry context's (for callers that carry trace context without OpenTelemetry).
   */
  public CtxfoldClient withTraceparent(String traceparent) {
    return withTraceparent(traceparent, null);
  }

  /** As {@link #withTraceparent(String)}, with a {@code tracestate}. */
  public CtxfoldClient withTraceparent(String traceparent, String tracestate) {
    if (traceparent != null && !TRACEPARENT.matcher(traceparent).matches()) {
      throw new IllegalArgumentException("not a W3C traceparent: " + traceparent);
    }
    return new CtxfoldClient(shared, deadline, traceparent, tracestate, false);
  }

  // ---- stubs ----------------------------------------------------------------------------------

  private <S extends AbstractStub<S>> S configure(S stub) {
    if (deadline != null) {
      stub = stub.withDeadlineAfter(deadline.toNanos(), TimeUnit.NANOSECONDS);
    }
    if (traceparent != null) {
      stub = stub.withOption(TraceContextInterceptor.TRACEPARENT, traceparent);
      if (tracestate != null) {
        stub = stub.withOption(TraceContextInterceptor.TRACESTATE, tracestate);
      }
    }
    return stub;
  }

  /**
   * A generated blocking stub on this client's channel, with its auth, trace propagation and
   * deadline: the escape hatch for anything the idiomatic layer does not cover. Its calls throw
   * {@link StatusRuntimeException}; {@link CtxfoldException#from(Throwable)} converts them.
   */
  public ContextServiceGrpc.ContextServiceBlockingStub blockingStub() {
    return configure(ContextServiceGrpc.newBlockingStub(shared.channel));
  }

  /** A generated async stub on this client's channel (see {@link #blockingStub()}). */
  public ContextServiceGrpc.ContextServiceStub asyncStub() {
    return configure(ContextServiceGrpc.newStub(shared.channel));
  }

  /** The channel with this client's interceptors (auth, trace context). */
  public Channel channel() {
    return shared.channel;
  }

  private static <T> T call(Supplier<T> rpc) {
    try {
      return rpc.get();
    } catch (StatusRuntimeException e) {
      throw CtxfoldException.from(e);
    }
  }

  private static String requireId(String sessionId) {
    Objects.requireNonNull(sessionId, "sessionId");
    if (sessionId.isEmpty()) {
      throw new IllegalArgumentException("sessionId is empty");
    }
    return sessionId;
  }

  // ---- sessions -------------------------------------------------------------------------------

  /** Creates a session; the returned {@link Session} carries its {@code id} and filled-in config. */
  public Session createSession(SessionConfig config) {
    Objects.requireNonNull(config, "config");
    return call(() -> blockingStub()
        .createSession(CreateSessionRequest.newBuilder().setConfig(config.toProto()).build())
        .getSession());
  }

  public Session getSession(String sessionId) {
    return call(() -> blockingStub()
        .getSession(GetSessionRequest.newBuilder().setSessionId(requireId(sessionId)).build())
        .getSession());
  }

  /** Deletes a session and everything only it refers to. */
  public void deleteSession(String sessionId) {
    call(() -> blockingStub()
        .deleteSession(DeleteSessionRequest.newBuilder().setSessionId(requireId(sessionId)).build()));
    shared.views.remove(sessionId);
  }

  /** The caller's sessions, newest first, fetched page by page (100 a page). */
  public Paged<Session> listSessions() {
    return listSessions(0);
  }

  /** The caller's sessions, newest first; {@code pageSize} 1..1000, 0 = the server's default. */
  public Paged<Session> listSessions(int pageSize) {
    return new Paged<>(token -> {
      ListSessionsResponse page = call(() -> blockingStub().listSessions(
          ListSessionsRequest.newBuilder().setPageSize(pageSize).setPageToken(token).build()));
      return new Paged.Page<>(page.getSessionsList(), page.getNextPageToken());
    });
  }

  /**
   * New session holding the source's transcript up to and including {@code atSeq} (0 = head).
   */
  public Session fork(String sessionId, long atSeq) {
    return fork(sessionId, atSeq, null);
  }

  /**
   * As {@link #fork(String, long)}, with config overrides built by {@link SessionConfig#overrides()}:
   * each field set replaces the source's value.
   */
  public Session fork(String sessionId, long atSeq, SessionConfig overrides) {
    ForkRequest.Builder request = ForkRequest.newBuilder().setSessionId(requireId(sessionId)).setAtSeq(atSeq);
    if (overrides != null) {
      request.setConfig(overrides.toProto());
    }
    return call(() -> blockingStub().fork(request.build()).getSession());
  }

  /** Moves the head back to {@code toSeq}; later messages become abandoned (still listable). */
  public Session rewind(String sessionId, long toSeq) {
    if (toSeq < 0) {
      throw new IllegalArgumentException("toSeq must be >= 0");
    }
    Session session = call(() -> blockingStub()
        .rewind(RewindRequest.newBuilder().setSessionId(requireId(sessionId)).setToSeq(toSeq).build())
        .getSession());
    shared.views.remove(sessionId);
    return session;
  }

  /** The session's context state ("sidecar", schema version 3) as a JSON document. */
  public String getContextState(String sessionId) {
    return call(() -> blockingStub()
        .getContextState(GetContextStateRequest.newBuilder().setSessionId(requireId(sessionId)).build())
        .getStateJson());
  }

  // ---- transcript -----------------------------------------------------------------------------

  /** Appends messages atomically; returns them with {@code id} and {@code seq}. */
  public List<Message> append(String sessionId, Message... messages) {
    return append(sessionId, List.of(messages), "");
  }

  /**
   * Appends messages atomically; with a non-empty {@code requestId}, a retried call returns the
   * first call's messages instead of appending again.
   */
  public List<Message> append(String sessionId, List<Message> messages, String requestId) {
    AppendMessagesRequest request = AppendMessagesRequest.newBuilder()
        .setSessionId(requireId(sessionId))
        .addAllMessages(messages)
        .setRequestId(requestId == null ? "" : requestId)
        .build();
    return call(() -> blockingStub().appendMessages(request).getMessagesList());
  }

  /** The live canonical transcript in seq order, fetched page by page. */
  public Paged<Message> listMessages(String sessionId) {
    return listMessages(sessionId, 0, false);
  }

  /**
   * The canonical transcript in seq order; with {@code includeAbandoned}, also the messages
   * abandoned by rewinds (marked {@code abandoned}).
   */
  public Paged<Message> listMessages(String sessionId, int pageSize, boolean includeAbandoned) {
    requireId(sessionId);
    return new Paged<>(token -> {
      ListMessagesResponse page = call(() -> blockingStub().listMessages(ListMessagesRequest.newBuilder()
          .setSessionId(sessionId)
          .setPageSize(pageSize)
          .setPageToken(token)
          .setIncludeAbandoned(includeAbandoned)
          .build()));
      return new Paged.Page<>(page.getMessagesList(), page.getNextPageToken());
    });
  }

  // ---- prepare / compact ----------------------------------------------------------------------

  /** Prepares the view to send now, appending nothing. */
  public PreparedContext prepare(String sessionId) {
    return prepare(sessionId, PrepareOptions.defaults());
  }

  /** Appends {@code messages} and prepares the view to send. */
  public PreparedContext prepare(String sessionId, Message... messages) {
    return prepare(sessionId, PrepareOptions.appending(messages));
  }

  /**
   * Appends {@code options.append()}, lets the server maintain the context when it reached the
   * trigger (streaming {@link FoldProgress} events to {@code options.onProgress()} on this thread)
   * and returns the full view to send to the model.
   */
  public PreparedContext prepare(String sessionId, PrepareOptions options) {
    requireId(sessionId);
    Objects.requireNonNull(options, "options");
    View known = options.useDelta() ? shared.views.get(sessionId) : null;
    PrepareRequest.Builder request = PrepareRequest.newBuilder()
        .setSessionId(sessionId)
        .addAllAppend(options.append())
        .setOverflow(options.overflow())
        .setRequestId(options.requestId());
    if (known != null) {
      request.setKnownViewVersion(known.version());
    }
    List<FoldProgress> progress = new ArrayList<>();
    dev.ctxfold.v1.PreparedContext result = stream(
        () -> blockingStub().prepare(request.build()),
        r -> r.hasProgress() ? r.getProgress() : null,
        r -> r.hasResult() ? r.getResult() : null,
        progress, options.onProgress());
    List<Message> full = assemble(sessionId, known, result);
    if (full == null) {
      // The delta did not fit the view held here (it should not happen): ask for the whole view.
      // The append already happened, so this second call appends nothing.
      shared.views.remove(sessionId);
      PreparedContext whole = prepare(sessionId, PrepareOptions.builder().useDelta(false).build());
      List<FoldProgress> all = new ArrayList<>(progress);
      all.addAll(whole.progress());
      return new PreparedContext(whole.toProto(), whole.messages(), all);
    }
    return new PreparedContext(result, full, progress);
  }

  /** Folds the session's history into a summary checkpoint now (manual compaction). */
  public PreparedContext compact(String sessionId) {
    return compact(sessionId, "", p -> { });
  }

  /**
   * Folds history now, even below the trigger, with {@code focus} appended to the summary
   * instructions; progress events go to {@code onProgress} on this thread.
   */
  public PreparedContext compact(String sessionId, String focus, Consumer<FoldProgress> onProgress) {
    requireId(sessionId);
    CompactRequest request = CompactRequest.newBuilder()
        .setSessionId(sessionId)
        .setFocus(focus == null ? "" : focus)
        .build();
    List<FoldProgress> progress = new ArrayList<>();
    dev.ctxfold.v1.PreparedContext result = stream(
        () -> blockingStub().compact(request),
        (CompactResponse r) -> r.hasProgress() ? r.getProgress() : null,
        r -> r.hasResult() ? r.getResult() : null,
        progress, onProgress == null ? p -> { } : onProgress);
    List<Message> full = assemble(sessionId, null, result);
    return new PreparedContext(result, full, progress);
  }

  /** Reads a server stream of progress events ending with one result. */
  private <R> dev.ctxfold.v1.PreparedContext stream(
      Supplier<Iterator<R>> open,
      java.util.function.Function<R, FoldProgress> progressOf,
      java.util.function.Function<R, dev.ctxfold.v1.PreparedContext> resultOf,
      List<FoldProgress> progress,
      Consumer<FoldProgress> listener) {
    io.grpc.Context.CancellableContext scope = io.grpc.Context.current().withCancellation();
    try {
      Iterator<R> items;
      try {
        items = scope.call(open::get);
      } catch (RuntimeException e) {
        throw e;
      } catch (Exception e) {
        throw new IllegalStateException(e);
      }
      dev.ctxfold.v1.PreparedContext result = null;
      while (items.hasNext()) {
        R item = items.next();
        FoldProgress p = progressOf.apply(item);
        if (p != null) {
          progress.add(p);
          listener.accept(p);
          continue;
        }
        dev.ctxfold.v1.PreparedContext r = resultOf.apply(item);
        if (r != null) {
          result = r;
        }
      }
      if (result == null) {
        throw new CtxfoldException(Status.Code.INTERNAL, "the stream ended without a result",
            "NO_RESULT", "", Map.of(), null);
      }
      return result;
    } catch (StatusRuntimeException e) {
      throw CtxfoldException.from(e);
    } finally {
      scope.cancel(null);
    }
  }

  /** The full view of a result (applying a delta to {@code known}); null when it does not fit. */
  private List<Message> assemble(String sessionId, View known, dev.ctxfold.v1.PreparedContext result) {
    List<Message> full;
    if (result.getDelta()) {
      long keep = result.getViewMessageCount() - result.getMessagesCount();
      if (known == null || keep != known.messages().size()) {
        return null;
      }
      full = new ArrayList<>(known.messages().size() + result.getMessagesCount());
      full.addAll(known.messages());
      full.addAll(result.getMessagesList());
      full = List.copyOf(full);
    } else {
      full = result.getMessagesList();
    }
    shared.views.put(sessionId, new View(result.getViewVersion(), full));
    return full;
  }

  /** Drops the view this client holds for a session: the next prepare asks for the whole view. */
  public void forgetView(String sessionId) {
    shared.views.remove(sessionId);
  }

  // ---- edit / retry ---------------------------------------------------------------------------

  /**
   * Replaces the message at {@code seq} (and abandons everything after it): rewinds to
   * {@code seq - 1} and appends {@code replacement}. Returns the new message with its id and seq.
   * The old version stays listable with {@code listMessages(id, 0, true)}.
   */
  public Message edit(String sessionId, long seq, Message replacement) {
    if (seq < 1) {
      throw new IllegalArgumentException("seq must be >= 1");
    }
    Objects.requireNonNull(replacement, "replacement");
    rewind(sessionId, seq - 1);
    return append(sessionId, replacement).get(0);
  }

  /** As {@link #edit}, then prepares the view in the same round trip as the append. */
  public PreparedContext editAndPrepare(String sessionId, long seq, Message replacement, PrepareOptions options) {
    if (seq < 1) {
      throw new IllegalArgumentException("seq must be >= 1");
    }
    Objects.requireNonNull(replacement, "replacement");
    rewind(sessionId, seq - 1);
    PrepareOptions.Builder merged = PrepareOptions.builder().append(replacement).append(options.append())
        .overflow(options.overflow()).onProgress(options.onProgress()).useDelta(options.useDelta());
    if (!options.requestId().isEmpty()) {
      merged.requestId(options.requestId());
    }
    return prepare(sessionId, merged.build());
  }

  /**
   * Retries a model answer: rewinds to just before the assistant message at {@code assistantSeq}
   * (which, and everything after it, becomes abandoned) and prepares the view again, so the model
   * can be asked once more.
   */
  public PreparedContext retry(String sessionId, long assistantSeq) {
    return retry(sessionId, assistantSeq, PrepareOptions.defaults());
  }

  /** As {@link #retry(String, long)}, with prepare options (for example a progress listener). */
  public PreparedContext retry(String sessionId, long assistantSeq, PrepareOptions options) {
    if (assistantSeq < 1) {
      throw new IllegalArgumentException("assistantSeq must be >= 1");
    }
    rewind(sessionId, assistantSeq - 1);
    return prepare(sessionId, options);
  }

  // ---- usage ----------------------------------------------------------------------------------

  /** Records the provider's usage for the view {@code viewVersion} (statistics, calibration). */
  public Calibration observeUsage(String sessionId, long viewVersion, Usage usage) {
    Objects.requireNonNull(usage, "usage");
    ObserveUsageResponse response = call(() -> blockingStub().observeUsage(ObserveUsageRequest.newBuilder()
        .setSessionId(requireId(sessionId))
        .setViewVersion(viewVersion)
        .setInputTokens(usage.inputTokens())
        .setCachedInputTokens(usage.cachedInputTokens())
        .setOutputTokens(usage.outputTokens())
        .setFinishReason(usage.finishReason())
        .build()));
    return new Calibration(response.getCalibration(), response.getCalibrationAccepted());
  }

  /** Records the provider's usage for a prepared view. */
  public Calibration observeUsage(String sessionId, PreparedContext context, Usage usage) {
    return observeUsage(sessionId, context.viewVersion(), usage);
  }

  // ---- tool results ---------------------------------------------------------------------------

  /**
   * One page of a stored raw tool result, named by {@code resultRef} (preferred) or
   * {@code toolCallId} (one of them empty); {@code limit} 4..24576 bytes, 0 = 16384.
   */
  public ReadToolResultResponse readToolResultPage(
      String sessionId, String resultRef, String toolCallId, long offset, int limit) {
    ReadToolResultRequest request = ReadToolResultRequest.newBuilder()
        .setSessionId(requireId(sessionId))
        .setResultRef(resultRef == null ? "" : resultRef)
        .setToolCallId(toolCallId == null ? "" : toolCallId)
        .setOffset(offset)
        .setLimit(limit)
        .build();
    return call(() -> blockingStub().readToolResult(request));
  }

  /** The whole raw tool result named by its {@code result_ref}, read page by page and checked. */
  public ToolResult readToolResult(String sessionId, String resultRef) {
    Objects.requireNonNull(resultRef, "resultRef");
    return readWhole(sessionId, resultRef, "");
  }

  /** The whole raw result of the tool call {@code toolCallId} (must be unambiguous). */
  public ToolResult readToolResultOfCall(String sessionId, String toolCallId) {
    Objects.requireNonNull(toolCallId, "toolCallId");
    return readWhole(sessionId, "", toolCallId);
  }

  private ToolResult readWhole(String sessionId, String resultRef, String toolCallId) {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    String ref = resultRef;
    String callId = toolCallId;
    String sha = null;
    long total = -1;
    long offset = 0;
    while (true) {
      ReadToolResultResponse page = readToolResultPage(sessionId, ref, callId, offset, MAX_TOOL_RESULT_PAGE);
      if (page.getOffset() != offset) {
        throw integrity("page starts at " + page.getOffset() + ", asked for " + offset);
      }
      if (sha == null) {
        sha = page.getSha256();
        total = page.getTotalBytes();
        if (!page.getResultRef().isEmpty()) {
          ref = page.getResultRef();
          callId = "";
        }
      }
      byte[] data = page.getData().getBytes(StandardCharsets.UTF_8);
      bytes.write(data, 0, data.length);
      if (page.getComplete()) {
        break;
      }
      if (page.getNextOffset() <= offset) {
        throw integrity("next_offset " + page.getNextOffset() + " does not advance past " + offset);
      }
      offset = page.getNextOffset();
    }
    byte[] all = bytes.toByteArray();
    if (all.length != total) {
      throw integrity("read " + all.length + " bytes, the server reported " + total);
    }
    String digest = sha256Hex(all);
    if (!digest.equalsIgnoreCase(sha)) {
      throw integrity("sha256 " + digest + " of the bytes read differs from the server's " + sha);
    }
    return new ToolResult(ref, new String(all, StandardCharsets.UTF_8), total, sha);
  }

  private static CtxfoldException integrity(String message) {
    return new CtxfoldException(Status.Code.DATA_LOSS, message, "TOOL_RESULT_INTEGRITY", "", Map.of(), null);
  }

  static String sha256Hex(byte[] data) {
    try {
      return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(data));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  // ---- lifecycle ------------------------------------------------------------------------------

  /**
   * Closes the connection this client opened (waiting up to 5 seconds for calls in flight).
   * A no-op on derived views and on clients built around a caller's channel.
   */
  @Override
  public void close() {
    if (!root || shared.owned == null) {
      return;
    }
    shared.owned.shutdown();
    try {
      if (!shared.owned.awaitTermination(5, TimeUnit.SECONDS)) {
        shared.owned.shutdownNow();
      }
    } catch (InterruptedException e) {
      shared.owned.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }

  // ---- builder --------------------------------------------------------------------------------

  /** Builds a {@link CtxfoldClient}. Plaintext unless a TLS option is set. */
  public static final class Builder {
    private String target;
    private Channel channel;
    private String bearerToken;
    private boolean tls;
    private Path trustCertificates;
    private Path clientCertChain;
    private Path clientPrivateKey;
    private String authority;
    private Duration defaultDeadline;
    private OpenTelemetry openTelemetry;
    private boolean propagateTraceContext = true;
    private int maxInboundMessageBytes = 64 * 1024 * 1024;
    private String userAgent = "ctxfold-java";
    private int maxCachedViews = 1024;
    private final List<ClientInterceptor> interceptors = new ArrayList<>();

    private Builder() {}

    /** The server address: {@code host:port}, or any gRPC target URI ({@code dns:///host:port}). */
    public Builder target(String target) {
      this.target = Objects.requireNonNull(target, "target");
      return this;
    }

    /**
     * Use this channel instead of opening one (for in-process tests or a shared channel); the
     * client adds its interceptors and never shuts the channel down.
     */
    public Builder channel(Channel channel) {
      this.channel = Objects.requireNonNull(channel, "channel");
      return this;
    }

    /** Sends {@code authorization: Bearer TOKEN} on every call (null or empty = none). */
    public Builder bearerToken(String token) {
      this.bearerToken = token;
      return this;
    }

    /** Use TLS, trusting the system's root certificates unless {@link #trustCertificates} is set. */
    public Builder useTls() {
      this.tls = true;
      return this;
    }

    /** Use TLS, trusting the CA certificates of this PEM file. */
    public Builder trustCertificates(Path caPem) {
      this.trustCertificates = Objects.requireNonNull(caPem, "caPem");
      this.tls = true;
      return this;
    }

    /** Use mutual TLS, presenting this PEM certificate chain and PKCS#8 PEM private key. */
    public Builder clientCertificate(Path certChainPem, Path privateKeyPem) {
      this.clientCertChain = Objects.requireNonNull(certChainPem, "certChainPem");
      this.clientPrivateKey = Objects.requireNonNull(privateKeyPem, "privateKeyPem");
      this.tls = true;
      return this;
    }

    /** The authority (TLS server name) to use instead of the target's host. */
    public Builder overrideAuthority(String authority) {
      this.authority = Objects.requireNonNull(authority, "authority");
      return this;
    }

    /** Deadline of each call (a whole Prepare or Compact stream counts as one call); null = none. */
    public Builder defaultDeadline(Duration deadline) {
      if (deadline != null && (deadline.isNegative() || deadline.isZero())) {
        throw new IllegalArgumentException("deadline must be positive");
      }
      this.defaultDeadline = deadline;
      return this;
    }

    /** Inject trace context with this OpenTelemetry's propagators (default: global, else W3C). */
    public Builder openTelemetry(OpenTelemetry openTelemetry) {
      this.openTelemetry = Objects.requireNonNull(openTelemetry, "openTelemetry");
      return this;
    }

    /** Whether to inject the active trace context into call metadata (default true). */
    public Builder propagateTraceContext(boolean propagate) {
      this.propagateTraceContext = propagate;
      return this;
    }

    /** Largest response accepted (default 64 MiB: views of large windows are big). */
    public Builder maxInboundMessageBytes(int bytes) {
      if (bytes <= 0) {
        throw new IllegalArgumentException("bytes must be > 0");
      }
      this.maxInboundMessageBytes = bytes;
      return this;
    }

    /** The user agent prefix (default {@code ctxfold-java}). */
    public Builder userAgent(String userAgent) {
      this.userAgent = Objects.requireNonNull(userAgent, "userAgent");
      return this;
    }

    /**
     * How many sessions' last views the client keeps for delta answers (default 1024, least
     * recently used dropped first; 0 = never ask for deltas).
     */
    public Builder maxCachedViews(int sessions) {
      if (sessions < 0) {
        throw new IllegalArgumentException("sessions must be >= 0");
      }
      this.maxCachedViews = sessions;
      return this;
    }

    /** An extra interceptor, run after the client's own. */
    public Builder intercept(ClientInterceptor interceptor) {
      interceptors.add(Objects.requireNonNull(interceptor, "interceptor"));
      return this;
    }

    private ChannelCredentials credentials() {
      if (!tls) {
        return InsecureChannelCredentials.create();
      }
      try {
        TlsChannelCredentials.Builder creds = TlsChannelCredentials.newBuilder();
        if (trustCertificates != null) {
          creds.trustManager(trustCertificates.toFile());
        }
        if (clientCertChain != null) {
          creds.keyManager(clientCertChain.toFile(), clientPrivateKey.toFile());
        }
        return creds.build();
      } catch (IOException e) {
        throw new UncheckedIOException("cannot read TLS key material", e);
      }
    }

    public CtxfoldClient build() {
      ManagedChannel owned = null;
      Channel base = channel;
      if (base == null) {
        if (target == null || target.isEmpty()) {
          throw new IllegalStateException("target (or channel) is required");
        }
        ManagedChannelBuilder<?> b = Grpc.newChannelBuilder(target, credentials())
            .maxInboundMessageSize(maxInboundMessageBytes)
            .userAgent(userAgent);
        if (authority != null) {
          b.overrideAuthority(authority);
        }
        owned = b.build();
        base = owned;
      }
      // ClientInterceptors.intercept runs the last interceptor first.
      List<ClientInterceptor> chain = new ArrayList<>();
      for (int i = interceptors.size() - 1; i >= 0; i--) {
        chain.add(interceptors.get(i));
      }
      if (propagateTraceContext) {
        chain.add(new TraceContextInterceptor(openTelemetry));
      }
      if (bearerToken != null && !bearerToken.isEmpty()) {
        Metadata headers = new Metadata();
        headers.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + bearerToken);
        chain.add(MetadataUtils.newAttachHeadersInterceptor(headers));
      }
      Channel intercepted = ClientInterceptors.intercept(base, chain);
      return new CtxfoldClient(new Shared(intercepted, owned, maxCachedViews), defaultDeadline, null, null, true);
    }
  }
}

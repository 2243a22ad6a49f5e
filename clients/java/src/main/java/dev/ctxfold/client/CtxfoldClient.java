package dev.ctxfold.client;

import dev.ctxfold.v1.ContextServiceGrpc;
import dev.ctxfold.v1.ErrorReason;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.TlsChannelCredentials;
import io.grpc.stub.AbstractStub;
import io.grpc.stub.MetadataUtils;
import io.opentelemetry.api.OpenTelemetry;
import java.io.IOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.regex.Pattern;

/**
 * The blocking client of the ctxfold {@code ContextService}; {@link #async()} is the same client
 * with {@link CompletableFuture} results. Both share one implementation, one connection and one
 * view cache.
 *
 * <pre>{@code
 * try (CtxfoldClient client = CtxfoldClient.builder()
 *     .target("127.0.0.1:50051")
 *     .bearerToken(System.getenv("CTXFOLD_TOKEN"))
 *     .build()) {
 *   Session session = client.createSession(SessionSettings.builder().contextWindow(128_000).build());
 *   View view = client.prepare(session.getId(), Messages.user("hi"));
 *   // send view.messages() to the model ...
 * }
 * }</pre>
 *
 * <p>All methods are thread-safe. Failures are thrown as the unchecked {@link CtxfoldException}
 * carrying the gRPC code, the server's {@link dev.ctxfold.v1.ErrorReason} and metadata.
 *
 * <p>The client keeps, per session, the last whole view it received (for the 256 most recently
 * used sessions by default, see {@link Builder#maxCachedViews}); {@code prepare} sends its version
 * as {@code known_view_version} so the server may answer with only the new messages, and puts the
 * whole view back together ({@link View#messages()}).
 *
 * <p>Defaults: unary calls 30 s, prepare / compact streams 600 s, user agent
 * {@code ctxfold-java/<version>}. {@link #withDeadline(Duration)} and
 * {@link #withTraceparent(String)} return lightweight views of the same client (same connection
 * and view cache); close the client they came from.
 */
public final class CtxfoldClient implements AutoCloseable {
  /** Largest page ReadToolResult serves. */
  public static final int MAX_PAGE_BYTES = Engine.MAX_PAGE_BYTES;
  /** The page ReadToolResult serves when none is asked for. */
  public static final int DEFAULT_PAGE_BYTES = Engine.DEFAULT_PAGE_BYTES;

  private static final Pattern TRACEPARENT =
      Pattern.compile("[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}");

  private final Engine engine;
  private final boolean root;

  CtxfoldClient(Engine engine, boolean root) {
    this.engine = engine;
    this.root = root;
  }

  public static Builder builder() {
    return new Builder();
  }

  /** A plaintext client of {@code target} ({@code host:port}) with default settings. */
  public static CtxfoldClient connect(String target) {
    return builder().target(target).build();
  }

  /** This SDK's version (the project version in the repository's {@code VERSION} file). */
  public static String version() {
    return Version.VALUE;
  }

  /** The same client with {@link CompletableFuture} results (same connection and view cache). */
  public CtxfoldAsyncClient async() {
    return new CtxfoldAsyncClient(engine, false);
  }

  // ---- derived views --------------------------------------------------------------------------

  /** A client setting this SDK cannot use. */
  static CtxfoldException badSetting(String field, String message) {
    return CtxfoldException.invalidArgument(ErrorReason.INVALID_CLIENT_ARGUMENT, field, message);
  }

  static Duration checkDeadline(Duration deadline) {
    if (deadline != null && (deadline.isNegative() || deadline.isZero())) {
      throw badSetting("deadline", "a deadline must be positive (null = none), got " + deadline);
    }
    return deadline;
  }

  static String checkTraceparent(String traceparent) {
    if (traceparent != null && !TRACEPARENT.matcher(traceparent).matches()) {
      throw badSetting("traceparent", "not a W3C traceparent: " + traceparent);
    }
    return traceparent;
  }

  /** The same client with this deadline for every call (a whole prepare or compact stream counts as one). */
  public CtxfoldClient withDeadline(Duration deadline) {
    checkDeadline(deadline);
    return new CtxfoldClient(engine.withDeadlines(deadline, deadline), false);
  }

  /** The same client with no deadline. */
  public CtxfoldClient withoutDeadline() {
    return new CtxfoldClient(engine.withDeadlines(null, null), false);
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
    return new CtxfoldClient(engine.withTraceparent(checkTraceparent(traceparent), tracestate), false);
  }

  // ---- stubs ----------------------------------------------------------------------------------

  private <S extends AbstractStub<S>> S configure(S stub) {
    if (engine.unaryDeadline != null) {
      stub = stub.withDeadlineAfter(engine.unaryDeadline.toNanos(), TimeUnit.NANOSECONDS);
    }
    if (engine.traceparent != null) {
      stub = stub.withOption(TraceContextInterceptor.TRACEPARENT, engine.traceparent);
      if (engine.tracestate != null) {
        stub = stub.withOption(TraceContextInterceptor.TRACESTATE, engine.tracestate);
      }
    }
    return stub;
  }

  /**
   * A generated blocking stub on this client's channel, with its auth, trace propagation and
   * unary deadline: the escape hatch for anything the idiomatic layer does not cover. Its calls
   * throw {@link io.grpc.StatusRuntimeException}; {@link CtxfoldException#from(Throwable)} converts them.
   */
  public ContextServiceGrpc.ContextServiceBlockingStub blockingStub() {
    return configure(ContextServiceGrpc.newBlockingStub(engine.shared.channel));
  }

  /** A generated async stub on this client's channel (see {@link #blockingStub()}). */
  public ContextServiceGrpc.ContextServiceStub asyncStub() {
    return configure(ContextServiceGrpc.newStub(engine.shared.channel));
  }

  /** The channel with this client's interceptors (auth, trace context). */
  public Channel channel() {
    return engine.shared.channel;
  }

  /** Runs one operation of the engine, its callbacks on this thread, and waits for its result. */
  private static <T> T await(Function<Executor, CompletableFuture<T>> operation) {
    CallerThreadExecutor executor = new CallerThreadExecutor();
    CompletableFuture<T> future;
    try {
      future = Engine.cancellable(() -> operation.apply(executor));
    } catch (RuntimeException e) {
      executor.finish();
      throw e;
    }
    return executor.await(future);
  }

  // ---- sessions -------------------------------------------------------------------------------

  /** Creates a session; the returned {@link Session} carries its {@code id} and filled-in config. */
  public Session createSession(SessionSettings settings) {
    return await(ex -> engine.createSession(settings, ex));
  }

  public Session getSession(String sessionId) {
    return await(ex -> engine.getSession(sessionId, ex));
  }

  /** Deletes a session and everything only it refers to; forgets its cached view. */
  public void deleteSession(String sessionId) {
    await(ex -> engine.deleteSession(sessionId, ex));
  }

  /** The caller's sessions, newest first, fetched page by page (the server's default page). */
  public Paged<Session> listSessions() {
    return listSessions(0);
  }

  /** The caller's sessions, newest first; {@code pageSize} 1..1000, 0 = the server's default. */
  public Paged<Session> listSessions(int pageSize) {
    return new Paged<>(token -> await(ex -> engine.listSessionsPage(pageSize, token, ex)));
  }

  /** A new session holding the source's whole transcript (fork at its head). */
  public Session forkAtHead(String sessionId) {
    return forkAtHead(sessionId, null);
  }

  /**
   * As {@link #forkAtHead(String)}, with config overrides built by {@link SessionSettings#overrides()}:
   * each field set replaces the source's value.
   */
  public Session forkAtHead(String sessionId, SessionSettings overrides) {
    return await(ex -> engine.fork(sessionId, 0, overrides, ex));
  }

  /** A new session holding the source's transcript up to and including {@code atSeq} (&ge; 1). */
  public Session fork(String sessionId, long atSeq) {
    return fork(sessionId, atSeq, null);
  }

  /** As {@link #fork(String, long)}, with config overrides (see {@link #forkAtHead(String, SessionSettings)}). */
  public Session fork(String sessionId, long atSeq, SessionSettings overrides) {
    Engine.storedSeq("at_seq", atSeq); // the wire's 0 is the head: use forkAtHead for it
    return await(ex -> engine.fork(sessionId, atSeq, overrides, ex));
  }

  /** Moves the head back to {@code toSeq}; later messages become abandoned (still listable). */
  public Session rewind(String sessionId, long toSeq) {
    return await(ex -> engine.rewind(sessionId, toSeq, ex));
  }

  /** The session's context state (schema version 3): the server's bookkeeping, for diagnostics. */
  public ContextState getContextState(String sessionId) {
    return ContextState.parse(await(ex -> engine.getContextState(sessionId, ex)));
  }

  // ---- transcript -----------------------------------------------------------------------------

  /** Appends messages atomically; returns them with {@code id}, {@code seq} and {@code result_ref}. */
  public List<Message> appendMessages(String sessionId, Message... messages) {
    return appendMessages(sessionId, List.of(messages), "");
  }

  /**
   * Appends messages atomically. A retried call with the same {@code requestId} returns the first
   * call's messages instead of appending again; "" = a random one for this call.
   */
  public List<Message> appendMessages(String sessionId, List<Message> messages, String requestId) {
    return await(ex -> engine.appendMessages(sessionId, messages, requestId, ex));
  }

  /** The live canonical transcript in seq order, fetched page by page. */
  public Paged<Message> listMessages(String sessionId) {
    return listMessages(sessionId, false, 0);
  }

  /**
   * The canonical transcript in seq order; with {@code includeAbandoned}, also the messages
   * abandoned by rewinds (marked {@code abandoned}). {@code pageSize} 0 = the server's default.
   */
  public Paged<Message> listMessages(String sessionId, boolean includeAbandoned, int pageSize) {
    Engine.requireId(sessionId);
    return new Paged<>(token -> await(ex -> engine.listMessagesPage(sessionId, includeAbandoned, pageSize, token, ex)));
  }

  // ---- prepare / compact ----------------------------------------------------------------------

  /** Prepares the view to send now, appending nothing. */
  public View prepare(String sessionId) {
    return prepare(sessionId, PrepareOptions.defaults());
  }

  /** Appends {@code messages} and prepares the view to send. */
  public View prepare(String sessionId, Message... messages) {
    return prepare(sessionId, PrepareOptions.appending(messages));
  }

  /**
   * Appends {@code options.append()}, lets the server maintain the context when it reached the
   * trigger (handing {@link FoldProgress} events to {@code options.onProgress()} on this thread)
   * and returns the whole view to send to the model.
   */
  public View prepare(String sessionId, PrepareOptions options) {
    return await(ex -> engine.prepare(sessionId, options, ex));
  }

  /**
   * As {@link #prepare(String, PrepareOptions)}, as events to iterate: the progress events as they
   * arrive, then one {@link FoldEvent.Result}. Closing it before the end cancels the call.
   */
  public FoldEvents prepareEvents(String sessionId, PrepareOptions options) {
    return events(listener -> ex -> engine.prepare(sessionId, withListener(options, listener), ex));
  }

  private static PrepareOptions withListener(PrepareOptions options, Consumer<FoldProgress> listener) {
    Consumer<FoldProgress> own = options.onProgress();
    return options.toBuilder().onProgress(p -> {
      own.accept(p);
      listener.accept(p);
    }).build();
  }

  /** Folds the session's history into a summary checkpoint now (manual compaction). */
  public View compact(String sessionId) {
    return compact(sessionId, CompactOptions.defaults());
  }

  /**
   * Folds history now, even below the trigger. A fold that installs nothing says why in
   * {@link View#notFoldedReason()}; a failed Compact is thrown.
   */
  public View compact(String sessionId, CompactOptions options) {
    return await(ex -> engine.compact(sessionId, options, ex));
  }

  /** As {@link #compact(String, CompactOptions)}, as events to iterate (see {@link #prepareEvents}). */
  public FoldEvents compactEvents(String sessionId, CompactOptions options) {
    Consumer<FoldProgress> own = options.onProgress();
    return events(listener -> ex -> engine.compact(sessionId, options.toBuilder().onProgress(p -> {
      own.accept(p);
      listener.accept(p);
    }).build(), ex));
  }

  /**
   * The events of one fold call, lazily: pulling the next one runs the call's callbacks on the
   * pulling thread until a progress event or the result is there.
   */
  private static FoldEvents events(
      Function<Consumer<FoldProgress>, Function<Executor, CompletableFuture<View>>> start) {
    CallerThreadExecutor executor = new CallerThreadExecutor();
    ArrayDeque<FoldEvent> ready = new ArrayDeque<>();
    CompletableFuture<View> future =
        Engine.cancellable(() -> start.apply(p -> ready.add(new FoldEvent.Progress(p))).apply(executor));
    future.whenComplete((v, e) -> executor.execute(() -> { }));
    Iterator<FoldEvent> iterator = new Iterator<>() {
      private boolean resultGiven;

      @Override
      public boolean hasNext() {
        while (ready.isEmpty() && !resultGiven) {
          if (future.isDone()) {
            resultGiven = true;
            ready.add(new FoldEvent.Result(executor.await(future)));
          } else if (!executor.runOne()) {
            future.cancel(true);
            throw CtxfoldException.from(new java.util.concurrent.CancellationException("interrupted"));
          }
        }
        return !ready.isEmpty();
      }

      @Override
      public FoldEvent next() {
        if (!hasNext()) {
          throw new NoSuchElementException();
        }
        return ready.poll();
      }
    };
    return new FoldEvents(iterator, () -> {
      future.cancel(true);
      executor.finish();
    });
  }

  /** The last view this client received for the session, while its cache holds it. */
  public Optional<View> lastView(String sessionId) {
    return Optional.ofNullable(engine.cachedView(sessionId));
  }

  /** Drops the view this client holds for a session: the next prepare asks for the whole view. */
  public void forgetView(String sessionId) {
    engine.shared.views.remove(sessionId);
  }

  // ---- edit / retry ---------------------------------------------------------------------------

  /**
   * Replaces the message at {@code seq} (and abandons everything after it): rewinds to
   * {@code seq - 1} and appends {@code replacement}. Returns the new message with its id and seq.
   * The old version stays listable with {@code listMessages(id, true, 0)}.
   */
  public Message edit(String sessionId, long seq, Message replacement) {
    return edit(sessionId, seq, replacement, "");
  }

  /** As {@link #edit(String, long, Message)}, with the append's idempotency key. */
  public Message edit(String sessionId, long seq, Message replacement, String requestId) {
    return await(ex -> engine.edit(sessionId, seq, replacement, requestId, ex));
  }

  /** As {@link #edit(String, long, Message)} for the message {@code original} (by its seq). */
  public Message edit(String sessionId, Message original, Message replacement) {
    return edit(sessionId, original.seq(), replacement);
  }

  /**
   * Retries a model answer: rewinds to just before the answer at {@code answerSeq} (which, and
   * everything after it, becomes abandoned) and prepares the view again, so the model can be asked
   * once more. Appends and lists nothing.
   */
  public View retry(String sessionId, long answerSeq) {
    return retry(sessionId, answerSeq, PrepareOptions.IGNORE);
  }

  /** As {@link #retry(String, long)}, with a progress listener. */
  public View retry(String sessionId, long answerSeq, Consumer<FoldProgress> onProgress) {
    PrepareOptions options = PrepareOptions.builder().onProgress(onProgress).build();
    return await(ex -> engine.retry(sessionId, answerSeq, options, ex));
  }

  /** As {@link #retry(String, long)} for the answer message {@code answer} (by its seq). */
  public View retry(String sessionId, Message answer) {
    return retry(sessionId, answer.seq());
  }

  // ---- usage ----------------------------------------------------------------------------------

  /** Records the provider's usage for the view {@code viewVersion} (statistics, calibration). */
  public UsageResult observeUsage(String sessionId, long viewVersion, Usage usage) {
    return await(ex -> engine.observeUsage(sessionId, viewVersion, usage, ex));
  }

  /** Records the provider's usage for a prepared view. */
  public UsageResult observeUsage(String sessionId, View view, Usage usage) {
    return observeUsage(sessionId, view.viewVersion(), usage);
  }

  // ---- tool results ---------------------------------------------------------------------------

  /** The whole raw tool result named by its {@code result_ref}, read page by page and sha256-checked. */
  public ToolResult readToolResult(String sessionId, String resultRef) {
    return readToolResult(sessionId, resultRef, DEFAULT_PAGE_BYTES);
  }

  /** As {@link #readToolResult(String, String)} with pages of {@code pageBytes} (4..24576). */
  public ToolResult readToolResult(String sessionId, String resultRef, int pageBytes) {
    return await(ex -> engine.readWhole(sessionId, Engine.ResultName.ref(resultRef), pageBytes, ex));
  }

  /** The whole raw result of the tool call {@code toolCallId} (which must answer one result). */
  public ToolResult readToolResultOfCall(String sessionId, String toolCallId) {
    return readToolResultOfCall(sessionId, toolCallId, DEFAULT_PAGE_BYTES);
  }

  /** As {@link #readToolResultOfCall(String, String)} with pages of {@code pageBytes}. */
  public ToolResult readToolResultOfCall(String sessionId, String toolCallId, int pageBytes) {
    return await(ex -> engine.readWhole(sessionId, Engine.ResultName.call(toolCallId), pageBytes, ex));
  }

  /**
   * The pages of a stored raw result from {@code offset} (a UTF-8 byte offset on a character
   * boundary), one request per page, lazily.
   */
  public Iterable<ToolResultPage> toolResultPages(String sessionId, String resultRef, long offset, int pageBytes) {
    return pages(sessionId, Engine.ResultName.ref(resultRef), offset, pageBytes);
  }

  /** As {@link #toolResultPages} for the result of the tool call {@code toolCallId}. */
  public Iterable<ToolResultPage> toolResultPagesOfCall(
      String sessionId, String toolCallId, long offset, int pageBytes) {
    return pages(sessionId, Engine.ResultName.call(toolCallId), offset, pageBytes);
  }

  private Iterable<ToolResultPage> pages(String sessionId, Engine.ResultName name, long offset, int pageBytes) {
    Engine.requireId(sessionId);
    Engine.checkPageBytes(pageBytes);
    return new Paged<>(token -> await(ex -> engine.toolResultPage(sessionId, name, offset, pageBytes, token, ex)));
  }

  // ---- the model's tools ---------------------------------------------------------------------

  /**
   * Answers a model's call of a {@link ModelTools} tool with the text to append as that call's
   * tool result: for {@code read_tool_result} the page (with a footer naming the next offset when
   * the result continues), for {@code context_budget} the last view's token figures, and for the
   * model's mistakes (unknown ref, bad offset, malformed arguments) a short error text it can act
   * on. Empty when {@code name} is not a ctxfold tool (the agent runs its own tools). Other
   * failures (the server down, the session gone) are thrown.
   *
   * @param argumentsJson the call's arguments as the model wrote them (a JSON object)
   */
  public Optional<String> dispatchToolCall(String sessionId, String name, String argumentsJson) {
    return await(ex -> engine.dispatchToolCall(sessionId, name, argumentsJson, ex));
  }

  // ---- checkpoints ----------------------------------------------------------------------------

  /** The session's checkpoint chain, newest first, with summaries. */
  public Paged<Checkpoint> listCheckpoints(String sessionId) {
    return listCheckpoints(sessionId, false, 0);
  }

  /** As {@link #listCheckpoints(String)}; with {@code includeAbandoned} also those of abandoned branches. */
  public Paged<Checkpoint> listCheckpoints(String sessionId, boolean includeAbandoned, int pageSize) {
    Engine.requireId(sessionId);
    return new Paged<>(token ->
        await(ex -> engine.listCheckpointsPage(sessionId, includeAbandoned, pageSize, token, ex)));
  }

  /** One checkpoint of the session, with its summary. */
  public Checkpoint getCheckpoint(String sessionId, String checkpointId) {
    return await(ex -> engine.getCheckpoint(sessionId, checkpointId, ex));
  }

  // ---- lifecycle ------------------------------------------------------------------------------

  /**
   * Closes the connection this client opened (waiting up to 5 seconds for calls in flight).
   * A no-op on derived views and on clients built around a caller's channel.
   */
  @Override
  public void close() {
    if (root) {
      engine.close();
    }
  }


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
    private Duration unaryDeadline = Duration.ofSeconds(30);
    private Duration streamDeadline = Duration.ofSeconds(600);
    private OpenTelemetry openTelemetry;
    private boolean propagateTraceContext = true;
    private int maxInboundMessageBytes = 64 * 1024 * 1024;
    private String userAgent = "ctxfold-java/" + Version.VALUE;
    private int maxCachedViews = 256;
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
      if (token != null && token.chars().anyMatch(Character::isWhitespace)) {
        throw badSetting("token", "the bearer token must not contain whitespace");
      }
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

    /** Deadline of each unary call (default 30 s); null = none. */
    public Builder unaryDeadline(Duration deadline) {
      this.unaryDeadline = checkDeadline(deadline);
      return this;
    }

    /** Deadline of a whole prepare or compact stream (default 600 s); null = none. */
    public Builder streamDeadline(Duration deadline) {
      this.streamDeadline = checkDeadline(deadline);
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
        throw badSetting("max_inbound_message_bytes", "must be > 0, got " + bytes);
      }
      this.maxInboundMessageBytes = bytes;
      return this;
    }

    /** The user agent prefix (default {@code ctxfold-java/<version>}; gRPC appends its own). */
    public Builder userAgent(String userAgent) {
      this.userAgent = Objects.requireNonNull(userAgent, "userAgent");
      return this;
    }

    /**
     * How many sessions' last views the client keeps for delta answers (default 256, least
     * recently used dropped first; 0 = never ask for deltas).
     */
    public Builder maxCachedViews(int sessions) {
      if (sessions < 0) {
        throw badSetting("max_cached_views", "must be >= 0, got " + sessions);
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
        throw new CtxfoldException(io.grpc.Status.Code.INVALID_ARGUMENT, "cannot read TLS key material: " + e.getMessage(),
            ErrorReason.INVALID_CLIENT_ARGUMENT.name(), CtxfoldException.CLIENT_DOMAIN, Map.of("field", "tls"), null, e);
      }
    }

    public CtxfoldClient build() {
      ManagedChannel owned = null;
      Channel base = channel;
      if (base == null) {
        if (target == null || target.isEmpty()) {
          throw badSetting("target", "the server address (target) or a channel is required");
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
      Engine engine = new Engine(new Engine.Shared(intercepted, owned, maxCachedViews),
          unaryDeadline, streamDeadline, null, null);
      return new CtxfoldClient(engine, true);
    }

    /** Builds the async client ({@link CtxfoldAsyncClient#sync()} is its blocking twin). */
    public CtxfoldAsyncClient buildAsync() {
      CtxfoldClient client = build();
      return new CtxfoldAsyncClient(client.engine, true);
    }
  }
}

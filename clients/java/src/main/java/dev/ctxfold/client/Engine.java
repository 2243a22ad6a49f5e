package dev.ctxfold.client;

import com.google.protobuf.Descriptors;
import dev.ctxfold.v1.AppendMessagesRequest;
import dev.ctxfold.v1.CompactRequest;
import dev.ctxfold.v1.CompactResponse;
import dev.ctxfold.v1.ContextServiceGrpc;
import dev.ctxfold.v1.CreateSessionRequest;
import dev.ctxfold.v1.DeleteSessionRequest;
import dev.ctxfold.v1.ErrorReason;
import dev.ctxfold.v1.ForkRequest;
import dev.ctxfold.v1.GetCheckpointRequest;
import dev.ctxfold.v1.GetContextStateRequest;
import dev.ctxfold.v1.GetSessionRequest;
import dev.ctxfold.v1.ListCheckpointsRequest;
import dev.ctxfold.v1.ListMessagesRequest;
import dev.ctxfold.v1.ListSessionsRequest;
import dev.ctxfold.v1.ObserveUsageRequest;
import dev.ctxfold.v1.PrepareRequest;
import dev.ctxfold.v1.PrepareResponse;
import dev.ctxfold.v1.PreparedContext;
import dev.ctxfold.v1.ReadToolResultRequest;
import dev.ctxfold.v1.ReadToolResultResponse;
import dev.ctxfold.v1.RewindRequest;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.Context;
import io.grpc.ManagedChannel;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.Supplier;

/**
 * The one implementation of every operation, asynchronous: each returns a future and runs its
 * gRPC callbacks on {@code executor} (null = gRPC's default). {@link CtxfoldClient} waits for the
 * futures on the calling thread ({@link CallerThreadExecutor}); {@link CtxfoldAsyncClient} hands
 * them out.
 */
final class Engine {
  /** Largest page ReadToolResult serves, the smallest, and the default page. */
  static final int MAX_PAGE_BYTES = 24_576;
  static final int MIN_PAGE_BYTES = 4;
  static final int DEFAULT_PAGE_BYTES = 16_384;
  /** Largest list pages the server serves: sessions and messages, checkpoints. */
  static final int MAX_PAGE_SIZE = 1000;
  static final int MAX_CHECKPOINT_PAGE_SIZE = 100;

  /** Connection and view cache, shared by a client, its async twin and the views derived from them. */
  static final class Shared {
    final Channel channel;
    final ManagedChannel owned;
    final Map<String, View> views;

    Shared(Channel channel, ManagedChannel owned, int maxViews) {
      this.channel = channel;
      this.owned = owned;
      // The most recently used sessions' last views; the eldest is dropped past maxViews (its
      // next prepare then asks for the whole view).
      this.views = Collections.synchronizedMap(new LinkedHashMap<>(16, 0.75f, true) {
        private static final long serialVersionUID = 1L;

        @Override
        protected boolean removeEldestEntry(Map.Entry<String, View> eldest) {
          return size() > maxViews;
        }
      });
    }
  }

  /** The name of a stored tool result: its reference, or the tool call it answers. */
  record ResultName(String resultRef, String toolCallId) {
    static ResultName ref(String resultRef) {
      return new ResultName(Objects.requireNonNull(resultRef, "resultRef"), "");
    }

    static ResultName call(String toolCallId) {
      return new ResultName("", Objects.requireNonNull(toolCallId, "toolCallId"));
    }
  }

  final Shared shared;
  final Duration unaryDeadline;
  final Duration streamDeadline;
  final String traceparent;
  final String tracestate;

  Engine(Shared shared, Duration unaryDeadline, Duration streamDeadline, String traceparent, String tracestate) {
    this.shared = shared;
    this.unaryDeadline = unaryDeadline;
    this.streamDeadline = streamDeadline;
    this.traceparent = traceparent;
    this.tracestate = tracestate;
  }

  Engine withDeadlines(Duration unary, Duration stream) {
    return new Engine(shared, unary, stream, traceparent, tracestate);
  }

  Engine withTraceparent(String parent, String state) {
    return new Engine(shared, unaryDeadline, streamDeadline, parent, state);
  }

  CallOptions options(Duration deadline, Executor executor) {
    CallOptions options = CallOptions.DEFAULT;
    if (deadline != null) {
      options = options.withDeadlineAfter(deadline.toNanos(), TimeUnit.NANOSECONDS);
    }
    if (executor != null) {
      options = options.withExecutor(executor);
    }
    if (traceparent != null) {
      options = options.withOption(TraceContextInterceptor.TRACEPARENT, traceparent);
      if (tracestate != null) {
        options = options.withOption(TraceContextInterceptor.TRACESTATE, tracestate);
      }
    }
    return options;
  }

  static String requireId(String sessionId) {
    Objects.requireNonNull(sessionId, "sessionId");
    if (sessionId.isEmpty()) {
      throw CtxfoldException.invalidArgument(ErrorReason.SESSION_ID_REQUIRED, "session_id", "session_id is required");
    }
    return sessionId;
  }

  /** A list's page size: 0 (the server's default) up to the server's maximum. */
  static int checkPageSize(int pageSize, int maximum) {
    if (pageSize < 0 || pageSize > maximum) {
      throw CtxfoldException.invalidArgument(ErrorReason.INVALID_PAGE_SIZE, "page_size",
          "page_size must be within [0, " + maximum + "], got " + pageSize);
    }
    return pageSize;
  }

  /** A seq that names no stored message (below 1) is refused, as the server would. */
  static long storedSeq(String field, long seq) {
    if (seq < 1) {
      throw CtxfoldException.invalidArgument(ErrorReason.SEQ_OUT_OF_RANGE, field,
          field + " must name a stored message (>= 1), got " + seq);
    }
    return seq;
  }

  private static String requestIdOrNew(String requestId) {
    return requestId == null || requestId.isEmpty() ? UUID.randomUUID().toString() : requestId;
  }

  // ---- the two call shapes --------------------------------------------------------------------

  /** The caller's context an operation's scope was made from (an operation started in another's callback). */
  private static final Context.Key<Context> CALLER_CONTEXT = Context.key("ctxfold-caller-context");

  /**
   * Starts one operation in a cancellable gRPC context and ends that context with the operation.
   * Every call the operation makes is bound to the context (later steps start in the callbacks of
   * earlier ones, which gRPC runs in it), so cancelling the returned future — Future.cancel, or the
   * blocking caller's interrupt — cancels the call in flight: a future made by thenApply or
   * thenCompose does not pass a cancel on to the stages it was made from. An operation the caller
   * starts in the callback of another (thenCompose) gets a scope of the caller's context, not one
   * inside the other's: it neither ends with it nor deepens the context chain.
   */
  static <T> CompletableFuture<T> cancellable(Supplier<CompletableFuture<T>> operation) {
    Context current = Context.current();
    Context caller = Objects.requireNonNullElse(CALLER_CONTEXT.get(current), current);
    Context.CancellableContext scope = caller.withValue(CALLER_CONTEXT, caller).withCancellation();
    CompletableFuture<T> future;
    Context previous = scope.attach();
    try {
      future = operation.get();
    } catch (RuntimeException | Error e) {
      scope.cancel(e);
      throw e;
    } finally {
      scope.detach(previous);
    }
    future.whenComplete((value, error) -> scope.cancel(null));
    return future;
  }

  private <Q, R> CompletableFuture<R> unary(MethodDescriptor<Q, R> method, Q request, Executor executor) {
    checkText(request);
    CompletableFuture<R> future = new CompletableFuture<>();
    ClientCall<Q, R> call = shared.channel.newCall(method, options(unaryDeadline, executor));
    ClientCalls.asyncUnaryCall(call, request, new StreamObserver<R>() {
      @Override
      public void onNext(R value) {
        future.complete(value);
      }

      @Override
      public void onError(Throwable t) {
        future.completeExceptionally(CtxfoldException.from(t));
      }

      @Override
      public void onCompleted() {
        // The value completed the future.
      }
    });
    future.whenComplete((value, error) -> {
      if (future.isCancelled()) {
        call.cancel("cancelled by the caller", null);
      }
    });
    return future;
  }

  /** A Prepare or Compact stream: progress to {@code listener} in order, then the one result. */
  private <Q, R> CompletableFuture<PreparedContext> fold(
      MethodDescriptor<Q, R> method,
      Q request,
      Function<R, dev.ctxfold.v1.FoldProgress> progressOf,
      Function<R, PreparedContext> resultOf,
      Consumer<FoldProgress> listener,
      Executor executor) {
    checkText(request);
    CompletableFuture<PreparedContext> future = new CompletableFuture<>();
    ClientCall<Q, R> call = shared.channel.newCall(method, options(streamDeadline, executor));
    ClientCalls.asyncServerStreamingCall(call, request, new StreamObserver<R>() {
      private PreparedContext result;

      @Override
      public void onNext(R item) {
        if (result != null) {
          fail(protocolViolation("the stream went on after its result"));
          return;
        }
        dev.ctxfold.v1.FoldProgress progress = progressOf.apply(item);
        if (progress != null) {
          try {
            listener.accept(FoldProgress.fromProto(progress));
          } catch (RuntimeException e) {
            fail(e);
          }
        } else {
          result = resultOf.apply(item);
        }
      }

      private void fail(RuntimeException e) {
        future.completeExceptionally(e);
        call.cancel(e.getMessage(), e);
      }

      @Override
      public void onError(Throwable t) {
        future.completeExceptionally(CtxfoldException.from(t));
      }

      @Override
      public void onCompleted() {
        if (result == null) {
          future.completeExceptionally(CtxfoldException.client(Status.Code.UNAVAILABLE,
              ErrorReason.STREAM_ENDED_WITHOUT_RESULT, "the stream ended without a result"));
        } else {
          future.complete(result);
        }
      }
    });
    future.whenComplete((value, error) -> {
      if (future.isCancelled()) {
        call.cancel("cancelled by the caller", null);
      }
    });
    return future;
  }

  /**
   * Refuses a request holding text that is not Unicode (a lone surrogate, e.g. a string cut between
   * the halves of an emoji) as the server refuses a NUL: INVALID_TEXT, {@code field} the path in the
   * request ({@code messages[1].content}). protobuf-java would write it as '?', other text than the caller's.
   */
  static void checkText(Object request) {
    if (request instanceof com.google.protobuf.Message message) {
      String field = notUnicodeField(message, "");
      if (!field.isEmpty()) {
        throw CtxfoldException.invalidArgument(ErrorReason.INVALID_TEXT, field,
            field + " is not valid Unicode text (a lone surrogate)");
      }
    }
  }

  /** The path of the first string field that holds a lone surrogate, or "". */
  private static String notUnicodeField(com.google.protobuf.Message message, String prefix) {
    for (Map.Entry<Descriptors.FieldDescriptor, Object> entry : message.getAllFields().entrySet()) {
      Descriptors.FieldDescriptor field = entry.getKey();
      List<?> values = field.isRepeated() ? (List<?>) entry.getValue() : List.of(entry.getValue());
      for (int i = 0; i < values.size(); i++) {
        String path = prefix + field.getName() + (field.isRepeated() ? "[" + i + "]" : "");
        Object value = values.get(i);
        String found = value instanceof com.google.protobuf.Message nested ? notUnicodeField(nested, path + ".")
            : value instanceof String text && hasLoneSurrogate(text) ? path : "";
        if (!found.isEmpty()) {
          return found;
        }
      }
    }
    return "";
  }

  private static boolean hasLoneSurrogate(String text) {
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      if (Character.isHighSurrogate(c) && i + 1 < text.length() && Character.isLowSurrogate(text.charAt(i + 1))) {
        i++;
      } else if (Character.isSurrogate(c)) {
        return true;
      }
    }
    return false;
  }

  /** The server broke the protocol this SDK speaks (a bug on one side or the other). */
  static CtxfoldException protocolViolation(String message) {
    return CtxfoldException.client(Status.Code.INTERNAL, ErrorReason.PROTOCOL_VIOLATION, message);
  }

  // ---- sessions -------------------------------------------------------------------------------

  CompletableFuture<Session> createSession(SessionSettings settings, Executor executor) {
    Objects.requireNonNull(settings, "settings");
    if (settings.contextWindow() <= 0) {
      throw CtxfoldException.invalidArgument(ErrorReason.INVALID_CONFIG, "context_window",
          "config.context_window: is required and must be > 0");
    }
    return unary(ContextServiceGrpc.getCreateSessionMethod(),
        CreateSessionRequest.newBuilder().setConfig(settings.toProto()).build(), executor)
        .thenApply(r -> Session.fromProto(r.getSession()));
  }

  CompletableFuture<Session> getSession(String sessionId, Executor executor) {
    return unary(ContextServiceGrpc.getGetSessionMethod(),
        GetSessionRequest.newBuilder().setSessionId(requireId(sessionId)).build(), executor)
        .thenApply(r -> Session.fromProto(r.getSession()));
  }

  CompletableFuture<Void> deleteSession(String sessionId, Executor executor) {
    return unary(ContextServiceGrpc.getDeleteSessionMethod(),
        DeleteSessionRequest.newBuilder().setSessionId(requireId(sessionId)).build(), executor)
        .thenApply(r -> {
          shared.views.remove(sessionId);
          return null;
        });
  }

  CompletableFuture<Paged.Page<Session>> listSessionsPage(int pageSize, String token, Executor executor) {
    return unary(ContextServiceGrpc.getListSessionsMethod(), ListSessionsRequest.newBuilder()
        .setPageSize(checkPageSize(pageSize, MAX_PAGE_SIZE)).setPageToken(token).build(), executor)
        .thenApply(r -> new Paged.Page<>(r.getSessionsList().stream().map(Session::fromProto).toList(),
            r.getNextPageToken()));
  }

  /** Fork at {@code atSeq}; 0 is only ever passed by forkAtHead (the proto's "head"). */
  CompletableFuture<Session> fork(String sessionId, long atSeq, SessionSettings overrides, Executor executor) {
    ForkRequest.Builder request = ForkRequest.newBuilder().setSessionId(requireId(sessionId)).setAtSeq(atSeq);
    if (overrides != null) {
      request.setConfig(overrides.toProto());
    }
    return unary(ContextServiceGrpc.getForkMethod(), request.build(), executor)
        .thenApply(r -> Session.fromProto(r.getSession()));
  }

  CompletableFuture<Session> rewind(String sessionId, long toSeq, Executor executor) {
    if (toSeq < 0) {
      throw CtxfoldException.invalidArgument(ErrorReason.SEQ_OUT_OF_RANGE, "to_seq",
          "to_seq must be >= 0 (0 = empty), got " + toSeq);
    }
    return unary(ContextServiceGrpc.getRewindMethod(),
        RewindRequest.newBuilder().setSessionId(requireId(sessionId)).setToSeq(toSeq).build(), executor)
        .thenApply(r -> {
          shared.views.remove(sessionId);
          return Session.fromProto(r.getSession());
        });
  }

  CompletableFuture<String> getContextState(String sessionId, Executor executor) {
    return unary(ContextServiceGrpc.getGetContextStateMethod(),
        GetContextStateRequest.newBuilder().setSessionId(requireId(sessionId)).build(), executor)
        .thenApply(r -> r.getStateJson());
  }

  // ---- transcript -----------------------------------------------------------------------------

  CompletableFuture<List<Message>> appendMessages(
      String sessionId, List<Message> messages, String requestId, Executor executor) {
    AppendMessagesRequest request = AppendMessagesRequest.newBuilder()
        .setSessionId(requireId(sessionId))
        .addAllMessages(Message.toProto(messages))
        .setRequestId(requestIdOrNew(requestId))
        .build();
    return unary(ContextServiceGrpc.getAppendMessagesMethod(), request, executor)
        .thenApply(r -> Message.fromProto(r.getMessagesList()));
  }

  CompletableFuture<Paged.Page<Message>> listMessagesPage(
      String sessionId, boolean includeAbandoned, int pageSize, String token, Executor executor) {
    return unary(ContextServiceGrpc.getListMessagesMethod(), ListMessagesRequest.newBuilder()
        .setSessionId(requireId(sessionId))
        .setPageSize(checkPageSize(pageSize, MAX_PAGE_SIZE))
        .setPageToken(token)
        .setIncludeAbandoned(includeAbandoned)
        .build(), executor)
        .thenApply(r -> new Paged.Page<>(Message.fromProto(r.getMessagesList()), r.getNextPageToken()));
  }

  // ---- prepare / compact ----------------------------------------------------------------------

  CompletableFuture<View> prepare(String sessionId, PrepareOptions options, Executor executor) {
    requireId(sessionId);
    Objects.requireNonNull(options, "options");
    View known = options.useDelta() ? shared.views.get(sessionId) : null;
    PrepareRequest.Builder request = PrepareRequest.newBuilder()
        .setSessionId(sessionId)
        .addAllAppend(Message.toProto(options.append()))
        .setOverflow(options.overflow())
        .setRequestId(requestIdOrNew(options.requestId()));
    if (known != null) {
      request.setKnownViewVersion(known.viewVersion());
    }
    List<FoldProgress> progress = Collections.synchronizedList(new ArrayList<>());
    Consumer<FoldProgress> listener = p -> {
      progress.add(p);
      options.onProgress().accept(p);
    };
    return preparing(request.build(), listener, executor).thenCompose(result -> {
      View whole = assemble(sessionId, known, result, progress);
      if (whole != null) {
        return CompletableFuture.completedFuture(whole);
      }
      // The delta does not extend the view held here (evicted meanwhile, or a server bug): the
      // append (and any overflow maintenance) already happened, so prepare once more with no append,
      // no overflow and no known version; the view still says what this call appended.
      shared.views.remove(sessionId);
      PrepareRequest again = PrepareRequest.newBuilder().setSessionId(sessionId).build();
      return preparing(again, listener, executor).thenApply(r -> {
        if (r.getDelta()) {
          throw protocolViolation("a prepare without known_view_version answered with a delta");
        }
        PreparedContext recovered = r.toBuilder().clearAppended().addAllAppended(result.getAppendedList()).build();
        return assemble(sessionId, null, recovered, progress);
      });
    });
  }

  private CompletableFuture<PreparedContext> preparing(
      PrepareRequest request, Consumer<FoldProgress> listener, Executor executor) {
    return fold(ContextServiceGrpc.getPrepareMethod(), request,
        (PrepareResponse r) -> r.hasProgress() ? r.getProgress() : null,
        r -> r.hasResult() ? r.getResult() : null,
        listener, executor);
  }

  CompletableFuture<View> compact(String sessionId, CompactOptions options, Executor executor) {
    requireId(sessionId);
    Objects.requireNonNull(options, "options");
    CompactRequest request = CompactRequest.newBuilder()
        .setSessionId(sessionId)
        .setFocus(options.focus())
        .setKeepTokens(options.keepTokens())
        .setDryRun(options.dryRun())
        .build();
    List<FoldProgress> progress = Collections.synchronizedList(new ArrayList<>());
    return fold(ContextServiceGrpc.getCompactMethod(), request,
        (CompactResponse r) -> r.hasProgress() ? r.getProgress() : null,
        r -> r.hasResult() ? r.getResult() : null,
        p -> {
          progress.add(p);
          options.onProgress().accept(p);
        }, executor)
        .thenApply(result -> {
          if (options.dryRun()) {
            // A dry run installed nothing: the view held for deltas stays the last real one.
            return new View(result, Message.fromProto(result.getMessagesList()), progress);
          }
          return assemble(sessionId, null, result, progress);
        });
  }

  /** The whole view of a result (applying a delta to {@code known}), cached; null when it does not fit. */
  private View assemble(String sessionId, View known, PreparedContext result, List<FoldProgress> progress) {
    List<Message> whole;
    if (result.getDelta()) {
      long keep = result.getViewMessageCount() - result.getMessagesCount();
      if (known == null || keep != known.messages().size()) {
        return null;
      }
      whole = new ArrayList<>(known.messages().size() + result.getMessagesCount());
      whole.addAll(known.messages());
      whole.addAll(Message.fromProto(result.getMessagesList()));
    } else {
      whole = Message.fromProto(result.getMessagesList());
    }
    if (whole.size() != result.getViewMessageCount()) {
      throw protocolViolation("a whole view of " + whole.size() + " messages says it has "
          + result.getViewMessageCount());
    }
    View view = new View(result, whole, progress);
    shared.views.put(sessionId, view);
    return view;
  }

  /** The last view this client received for the session, if it still holds it. */
  View cachedView(String sessionId) {
    return shared.views.get(sessionId);
  }

  // ---- edit / retry ---------------------------------------------------------------------------

  CompletableFuture<Message> edit(String sessionId, long seq, Message replacement, String requestId, Executor executor) {
    storedSeq("seq", seq);
    Objects.requireNonNull(replacement, "replacement");
    return rewind(sessionId, seq - 1, executor)
        .thenCompose(s -> appendMessages(sessionId, List.of(replacement), requestId, executor))
        .thenApply(messages -> messages.get(0));
  }

  CompletableFuture<View> retry(String sessionId, long answerSeq, PrepareOptions options, Executor executor) {
    storedSeq("seq", answerSeq);
    return rewind(sessionId, answerSeq - 1, executor).thenCompose(s -> prepare(sessionId, options, executor));
  }

  // ---- usage ----------------------------------------------------------------------------------

  CompletableFuture<UsageResult> observeUsage(String sessionId, long viewVersion, Usage usage, Executor executor) {
    Objects.requireNonNull(usage, "usage");
    return unary(ContextServiceGrpc.getObserveUsageMethod(), ObserveUsageRequest.newBuilder()
        .setSessionId(requireId(sessionId))
        .setViewVersion(viewVersion)
        .setInputTokens(usage.inputTokens())
        .setCachedInputTokens(usage.cachedInputTokens())
        .setOutputTokens(usage.outputTokens())
        .setFinishReason(usage.finishReason())
        .build(), executor)
        .thenApply(r -> new UsageResult(r.getCalibration(), r.getCalibrationAccepted()));
  }

  // ---- tool results ---------------------------------------------------------------------------

  static int checkPageBytes(int pageBytes) {
    if (pageBytes < MIN_PAGE_BYTES || pageBytes > MAX_PAGE_BYTES) {
      throw CtxfoldException.invalidArgument(ErrorReason.LIMIT_OUT_OF_RANGE, "page_bytes",
          "page_bytes must be within [" + MIN_PAGE_BYTES + ", " + MAX_PAGE_BYTES + "], got " + pageBytes);
    }
    return pageBytes;
  }

  /** A stored result is named by its reference or by the tool call it answers. */
  static ResultName checkName(ResultName name) {
    if (name.resultRef().isEmpty() && name.toolCallId().isEmpty()) {
      throw CtxfoldException.invalidArgument(ErrorReason.RESULT_REF_REQUIRED, "result_ref",
          "name the tool result by result_ref or tool_call_id");
    }
    return name;
  }

  CompletableFuture<ToolResultPage> readPage(
      String sessionId, ResultName name, long offset, int pageBytes, Executor executor) {
    if (offset < 0) {
      throw CtxfoldException.invalidArgument(ErrorReason.OFFSET_OUT_OF_RANGE, "offset", "offset must be >= 0, got " + offset);
    }
    ReadToolResultRequest request = ReadToolResultRequest.newBuilder()
        .setSessionId(requireId(sessionId))
        .setResultRef(checkName(name).resultRef())
        .setToolCallId(name.toolCallId())
        .setOffset(offset)
        .setLimit(checkPageBytes(pageBytes))
        .build();
    return unary(ContextServiceGrpc.getReadToolResultMethod(), request, executor)
        .thenApply(ToolResultPage::of);
  }

  /**
   * One page of {@code toolResultPages} as a list page: the token is the offset to read ("" =
   * {@code start}), and the next token is empty once a page completes the result.
   */
  CompletableFuture<Paged.Page<ToolResultPage>> toolResultPage(
      String sessionId, ResultName name, long start, int pageBytes, String token, Executor executor) {
    long offset = token.isEmpty() ? start : Long.parseLong(token);
    return readPage(sessionId, name, offset, pageBytes, executor).thenApply(page -> new Paged.Page<>(
        List.of(page), page.complete() ? "" : Long.toString(page.nextOffset())));
  }

  /** The whole result: pages read one after the other, then the bytes checked against sha256. */
  CompletableFuture<ToolResult> readWhole(String sessionId, ResultName name, int pageBytes, Executor executor) {
    checkPageBytes(pageBytes);
    return readPage(sessionId, name, 0, pageBytes, executor).thenCompose(first -> {
      // Later pages name the result by the ref the first page reported (a tool_call_id could
      // become ambiguous meanwhile).
      ResultName ref = first.resultRef().isEmpty() ? name : ResultName.ref(first.resultRef());
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      return readRest(sessionId, ref, first, first, bytes, pageBytes, executor).thenApply(v -> {
        byte[] all = bytes.toByteArray();
        String digest = sha256Hex(all);
        if (all.length != first.totalBytes() || !digest.equalsIgnoreCase(first.sha256())) {
          throw CtxfoldException.client(Status.Code.DATA_LOSS, ErrorReason.RESULT_CHECKSUM_MISMATCH,
              "read " + all.length + " bytes hashing to " + digest + "; the server reported "
                  + first.totalBytes() + " bytes with sha256 " + first.sha256());
        }
        return new ToolResult(new String(all, StandardCharsets.UTF_8), first.sha256(), first.totalBytes(),
            ref.resultRef().isEmpty() ? first.resultRef() : ref.resultRef());
      });
    });
  }

  private CompletableFuture<Void> readRest(String sessionId, ResultName name, ToolResultPage first,
      ToolResultPage page, ByteArrayOutputStream bytes, int pageBytes, Executor executor) {
    if (page.offset() != bytes.size() || page.totalBytes() != first.totalBytes()
        || !page.sha256().equals(first.sha256())) {
      throw protocolViolation("the page at " + page.offset() + " (" + page.totalBytes() + " bytes, sha256 "
          + page.sha256() + ") disagrees with the pages before it (" + bytes.size() + " bytes read of "
          + first.totalBytes() + ", sha256 " + first.sha256() + ")");
    }
    byte[] data = page.data().getBytes(StandardCharsets.UTF_8);
    bytes.write(data, 0, data.length);
    if (page.complete()) {
      return CompletableFuture.completedFuture(null);
    }
    if (page.nextOffset() <= page.offset()) {
      throw protocolViolation("next_offset " + page.nextOffset() + " does not advance past " + page.offset());
    }
    return readPage(sessionId, name, page.nextOffset(), pageBytes, executor)
        .thenCompose(next -> readRest(sessionId, name, first, next, bytes, pageBytes, executor));
  }

  static String sha256Hex(byte[] data) {
    try {
      return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(data));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  // ---- the model's tools ---------------------------------------------------------------------

  CompletableFuture<Optional<String>> dispatchToolCall(
      String sessionId, String name, String arguments, Executor executor) {
    requireId(sessionId);
    ModelTools.Call call = ModelTools.parse(name, arguments);
    if (call == null) {
      return CompletableFuture.completedFuture(Optional.empty());
    }
    if (call instanceof ModelTools.BadCall bad) {
      return CompletableFuture.completedFuture(Optional.of(bad.answer()));
    }
    if (call instanceof ModelTools.BudgetCall) {
      return CompletableFuture.completedFuture(Optional.of(ModelTools.budgetAnswer(cachedView(sessionId))));
    }
    ModelTools.ReadCall read = (ModelTools.ReadCall) call;
    return readPage(sessionId, ResultName.ref(read.resultRef()), read.offset(), DEFAULT_PAGE_BYTES, executor)
        .thenApply(page -> Optional.of(ModelTools.pageAnswer(page)))
        .exceptionally(error -> Optional.of(ModelTools.errorAnswer(CtxfoldException.from(error))));
  }

  // ---- checkpoints ----------------------------------------------------------------------------

  CompletableFuture<Paged.Page<Checkpoint>> listCheckpointsPage(
      String sessionId, boolean includeAbandoned, int pageSize, String token, Executor executor) {
    return unary(ContextServiceGrpc.getListCheckpointsMethod(), ListCheckpointsRequest.newBuilder()
        .setSessionId(requireId(sessionId))
        .setPageSize(checkPageSize(pageSize, MAX_CHECKPOINT_PAGE_SIZE))
        .setPageToken(token)
        .setIncludeAbandoned(includeAbandoned)
        .build(), executor)
        .thenApply(r -> new Paged.Page<>(r.getCheckpointsList().stream().map(Checkpoint::fromProto).toList(),
            r.getNextPageToken()));
  }

  CompletableFuture<Checkpoint> getCheckpoint(String sessionId, String checkpointId, Executor executor) {
    return unary(ContextServiceGrpc.getGetCheckpointMethod(), GetCheckpointRequest.newBuilder()
        .setSessionId(requireId(sessionId))
        .setCheckpointId(Objects.requireNonNull(checkpointId, "checkpointId"))
        .build(), executor)
        .thenApply(r -> Checkpoint.fromProto(r.getCheckpoint()));
  }

  // ---- lifecycle ------------------------------------------------------------------------------

  void close() {
    if (shared.owned == null) {
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
}

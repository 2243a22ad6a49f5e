package dev.ctxfold.client;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Flow;
import java.util.concurrent.SubmissionPublisher;
import java.util.function.Consumer;
import java.util.function.Function;

/**
 * The asynchronous client: every operation of {@link CtxfoldClient} returning a
 * {@link CompletableFuture} (failed with a {@link CtxfoldException}), and the fold streams as a
 * {@link Flow.Publisher}. Get one with {@link CtxfoldClient#async()} or
 * {@link CtxfoldClient.Builder#buildAsync()}; both share one connection and view cache with the
 * blocking client.
 *
 * <pre>{@code
 * CtxfoldAsyncClient async = client.async();
 * async.createSession(settings)
 *     .thenCompose(s -> async.prepare(s.getId(), PrepareOptions.appending(Messages.user("hi"))))
 *     .thenAccept(view -> send(view.messages()));
 * }</pre>
 *
 * <p>Continuations and progress listeners run on gRPC's callback threads: do not block in them.
 */
public final class CtxfoldAsyncClient implements AutoCloseable {
  private final Engine engine;
  private final boolean root;

  CtxfoldAsyncClient(Engine engine, boolean root) {
    this.engine = engine;
    this.root = root;
  }

  /** The blocking twin of this client (same connection and view cache). */
  public CtxfoldClient sync() {
    return new CtxfoldClient(engine, false);
  }

  /** The same client with this deadline for every call. */
  public CtxfoldAsyncClient withDeadline(Duration deadline) {
    CtxfoldClient.checkDeadline(deadline);
    return new CtxfoldAsyncClient(engine.withDeadlines(deadline, deadline), false);
  }

  /** The same client sending this W3C {@code traceparent} (and {@code tracestate}, may be null). */
  public CtxfoldAsyncClient withTraceparent(String traceparent, String tracestate) {
    return new CtxfoldAsyncClient(engine.withTraceparent(CtxfoldClient.checkTraceparent(traceparent), tracestate),
        false);
  }

  public CompletableFuture<Session> createSession(SessionSettings settings) {
    return Engine.cancellable(() -> engine.createSession(settings, null));
  }

  public CompletableFuture<Session> getSession(String sessionId) {
    return Engine.cancellable(() -> engine.getSession(sessionId, null));
  }

  public CompletableFuture<Void> deleteSession(String sessionId) {
    return Engine.cancellable(() -> engine.deleteSession(sessionId, null));
  }

  public AsyncPaged<Session> listSessions() {
    return listSessions(0);
  }

  public AsyncPaged<Session> listSessions(int pageSize) {
    return new AsyncPaged<>(token -> engine.listSessionsPage(pageSize, token, null));
  }

  public CompletableFuture<Session> forkAtHead(String sessionId) {
    return forkAtHead(sessionId, null);
  }

  public CompletableFuture<Session> forkAtHead(String sessionId, SessionSettings overrides) {
    return Engine.cancellable(() -> engine.fork(sessionId, 0, overrides, null));
  }

  public CompletableFuture<Session> fork(String sessionId, long atSeq, SessionSettings overrides) {
    Engine.storedSeq("at_seq", atSeq); // the wire's 0 is the head: use forkAtHead for it
    return Engine.cancellable(() -> engine.fork(sessionId, atSeq, overrides, null));
  }

  public CompletableFuture<Session> rewind(String sessionId, long toSeq) {
    return Engine.cancellable(() -> engine.rewind(sessionId, toSeq, null));
  }

  public CompletableFuture<ContextState> getContextState(String sessionId) {
    return Engine.cancellable(() -> engine.getContextState(sessionId, null).thenApply(ContextState::parse));
  }

  public CompletableFuture<List<Message>> appendMessages(String sessionId, List<Message> messages, String requestId) {
    return Engine.cancellable(() -> engine.appendMessages(sessionId, messages, requestId, null));
  }

  public AsyncPaged<Message> listMessages(String sessionId, boolean includeAbandoned, int pageSize) {
    Engine.requireId(sessionId);
    return new AsyncPaged<>(token -> engine.listMessagesPage(sessionId, includeAbandoned, pageSize, token, null));
  }

  /** See {@link CtxfoldClient#prepare(String, PrepareOptions)}; progress goes to the options' listener. */
  public CompletableFuture<View> prepare(String sessionId, PrepareOptions options) {
    return Engine.cancellable(() -> engine.prepare(sessionId, options, null));
  }

  /**
   * The prepare call as a cold publisher: each subscription runs one call and receives its
   * progress events, then one {@link FoldEvent.Result}, then completion (or the error).
   */
  public Flow.Publisher<FoldEvent> prepareEvents(String sessionId, PrepareOptions options) {
    return publisher(listener -> engine.prepare(sessionId, options.toBuilder().onProgress(p -> {
      options.onProgress().accept(p);
      listener.accept(p);
    }).build(), null));
  }

  public CompletableFuture<View> compact(String sessionId, CompactOptions options) {
    return Engine.cancellable(() -> engine.compact(sessionId, options, null));
  }

  /** The compact call as a cold publisher (see {@link #prepareEvents}). */
  public Flow.Publisher<FoldEvent> compactEvents(String sessionId, CompactOptions options) {
    return publisher(listener -> engine.compact(sessionId, options.toBuilder().onProgress(p -> {
      options.onProgress().accept(p);
      listener.accept(p);
    }).build(), null));
  }

  private static Flow.Publisher<FoldEvent> publisher(Function<Consumer<FoldProgress>, CompletableFuture<View>> start) {
    return subscriber -> {
      SubmissionPublisher<FoldEvent> events = new SubmissionPublisher<>();
      CompletableFuture<Void> left = new CompletableFuture<>();
      events.subscribe(new LeavingSubscriber(subscriber, left));
      CompletableFuture<View> call =
          Engine.cancellable(() -> start.apply(p -> events.submit(new FoldEvent.Progress(p))));
      left.thenRun(() -> call.cancel(true)); // a subscriber that leaves ends the call, as breaking out of a loop does
      call.whenComplete((view, error) -> {
        if (error != null) {
          events.closeExceptionally(CtxfoldException.from(error));
        } else {
          events.submit(new FoldEvent.Result(view));
          events.close();
        }
      });
    };
  }

  /** A subscriber whose cancelled subscription completes {@code left}. */
  private record LeavingSubscriber(Flow.Subscriber<? super FoldEvent> subscriber, CompletableFuture<Void> left)
      implements Flow.Subscriber<FoldEvent> {
    @Override
    public void onSubscribe(Flow.Subscription subscription) {
      subscriber.onSubscribe(new Flow.Subscription() {
        @Override
        public void request(long n) {
          subscription.request(n);
        }

        @Override
        public void cancel() {
          subscription.cancel();
          left.complete(null);
        }
      });
    }

    @Override
    public void onNext(FoldEvent item) {
      subscriber.onNext(item);
    }

    @Override
    public void onError(Throwable error) {
      subscriber.onError(error);
    }

    @Override
    public void onComplete() {
      subscriber.onComplete();
    }
  }

  public Optional<View> lastView(String sessionId) {
    return Optional.ofNullable(engine.cachedView(sessionId));
  }

  public CompletableFuture<Message> edit(String sessionId, long seq, Message replacement, String requestId) {
    return Engine.cancellable(() -> engine.edit(sessionId, seq, replacement, requestId, null));
  }

  public CompletableFuture<View> retry(String sessionId, long answerSeq, Consumer<FoldProgress> onProgress) {
    PrepareOptions options = PrepareOptions.builder().onProgress(onProgress).build();
    return Engine.cancellable(() -> engine.retry(sessionId, answerSeq, options, null));
  }

  public CompletableFuture<UsageResult> observeUsage(String sessionId, long viewVersion, Usage usage) {
    return Engine.cancellable(() -> engine.observeUsage(sessionId, viewVersion, usage, null));
  }

  public CompletableFuture<UsageResult> observeUsage(String sessionId, View view, Usage usage) {
    return observeUsage(sessionId, view.viewVersion(), usage);
  }

  public CompletableFuture<ToolResult> readToolResult(String sessionId, String resultRef, int pageBytes) {
    Engine.ResultName name = Engine.ResultName.ref(resultRef);
    return Engine.cancellable(() -> engine.readWhole(sessionId, name, pageBytes, null));
  }

  public CompletableFuture<ToolResult> readToolResultOfCall(String sessionId, String toolCallId, int pageBytes) {
    Engine.ResultName name = Engine.ResultName.call(toolCallId);
    return Engine.cancellable(() -> engine.readWhole(sessionId, name, pageBytes, null));
  }

  public AsyncPaged<ToolResultPage> toolResultPages(String sessionId, String resultRef, long offset, int pageBytes) {
    Engine.requireId(sessionId);
    Engine.checkPageBytes(pageBytes);
    Engine.ResultName name = Engine.ResultName.ref(resultRef);
    return new AsyncPaged<>(token -> engine.toolResultPage(sessionId, name, offset, pageBytes, token, null));
  }

  /** See {@link CtxfoldClient#dispatchToolCall}. */
  public CompletableFuture<Optional<String>> dispatchToolCall(String sessionId, String name, String argumentsJson) {
    return Engine.cancellable(() -> engine.dispatchToolCall(sessionId, name, argumentsJson, null));
  }

  public AsyncPaged<ToolResultPage> toolResultPagesOfCall(
      String sessionId, String toolCallId, long offset, int pageBytes) {
    Engine.requireId(sessionId);
    Engine.checkPageBytes(pageBytes);
    Engine.ResultName name = Engine.ResultName.call(toolCallId);
    return new AsyncPaged<>(token -> engine.toolResultPage(sessionId, name, offset, pageBytes, token, null));
  }

  public AsyncPaged<Checkpoint> listCheckpoints(String sessionId, boolean includeAbandoned, int pageSize) {
    Engine.requireId(sessionId);
    return new AsyncPaged<>(token -> engine.listCheckpointsPage(sessionId, includeAbandoned, pageSize, token, null));
  }

  public CompletableFuture<Checkpoint> getCheckpoint(String sessionId, String checkpointId) {
    return Engine.cancellable(() -> engine.getCheckpoint(sessionId, checkpointId, null));
  }

  /** Closes the connection when this client opened it ({@link CtxfoldClient.Builder#buildAsync()}). */
  @Override
  public void close() {
    if (root) {
      engine.close();
    }
  }
}

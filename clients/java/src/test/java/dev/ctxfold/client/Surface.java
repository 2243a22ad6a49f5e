package dev.ctxfold.client;

import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.Flow;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.StreamSupport;

/**
 * The operations of the conformance scenarios, on one of the SDK's two surfaces: the blocking
 * {@link CtxfoldClient} or the {@link CtxfoldAsyncClient} (its futures and publishers awaited), so
 * every scenario checks both.
 */
interface Surface {
  Session createSession(SessionSettings settings);

  Session getSession(String id);

  List<Session> listSessions(int pageSize);

  void deleteSession(String id);

  List<Message> appendMessages(String id, List<Message> messages, String requestId);

  List<Message> listMessages(String id, boolean includeAbandoned, int pageSize);

  View prepare(String id, PrepareOptions options);

  List<FoldEvent> prepareEvents(String id, PrepareOptions options);

  View compact(String id, CompactOptions options);

  List<FoldEvent> compactEvents(String id, CompactOptions options);

  UsageResult observeUsage(String id, long viewVersion, Usage usage);

  ContextState getContextState(String id);

  Session forkAtHead(String id, SessionSettings overrides);

  Session fork(String id, long atSeq, SessionSettings overrides);

  Session rewind(String id, long toSeq);

  Message edit(String id, long seq, Message replacement, String requestId);

  View retry(String id, long answerSeq);

  ToolResult readToolResult(String id, String resultRef, int pageBytes);

  ToolResult readToolResultOfCall(String id, String toolCallId, int pageBytes);

  List<ToolResultPage> toolResultPages(String id, String resultRef, long offset, int pageBytes);

  List<ToolResultPage> toolResultPagesOfCall(String id, String toolCallId, long offset, int pageBytes);

  List<Checkpoint> listCheckpoints(String id, boolean includeAbandoned, int pageSize);

  Checkpoint getCheckpoint(String id, String checkpointId);

  Optional<String> dispatchToolCall(String id, String name, String arguments);

  private static <T> List<T> all(Iterable<T> items) {
    return StreamSupport.stream(items.spliterator(), false).collect(Collectors.toList());
  }

  static Surface blocking(CtxfoldClient c) {
    return new Surface() {
      public Session createSession(SessionSettings s) { return c.createSession(s); }
      public Session getSession(String id) { return c.getSession(id); }
      public List<Session> listSessions(int size) { return c.listSessions(size).toList(); }
      public void deleteSession(String id) { c.deleteSession(id); }
      public List<Message> appendMessages(String id, List<Message> m, String r) { return c.appendMessages(id, m, r); }
      public List<Message> listMessages(String id, boolean ab, int size) { return c.listMessages(id, ab, size).toList(); }
      public View prepare(String id, PrepareOptions o) { return c.prepare(id, o); }
      public List<FoldEvent> prepareEvents(String id, PrepareOptions o) { return drain(c.prepareEvents(id, o)); }
      public View compact(String id, CompactOptions o) { return c.compact(id, o); }
      public List<FoldEvent> compactEvents(String id, CompactOptions o) { return drain(c.compactEvents(id, o)); }
      public UsageResult observeUsage(String id, long v, Usage u) { return c.observeUsage(id, v, u); }
      public ContextState getContextState(String id) { return c.getContextState(id); }
      public Session forkAtHead(String id, SessionSettings o) { return c.forkAtHead(id, o); }
      public Session fork(String id, long at, SessionSettings o) { return c.fork(id, at, o); }
      public Session rewind(String id, long to) { return c.rewind(id, to); }
      public Message edit(String id, long seq, Message m, String r) { return c.edit(id, seq, m, r); }
      public View retry(String id, long seq) { return c.retry(id, seq); }
      public ToolResult readToolResult(String id, String ref, int b) { return c.readToolResult(id, ref, b); }
      public ToolResult readToolResultOfCall(String id, String call, int b) { return c.readToolResultOfCall(id, call, b); }
      public List<ToolResultPage> toolResultPages(String id, String ref, long off, int b) {
        return all(c.toolResultPages(id, ref, off, b));
      }
      public List<ToolResultPage> toolResultPagesOfCall(String id, String call, long off, int b) {
        return all(c.toolResultPagesOfCall(id, call, off, b));
      }
      public List<Checkpoint> listCheckpoints(String id, boolean ab, int size) {
        return c.listCheckpoints(id, ab, size).toList();
      }
      public Checkpoint getCheckpoint(String id, String cp) { return c.getCheckpoint(id, cp); }
      public Optional<String> dispatchToolCall(String id, String n, String a) { return c.dispatchToolCall(id, n, a); }
    };
  }

  private static List<FoldEvent> drain(FoldEvents events) {
    List<FoldEvent> all = new ArrayList<>();
    for (FoldEvent event : events) {
      all.add(event);
    }
    return all;
  }

  /** A future's value, its failure rethrown as the CtxfoldException it carries. */
  private static <T> T join(CompletableFuture<T> future) {
    try {
      return future.orTimeout(120, TimeUnit.SECONDS).join();
    } catch (CompletionException e) {
      throw CtxfoldException.from(e);
    }
  }

  /** Every event of a publisher, in order, after it completed. */
  private static List<FoldEvent> collect(Flow.Publisher<FoldEvent> publisher) {
    List<FoldEvent> events = new ArrayList<>();
    CompletableFuture<List<FoldEvent>> done = new CompletableFuture<>();
    publisher.subscribe(new Flow.Subscriber<>() {
      public void onSubscribe(Flow.Subscription subscription) { subscription.request(Long.MAX_VALUE); }
      public void onNext(FoldEvent event) { events.add(event); }
      public void onError(Throwable error) { done.completeExceptionally(error); }
      public void onComplete() { done.complete(events); }
    });
    return join(done);
  }

  static Surface async(CtxfoldAsyncClient c) {
    return new Surface() {
      public Session createSession(SessionSettings s) { return join(c.createSession(s)); }
      public Session getSession(String id) { return join(c.getSession(id)); }
      public List<Session> listSessions(int size) { return join(c.listSessions(size).toList()); }
      public void deleteSession(String id) { join(c.deleteSession(id)); }
      public List<Message> appendMessages(String id, List<Message> m, String r) { return join(c.appendMessages(id, m, r)); }
      public List<Message> listMessages(String id, boolean ab, int size) {
        return join(c.listMessages(id, ab, size).toList());
      }
      public View prepare(String id, PrepareOptions o) { return join(c.prepare(id, o)); }
      public List<FoldEvent> prepareEvents(String id, PrepareOptions o) { return collect(c.prepareEvents(id, o)); }
      public View compact(String id, CompactOptions o) { return join(c.compact(id, o)); }
      public List<FoldEvent> compactEvents(String id, CompactOptions o) { return collect(c.compactEvents(id, o)); }
      public UsageResult observeUsage(String id, long v, Usage u) { return join(c.observeUsage(id, v, u)); }
      public ContextState getContextState(String id) { return join(c.getContextState(id)); }
      public Session forkAtHead(String id, SessionSettings o) { return join(c.forkAtHead(id, o)); }
      public Session fork(String id, long at, SessionSettings o) { return join(c.fork(id, at, o)); }
      public Session rewind(String id, long to) { return join(c.rewind(id, to)); }
      public Message edit(String id, long seq, Message m, String r) { return join(c.edit(id, seq, m, r)); }
      public View retry(String id, long seq) { return join(c.retry(id, seq, p -> { })); }
      public ToolResult readToolResult(String id, String ref, int b) { return join(c.readToolResult(id, ref, b)); }
      public ToolResult readToolResultOfCall(String id, String call, int b) {
        return join(c.readToolResultOfCall(id, call, b));
      }
      public List<ToolResultPage> toolResultPages(String id, String ref, long off, int b) {
        return join(c.toolResultPages(id, ref, off, b).toList());
      }
      public List<ToolResultPage> toolResultPagesOfCall(String id, String call, long off, int b) {
        return join(c.toolResultPagesOfCall(id, call, off, b).toList());
      }
      public List<Checkpoint> listCheckpoints(String id, boolean ab, int size) {
        return join(c.listCheckpoints(id, ab, size).toList());
      }
      public Checkpoint getCheckpoint(String id, String cp) { return join(c.getCheckpoint(id, cp)); }
      public Optional<String> dispatchToolCall(String id, String n, String a) {
        return join(c.dispatchToolCall(id, n, a));
      }
    };
  }
}

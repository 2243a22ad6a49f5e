package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.ctxfold.v1.Action;
import dev.ctxfold.v1.ErrorReason;
import dev.ctxfold.v1.FoldStage;
import dev.ctxfold.v1.Role;
import io.grpc.Status;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Runs the client against a real {@code ctxfold serve} (no auth, plaintext, SQLite). */
class EndToEndTest {
  private static CtxfoldServer server;
  private static CtxfoldClient client;

  @BeforeAll
  static void startServer() throws Exception {
    server = CtxfoldServer.start();
    client = CtxfoldClient.builder()
        .target(server.target())
        .unaryDeadline(Duration.ofSeconds(60))
        .build();
    awaitReady(client);
  }

  @AfterAll
  static void stopServer() throws Exception {
    if (client != null) {
      client.close();
    }
    if (server != null) {
      server.close();
    }
  }

  /** Retries a cheap call until the server answers (it may still be migrating its database). */
  static void awaitReady(CtxfoldClient c) throws InterruptedException {
    long end = System.nanoTime() + Duration.ofSeconds(30).toNanos();
    while (true) {
      try {
        c.withDeadline(Duration.ofSeconds(2)).listSessions(1).iterator().hasNext();
        return;
      } catch (CtxfoldException e) {
        if (e.code() == Status.Code.UNAUTHENTICATED) {
          return;
        }
        if (System.nanoTime() > end) {
          throw e;
        }
        Thread.sleep(200);
      }
    }
  }

  private static Session newSession(long window) {
    return client.createSession(SessionSettings.builder().contextWindow(window).maxOutputTokens(256).build());
  }

  // ---- session lifecycle ----------------------------------------------------------------------

  @Test
  void sessionLifecycle() throws Exception {
    Session created = client.createSession(SessionSettings.builder()
        .contextWindow(32_000)
        .maxOutputTokens(1_000)
        .systemPrompt("be brief")
        .model("test-model")
        .build());
    assertFalse(created.id().isEmpty());
    assertEquals(0, created.headSeq());
    SessionSettings effective = created.config();
    assertEquals(32_000, effective.contextWindow());
    assertEquals(0.80, effective.compactRatio(), 1e-9, "defaults are filled in");
    assertEquals("extractive", effective.summarizer());

    List<Message> appended = client.appendMessages(created.id(), Messages.user("hello"), Messages.assistant("hi!"));
    assertEquals(List.of(1L, 2L), appended.stream().map(Message::seq).collect(Collectors.toList()));
    assertTrue(appended.stream().allMatch(m -> !m.id().isEmpty()));

    Session read = client.getSession(created.id());
    assertEquals(2, read.headSeq());

    List<Message> transcript = client.listMessages(created.id(), false, 1).toList();
    assertEquals(List.of("hello", "hi!"), transcript.stream().map(Message::content).collect(Collectors.toList()));

    ContextState state = client.getContextState(created.id());
    assertEquals(3, state.schemaVersion());
    assertFalse(state.views().isEmpty() && state.generation() == 0, state.toString());

    Session other = newSession(8_000);
    List<String> ids = new ArrayList<>();
    for (Session s : client.listSessions(1)) { // one session a page: exercises the page tokens
      ids.add(s.id());
    }
    assertTrue(ids.containsAll(List.of(created.id(), other.id())), ids.toString());
    assertEquals(ids.size(), new HashSet<>(ids).size(), "no session twice across pages");

    client.deleteSession(created.id());
    CtxfoldException gone = assertThrows(CtxfoldException.class, () -> client.getSession(created.id()));
    assertEquals(ErrorReason.SESSION_NOT_FOUND, gone.errorReason());
    client.deleteSession(other.id());
  }

  @Test
  void idempotentAppendWithRequestId() {
    Session s = newSession(8_000);
    List<Message> first = client.appendMessages(s.id(), List.of(Messages.user("once")), "req-1");
    List<Message> again = client.appendMessages(s.id(), List.of(Messages.user("once")), "req-1");
    assertEquals(first.get(0).id(), again.get(0).id());
    assertEquals(1, client.getSession(s.id()).headSeq());
  }

  // ---- deltas ---------------------------------------------------------------------------------

  @Test
  void deltaIsAppliedToTheHeldView() throws Exception {
    Session s = newSession(100_000);
    View first = client.prepare(s.id(), Messages.user("one"));
    assertFalse(first.delta());
    assertEquals(1, first.messages().size());

    View second = client.prepare(s.id(), Messages.assistant("two"), Messages.user("three"));
    assertTrue(second.delta(), "the server answers with the new messages only");
    assertEquals(2, second.received().size());
    assertEquals(List.of("one", "two", "three"),
        second.messages().stream().map(Message::content).collect(Collectors.toList()));
    assertEquals(1, second.stablePrefixMessages());
    assertEquals(List.of(2L, 3L), second.appended().stream().map(Message::seq).collect(Collectors.toList()));

    // A fresh client (no view held) gets the whole view, equal to the assembled one.
    try (CtxfoldClient fresh = CtxfoldClient.connect(server.target())) {
      View whole = fresh.prepare(s.id());
      assertFalse(whole.delta());
      assertEquals(second.messages(), whole.messages());
      assertEquals(second.viewVersion(), whole.viewVersion());
    }

    // Nothing new: an empty delta still yields the whole view.
    View same = client.prepare(s.id());
    assertTrue(same.delta());
    assertEquals(0, same.received().size());
    assertEquals(second.messages(), same.messages());

    // useDelta(false) asks for the whole view.
    View full = client.prepare(s.id(), PrepareOptions.builder().useDelta(false).build());
    assertFalse(full.delta());
    assertEquals(second.messages(), full.messages());
  }

  /** About 1500 characters of a directory listing, different for every path. */
  private static String listing(String path) {
    StringBuilder out = new StringBuilder();
    int seed = Math.abs(path.hashCode());
    for (int i = 0; out.length() < 1500; i++) {
      out.append(String.format("-rw-r--r-- 1 dev dev %6d Nov %2d 10:%02d %s/%s_%d.java%n",
          (seed * 31 + i * 7919) % 90_000 + 100, i % 28 + 1, (seed + i) % 60, path,
          List.of("Handler", "Client", "Config", "Retry", "Backoff", "Test").get((seed + i) % 6), i));
    }
    return out.toString();
  }

  @Test
  void manualCompactFoldsWithProgress() {
    Session s = client.createSession(SessionSettings.builder().contextWindow(16_000).maxOutputTokens(256).build());
    client.prepare(s.id(), Messages.user("Survey the modules."));
    for (int i = 1; i <= 4; i++) {
      String id = "c" + i;
      client.prepare(s.id(),
          Messages.assistant("looking", Messages.toolCall(id, "list_files", "{\"path\":\"m" + i + "\"}")),
          Messages.toolResult(id, listing("m" + i)));
    }
    List<FoldProgress> seen = new ArrayList<>();
    View compacted = client.compact(s.id(),
        CompactOptions.builder().focus("keep the module names").onProgress(seen::add).build());
    assertEquals(Action.ACTION_FOLDED, compacted.action(),
        compacted + " " + compacted.notFoldedReason() + ": " + compacted.notFoldedDetail());
    assertTrue(compacted.summary().isPresent());
    assertFalse(seen.isEmpty());
    assertEquals(seen, compacted.progress());
    assertEquals(client.getSession(s.id()).checkpointId(), compacted.checkpointId());

    // After a compaction, a prepare with the held view gets a delta against the compacted view.
    View next = client.prepare(s.id(), Messages.assistant("done"));
    assertEquals(compacted.messages().size() + 1, next.messages().size());
    assertEquals(compacted.messages(), next.messages().subList(0, compacted.messages().size()));
  }

  @Test
  void theAsyncClientFoldsAndPublishesProgress() throws Exception {
    CtxfoldAsyncClient async = client.async();
    Session s = async.createSession(SessionSettings.builder().contextWindow(16_000).maxOutputTokens(256).build())
        .get(30, java.util.concurrent.TimeUnit.SECONDS);
    CompletableFuture<View> chain = async.prepare(s.id(), PrepareOptions.appending(Messages.user("Survey.")));
    for (int i = 1; i <= 4; i++) {
      String id = "c" + i;
      Message call = Messages.assistant("looking", Messages.toolCall(id, "list_files", "{\"path\":\"m" + i + "\"}"));
      Message result = Messages.toolResult(id, listing("m" + i));
      chain = chain.thenCompose(v -> async.prepare(s.id(), PrepareOptions.appending(call, result)));
    }
    assertEquals(9, chain.get(30, java.util.concurrent.TimeUnit.SECONDS).messages().size());

    List<FoldEvent> events = new java.util.concurrent.CopyOnWriteArrayList<>();
    CompletableFuture<Void> done = new CompletableFuture<>();
    async.compactEvents(s.id(), CompactOptions.defaults()).subscribe(new java.util.concurrent.Flow.Subscriber<>() {
      @Override
      public void onSubscribe(java.util.concurrent.Flow.Subscription subscription) {
        subscription.request(Long.MAX_VALUE);
      }

      @Override
      public void onNext(FoldEvent event) {
        events.add(event);
      }

      @Override
      public void onError(Throwable error) {
        done.completeExceptionally(error);
      }

      @Override
      public void onComplete() {
        done.complete(null);
      }
    });
    done.get(60, java.util.concurrent.TimeUnit.SECONDS);
    View folded = ((FoldEvent.Result) events.get(events.size() - 1)).view();
    assertEquals(Action.ACTION_FOLDED, folded.action(), folded.toString());
    assertTrue(events.stream().anyMatch(e -> e instanceof FoldEvent.Progress p
        && p.progress().stage() == FoldStage.FOLD_STAGE_PASS_COMMITTED), events.toString());
    assertEquals(folded.checkpointId(), client.getSession(s.id()).checkpointId(), "the blocking twin sees it");
  }

  // ---- tool results ---------------------------------------------------------------------------

  @Test
  void readToolResultRoundTripsLargeMultibyteText() throws Exception {
    StringBuilder text = new StringBuilder();
    for (int i = 0; text.toString().getBytes(StandardCharsets.UTF_8).length < 80_000; i++) {
      text.append(String.format("%05d héllo wörld — 日本語のテキスト 🚀✨ Ωμέγα ∑ %s%n", i, "ß".repeat(i % 7)));
    }
    String raw = text.toString();
    byte[] rawBytes = raw.getBytes(StandardCharsets.UTF_8);
    assertTrue(rawBytes.length > 32 * 1024);

    Session s = newSession(100_000);
    client.prepare(s.id(), Messages.user("dump the log"));
    List<Message> appended = client.appendMessages(s.id(),
        Messages.assistant("", Messages.toolCall("call_big", "cat", "{\"path\":\"log.txt\"}")),
        Messages.toolResult("call_big", raw));
    Message tool = appended.get(1);
    assertTrue(tool.truncated(), "a result above 32 KiB is bounded");
    assertEquals(rawBytes.length, tool.rawBytes());
    assertFalse(tool.resultRef().isEmpty());
    assertTrue(tool.content().getBytes(StandardCharsets.UTF_8).length <= 32 * 1024);
    assertTrue(tool.content().contains(tool.resultRef()), "the marker names the result_ref");

    ToolResult byRef = client.readToolResult(s.id(), tool.resultRef());
    assertEquals(raw, byRef.text());
    assertArrayEquals(rawBytes, byRef.bytes());
    assertEquals(rawBytes.length, byRef.totalBytes());
    assertEquals(Engine.sha256Hex(rawBytes), byRef.sha256());
    assertEquals(tool.resultRef(), byRef.resultRef());

    ToolResult byCall = client.readToolResultOfCall(s.id(), "call_big");
    assertEquals(raw, byCall.text());

    // Pages end on character boundaries; an offset inside a character is refused.
    ToolResultPage page = client.toolResultPages(s.id(), tool.resultRef(), 0, 4096).iterator().next();
    assertTrue(page.nextOffset() <= 4096 && page.nextOffset() > 4000);
    assertEquals(page.nextOffset(), page.data().getBytes(StandardCharsets.UTF_8).length);
    assertFalse(page.complete());
    int inside = raw.indexOf('é');
    long insideOffset = raw.substring(0, inside).getBytes(StandardCharsets.UTF_8).length + 1;
    CtxfoldException e = assertThrows(CtxfoldException.class,
        () -> client.toolResultPages(s.id(), tool.resultRef(), insideOffset, 100).iterator().next());
    assertEquals(ErrorReason.OFFSET_NOT_CHAR_BOUNDARY, e.errorReason());
    assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
  }

  // ---- edit / retry / fork --------------------------------------------------------------------

  @Test
  void editReplacesAMessageAndAbandonsTheRest() {
    Session s = newSession(50_000);
    client.prepare(s.id(), Messages.user("What is 2+2?"));
    client.appendMessages(s.id(), Messages.assistant("4"));
    client.appendMessages(s.id(), Messages.user("And 3+3?"));

    Message edited = client.edit(s.id(), 3, Messages.user("And 3+4?"));
    assertEquals(3, edited.seq());
    assertEquals("And 3+4?", edited.content());

    List<Message> live = client.listMessages(s.id()).toList();
    assertEquals(List.of("What is 2+2?", "4", "And 3+4?"),
        live.stream().map(Message::content).collect(Collectors.toList()));
    List<Message> all = client.listMessages(s.id(), true, 100).toList();
    assertTrue(all.stream().anyMatch(m -> m.abandoned() && m.content().equals("And 3+3?")),
        "the old version stays readable as abandoned");

    client.edit(s.id(), 1, Messages.user("What is 5+5?"));
    View view = client.prepare(s.id());
    assertEquals(List.of("What is 5+5?"), view.messages().stream().map(Message::content).collect(Collectors.toList()));
    assertEquals(1, client.getSession(s.id()).headSeq());
  }

  @Test
  void retryRewindsBeforeTheAnswerAndPreparesAgain() {
    Session s = newSession(50_000);
    View before = client.prepare(s.id(), Messages.user("Name a prime."));
    Message answer = client.appendMessages(s.id(), Messages.assistant("Nine.")).get(0);
    assertEquals(2, answer.seq());

    View again = client.retry(s.id(), answer.seq());
    assertEquals(before.messages(), again.messages(), "the model sees the same view again");
    assertEquals(Role.ROLE_USER, again.messages().get(again.messages().size() - 1).role());
    assertEquals(1, client.getSession(s.id()).headSeq());

    Message better = client.appendMessages(s.id(), Messages.assistant("Seven.")).get(0);
    assertEquals(2, better.seq());
    assertNotEquals(answer.id(), better.id());
  }

  @Test
  void forkWithOverrides() {
    Session s = newSession(50_000);
    client.appendMessages(s.id(), Messages.user("a"), Messages.assistant("b"), Messages.user("c"));
    Session fork = client.fork(s.id(), 2, SessionSettings.overrides().systemPrompt("forked").build());
    assertNotEquals(s.id(), fork.id());
    assertEquals(2, fork.headSeq());
    assertEquals(s.id(), fork.forkedFromSessionId());
    assertEquals("forked", fork.config().systemPrompt());
    assertEquals(50_000, fork.config().contextWindow());
    assertEquals(List.of("a", "b"), client.listMessages(fork.id()).stream()
        .map(Message::content).collect(Collectors.toList()));
  }

  // ---- errors ---------------------------------------------------------------------------------

  @Test
  void unknownSessionIsSessionNotFound() {
    CtxfoldException e = assertThrows(CtxfoldException.class,
        () -> client.prepare("s_does_not_exist", Messages.user("hi")));
    assertEquals(Status.Code.NOT_FOUND, e.code());
    assertEquals(ErrorReason.SESSION_NOT_FOUND, e.errorReason());
    assertTrue(e.is(ErrorReason.SESSION_NOT_FOUND));
    assertEquals("ctxfold.dev", e.domain());
    assertEquals("s_does_not_exist", e.metadata().get("session_id"), e.metadata().toString());
    assertFalse(e.statusMessage().isEmpty());
    assertTrue(e.getMessage().contains("SESSION_NOT_FOUND"), e.getMessage());
  }

  @Test
  void otherErrorsCarryTheirReasons() {
    CtxfoldException config = assertThrows(CtxfoldException.class,
        () -> client.createSession(SessionSettings.overrides().build()));
    assertEquals(Status.Code.INVALID_ARGUMENT, config.code());
    assertEquals(ErrorReason.INVALID_CONFIG, config.errorReason());

    Session s = newSession(50_000);
    client.appendMessages(s.id(), Messages.user("run it"),
        Messages.assistant("", Messages.toolCall("t1", "run", "{}")));
    CtxfoldException pending = assertThrows(CtxfoldException.class,
        () -> client.appendMessages(s.id(), Messages.user("are you there?")));
    assertEquals(Status.Code.FAILED_PRECONDITION, pending.code());
    assertEquals(ErrorReason.TOOL_RESULTS_PENDING, pending.errorReason());

    CtxfoldException late = assertThrows(CtxfoldException.class,
        () -> client.withDeadline(Duration.ofNanos(1)).getSession(s.id()));
    assertEquals(Status.Code.DEADLINE_EXCEEDED, late.code());
    assertEquals("", late.reason());
  }
}

package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.ctxfold.examples.AgentLoop;
import dev.ctxfold.v1.Action;
import dev.ctxfold.v1.FoldProgress;
import dev.ctxfold.v1.FoldStage;
import dev.ctxfold.v1.Message;
import dev.ctxfold.v1.ReadToolResultResponse;
import dev.ctxfold.v1.Role;
import dev.ctxfold.v1.Session;
import io.grpc.Status;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
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
        .defaultDeadline(Duration.ofSeconds(60))
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
    return client.createSession(SessionConfig.builder().contextWindow(window).maxOutputTokens(256).build());
  }

  // ---- session lifecycle ----------------------------------------------------------------------

  @Test
  void sessionLifecycle() throws Exception {
    Session created = client.createSession(SessionConfig.builder()
        .contextWindow(32_000)
        .maxOutputTokens(1_000)
        .systemPrompt("be brief")
        .model("test-model")
        .build());
    assertFalse(created.getId().isEmpty());
    assertEquals(0, created.getHeadSeq());
    SessionConfig effective = SessionConfig.fromProto(created.getConfig());
    assertEquals(32_000, effective.contextWindow());
    assertEquals(0.80, effective.compactRatio(), 1e-9, "defaults are filled in");
    assertEquals("extractive", effective.summarizer());

    List<Message> appended = client.append(created.getId(), Messages.user("hello"), Messages.assistant("hi!"));
    assertEquals(List.of(1L, 2L), appended.stream().map(Message::getSeq).collect(Collectors.toList()));
    assertTrue(appended.stream().allMatch(m -> !m.getId().isEmpty()));

    Session read = client.getSession(created.getId());
    assertEquals(2, read.getHeadSeq());

    List<Message> transcript = client.listMessages(created.getId(), 1, false).toList();
    assertEquals(List.of("hello", "hi!"), transcript.stream().map(Message::getContent).collect(Collectors.toList()));

    String state = client.getContextState(created.getId());
    assertTrue(state.contains("\"schema_version\": 3") || state.contains("\"schema_version\":3"), state);

    Session other = newSession(8_000);
    List<String> ids = new ArrayList<>();
    for (Session s : client.listSessions(1)) { // one session a page: exercises the page tokens
      ids.add(s.getId());
    }
    assertTrue(ids.containsAll(List.of(created.getId(), other.getId())), ids.toString());
    assertEquals(ids.size(), new HashSet<>(ids).size(), "no session twice across pages");

    client.deleteSession(created.getId());
    CtxfoldException gone = assertThrows(CtxfoldException.class, () -> client.getSession(created.getId()));
    assertEquals(Reasons.SESSION_NOT_FOUND, gone.reason());
    client.deleteSession(other.getId());
  }

  @Test
  void idempotentAppendWithRequestId() {
    Session s = newSession(8_000);
    List<Message> first = client.append(s.getId(), List.of(Messages.user("once")), "req-1");
    List<Message> again = client.append(s.getId(), List.of(Messages.user("once")), "req-1");
    assertEquals(first.get(0).getId(), again.get(0).getId());
    assertEquals(1, client.getSession(s.getId()).getHeadSeq());
  }

  // ---- the example agent loop with a fold -----------------------------------------------------

  @Test
  void agentLoopExampleFoldsWithProgress() {
    ByteArrayOutputStream logBytes = new ByteArrayOutputStream();
    AgentLoop.Report report = AgentLoop.run(client, 8,
        new PrintStream(logBytes, true, StandardCharsets.UTF_8));
    String log = logBytes.toString(StandardCharsets.UTF_8);

    assertTrue(report.folded(), "the loop should fold at least once:\n" + log);
    Set<FoldStage> stages = report.progress().stream().map(FoldProgress::getStage)
        .collect(Collectors.toCollection(() -> EnumSet.noneOf(FoldStage.class)));
    assertTrue(stages.containsAll(EnumSet.of(FoldStage.FOLD_STAGE_PLANNED, FoldStage.FOLD_STAGE_PASS_STARTED,
        FoldStage.FOLD_STAGE_PASS_COMMITTED)), stages + "\n" + log);
    assertTrue(log.contains("fold: FOLD_STAGE_PASS_COMMITTED"), log);

    PreparedContext folded = report.contexts().stream().filter(PreparedContext::folded).findFirst().orElseThrow();
    assertFalse(folded.checkpointId().isEmpty());
    assertTrue(folded.summary().isPresent(), "a folded view has a summary message");
    assertEquals(1, folded.messages().stream().filter(Message::getSummary).count());
    assertEquals(Role.ROLE_SYSTEM, folded.messages().get(0).getRole());
    assertTrue(folded.progress().stream().anyMatch(p -> p.getStage() == FoldStage.FOLD_STAGE_PASS_COMMITTED
        && p.getCheckpointId().equals(folded.checkpointId()) && p.getTokensAfter() < p.getTokensBefore()));
    for (PreparedContext ctx : report.contexts()) {
      assertTrue(ctx.estimatedTokens() <= ctx.hardLimitTokens(), ctx.toString());
      assertEquals(ctx.toProto().getViewMessageCount(), ctx.messages().size(), ctx.toString());
    }
    assertTrue(report.contexts().stream().anyMatch(PreparedContext::delta), "turns below the trigger use deltas");
    assertTrue(report.answer().startsWith("The retry policy"), report.answer());
    assertTrue(report.lastCalibration().factor() > 0);

    // The client's assembled view equals the server's whole view.
    PreparedContext whole = client.prepare(report.sessionId(), PrepareOptions.builder().useDelta(false).build());
    PreparedContext last = report.contexts().get(report.contexts().size() - 1);
    List<Message> expected = new ArrayList<>(last.messages());
    List<Message> actual = whole.messages();
    assertEquals(expected, actual.subList(0, expected.size()), "the last view is a prefix of the current one");
    assertEquals(Role.ROLE_ASSISTANT, actual.get(actual.size() - 1).getRole(), "the final answer follows it");
  }

  // ---- deltas ---------------------------------------------------------------------------------

  @Test
  void deltaIsAppliedToTheHeldView() throws Exception {
    Session s = newSession(100_000);
    PreparedContext first = client.prepare(s.getId(), Messages.user("one"));
    assertFalse(first.delta());
    assertEquals(1, first.messages().size());

    PreparedContext second = client.prepare(s.getId(), Messages.assistant("two"), Messages.user("three"));
    assertTrue(second.delta(), "the server answers with the new messages only");
    assertEquals(2, second.received().size());
    assertEquals(List.of("one", "two", "three"),
        second.messages().stream().map(Message::getContent).collect(Collectors.toList()));
    assertEquals(1, second.stablePrefixMessages());
    assertEquals(List.of(2L, 3L), second.appended().stream().map(Message::getSeq).collect(Collectors.toList()));

    // A fresh client (no view held) gets the whole view, equal to the assembled one.
    try (CtxfoldClient fresh = CtxfoldClient.connect(server.target())) {
      PreparedContext whole = fresh.prepare(s.getId());
      assertFalse(whole.delta());
      assertEquals(second.messages(), whole.messages());
      assertEquals(second.viewVersion(), whole.viewVersion());
    }

    // Nothing new: an empty delta still yields the whole view.
    PreparedContext same = client.prepare(s.getId());
    assertTrue(same.delta());
    assertEquals(0, same.received().size());
    assertEquals(second.messages(), same.messages());

    // useDelta(false) asks for the whole view.
    PreparedContext full = client.prepare(s.getId(), PrepareOptions.builder().useDelta(false).build());
    assertFalse(full.delta());
    assertEquals(second.messages(), full.messages());
  }

  @Test
  void manualCompactFoldsWithProgress() {
    Session s = client.createSession(SessionConfig.builder().contextWindow(16_000).maxOutputTokens(256).build());
    client.prepare(s.getId(), Messages.user("Survey the modules."));
    for (int i = 1; i <= 4; i++) {
      String id = "c" + i;
      client.prepare(s.getId(),
          Messages.assistant("looking", Messages.toolCall(id, "list_files", "{\"path\":\"m" + i + "\"}")),
          Messages.toolResult(id, AgentLoop.FakeModel.listFiles(Messages.toolCall(id, "list_files",
              "{\"path\":\"m" + i + "\"}"))));
    }
    List<FoldProgress> seen = new ArrayList<>();
    PreparedContext compacted = client.compact(s.getId(), "keep the module names", seen::add);
    assertEquals(Action.ACTION_FOLDED, compacted.action(), compacted.toString());
    assertTrue(compacted.summary().isPresent());
    assertFalse(seen.isEmpty());
    assertEquals(seen, compacted.progress());
    assertEquals(client.getSession(s.getId()).getCheckpointId(), compacted.checkpointId());

    // After a compaction, a prepare with the held view gets a delta against the compacted view.
    PreparedContext next = client.prepare(s.getId(), Messages.assistant("done"));
    assertEquals(compacted.messages().size() + 1, next.messages().size());
    assertEquals(compacted.messages(), next.messages().subList(0, compacted.messages().size()));
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
    client.prepare(s.getId(), Messages.user("dump the log"));
    List<Message> appended = client.append(s.getId(),
        Messages.assistant("", Messages.toolCall("call_big", "cat", "{\"path\":\"log.txt\"}")),
        Messages.toolResult("call_big", raw));
    Message tool = appended.get(1);
    assertTrue(tool.getTruncated(), "a result above 32 KiB is bounded");
    assertEquals(rawBytes.length, tool.getRawBytes());
    assertFalse(tool.getResultRef().isEmpty());
    assertTrue(tool.getContent().getBytes(StandardCharsets.UTF_8).length <= 32 * 1024);
    assertTrue(tool.getContent().contains(tool.getResultRef()), "the marker names the result_ref");

    ToolResult byRef = client.readToolResult(s.getId(), tool.getResultRef());
    assertEquals(raw, byRef.text());
    assertArrayEquals(rawBytes, byRef.bytes());
    assertEquals(rawBytes.length, byRef.totalBytes());
    assertEquals(CtxfoldClient.sha256Hex(rawBytes), byRef.sha256());
    assertEquals(tool.getResultRef(), byRef.resultRef());

    ToolResult byCall = client.readToolResultOfCall(s.getId(), "call_big");
    assertEquals(raw, byCall.text());

    // Pages end on character boundaries; an offset inside a character is refused.
    ReadToolResultResponse page = client.readToolResultPage(s.getId(), tool.getResultRef(), "", 0, 4096);
    assertTrue(page.getNextOffset() <= 4096 && page.getNextOffset() > 4000);
    assertEquals(page.getNextOffset(), page.getData().getBytes(StandardCharsets.UTF_8).length);
    assertFalse(page.getComplete());
    int inside = raw.indexOf('é');
    long insideOffset = raw.substring(0, inside).getBytes(StandardCharsets.UTF_8).length + 1;
    CtxfoldException e = assertThrows(CtxfoldException.class,
        () -> client.readToolResultPage(s.getId(), tool.getResultRef(), "", insideOffset, 100));
    assertEquals(Reasons.OFFSET_NOT_CHAR_BOUNDARY, e.reason());
    assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
  }

  // ---- edit / retry / fork --------------------------------------------------------------------

  @Test
  void editReplacesAMessageAndAbandonsTheRest() {
    Session s = newSession(50_000);
    client.prepare(s.getId(), Messages.user("What is 2+2?"));
    client.append(s.getId(), Messages.assistant("4"));
    client.append(s.getId(), Messages.user("And 3+3?"));

    Message edited = client.edit(s.getId(), 3, Messages.user("And 3+4?"));
    assertEquals(3, edited.getSeq());
    assertEquals("And 3+4?", edited.getContent());

    List<Message> live = client.listMessages(s.getId()).toList();
    assertEquals(List.of("What is 2+2?", "4", "And 3+4?"),
        live.stream().map(Message::getContent).collect(Collectors.toList()));
    List<Message> all = client.listMessages(s.getId(), 100, true).toList();
    assertTrue(all.stream().anyMatch(m -> m.getAbandoned() && m.getContent().equals("And 3+3?")),
        "the old version stays readable as abandoned");

    PreparedContext view = client.editAndPrepare(s.getId(), 1, Messages.user("What is 5+5?"),
        PrepareOptions.defaults());
    assertEquals(List.of("What is 5+5?"), view.messages().stream().map(Message::getContent).collect(Collectors.toList()));
    assertEquals(1, client.getSession(s.getId()).getHeadSeq());
  }

  @Test
  void retryRewindsBeforeTheAnswerAndPreparesAgain() {
    Session s = newSession(50_000);
    PreparedContext before = client.prepare(s.getId(), Messages.user("Name a prime."));
    Message answer = client.append(s.getId(), Messages.assistant("Nine.")).get(0);
    assertEquals(2, answer.getSeq());

    PreparedContext again = client.retry(s.getId(), answer.getSeq());
    assertEquals(before.messages(), again.messages(), "the model sees the same view again");
    assertEquals(Role.ROLE_USER, again.messages().get(again.messages().size() - 1).getRole());
    assertEquals(1, client.getSession(s.getId()).getHeadSeq());

    Message better = client.append(s.getId(), Messages.assistant("Seven.")).get(0);
    assertEquals(2, better.getSeq());
    assertNotEquals(answer.getId(), better.getId());
  }

  @Test
  void forkWithOverrides() {
    Session s = newSession(50_000);
    client.append(s.getId(), Messages.user("a"), Messages.assistant("b"), Messages.user("c"));
    Session fork = client.fork(s.getId(), 2, SessionConfig.overrides().systemPrompt("forked").build());
    assertNotEquals(s.getId(), fork.getId());
    assertEquals(2, fork.getHeadSeq());
    assertEquals(s.getId(), fork.getForkedFromSessionId());
    assertEquals("forked", fork.getConfig().getSystemPrompt());
    assertEquals(50_000, fork.getConfig().getContextWindow());
    assertEquals(List.of("a", "b"), client.listMessages(fork.getId()).stream()
        .map(Message::getContent).collect(Collectors.toList()));
  }

  // ---- errors ---------------------------------------------------------------------------------

  @Test
  void unknownSessionIsSessionNotFound() {
    CtxfoldException e = assertThrows(CtxfoldException.class,
        () -> client.prepare("s_does_not_exist", Messages.user("hi")));
    assertEquals(Status.Code.NOT_FOUND, e.code());
    assertEquals(Reasons.SESSION_NOT_FOUND, e.reason());
    assertTrue(e.is(Reasons.SESSION_NOT_FOUND));
    assertEquals("ctxfold.dev", e.domain());
    assertEquals("s_does_not_exist", e.metadata().get("session_id"), e.metadata().toString());
    assertFalse(e.statusMessage().isEmpty());
    assertTrue(e.getMessage().contains("SESSION_NOT_FOUND"), e.getMessage());
  }

  @Test
  void otherErrorsCarryTheirReasons() {
    CtxfoldException config = assertThrows(CtxfoldException.class,
        () -> client.createSession(SessionConfig.overrides().build()));
    assertEquals(Status.Code.INVALID_ARGUMENT, config.code());
    assertEquals(Reasons.INVALID_CONFIG, config.reason());

    Session s = newSession(50_000);
    client.append(s.getId(), Messages.user("run it"),
        Messages.assistant("", Messages.toolCall("t1", "run", "{}")));
    CtxfoldException pending = assertThrows(CtxfoldException.class,
        () -> client.append(s.getId(), Messages.user("are you there?")));
    assertEquals(Status.Code.FAILED_PRECONDITION, pending.code());
    assertEquals(Reasons.TOOL_RESULTS_PENDING, pending.reason());

    CtxfoldException late = assertThrows(CtxfoldException.class,
        () -> client.withDeadline(Duration.ofNanos(1)).getSession(s.getId()));
    assertEquals(Status.Code.DEADLINE_EXCEEDED, late.code());
    assertEquals("", late.reason());
  }
}

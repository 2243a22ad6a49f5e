package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.util.JsonFormat;
import dev.ctxfold.client.adapters.AnthropicMessages;
import dev.ctxfold.client.adapters.OpenAiChat;
import dev.ctxfold.client.adapters.OpenAiResponses;
import dev.ctxfold.client.adapters.ProviderTurn;
import dev.ctxfold.v1.PreparedContext;
import dev.ctxfold.v1.SessionConfig;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/** Every scenario of clients/conformance/scenarios as one test, against a real {@code ctxfold serve}. */
class ConformanceTest {
  private static CtxfoldServer server;
  private static CtxfoldClient client;

  @BeforeAll
  static void startServer() throws Exception {
    server = CtxfoldServer.start();
    client = CtxfoldClient.builder().target(server.target()).unaryDeadline(Duration.ofSeconds(60)).build();
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

  static List<Path> scenarioFiles() {
    try (Stream<Path> files = Files.list(Conformance.dir().resolve("scenarios"))) {
      return files.filter(p -> p.toString().endsWith(".json")).sorted().collect(Collectors.toList());
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** One operation of the scenarios: on a surface, a session id and the resolved args, its result. */
  interface Op {
    Object apply(Surface client, String session, Map<String, Object> args);
  }

  @TestFactory
  Stream<DynamicTest> blocking() {
    return scenarios(Surface.blocking(client));
  }

  @TestFactory
  Stream<DynamicTest> async() {
    return scenarios(Surface.async(client.async()));
  }

  private static Stream<DynamicTest> scenarios(Surface surface) {
    List<Path> files = scenarioFiles();
    assertTrue(!files.isEmpty(), "no scenarios in " + Conformance.dir());
    return files.stream().map(file -> DynamicTest.dynamicTest(file.getFileName().toString(), file.toUri(), () -> {
      Map<String, Object> scenario = Conformance.load(file);
      onLargeStack(() -> run(surface, scenario));
    }));
  }

  /**
   * Runs {@code body} on a thread with a 256 MiB stack: java.util.regex matches a group repeated
   * over a long text (the scenarios' {@code (.|\n)*}) by recursion, one frame per character.
   */
  static void onLargeStack(Runnable body) throws Throwable {
    Throwable[] failure = new Throwable[1];
    Thread thread = new Thread(null, () -> {
      try {
        body.run();
      } catch (Throwable t) {
        failure[0] = t;
      }
    }, "conformance", 256L << 20);
    thread.start();
    thread.join();
    if (failure[0] != null) {
      throw failure[0];
    }
  }

  @Test
  void everyScenarioOperationIsBound() {
    Set<String> used = new HashSet<>();
    for (Path file : scenarioFiles()) {
      for (Object step : (List<?>) Conformance.load(file).get("steps")) {
        used.add(String.valueOf(((Map<?, ?>) step).get("op")));
      }
    }
    used.removeAll(OPS.keySet());
    assertTrue(used.isEmpty(), "operations without a binding: " + used);
  }

  // ---- running a scenario ---------------------------------------------------------------------

  @SuppressWarnings("unchecked")
  static void run(Surface surface, Map<String, Object> scenario) {
    Map<String, Object> saved = new LinkedHashMap<>();
    if (scenario.containsKey("config")) {
      saved.put("session", Conformance.canonicalValue(
          surface.createSession(settings(SessionSettings.builder(), scenario.get("config")))));
    }
    List<Object> steps = (List<Object>) scenario.get("steps");
    for (int index = 0; index < steps.size(); index++) {
      Map<String, Object> step = (Map<String, Object>) steps.get(index);
      String op = (String) step.get("op");
      Op binding = OPS.get(op);
      if (binding == null) {
        fail("unknown op " + op);
      }
      Map<String, Object> args = (Map<String, Object>) Conformance.resolve(step.getOrDefault("args", Map.of()), saved);
      Object sessionArg = args.containsKey("session") ? args.remove("session") : saved.getOrDefault("session", "");
      String session = sessionArg instanceof Map ? (String) ((Map<?, ?>) sessionArg).get("id") : (String) sessionArg;
      String where = "step " + index + " (" + op + ")";
      int times = step.containsKey("repeat") ? ((Number) step.get("repeat")).intValue() : 1;
      for (int n = 0; n < times; n++) {
        if (step.containsKey("error")) {
          CtxfoldException e = assertThrows(CtxfoldException.class, () -> binding.apply(surface, session, args), where);
          Map<String, Object> wanted = new LinkedHashMap<>((Map<String, Object>) step.get("error"));
          Map<String, Object> failure = new LinkedHashMap<>();
          failure.put("code", e.code().name());
          failure.put("reason", e.reason());
          if (wanted.containsKey("domain")) {
            failure.put("domain", e.domain());
          }
          assertEquals(Conformance.JSON.toJson(wanted), Conformance.JSON.toJson(failure), where + ": " + e);
          continue;
        }
        Object result = Conformance.canonicalValue(binding.apply(surface, session, args));
        Conformance.checkAll(result, (Map<String, Object>) step.getOrDefault("expect", Map.of()), saved, where);
        if (step.containsKey("save")) {
          saved.put((String) step.get("save"), result);
        }
      }
    }
  }

  // ---- arguments ------------------------------------------------------------------------------

  private static <B extends com.google.protobuf.Message.Builder> B proto(Object json, B builder) {
    try {
      JsonFormat.parser().merge(Conformance.JSON.toJson(json), builder);
      return builder;
    } catch (InvalidProtocolBufferException e) {
      throw new IllegalArgumentException("not proto JSON of " + builder.getDescriptorForType().getName() + ": " + json, e);
    }
  }

  /**
   * Settings from a config's proto JSON, through the builder as a user sets them (each field that
   * is set, so the builder's checks and the tools' one JSON form apply).
   */
  static SessionSettings settings(SessionSettings.Builder b, Object json) {
    SessionConfig c = proto(json, SessionConfig.newBuilder()).build();
    if (c.getContextWindow() != 0) {
      b.contextWindow(c.getContextWindow());
    }
    if (c.getCompactRatio() != 0) {
      b.compactRatio(c.getCompactRatio());
    }
    if (c.getTailRatio() != 0) {
      b.tailRatio(c.getTailRatio());
    }
    if (c.hasPrefoldRatio()) {
      b.prefoldRatio(c.getPrefoldRatio());
    }
    if (c.getMaxOutputTokens() != 0) {
      b.maxOutputTokens(c.getMaxOutputTokens());
    }
    if (c.getSummaryMaxTokens() != 0) {
      b.summaryMaxTokens(c.getSummaryMaxTokens());
    }
    if (c.getToolContentMaxBytes() != 0) {
      b.toolContentMaxBytes(c.getToolContentMaxBytes());
    }
    if (c.getCacheTtlSeconds() != 0) {
      b.cacheTtl(Duration.ofSeconds(c.getCacheTtlSeconds()));
    }
    if (!c.getToolsJson().isEmpty()) {
      b.toolsJson(c.getToolsJson());
    }
    return b.systemPrompt(c.getSystemPrompt()).summarizer(c.getSummarizer())
        .promptCacheKey(c.getPromptCacheKey()).model(c.getModel()).disableTaskAnchor(c.getDisableTaskAnchor()).build();
  }

  @SuppressWarnings("unchecked")
  static SessionSettings createSettings(Map<String, Object> args) {
    SessionSettings.Builder b = SessionSettings.builder();
    if (args.containsKey("tools")) {
      b.tools((List<Object>) args.get("tools"));
    }
    return settings(b, args.getOrDefault("config", Map.of()));
  }

  static List<Message> messages(Object json) {
    List<Message> out = new ArrayList<>();
    for (Object m : (List<?>) json) {
      out.add(Message.fromProto(proto(m, dev.ctxfold.v1.Message.newBuilder()).build()));
    }
    return out;
  }

  /** A View from its canonical JSON (what a scenario saved). */
  static View view(Object json) {
    PreparedContext proto = proto(json, PreparedContext.newBuilder()).build();
    return new View(proto, Message.fromProto(proto.getMessagesList()), List.of());
  }

  private static List<?> tools(Map<String, Object> args) {
    return (List<?>) args.getOrDefault("tools", List.of());
  }

  private static String str(Map<String, Object> args, String key) {
    Object value = args.get(key);
    return value == null ? "" : String.valueOf(value);
  }

  private static long num(Map<String, Object> args, String key, long otherwise) {
    Object value = args.get(key);
    return value == null ? otherwise : ((Number) value).longValue();
  }

  private static boolean flag(Map<String, Object> args, String key) {
    return Boolean.TRUE.equals(args.get(key));
  }

  private static int pageBytes(Map<String, Object> args) {
    return (int) num(args, "page_bytes", CtxfoldClient.DEFAULT_PAGE_BYTES);
  }

  private static PrepareOptions prepareOptions(Map<String, Object> args) {
    return PrepareOptions.builder()
        .append(messages(args.getOrDefault("append", List.of())))
        .overflow(flag(args, "overflow"))
        .requestId(str(args, "request_id"))
        .build();
  }

  private static CompactOptions compactOptions(Map<String, Object> args) {
    return CompactOptions.builder()
        .focus(str(args, "focus"))
        .keepTokens(num(args, "keep_tokens", 0))
        .dryRun(flag(args, "dry_run"))
        .build();
  }

  private static long viewVersion(Object view) {
    return view instanceof Map ? ((Number) ((Map<?, ?>) view).get("view_version")).longValue() : ((Number) view).longValue();
  }

  // ---- results --------------------------------------------------------------------------------

  static Map<String, Object> canonical(View view) {
    @SuppressWarnings("unchecked")
    Map<String, Object> out = (Map<String, Object>) Conformance.canonical(view.toProto());
    out.put("messages", Conformance.canonicalValue(view.messages()));
    out.remove("delta"); // a transport detail: the SDK's view is always whole
    return out;
  }

  private static Map<String, Object> events(List<FoldEvent> events) {
    List<Object> progress = new ArrayList<>();
    Object result = null;
    for (FoldEvent event : events) {
      if (event instanceof FoldEvent.Progress p) {
        progress.add(Conformance.canonicalValue(p.progress()));
      } else {
        result = canonical(((FoldEvent.Result) event).view());
      }
    }
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("progress", progress);
    out.put("result", result);
    return out;
  }

  private static Map<String, Object> named(String key, Object value) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put(key, Conformance.canonicalValue(value));
    return out;
  }

  static Map<String, Object> toolResult(ToolResult r) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("text", r.text());
    out.put("sha256", r.sha256());
    out.put("total_bytes", r.totalBytes());
    out.put("result_ref", r.resultRef());
    return out;
  }

  static Map<String, Object> page(ToolResultPage p) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("data", p.data());
    out.put("offset", p.offset());
    out.put("next_offset", p.nextOffset());
    out.put("total_bytes", p.totalBytes());
    out.put("sha256", p.sha256());
    out.put("complete", p.complete());
    out.put("result_ref", p.resultRef());
    return out;
  }

  static Map<String, Object> turn(ProviderTurn turn) {
    Map<String, Object> usage = new LinkedHashMap<>();
    usage.put("input_tokens", turn.usage().inputTokens());
    usage.put("cached_input_tokens", turn.usage().cachedInputTokens());
    usage.put("output_tokens", turn.usage().outputTokens());
    usage.put("finish_reason", turn.usage().finishReason());
    Map<String, Object> out = named("messages", turn.messages());
    out.put("usage", usage);
    return out;
  }

  private static String fixture(Map<String, Object> args) {
    try {
      return Files.readString(Conformance.dir().resolve("fixtures").resolve(str(args, "fixture")));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  // ---- the operations -------------------------------------------------------------------------

  static final Map<String, Op> OPS = Map.ofEntries(
      Map.entry("create_session", (c, s, a) -> c.createSession(createSettings(a))),
      Map.entry("get_session", (c, s, a) -> c.getSession(s)),
      Map.entry("list_sessions", (c, s, a) -> named("sessions", c.listSessions((int) num(a, "page_size", 0)))),
      Map.entry("delete_session", (c, s, a) -> {
        c.deleteSession(s);
        return Map.of();
      }),
      Map.entry("append_messages", (c, s, a) ->
          named("messages", c.appendMessages(s, messages(a.get("messages")), str(a, "request_id")))),
      Map.entry("list_messages", (c, s, a) ->
          named("messages", c.listMessages(s, flag(a, "include_abandoned"), (int) num(a, "page_size", 0)))),
      Map.entry("prepare", (c, s, a) -> canonical(c.prepare(s, prepareOptions(a)))),
      Map.entry("prepare_events", (c, s, a) -> events(c.prepareEvents(s, prepareOptions(a)))),
      Map.entry("compact", (c, s, a) -> canonical(c.compact(s, compactOptions(a)))),
      Map.entry("compact_events", (c, s, a) -> events(c.compactEvents(s, compactOptions(a)))),
      Map.entry("observe_usage", (c, s, a) -> {
        UsageResult r = c.observeUsage(s, viewVersion(a.containsKey("view") ? a.get("view") : a.get("view_version")),
            new Usage(num(a, "input_tokens", 0), num(a, "cached_input_tokens", 0), num(a, "output_tokens", 0),
                str(a, "finish_reason")));
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("calibration", r.calibration());
        out.put("calibration_accepted", r.calibrationAccepted());
        return out;
      }),
      Map.entry("get_context_state", (c, s, a) -> Conformance.parse(
          new com.google.gson.GsonBuilder().setFieldNamingPolicy(com.google.gson.FieldNamingPolicy.LOWER_CASE_WITH_UNDERSCORES)
              .create().toJson(c.getContextState(s)))),
      Map.entry("fork", (c, s, a) -> {
        SessionSettings overrides = a.containsKey("config") ? settings(SessionSettings.overrides(), a.get("config")) : null;
        return flag(a, "at_head") ? c.forkAtHead(s, overrides) : c.fork(s, num(a, "at_seq", 0), overrides);
      }),
      Map.entry("rewind", (c, s, a) -> c.rewind(s, num(a, "to_seq", 0))),
      Map.entry("edit", (c, s, a) ->
          c.edit(s, num(a, "seq", 0), messages(List.of(a.get("message"))).get(0), str(a, "request_id"))),
      Map.entry("retry", (c, s, a) -> canonical(c.retry(s, num(a, "answer_seq", 0)))),
      Map.entry("read_tool_result", (c, s, a) -> toolResult(a.containsKey("result_ref")
          ? c.readToolResult(s, str(a, "result_ref"), pageBytes(a))
          : c.readToolResultOfCall(s, str(a, "tool_call_id"), pageBytes(a)))),
      Map.entry("tool_result_pages", (c, s, a) -> {
        List<ToolResultPage> pages = a.containsKey("result_ref")
            ? c.toolResultPages(s, str(a, "result_ref"), num(a, "offset", 0), pageBytes(a))
            : c.toolResultPagesOfCall(s, str(a, "tool_call_id"), num(a, "offset", 0), pageBytes(a));
        return Map.of("pages", pages.stream().map(ConformanceTest::page).collect(Collectors.toList()));
      }),
      Map.entry("list_checkpoints", (c, s, a) -> named("checkpoints",
          c.listCheckpoints(s, flag(a, "include_abandoned"), (int) num(a, "page_size", 0)))),
      Map.entry("get_checkpoint", (c, s, a) -> c.getCheckpoint(s, str(a, "checkpoint_id"))),
      Map.entry("dispatch_tool_call", (c, s, a) -> {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("content", c.dispatchToolCall(s, str(a, "name"), str(a, "arguments")).orElse(null));
        return out;
      }),
      Map.entry("tool_definitions", (c, s, a) ->
          named("tools", ModelTools.definitions(ToolFormat.of(str(a, "format"))))),
      Map.entry("to_openai_chat", (c, s, a) -> OpenAiChat.request(view(a.get("view")), tools(a))),
      Map.entry("to_openai_responses", (c, s, a) -> OpenAiResponses.request(view(a.get("view")), tools(a))),
      Map.entry("to_anthropic_messages", (c, s, a) -> AnthropicMessages.request(view(a.get("view")), tools(a))),
      Map.entry("from_openai_chat_messages", (c, s, a) ->
          named("messages", OpenAiChat.fromMessages((List<?>) a.get("messages")))),
      Map.entry("from_openai_chat", (c, s, a) -> turn(OpenAiChat.response(fixture(a)))),
      Map.entry("from_openai_responses", (c, s, a) -> turn(OpenAiResponses.response(fixture(a)))),
      Map.entry("from_anthropic_messages", (c, s, a) -> turn(AnthropicMessages.response(fixture(a)))));
}

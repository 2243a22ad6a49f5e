package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import org.junit.jupiter.api.Test;

class SessionSettingsTest {
  /** A setting out of its documented range: INVALID_CONFIG in the client domain, naming the field as the proto does. */
  private static void refused(String field, org.junit.jupiter.api.function.Executable build) {
    CtxfoldException e = assertThrows(CtxfoldException.class, build);
    assertTrue(e.is(dev.ctxfold.v1.ErrorReason.INVALID_CONFIG), e.toString());
    assertEquals(CtxfoldException.CLIENT_DOMAIN, e.domain());
    assertEquals(field, e.metadata().get("field"));
  }

  @Test
  void toolsAreWrittenInTheOneJsonForm() {
    java.util.Map<String, Object> parameters = new java.util.LinkedHashMap<>();
    parameters.put("type", "object");
    parameters.put("minimum", 1.0);
    java.util.Map<String, Object> tool = new java.util.LinkedHashMap<>();
    tool.put("name", "f");
    tool.put("description", "<é> & 'x' = \u2028");
    tool.put("parameters", parameters);
    String written = "[{\"name\":\"f\",\"description\":\"<é> & 'x' = \u2028\",\"parameters\":{\"type\":\"object\",\"minimum\":1}}]";
    assertEquals(written, SessionSettings.builder().contextWindow(8_000).tools(java.util.List.of(tool)).build().toolsJson());
    assertEquals(written, SessionSettings.builder().contextWindow(8_000)
        .toolsJson("[ {\"name\": \"f\", \"description\": \"\\u003c\\u00e9> \\u0026 \\u0027x\\u0027 \\u003d \\u2028\","
            + " \"parameters\": {\"type\": \"object\", \"minimum\": 1.0}} ]").build().toolsJson());
  }

  @Test
  void numbersAreWrittenAsJavaScriptWritesThem() {
    String[][] cases = {{"1.0", "1"}, {"0.5", "0.5"}, {"1e-7", "1e-7"}, {"1E-6", "0.000001"}, {"1.5e-6", "0.0000015"},
        {"1e21", "1e+21"}, {"1e20", "100000000000000000000"}, {"1e16", "10000000000000000"}, {"-2.5", "-2.5"},
        {"5e-324", "5e-324"}, {"-0", "0"}, {"0.30000000000000004", "0.30000000000000004"}, {"1e2", "100"}};
    for (String[] c : cases) {
      assertEquals(c[1], JsonText.normalize(c[0]), c[0]);
    }
    assertEquals("\"\\ud83d\"", JsonText.write("\ud83d"), "a lone surrogate is escaped, as JSON.stringify does");
  }

  @Test
  void buildsTheWireMessage() {
    SessionSettings config = SessionSettings.builder()
        .contextWindow(128_000)
        .compactRatio(0.75)
        .tailRatio(0.2)
        .maxOutputTokens(4_096)
        .summaryMaxTokens(2_000)
        .toolContentMaxBytes(16_384)
        .systemPrompt("sys")
        .toolsJson("[]")
        .summarizer("extractive")
        .cacheTtl(Duration.ofMinutes(5))
        .promptCacheKey("key")
        .model("gpt")
        .build();
    dev.ctxfold.v1.SessionConfig p = config.toProto();
    assertEquals(128_000, p.getContextWindow());
    assertEquals(0.75, p.getCompactRatio());
    assertEquals(0.2, p.getTailRatio());
    assertEquals(4_096, p.getMaxOutputTokens());
    assertEquals(2_000, p.getSummaryMaxTokens());
    assertEquals(16_384, p.getToolContentMaxBytes());
    assertEquals("sys", p.getSystemPrompt());
    assertEquals("[]", p.getToolsJson());
    assertEquals("extractive", p.getSummarizer());
    assertEquals(300, p.getCacheTtlSeconds());
    assertEquals("key", p.getPromptCacheKey());
    assertEquals("gpt", p.getModel());
    assertEquals(config, SessionSettings.fromProto(p));
    assertEquals(config, config.toBuilder().build());
    assertEquals(Duration.ofMinutes(5), config.cacheTtl());
  }

  @Test
  void unsetFieldsStayZeroForServerDefaults() {
    dev.ctxfold.v1.SessionConfig p = SessionSettings.builder().contextWindow(8_000).build().toProto();
    assertEquals(dev.ctxfold.v1.SessionConfig.newBuilder().setContextWindow(8_000).build(), p);
  }

  @Test
  void validatesEarly() {
    refused("context_window", () -> SessionSettings.builder().build());
    refused("context_window", () -> SessionSettings.builder().contextWindow(-1));
    refused("compact_ratio", () -> SessionSettings.builder().compactRatio(0.99));
    refused("tail_ratio", () -> SessionSettings.builder().tailRatio(0));
    refused("prefold_ratio", () -> SessionSettings.builder().prefoldRatio(0.05));
    refused("prefold_ratio", () -> SessionSettings.builder().prefoldRatio(1));
    refused("tool_content_max_bytes", () -> SessionSettings.builder().toolContentMaxBytes(100));
    refused("max_output_tokens", () -> SessionSettings.builder().maxOutputTokens(-1));
    refused("cache_ttl_seconds", () -> SessionSettings.builder().cacheTtl(Duration.ofSeconds(-1)));
    refused("tools_json", () -> SessionSettings.builder().toolsJson("[{"));
    assertThrows(NullPointerException.class, () -> SessionSettings.builder().systemPrompt(null));
  }

  @Test
  void prefoldRatioZeroIsSentUnsetIsNot() {
    SessionSettings off = SessionSettings.builder().contextWindow(8_000).prefoldRatio(0).build();
    assertTrue(off.toProto().hasPrefoldRatio());
    assertEquals(0.0, off.prefoldRatio().getAsDouble());
    SessionSettings unset = SessionSettings.builder().contextWindow(8_000).build();
    assertFalse(unset.toProto().hasPrefoldRatio());
    assertTrue(unset.prefoldRatio().isEmpty());
    refused("prefold_ratio", () -> SessionSettings.builder().prefoldRatio(Double.NaN));
    refused("prefold_ratio", () -> SessionSettings.builder().prefoldRatio(-0.1));
    assertEquals(0.10, SessionSettings.builder().contextWindow(8_000).prefoldRatio(0.10).build().prefoldRatio().getAsDouble());
    assertTrue(SessionSettings.overrides().prefoldRatio(0).build().toProto().hasPrefoldRatio(), "a fork can turn them off");
    // A session's settings are the server's config: its value, 0 included, read back with presence.
    SessionSettings effective = SessionSettings.fromProto(
        dev.ctxfold.v1.SessionConfig.newBuilder().setContextWindow(8_000).setPrefoldRatio(0.75).build());
    assertEquals(0.75, effective.prefoldRatio().getAsDouble());
    assertEquals(0.0, SessionSettings.fromProto(off.toProto()).prefoldRatio().getAsDouble());
    assertTrue(SessionSettings.fromProto(unset.toProto()).prefoldRatio().isEmpty());
  }

  @Test
  void backgroundFoldStagesPrintByName() {
    for (dev.ctxfold.v1.FoldStage stage : new dev.ctxfold.v1.FoldStage[] {dev.ctxfold.v1.FoldStage.FOLD_STAGE_BACKGROUND_STARTED,
        dev.ctxfold.v1.FoldStage.FOLD_STAGE_PREPARED_INSTALLED, dev.ctxfold.v1.FoldStage.FOLD_STAGE_BACKGROUND_RUNNING}) {
      FoldProgress p = FoldProgress.fromProto(dev.ctxfold.v1.FoldProgress.newBuilder().setStageValue(stage.getNumber()).build());
      assertEquals(stage, p.stage());
      assertTrue(p.toString().contains("stage=" + stage.name()), p.toString());
    }
  }

  @Test
  void overridesNeedNoWindow() {
    SessionSettings overrides = SessionSettings.overrides().systemPrompt("other").build();
    assertEquals(0, overrides.contextWindow());
    assertEquals("other", overrides.systemPrompt());
    assertTrue(overrides.toString().contains("other"));
  }

  @Test
  void messageFactories() {
    assertEquals(dev.ctxfold.v1.Role.ROLE_USER, Messages.user("u").role());
    assertEquals(dev.ctxfold.v1.Role.ROLE_SYSTEM, Messages.system("s").role());
    Message call = Messages.assistant("", Messages.toolCall("c1", "ls", "{}"));
    assertEquals("c1", call.toolCalls().get(0).id());
    Message result = Messages.toolResult("c1", "out");
    assertEquals(dev.ctxfold.v1.Role.ROLE_TOOL, result.role());
    assertEquals("c1", result.toolCallId());
    assertTrue(Messages.pinned(Messages.user("keep")).pinned());
    java.util.Map<String, Object> arguments = new java.util.LinkedHashMap<>();
    arguments.put("b", 1.0);
    arguments.put("a", "<");
    assertEquals("{\"b\":1,\"a\":\"<\"}", Messages.toolCall("c2", "f", arguments).arguments(),
        "object arguments are written as every SDK writes JSON");
    assertEquals(Messages.user("u"), Message.fromProto(Messages.user("u").toProto()), "a message round-trips its proto");
  }
}

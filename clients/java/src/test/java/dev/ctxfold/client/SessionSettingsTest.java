package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import org.junit.jupiter.api.Test;

class SessionSettingsTest {
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
    assertThrows(IllegalStateException.class, () -> SessionSettings.builder().build());
    assertThrows(IllegalArgumentException.class, () -> SessionSettings.builder().contextWindow(0));
    assertThrows(IllegalArgumentException.class, () -> SessionSettings.builder().compactRatio(0.99));
    assertThrows(IllegalArgumentException.class, () -> SessionSettings.builder().tailRatio(0));
    assertThrows(IllegalArgumentException.class, () -> SessionSettings.builder().toolContentMaxBytes(100));
    assertThrows(IllegalArgumentException.class, () -> SessionSettings.builder().maxOutputTokens(-1));
    assertThrows(NullPointerException.class, () -> SessionSettings.builder().systemPrompt(null));
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
    assertEquals(dev.ctxfold.v1.Role.ROLE_USER, Messages.user("u").getRole());
    assertEquals(dev.ctxfold.v1.Role.ROLE_SYSTEM, Messages.system("s").getRole());
    dev.ctxfold.v1.Message call = Messages.assistant("", Messages.toolCall("c1", "ls", "{}"));
    assertEquals("c1", call.getToolCalls(0).getId());
    dev.ctxfold.v1.Message result = Messages.toolResult("c1", "out");
    assertEquals(dev.ctxfold.v1.Role.ROLE_TOOL, result.getRole());
    assertEquals("c1", result.getToolCallId());
    assertTrue(Messages.pinned(Messages.user("keep")).getPinned());
  }
}

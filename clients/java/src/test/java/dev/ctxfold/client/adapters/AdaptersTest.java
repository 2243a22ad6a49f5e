package dev.ctxfold.client.adapters;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.ctxfold.client.CtxfoldException;
import dev.ctxfold.client.Message;
import dev.ctxfold.client.Messages;
import dev.ctxfold.client.ModelTools;
import dev.ctxfold.client.ToolFormat;
import dev.ctxfold.client.ViewsForTests;
import dev.ctxfold.v1.ErrorReason;
import dev.ctxfold.v1.Role;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The adapters' rules that the shared scenarios (06_adapters.json) do not reach. */
class AdaptersTest {
  private static final Message CALL = Messages.assistant("", Messages.toolCall("c1", "ls", "{\"path\":\"src\"}"),
      Messages.toolCall("c2", "ls", "{\"path\":\"docs\"}"));

  @Test
  void anthropicMergesSameRoleTurnsAndTurnsLaterSystemMessagesIntoUserText() {
    Map<String, Object> request = AnthropicMessages.request(ViewsForTests.of(3, "",
        Messages.system("rules"), Messages.user("task"), Messages.system("a later instruction"), CALL,
        Messages.toolResult("c1", "a.py"), Messages.toolResult("c2", "b.md"), Messages.user("and now?")));
    assertEquals(List.of(Map.of("type", "text", "text", "rules")), request.get("system"));
    assertEquals(List.of(
        Map.of("role", "user", "content", List.of(
            Map.of("type", "text", "text", "task"),
            Map.of("type", "text", "text", "a later instruction", "cache_control", Map.of("type", "ephemeral")))),
        Map.of("role", "assistant", "content", List.of(
            Map.of("type", "tool_use", "id", "c1", "name", "ls", "input", Map.of("path", "src")),
            Map.of("type", "tool_use", "id", "c2", "name", "ls", "input", Map.of("path", "docs")))),
        Map.of("role", "user", "content", List.of(
            Map.of("type", "tool_result", "tool_use_id", "c1", "content", "a.py"),
            Map.of("type", "tool_result", "tool_use_id", "c2", "content", "b.md"),
            Map.of("type", "text", "text", "and now?")))), request.get("messages"));
  }

  @Test
  void anthropicRefusesArgumentsThatAreNotAnObjectAndPutsNoBreakpointWithoutAStablePrefix() {
    Message bad = Messages.assistant("", Messages.toolCall("c1", "ls", "[1, 2]"));
    CtxfoldException refused = assertThrows(CtxfoldException.class,
        () -> AnthropicMessages.request(ViewsForTests.of(0, "", Messages.user("task"), bad)));
    assertTrue(refused.is(ErrorReason.INVALID_MESSAGE), refused.toString());
    Map<String, Object> request = AnthropicMessages.request(ViewsForTests.of(0, "", Messages.user("task")));
    assertEquals(List.of(Map.of("role", "user", "content", List.of(Map.of("type", "text", "text", "task")))),
        request.get("messages"));
    assertFalse(request.containsKey("system"));
  }

  @Test
  void chatSendsReasoningOnlyWhenAskedAndLeavesTheEmptyCacheKeyOut() {
    Message thought = Messages.assistant("42").withReasoningContent("6 times 7");
    Map<String, Object> plain = OpenAiChat.request(ViewsForTests.of(0, "", thought));
    assertEquals(List.of(Map.of("role", "assistant", "content", "42")), plain.get("messages"));
    assertFalse(plain.containsKey("prompt_cache_key"));
    assertEquals(List.of(Map.of("role", "assistant", "content", "42", "reasoning_content", "6 times 7")),
        OpenAiChat.request(ViewsForTests.of(0, "", thought), List.of(), true).get("messages"));
  }

  @Test
  void responsesSendLaterSystemMessagesAsSystemItems() {
    Map<String, Object> request = OpenAiResponses.request(ViewsForTests.of(0, "k",
        Messages.user("task"), Messages.system("be brief")));
    assertFalse(request.containsKey("instructions"));
    assertEquals(List.of(Map.of("type", "message", "role", "user", "content", "task"),
        Map.of("type", "message", "role", "system", "content", "be brief")), request.get("input"));
    assertEquals("k", request.get("prompt_cache_key"));
  }

  @Test
  void refusalsAreTheContentAndMissingCountsAreZero() {
    ProviderTurn chat = OpenAiChat.response("{\"choices\": [{\"message\": {\"role\": \"assistant\", \"content\": null,"
        + " \"refusal\": \"I can't help with that.\"}, \"finish_reason\": \"stop\"}]}");
    assertEquals("I can't help with that.", chat.messages().get(0).content());
    assertEquals(0, chat.usage().inputTokens());
    ProviderTurn responses = OpenAiResponses.response("{\"status\": \"completed\", \"output\": [{\"type\": \"message\","
        + " \"content\": [{\"type\": \"refusal\", \"refusal\": \"No.\"}, {\"type\": \"output_text\", \"text\": \"Sorry.\"}]}]}");
    assertEquals("No.\nSorry.", responses.messages().get(0).content());
    assertEquals("completed", responses.usage().finishReason());
  }

  @Test
  void recordedChatMessagesBecomeMessagesToAppend() {
    List<Message> messages = OpenAiChat.fromMessages(List.of(
        Map.of("role", "developer", "content", "rules"),
        Map.of("role", "user", "content", List.of(Map.of("type", "text", "text", "a"), Map.of("type", "text", "text", "b"))),
        Map.of("role", "assistant", "content", "", "tool_calls", List.of(Map.of("id", "c1", "type", "function",
            "function", Map.of("name", "ls", "arguments", "{}")))),
        Map.of("role", "tool", "tool_call_id", "c1", "content", "x")));
    assertEquals(List.of(Role.ROLE_SYSTEM, Role.ROLE_USER, Role.ROLE_ASSISTANT, Role.ROLE_TOOL),
        messages.stream().map(Message::role).toList());
    assertEquals("a\nb", messages.get(1).content());
    assertEquals("c1", messages.get(2).toolCalls().get(0).id());
    assertEquals("c1", messages.get(3).toolCallId());
    CtxfoldException robot = assertThrows(CtxfoldException.class,
        () -> OpenAiChat.fromMessages(List.of(Map.of("role", "robot"))));
    assertTrue(robot.is(ErrorReason.INVALID_MESSAGE), robot.toString());
  }

  @Test
  void theReadToolIsOfferedWhenTheViewHidesAResult() {
    Map<String, Object> bash = Map.of("type", "function", "function", Map.of("name", "bash"));
    assertFalse(OpenAiChat.request(ViewsForTests.of(0, "", Messages.user("task"))).containsKey("tools"));
    assertEquals(List.of(bash), OpenAiChat.request(ViewsForTests.of(0, "", Messages.user("task")), List.of(bash)).get("tools"));
    Message bounded = Message.fromProto(Messages.toolResult("c1", "head … tail").toProto().toBuilder()
        .setTruncated(true).setResultRef("tr_1").build());
    Map<String, Object> read = ModelTools.definitions(ToolFormat.OPENAI_CHAT).get(0);
    assertEquals(List.of(bash, read), OpenAiChat.request(ViewsForTests.of(0, "", CALL, bounded), List.of(bash)).get("tools"));
    assertEquals(List.of(bash, read), OpenAiChat.request(ViewsForTests.of(0, "", CALL, bounded), List.of(bash, read)).get("tools"));
  }
}

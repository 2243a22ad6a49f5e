package dev.ctxfold.client.adapters;

import dev.ctxfold.client.Usage;
import dev.ctxfold.client.View;
import dev.ctxfold.v1.Message;
import dev.ctxfold.v1.Role;
import dev.ctxfold.v1.ToolCall;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Anthropic Messages ({@code POST /v1/messages}): a view as {@code system} and {@code messages}
 * with {@code tool_use} / {@code tool_result} blocks and a {@code cache_control} breakpoint on the
 * end of the stable prefix; a response's content blocks as the assistant message to append and
 * its usage.
 */
public final class AnthropicMessages {
  private static final Map<String, Object> EPHEMERAL = Map.of("type", "ephemeral");

  private AnthropicMessages() {}

  /**
   * The request body for the view: the leading system messages as {@code system} text blocks, the
   * rest as {@code messages} (assistant tool calls as {@code tool_use} blocks, consecutive tool
   * results as {@code tool_result} blocks of one user turn, later system messages as user text),
   * and {@code cache_control: {"type": "ephemeral"}} on the last block of the view's stable prefix
   * ({@link View#stablePrefixMessages()} messages), so the provider caches what the next request
   * repeats. A mutable map: add {@code model}, {@code max_tokens}, {@code tools}.
   */
  public static Map<String, Object> request(View view) {
    List<Message> messages = view.messages();
    long stable = Math.min(view.stablePrefixMessages(), messages.size());
    List<Map<String, Object>> system = new ArrayList<>();
    List<Map<String, Object>> turns = new ArrayList<>();
    Map<String, Object> breakpoint = null;
    int i = 0;
    while (i < messages.size() && messages.get(i).getRole() == Role.ROLE_SYSTEM) {
      system.add(text(messages.get(i).getContent()));
      if (i < stable) {
        breakpoint = system.get(system.size() - 1);
      }
      i++;
    }
    for (; i < messages.size(); i++) {
      Message m = messages.get(i);
      String role = m.getRole() == Role.ROLE_ASSISTANT ? "assistant" : "user";
      List<Map<String, Object>> blocks = blocks(m);
      Map<String, Object> last = turns.isEmpty() ? null : turns.get(turns.size() - 1);
      if (m.getRole() == Role.ROLE_TOOL && last != null && isToolResults(last)) {
        content(last).addAll(blocks);
      } else {
        Map<String, Object> turn = new LinkedHashMap<>();
        turn.put("role", role);
        turn.put("content", blocks);
        turns.add(turn);
      }
      if (i < stable && !blocks.isEmpty()) {
        breakpoint = blocks.get(blocks.size() - 1);
      }
    }
    if (breakpoint != null) {
      breakpoint.put("cache_control", new LinkedHashMap<>(EPHEMERAL));
    }
    Map<String, Object> request = new LinkedHashMap<>();
    if (!system.isEmpty()) {
      request.put("system", system);
    }
    request.put("messages", turns);
    return request;
  }

  @SuppressWarnings("unchecked")
  private static List<Map<String, Object>> content(Map<String, Object> turn) {
    return (List<Map<String, Object>>) turn.get("content");
  }

  private static boolean isToolResults(Map<String, Object> turn) {
    List<Map<String, Object>> blocks = content(turn);
    return "user".equals(turn.get("role")) && !blocks.isEmpty()
        && blocks.stream().allMatch(b -> "tool_result".equals(b.get("type")));
  }

  private static Map<String, Object> text(String text) {
    Map<String, Object> block = new LinkedHashMap<>();
    block.put("type", "text");
    block.put("text", text);
    return block;
  }

  private static List<Map<String, Object>> blocks(Message m) {
    List<Map<String, Object>> blocks = new ArrayList<>();
    if (m.getRole() == Role.ROLE_TOOL) {
      Map<String, Object> result = new LinkedHashMap<>();
      result.put("type", "tool_result");
      result.put("tool_use_id", m.getToolCallId());
      result.put("content", m.getContent());
      blocks.add(result);
      return blocks;
    }
    if (!m.getContent().isEmpty() || m.getToolCallsCount() == 0) {
      blocks.add(text(m.getContent()));
    }
    for (ToolCall call : m.getToolCallsList()) {
      Map<String, Object> use = new LinkedHashMap<>();
      use.put("type", "tool_use");
      use.put("id", call.getId());
      use.put("name", call.getName());
      use.put("input", call.getArguments().isBlank() ? new LinkedHashMap<>() : Json.parseObject(call.getArguments()));
      blocks.add(use);
    }
    return blocks;
  }

  /** The response (its JSON text) as the message to append and the usage to observe. */
  public static ProviderTurn response(String responseJson) {
    return response(Json.parseObject(responseJson));
  }

  /**
   * The response's {@code content} blocks as one assistant message ({@code text} blocks as its
   * content, {@code tool_use} blocks as tool calls with their {@code input} as JSON arguments,
   * {@code thinking} blocks as {@code reasoning_content}) and the usage: input is
   * {@code input_tokens + cache_read_input_tokens + cache_creation_input_tokens}, cached is
   * {@code cache_read_input_tokens}, output is {@code output_tokens}, the finish reason
   * {@code stop_reason}.
   */
  public static ProviderTurn response(Map<String, Object> response) {
    StringBuilder text = new StringBuilder();
    StringBuilder thinking = new StringBuilder();
    Message.Builder out = Message.newBuilder().setRole(Role.ROLE_ASSISTANT);
    for (Object entry : Json.list(response, "content")) {
      Map<String, Object> block = Json.asObject(entry);
      switch (Json.string(block, "type")) {
        case "text" -> text.append(Json.string(block, "text"));
        case "thinking" -> thinking.append(Json.string(block, "thinking"));
        case "tool_use" -> out.addToolCalls(ToolCall.newBuilder()
            .setId(Json.string(block, "id"))
            .setName(Json.string(block, "name"))
            .setArguments(Json.arguments(block.get("input"))));
        default -> {
          // redacted_thinking and server tool blocks have no ctxfold message form.
        }
      }
    }
    out.setContent(text.toString()).setReasoningContent(thinking.toString());
    Map<String, Object> usage = Json.object(response, "usage");
    long cacheRead = Json.number(usage, "cache_read_input_tokens");
    return new ProviderTurn(List.of(out.build()), new Usage(
        Json.number(usage, "input_tokens") + cacheRead + Json.number(usage, "cache_creation_input_tokens"),
        cacheRead,
        Json.number(usage, "output_tokens"),
        Json.string(response, "stop_reason")));
  }
}

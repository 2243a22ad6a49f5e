package dev.ctxfold.client.adapters;

import dev.ctxfold.client.Usage;
import dev.ctxfold.client.View;
import dev.ctxfold.client.Message;
import dev.ctxfold.client.Messages;
import dev.ctxfold.client.ModelTools;
import dev.ctxfold.client.ToolFormat;
import dev.ctxfold.v1.Role;
import dev.ctxfold.client.ToolCall;
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
   * The request body for the view: a leading system message as {@code system} (one text block);
   * assistant messages as text and {@code tool_use} blocks (the input parsed from the arguments);
   * tool results as {@code tool_result} blocks of the user turn; later system messages as user text.
   * Consecutive messages of one role form one turn (so the results of parallel tool calls share one
   * user turn); empty text is left out. The last block of the view's stable prefix
   * ({@link View#stablePrefixMessages()} messages) gets {@code cache_control: {"type": "ephemeral"}},
   * so the provider caches what the next request repeats. Thinking is not sent back (its signature
   * is not kept in the transcript). A mutable map: add {@code model}, {@code max_tokens}.
   */
  public static Map<String, Object> request(View view) {
    return request(view, List.of());
  }

  /**
   * As {@link #request(View)}, offering the session's {@code tools} (Messages format, JSON-shaped
   * values) and the {@code read_tool_result} definition when the view hides a result and they lack
   * it ({@link ModelTools#offered}).
   */
  public static Map<String, Object> request(View view, List<?> tools) {
    List<Message> messages = view.messages();
    List<Map<String, Object>> system = new ArrayList<>();
    List<Map<String, Object>> turns = new ArrayList<>();
    Map<String, Object> lastStable = null;
    for (int i = 0; i < messages.size(); i++) {
      Message m = messages.get(i);
      List<Map<String, Object>> blocks;
      if (i == 0 && m.role() == Role.ROLE_SYSTEM) {
        blocks = List.of(text(m.content()));
        system = blocks;
      } else {
        blocks = blocks(m);
        String role = m.role() == Role.ROLE_ASSISTANT ? "assistant" : "user";
        Map<String, Object> last = turns.isEmpty() ? null : turns.get(turns.size() - 1);
        if (!blocks.isEmpty() && last != null && role.equals(last.get("role"))) {
          content(last).addAll(blocks);
        } else if (!blocks.isEmpty()) {
          Map<String, Object> turn = new LinkedHashMap<>();
          turn.put("role", role);
          turn.put("content", new ArrayList<>(blocks));
          turns.add(turn);
        }
      }
      if (i < view.stablePrefixMessages() && !blocks.isEmpty()) {
        lastStable = blocks.get(blocks.size() - 1);
      }
    }
    if (lastStable != null) {
      lastStable.put("cache_control", new LinkedHashMap<>(EPHEMERAL));
    }
    Map<String, Object> request = new LinkedHashMap<>();
    if (!system.isEmpty()) {
      request.put("system", new ArrayList<>(system));
    }
    request.put("messages", turns);
    List<Object> offered = ModelTools.offered(tools, view, ToolFormat.ANTHROPIC);
    if (!offered.isEmpty()) {
      request.put("tools", offered);
    }
    return request;
  }

  @SuppressWarnings("unchecked")
  private static List<Map<String, Object>> content(Map<String, Object> turn) {
    return (List<Map<String, Object>>) turn.get("content");
  }

  private static Map<String, Object> text(String text) {
    Map<String, Object> block = new LinkedHashMap<>();
    block.put("type", "text");
    block.put("text", text);
    return block;
  }

  private static List<Map<String, Object>> blocks(Message m) {
    List<Map<String, Object>> blocks = new ArrayList<>();
    if (m.role() == Role.ROLE_TOOL) {
      Map<String, Object> result = new LinkedHashMap<>();
      result.put("type", "tool_result");
      result.put("tool_use_id", m.toolCallId());
      result.put("content", m.content());
      blocks.add(result);
      return blocks;
    }
    if (!m.content().isEmpty()) {
      blocks.add(text(m.content()));
    }
    for (ToolCall call : m.toolCalls()) {
      Map<String, Object> use = new LinkedHashMap<>();
      use.put("type", "tool_use");
      use.put("id", call.id());
      use.put("name", call.name());
      use.put("input", input(call));
      blocks.add(use);
    }
    return blocks;
  }

  /** A tool call's arguments as the tool_use input object (malformed arguments are refused). */
  private static Map<String, Object> input(ToolCall call) {
    if (call.arguments().isBlank()) {
      return new LinkedHashMap<>();
    }
    try {
      return Json.parseObject(call.arguments());
    } catch (RuntimeException e) {
      throw Json.unconvertible("tool call " + call.id() + " has arguments that are not a JSON object: "
          + call.arguments());
    }
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
    List<String> text = new ArrayList<>();
    List<String> thinking = new ArrayList<>();
    List<ToolCall> calls = new ArrayList<>();
    for (Object entry : Json.list(response, "content")) {
      Map<String, Object> block = Json.asObject(entry);
      switch (Json.string(block, "type")) {
        case "text" -> text.add(Json.string(block, "text"));
        case "thinking" -> thinking.add(Json.string(block, "thinking"));
        case "tool_use" -> calls.add(
            new ToolCall(Json.string(block, "id"), Json.string(block, "name"), Json.arguments(block.get("input"))));
        default -> {
          // redacted_thinking and server tool blocks have no ctxfold message form.
        }
      }
    }
    Message answer = Messages.assistant(Json.join(text), calls).withReasoningContent(Json.join(thinking));
    Map<String, Object> usage = Json.object(response, "usage");
    long cacheRead = Json.number(usage, "cache_read_input_tokens");
    return new ProviderTurn(List.of(answer), new Usage(
        Json.number(usage, "input_tokens") + cacheRead + Json.number(usage, "cache_creation_input_tokens"),
        cacheRead,
        Json.number(usage, "output_tokens"),
        Json.string(response, "stop_reason")));
  }
}

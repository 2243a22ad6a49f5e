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
 * OpenAI Responses ({@code POST /v1/responses}): a view as {@code instructions} (the system prompt)
 * plus {@code input} items and {@code prompt_cache_key}; a response's output items as the
 * assistant message to append and its usage.
 */
public final class OpenAiResponses {
  private OpenAiResponses() {}

  /**
   * The request body for the view: a leading system message as {@code instructions}; every other
   * message as {@code input} items (a {@code message} with role user, assistant or system for its
   * text, a {@code function_call} per tool call, a {@code function_call_output} per tool result);
   * and {@code prompt_cache_key}. Reasoning is not sent back (its items are opaque). A mutable map:
   * add {@code model} and other parameters.
   */
  public static Map<String, Object> request(View view) {
    return request(view, List.of());
  }

  /**
   * As {@link #request(View)}, offering the session's {@code tools} (Responses format, JSON-shaped
   * values) and the {@code read_tool_result} definition when the view hides a result and they lack
   * it ({@link ModelTools#offered}).
   */
  public static Map<String, Object> request(View view, List<?> tools) {
    List<Message> messages = view.messages();
    Map<String, Object> request = new LinkedHashMap<>();
    int first = 0;
    if (!messages.isEmpty() && messages.get(0).role() == Role.ROLE_SYSTEM) {
      request.put("instructions", messages.get(0).content());
      first = 1;
    }
    List<Map<String, Object>> input = new ArrayList<>();
    for (Message m : messages.subList(first, messages.size())) {
      if (m.role() == Role.ROLE_TOOL) {
        Map<String, Object> output = new LinkedHashMap<>();
        output.put("type", "function_call_output");
        output.put("call_id", m.toolCallId());
        output.put("output", m.content());
        input.add(output);
        continue;
      }
      if (!m.content().isEmpty() || m.toolCalls().isEmpty()) {
        input.add(message(role(m.role()), m.content()));
      }
      for (ToolCall call : m.toolCalls()) {
        Map<String, Object> item = new LinkedHashMap<>();
        item.put("type", "function_call");
        item.put("call_id", call.id());
        item.put("name", call.name());
        item.put("arguments", call.arguments());
        input.add(item);
      }
    }
    request.put("input", input);
    List<Object> offered = ModelTools.offered(tools, view, ToolFormat.OPENAI_RESPONSES);
    if (!offered.isEmpty()) {
      request.put("tools", offered);
    }
    if (!view.promptCacheKey().isEmpty()) {
      request.put("prompt_cache_key", view.promptCacheKey());
    }
    return request;
  }

  private static String role(Role role) {
    return switch (role) {
      case ROLE_SYSTEM -> "system";
      case ROLE_USER -> "user";
      case ROLE_ASSISTANT -> "assistant";
      default -> throw Json.unconvertible("a view message has no role: " + role);
    };
  }

  private static Map<String, Object> message(String role, String content) {
    Map<String, Object> item = new LinkedHashMap<>();
    item.put("type", "message");
    item.put("role", role);
    item.put("content", content);
    return item;
  }

  /** The response (its JSON text) as the message to append and the usage to observe. */
  public static ProviderTurn response(String responseJson) {
    return response(Json.parseObject(responseJson));
  }

  /**
   * The response's {@code output} items as one assistant message ({@code output_text} parts as its
   * content, {@code function_call} items as tool calls, reasoning summary text as
   * {@code reasoning_content}) and the usage ({@code input_tokens},
   * {@code input_tokens_details.cached_tokens}, {@code output_tokens}, the response's
   * {@code status} as the finish reason).
   */
  public static ProviderTurn response(Map<String, Object> response) {
    List<String> text = new ArrayList<>();
    List<String> reasoning = new ArrayList<>();
    List<ToolCall> calls = new ArrayList<>();
    for (Object entry : Json.list(response, "output")) {
      Map<String, Object> item = Json.asObject(entry);
      switch (Json.string(item, "type")) {
        case "message" -> {
          for (Object part : Json.list(item, "content")) {
            Map<String, Object> content = Json.asObject(part);
            switch (Json.string(content, "type")) {
              case "output_text" -> text.add(Json.string(content, "text"));
              case "refusal" -> text.add(Json.string(content, "refusal"));
              default -> {
                // Annotations, audio, ...: no text.
              }
            }
          }
        }
        case "function_call" -> calls.add(
            new ToolCall(Json.string(item, "call_id"), Json.string(item, "name"), Json.arguments(item.get("arguments"))));
        case "reasoning" -> {
          for (Object part : Json.list(item, "summary")) {
            Map<String, Object> summary = Json.asObject(part);
            if ("summary_text".equals(Json.string(summary, "type"))) {
              reasoning.add(Json.string(summary, "text"));
            }
          }
        }
        default -> {
          // Other items (web search calls, images, ...) have no ctxfold message form.
        }
      }
    }
    Message answer = Messages.assistant(Json.join(text), calls).withReasoningContent(Json.join(reasoning));
    Map<String, Object> usage = Json.object(response, "usage");
    return new ProviderTurn(List.of(answer), new Usage(
        Json.number(usage, "input_tokens"),
        Json.number(Json.object(usage, "input_tokens_details"), "cached_tokens"),
        Json.number(usage, "output_tokens"),
        Json.string(response, "status")));
  }
}

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
 * OpenAI Chat Completions ({@code POST /v1/chat/completions}): a view as the request's
 * {@code messages} and {@code prompt_cache_key}; a completion as the assistant message to append
 * and its usage.
 *
 * <pre>{@code
 * Map<String, Object> request = OpenAiChat.request(view);
 * request.put("model", "gpt-4.1");
 * request.put("tools", tools);
 * ProviderTurn turn = OpenAiChat.response(httpPost(request));
 * }</pre>
 */
public final class OpenAiChat {
  private OpenAiChat() {}

  /**
   * The request body for the view: {@code messages} (roles one to one, system first as the view
   * has it; assistant {@code tool_calls} of type function; {@code tool} messages with
   * {@code tool_call_id}) and {@code prompt_cache_key}. A mutable map: add {@code model},
   * {@code tools} and other parameters.
   */
  public static Map<String, Object> request(View view) {
    return request(view, false);
  }

  /**
   * As {@link #request(View)}; with {@code includeReasoning}, assistant messages carry their
   * {@code reasoning_content} (for the OpenAI-compatible providers that take it back).
   */
  public static Map<String, Object> request(View view, boolean includeReasoning) {
    Map<String, Object> request = new LinkedHashMap<>();
    request.put("messages", messages(view.messages(), includeReasoning));
    if (!view.promptCacheKey().isEmpty()) {
      request.put("prompt_cache_key", view.promptCacheKey());
    }
    return request;
  }

  /** The messages of a view (or any ctxfold messages) as Chat Completions messages. */
  public static List<Map<String, Object>> messages(List<Message> messages, boolean includeReasoning) {
    List<Map<String, Object>> out = new ArrayList<>(messages.size());
    for (Message m : messages) {
      out.add(message(m, includeReasoning));
    }
    return out;
  }

  private static Map<String, Object> message(Message m, boolean includeReasoning) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("role", role(m.getRole()));
    if (m.getRole() == Role.ROLE_TOOL) {
      out.put("tool_call_id", m.getToolCallId());
      out.put("content", m.getContent());
      return out;
    }
    if (m.getToolCallsCount() > 0) {
      out.put("content", m.getContent().isEmpty() ? null : m.getContent());
      List<Map<String, Object>> calls = new ArrayList<>();
      for (ToolCall call : m.getToolCallsList()) {
        Map<String, Object> function = new LinkedHashMap<>();
        function.put("name", call.getName());
        function.put("arguments", call.getArguments());
        Map<String, Object> entry = new LinkedHashMap<>();
        entry.put("id", call.getId());
        entry.put("type", "function");
        entry.put("function", function);
        calls.add(entry);
      }
      out.put("tool_calls", calls);
    } else {
      out.put("content", m.getContent());
    }
    if (includeReasoning && !m.getReasoningContent().isEmpty()) {
      out.put("reasoning_content", m.getReasoningContent());
    }
    if (!m.getName().isEmpty()) {
      out.put("name", m.getName());
    }
    return out;
  }

  private static String role(Role role) {
    return switch (role) {
      case ROLE_SYSTEM -> "system";
      case ROLE_USER -> "user";
      case ROLE_ASSISTANT -> "assistant";
      case ROLE_TOOL -> "tool";
      default -> throw new IllegalArgumentException("a view message has no role: " + role);
    };
  }

  /**
   * Chat Completions messages (a recorded conversation, or messages the agent built itself) as
   * ctxfold messages to append: roles one to one ({@code developer} as system), {@code tool_calls},
   * {@code tool_call_id}, {@code reasoning_content} and {@code name} kept.
   */
  public static List<Message> fromMessages(List<?> messages) {
    List<Message> out = new ArrayList<>(messages.size());
    for (Object item : messages) {
      out.add(fromMessage(Json.asObject(item)));
    }
    return out;
  }

  private static Message fromMessage(Map<String, Object> message) {
    String role = Json.string(message, "role");
    Message.Builder out = Message.newBuilder()
        .setRole(switch (role) {
          case "system", "developer" -> Role.ROLE_SYSTEM;
          case "user" -> Role.ROLE_USER;
          case "assistant" -> Role.ROLE_ASSISTANT;
          case "tool" -> Role.ROLE_TOOL;
          default -> throw new IllegalArgumentException("unsupported message role '" + role + "'");
        })
        .setContent(content(message.get("content")))
        .setReasoningContent(Json.string(message, "reasoning_content"))
        .setToolCallId(Json.string(message, "tool_call_id"))
        .setName(Json.string(message, "name"));
    for (Object item : Json.list(message, "tool_calls")) {
      Map<String, Object> call = Json.asObject(item);
      Map<String, Object> function = Json.object(call, "function");
      out.addToolCalls(ToolCall.newBuilder()
          .setId(Json.string(call, "id"))
          .setName(Json.string(function, "name"))
          .setArguments(Json.arguments(function.get("arguments"))));
    }
    return out.build();
  }

  /** A message's content: a string, or the text of its content parts joined with a newline. */
  private static String content(Object content) {
    if (content instanceof List) {
      List<String> text = new ArrayList<>();
      for (Object part : (List<?>) content) {
        text.add(Json.string(Json.asObject(part), "text"));
      }
      return Json.join(text);
    }
    return content instanceof String ? (String) content : "";
  }

  /** The completion (its JSON text) as the message to append and the usage to observe. */
  public static ProviderTurn response(String completionJson) {
    return response(Json.parseObject(completionJson));
  }

  /**
   * The completion as the message to append (the first choice's assistant message: {@code content},
   * {@code tool_calls}, {@code reasoning_content} where present) and the usage
   * ({@code prompt_tokens}, {@code prompt_tokens_details.cached_tokens}, {@code completion_tokens},
   * the choice's {@code finish_reason}).
   */
  public static ProviderTurn response(Map<String, Object> completion) {
    List<Object> choices = Json.list(completion, "choices");
    if (choices.isEmpty()) {
      throw new IllegalArgumentException("the completion has no choices");
    }
    Map<String, Object> choice = Json.asObject(choices.get(0));
    Map<String, Object> message = new LinkedHashMap<>(Json.object(choice, "message"));
    message.putIfAbsent("role", "assistant");
    Message answer = fromMessage(message).toBuilder()
        .setRole(Role.ROLE_ASSISTANT)
        .setContent(Json.string(message, "content").isEmpty() ? Json.string(message, "refusal")
            : Json.string(message, "content"))
        .build();
    Map<String, Object> usage = Json.object(completion, "usage");
    return new ProviderTurn(List.of(answer), new Usage(
        Json.number(usage, "prompt_tokens"),
        Json.number(Json.object(usage, "prompt_tokens_details"), "cached_tokens"),
        Json.number(usage, "completion_tokens"),
        Json.string(choice, "finish_reason")));
  }
}

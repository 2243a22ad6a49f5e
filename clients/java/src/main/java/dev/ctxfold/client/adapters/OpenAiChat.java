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
   * {@code tool_call_id}) and {@code prompt_cache_key}. A mutable map: add {@code model} and
   * other parameters.
   */
  public static Map<String, Object> request(View view) {
    return request(view, List.of(), false);
  }

  /**
   * As {@link #request(View)}, offering the session's {@code tools} (Chat format, JSON-shaped
   * values) and the {@code read_tool_result} definition when the view hides a result and they lack
   * it ({@link ModelTools#offered}).
   */
  public static Map<String, Object> request(View view, List<?> tools) {
    return request(view, tools, false);
  }

  /**
   * As {@link #request(View, List)}; with {@code includeReasoning}, assistant messages carry their
   * {@code reasoning_content} (for the OpenAI-compatible providers that take it back).
   */
  public static Map<String, Object> request(View view, List<?> tools, boolean includeReasoning) {
    Map<String, Object> request = new LinkedHashMap<>();
    request.put("messages", messages(view.messages(), includeReasoning));
    List<Object> offered = ModelTools.offered(tools, view, ToolFormat.OPENAI_CHAT);
    if (!offered.isEmpty()) {
      request.put("tools", offered);
    }
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
    out.put("role", role(m.role()));
    if (m.role() == Role.ROLE_TOOL) {
      out.put("tool_call_id", m.toolCallId());
      out.put("content", m.content());
      return out;
    }
    if (!m.toolCalls().isEmpty()) {
      out.put("content", m.content().isEmpty() ? null : m.content());
      List<Map<String, Object>> calls = new ArrayList<>();
      for (ToolCall call : m.toolCalls()) {
        Map<String, Object> function = new LinkedHashMap<>();
        function.put("name", call.name());
        function.put("arguments", call.arguments());
        Map<String, Object> entry = new LinkedHashMap<>();
        entry.put("id", call.id());
        entry.put("type", "function");
        entry.put("function", function);
        calls.add(entry);
      }
      out.put("tool_calls", calls);
    } else {
      out.put("content", m.content());
    }
    if (includeReasoning && !m.reasoningContent().isEmpty()) {
      out.put("reasoning_content", m.reasoningContent());
    }
    if (!m.name().isEmpty()) {
      out.put("name", m.name());
    }
    return out;
  }

  private static String role(Role role) {
    return switch (role) {
      case ROLE_SYSTEM -> "system";
      case ROLE_USER -> "user";
      case ROLE_ASSISTANT -> "assistant";
      case ROLE_TOOL -> "tool";
      default -> throw Json.unconvertible("a view message has no role: " + role);
    };
  }

  /**
   * Chat Completions messages (a recorded conversation, or messages the agent built itself) as
   * ctxfold messages to append: roles one to one ({@code developer} as system; another role is a
   * {@link dev.ctxfold.client.CtxfoldException} INVALID_MESSAGE), content as text (parts joined with
   * a newline), {@code tool_calls} (object arguments written as {@link dev.ctxfold.client.JsonText}
   * writes them), {@code tool_call_id}, {@code reasoning_content} and {@code name} kept.
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
    String content = content(message.get("content"));
    return (switch (role) {
      case "system", "developer" -> Messages.system(content);
      case "user" -> Messages.user(content);
      case "assistant" -> Messages.assistant(content, toolCalls(message));
      case "tool" -> Messages.toolResult(Json.string(message, "tool_call_id"), content);
      default -> throw Json.unconvertible("unsupported message role '" + role + "'");
    }).withReasoningContent(Json.string(message, "reasoning_content")).withName(Json.string(message, "name"));
  }

  private static List<ToolCall> toolCalls(Map<String, Object> message) {
    List<ToolCall> calls = new ArrayList<>();
    for (Object item : Json.list(message, "tool_calls")) {
      Map<String, Object> call = Json.asObject(item);
      Map<String, Object> function = Json.object(call, "function");
      calls.add(new ToolCall(Json.string(call, "id"), Json.string(function, "name"),
          Json.arguments(function.get("arguments"))));
    }
    return calls;
  }

  /** A message's content: a string, or its text parts joined with a newline (null = ""). */
  private static String content(Object content) {
    if (content instanceof List) {
      List<String> text = new ArrayList<>();
      for (Object part : (List<?>) content) {
        Map<String, Object> fields = Json.asObject(part);
        if ("text".equals(Json.string(fields, "type"))) {
          text.add(Json.string(fields, "text"));
        }
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
      throw Json.unconvertible("the completion has no choices");
    }
    Map<String, Object> choice = Json.asObject(choices.get(0));
    Map<String, Object> message = Json.object(choice, "message");
    String content = content(message.get("content"));
    Message answer = Messages.assistant(content.isEmpty() ? Json.string(message, "refusal") : content, toolCalls(message))
        .withReasoningContent(Json.string(message, "reasoning_content"));
    Map<String, Object> usage = Json.object(completion, "usage");
    return new ProviderTurn(List.of(answer), new Usage(
        Json.number(usage, "prompt_tokens"),
        Json.number(Json.object(usage, "prompt_tokens_details"), "cached_tokens"),
        Json.number(usage, "completion_tokens"),
        Json.string(choice, "finish_reason")));
  }
}

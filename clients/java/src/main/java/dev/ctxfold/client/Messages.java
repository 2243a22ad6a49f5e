package dev.ctxfold.client;

import dev.ctxfold.v1.Role;
import java.util.List;
import java.util.Map;

/**
 * Factories for the {@link Message}s an agent appends ({@link Message#withPinned},
 * {@link Message#withName} and {@link Message#withReasoningContent} set the rest).
 */
public final class Messages {
  private Messages() {}

  public static Message system(String content) {
    return Message.of(Role.ROLE_SYSTEM, content, List.of(), "");
  }

  public static Message user(String content) {
    return Message.of(Role.ROLE_USER, content, List.of(), "");
  }

  public static Message assistant(String content) {
    return Message.of(Role.ROLE_ASSISTANT, content, List.of(), "");
  }

  /** An assistant message that requests tool calls (its text may be empty). */
  public static Message assistant(String content, List<ToolCall> toolCalls) {
    return Message.of(Role.ROLE_ASSISTANT, content, toolCalls, "");
  }

  /** An assistant message that requests tool calls. */
  public static Message assistant(String content, ToolCall... toolCalls) {
    return assistant(content, List.of(toolCalls));
  }

  /** One tool call: the provider's call id, the function name and its JSON arguments. */
  public static ToolCall toolCall(String id, String name, String argumentsJson) {
    return new ToolCall(id, name, argumentsJson);
  }

  /** One tool call whose arguments are given as a map, written as {@link JsonText} writes JSON. */
  public static ToolCall toolCall(String id, String name, Map<String, ?> arguments) {
    return new ToolCall(id, name, JsonText.write(arguments));
  }

  /** The result of the tool call {@code toolCallId} (any size: the server bounds what the model sees). */
  public static Message toolResult(String toolCallId, String content) {
    return Message.of(Role.ROLE_TOOL, content, List.of(), java.util.Objects.requireNonNull(toolCallId, "toolCallId"));
  }

  /** The same message, pinned: folds always keep it verbatim. */
  public static Message pinned(Message message) {
    return message.withPinned(true);
  }
}

package dev.ctxfold.client;

import dev.ctxfold.v1.Message;
import dev.ctxfold.v1.Role;
import dev.ctxfold.v1.ToolCall;
import java.util.List;
import java.util.Objects;

/**
 * Factories for the {@link Message}s an agent appends. The messages are the generated protobuf
 * type, so every field stays reachable ({@code Messages.user("hi").toBuilder().setPinned(true)}).
 */
public final class Messages {
  private Messages() {}

  public static Message system(String content) {
    return Message.newBuilder().setRole(Role.ROLE_SYSTEM).setContent(content).build();
  }

  public static Message user(String content) {
    return Message.newBuilder().setRole(Role.ROLE_USER).setContent(content).build();
  }

  public static Message assistant(String content) {
    return Message.newBuilder().setRole(Role.ROLE_ASSISTANT).setContent(content).build();
  }

  /** An assistant message that requests tool calls (its text may be empty). */
  public static Message assistant(String content, List<ToolCall> toolCalls) {
    return Message.newBuilder()
        .setRole(Role.ROLE_ASSISTANT)
        .setContent(content)
        .addAllToolCalls(toolCalls)
        .build();
  }

  /** An assistant message that requests tool calls. */
  public static Message assistant(String content, ToolCall... toolCalls) {
    return assistant(content, List.of(toolCalls));
  }

  /** One tool call: the provider's call id, the function name and its JSON arguments. */
  public static ToolCall toolCall(String id, String name, String argumentsJson) {
    return ToolCall.newBuilder()
        .setId(Objects.requireNonNull(id, "id"))
        .setName(Objects.requireNonNull(name, "name"))
        .setArguments(argumentsJson == null ? "" : argumentsJson)
        .build();
  }

  /** The result of the tool call {@code toolCallId} (any size: the server bounds what the model sees). */
  public static Message toolResult(String toolCallId, String content) {
    return Message.newBuilder()
        .setRole(Role.ROLE_TOOL)
        .setToolCallId(Objects.requireNonNull(toolCallId, "toolCallId"))
        .setContent(content)
        .build();
  }

  /** The same message, pinned: folds always keep it verbatim. */
  public static Message pinned(Message message) {
    return message.toBuilder().setPinned(true).build();
  }
}

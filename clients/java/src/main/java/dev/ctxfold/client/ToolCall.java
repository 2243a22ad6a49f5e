package dev.ctxfold.client;

import java.util.Objects;

/**
 * One tool call of an assistant message.
 *
 * @param id the provider's id of the call; the tool result names it in {@code toolCallId}
 * @param name the function name
 * @param arguments the arguments as the model wrote them (usually a JSON object)
 */
public record ToolCall(String id, String name, String arguments) {
  public ToolCall {
    Objects.requireNonNull(id, "id");
    Objects.requireNonNull(name, "name");
    arguments = arguments == null ? "" : arguments;
  }

  /** The call as the generated type. */
  public dev.ctxfold.v1.ToolCall toProto() {
    return dev.ctxfold.v1.ToolCall.newBuilder().setId(id).setName(name).setArguments(arguments).build();
  }

  /** A generated call. */
  public static ToolCall fromProto(dev.ctxfold.v1.ToolCall call) {
    return new ToolCall(call.getId(), call.getName(), call.getArguments());
  }
}

package dev.ctxfold.client;

import dev.ctxfold.v1.ErrorReason;
import java.util.Locale;

/** A provider's function-tool definition format, for {@link ModelTools#definitions(ToolFormat)}. */
public enum ToolFormat {
  /** OpenAI Chat Completions: {@code {"type": "function", "function": {name, description, parameters}}}. */
  OPENAI_CHAT,
  /** OpenAI Responses: {@code {"type": "function", name, description, parameters}}. */
  OPENAI_RESPONSES,
  /** Anthropic Messages: {@code {name, description, input_schema}}. */
  ANTHROPIC;

  /**
   * The format named as the other SDKs name it ({@code openai_chat}, {@code openai_responses},
   * {@code anthropic}); another name is a {@link CtxfoldException} INVALID_CLIENT_ARGUMENT.
   */
  public static ToolFormat of(String name) {
    for (ToolFormat format : values()) {
      if (format.name().toLowerCase(Locale.ROOT).equals(name)) {
        return format;
      }
    }
    throw CtxfoldException.invalidArgument(ErrorReason.INVALID_CLIENT_ARGUMENT, "format",
        "unknown tool format '" + name + "': openai_chat, openai_responses or anthropic");
  }
}

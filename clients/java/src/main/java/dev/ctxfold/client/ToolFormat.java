package dev.ctxfold.client;

/** A provider's function-tool definition format, for {@link ModelTools#definitions(ToolFormat)}. */
public enum ToolFormat {
  /** OpenAI Chat Completions: {@code {"type": "function", "function": {name, description, parameters}}}. */
  OPENAI_CHAT,
  /** OpenAI Responses: {@code {"type": "function", name, description, parameters}}. */
  OPENAI_RESPONSES,
  /** Anthropic Messages: {@code {name, description, input_schema}}. */
  ANTHROPIC
}

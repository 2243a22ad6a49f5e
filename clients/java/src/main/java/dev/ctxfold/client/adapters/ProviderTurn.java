package dev.ctxfold.client.adapters;

import dev.ctxfold.client.Usage;
import dev.ctxfold.client.Message;
import dev.ctxfold.client.ToolCall;
import java.util.List;

/**
 * A provider's answer, converted: the messages to append (one assistant message, with its tool
 * calls and reasoning) and the usage to report with {@code observeUsage}.
 *
 * @param messages the messages to append, in order
 * @param usage the provider's usage of the request
 */
public record ProviderTurn(List<Message> messages, Usage usage) {
  public ProviderTurn {
    messages = List.copyOf(messages);
  }

  /** The tool calls the model asked for (empty when it answered in text). */
  public List<ToolCall> toolCalls() {
    return messages.stream().flatMap(m -> m.toolCalls().stream()).toList();
  }
}

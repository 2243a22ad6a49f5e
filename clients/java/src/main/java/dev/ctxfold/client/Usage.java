package dev.ctxfold.client;

import dev.ctxfold.v1.ErrorReason;

/**
 * Provider-reported usage of one request, for {@link CtxfoldClient#observeUsage}.
 *
 * @param inputTokens input tokens the provider billed
 * @param cachedInputTokens of those, tokens served from the provider's prompt cache
 * @param outputTokens output tokens the provider billed
 * @param finishReason the provider's finish reason (stop, length, tool_calls, ...); may be ""
 */
public record Usage(long inputTokens, long cachedInputTokens, long outputTokens, String finishReason) {
  public Usage {
    if (inputTokens < 0 || cachedInputTokens < 0 || outputTokens < 0) {
      throw CtxfoldException.invalidArgument(ErrorReason.INVALID_USAGE, "input_tokens",
          "token counts must not be negative");
    }
    finishReason = finishReason == null ? "" : finishReason;
  }
}

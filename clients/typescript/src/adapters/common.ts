import type { MessageInput } from "../config.js";

/** A provider's tool call as the SDK appends it: arguments as the JSON text the model wrote. */
export interface ProviderToolCall {
  id: string;
  name: string;
  arguments: string;
}

/** The assistant message of a provider response, ready to append. */
export interface ProviderMessage extends MessageInput {
  role: "ROLE_ASSISTANT";
  content: string;
  toolCalls: ProviderToolCall[];
  reasoningContent: string;
}

/** A provider response as ctxfold sees it: the messages to append and the usage for observeUsage. */
export interface ProviderTurn {
  messages: ProviderMessage[];
  usage: { inputTokens: number; cachedInputTokens: number; outputTokens: number; finishReason: string };
}

/** The non-empty parts, one per line (several text blocks or summary parts become one text). */
export function joinParts(parts: readonly string[]): string {
  return parts.filter((part) => part !== "").join("\n");
}

import type { MessageInput } from "../config.js";

/** What every view → request conversion takes. */
export interface RequestOptions {
  /**
   * The tools given to the session, in the API's tool format (an array, or the JSON text of
   * `session.config.toolsJson`). The request offers them in order, and adds the read_tool_result
   * definition when the view hides a result and no tool of that name is given.
   */
  tools?: string | readonly unknown[];
}

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

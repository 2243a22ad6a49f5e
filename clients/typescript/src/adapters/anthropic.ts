/**
 * Anthropic Messages: a View → `system`, `messages` with `tool_use` / `tool_result` blocks and a
 * prompt-cache breakpoint on the last block of the stable prefix, and `tools`; a message response
 * → the assistant message (text, tool_use, thinking) and the usage. Plain JSON shapes.
 */
import { unconvertible } from "../errors.js";
import type { Message, View } from "../model.js";
import { requestTools } from "../tools.js";
import { type ProviderToolCall, type ProviderTurn, type RequestOptions, joinParts } from "./common.js";

export interface AnthropicCacheControl {
  type: "ephemeral";
}

export type AnthropicBlock = (
  | { type: "text"; text: string }
  | { type: "tool_use"; id: string; name: string; input: Record<string, unknown> }
  | { type: "tool_result"; tool_use_id: string; content: string }
) & { cache_control?: AnthropicCacheControl };

export interface AnthropicMessage {
  role: "user" | "assistant";
  content: AnthropicBlock[];
}

/** The converted part of a request: add `model`, `max_tokens`, … and send. */
export interface AnthropicRequest {
  system?: AnthropicBlock[];
  messages: AnthropicMessage[];
  tools?: unknown[];
}

/** The parts of a message response the adapter reads. */
export interface AnthropicResponse {
  content: { type: string; text?: string; thinking?: string; id?: string; name?: string; input?: unknown }[];
  stop_reason?: string | null;
  usage?: {
    input_tokens?: number;
    output_tokens?: number;
    cache_read_input_tokens?: number | null;
    cache_creation_input_tokens?: number | null;
  } | null;
}

/** A tool call's arguments as the `input` object of a tool_use block (`{}` when empty). */
function toolInput(callId: string, args: string): Record<string, unknown> {
  let input: unknown;
  try {
    input = JSON.parse(args || "{}");
  } catch (err) {
    throw unconvertible(`tool call ${callId}: arguments are not JSON (${(err as Error).message})`);
  }
  if (typeof input !== "object" || input === null || Array.isArray(input)) {
    throw unconvertible(`tool call ${callId}: arguments are not a JSON object`);
  }
  return input as Record<string, unknown>;
}

function blocksOf(m: Message): AnthropicBlock[] {
  if (m.role === "ROLE_TOOL") {
    return [{ type: "tool_result", tool_use_id: m.toolCallId, content: m.content }];
  }
  const text: AnthropicBlock[] = m.content ? [{ type: "text", text: m.content }] : [];
  return [...text, ...m.toolCalls.map((c) => ({ type: "tool_use" as const, id: c.id, name: c.name, input: toolInput(c.id, c.arguments) }))];
}

/**
 * The request for a view. A leading system message becomes `system` (one text block); assistant
 * messages become text and `tool_use` blocks; tool results become `tool_result` blocks of the user
 * turn; later system messages become user text. Consecutive messages of one role form one turn
 * (so parallel tool results share one user turn); empty text is left out. The last block of the
 * view's stable prefix (`stablePrefixMessages`) gets `cache_control: {type: "ephemeral"}`.
 * Thinking is not sent back: its signature is not kept in the transcript. `tools`: the session's,
 * in Messages format (read_tool_result added when the view hides a result).
 */
export function toAnthropicMessages(view: View, options: RequestOptions = {}): AnthropicRequest {
  const request: AnthropicRequest = { messages: [] };
  let lastStableBlock: AnthropicBlock | undefined;
  view.messages.forEach((m, index) => {
    let blocks: AnthropicBlock[];
    if (index === 0 && m.role === "ROLE_SYSTEM") {
      blocks = [{ type: "text", text: m.content }];
      request.system = blocks;
    } else {
      blocks = blocksOf(m);
      const role = m.role === "ROLE_ASSISTANT" ? "assistant" : "user";
      const previous = request.messages.at(-1);
      if (blocks.length > 0 && previous?.role === role) previous.content.push(...blocks);
      else if (blocks.length > 0) request.messages.push({ role, content: blocks });
    }
    if (index < view.stablePrefixMessages && blocks.length > 0) lastStableBlock = blocks.at(-1);
  });
  if (lastStableBlock !== undefined) lastStableBlock.cache_control = { type: "ephemeral" };
  const tools = requestTools(options.tools, view, "anthropic");
  if (tools.length > 0) request.tools = tools;
  return request;
}

/**
 * The content blocks as one assistant message (`text`, `tool_use` as tool calls with the input
 * written by JSON.stringify, `thinking` as `reasoningContent`) and the usage: input_tokens +
 * cache_read_input_tokens + cache_creation_input_tokens as input, cache_read_input_tokens as
 * cached, output_tokens, stop_reason.
 */
export function fromAnthropicMessages(response: AnthropicResponse): ProviderTurn {
  const texts: string[] = [];
  const thinking: string[] = [];
  const toolCalls: ProviderToolCall[] = [];
  for (const block of response.content) {
    if (block.type === "text") texts.push(block.text ?? "");
    else if (block.type === "thinking") thinking.push(block.thinking ?? "");
    else if (block.type === "tool_use") toolCalls.push({ id: block.id ?? "", name: block.name ?? "", arguments: JSON.stringify(block.input ?? {}) });
  }
  const usage = response.usage ?? {};
  const cacheRead = usage.cache_read_input_tokens ?? 0;
  return {
    messages: [{ role: "ROLE_ASSISTANT", content: joinParts(texts), toolCalls, reasoningContent: joinParts(thinking) }],
    usage: {
      inputTokens: (usage.input_tokens ?? 0) + cacheRead + (usage.cache_creation_input_tokens ?? 0),
      cachedInputTokens: cacheRead,
      outputTokens: usage.output_tokens ?? 0,
      finishReason: response.stop_reason ?? "",
    },
  };
}

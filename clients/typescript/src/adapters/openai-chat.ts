/**
 * OpenAI Chat Completions: a View → the request's `messages` (system first, assistant
 * `tool_calls`, `tool` messages) and `prompt_cache_key`; a chat completion → the assistant message
 * to append and the usage to report. Plain JSON shapes: no OpenAI SDK is needed.
 */
import type { Message, View } from "../model.js";
import { type ProviderToolCall, type ProviderTurn, joinParts } from "./common.js";

export interface OpenAIChatToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export interface OpenAIChatMessage {
  role: "system" | "user" | "assistant" | "tool";
  content: string | null;
  name?: string;
  tool_calls?: OpenAIChatToolCall[];
  tool_call_id?: string;
  reasoning_content?: string;
}

/** The converted part of a request: add `model`, `tools`, … and send. */
export interface OpenAIChatRequest {
  messages: OpenAIChatMessage[];
  prompt_cache_key?: string;
}

/** The parts of a chat completion the adapter reads. */
export interface OpenAIChatResponse {
  choices: {
    message: {
      content?: string | { type: string; text?: string }[] | null;
      refusal?: string | null;
      tool_calls?: { id: string; function: { name: string; arguments: string | object } }[] | null;
      reasoning_content?: string | null;
    };
    finish_reason?: string | null;
  }[];
  usage?: { prompt_tokens?: number; completion_tokens?: number; prompt_tokens_details?: { cached_tokens?: number | null } | null } | null;
}

export interface OpenAIChatOptions {
  /** Send `reasoning_content` back, for the OpenAI-compatible providers that take it (DeepSeek). */
  includeReasoning?: boolean;
}

const ROLES = { ROLE_SYSTEM: "system", ROLE_USER: "user", ROLE_ASSISTANT: "assistant", ROLE_TOOL: "tool" } as const;

/** One view message as a Chat Completions message. */
export function toOpenAIChatMessage(m: Message, options: OpenAIChatOptions = {}): OpenAIChatMessage {
  if (m.role === "ROLE_TOOL") {
    return { role: "tool", tool_call_id: m.toolCallId, content: m.content };
  }
  const out: OpenAIChatMessage = { role: ROLES[m.role], content: m.content };
  if (m.toolCalls.length > 0) {
    // A tool-calling answer without text has null content in the Chat format.
    out.content = m.content || null;
    out.tool_calls = m.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
  }
  if (options.includeReasoning && m.reasoningContent) out.reasoning_content = m.reasoningContent;
  if (m.name) out.name = m.name;
  return out;
}

/**
 * The request for a view: roles one to one (the system prompt first, the checkpoint summary where
 * the server placed it), tool calls of type "function", tool results with `tool_call_id`, and the
 * view's `prompt_cache_key`.
 */
export function toOpenAIChat(view: View, options: OpenAIChatOptions = {}): OpenAIChatRequest {
  const request: OpenAIChatRequest = { messages: view.messages.map((m) => toOpenAIChatMessage(m, options)) };
  if (view.promptCacheKey) request.prompt_cache_key = view.promptCacheKey;
  return request;
}

/**
 * The first choice's message (content or refusal, tool calls, `reasoning_content` where the
 * provider sends it) and the usage: prompt_tokens, prompt_tokens_details.cached_tokens,
 * completion_tokens, finish_reason.
 */
export function fromOpenAIChat(response: OpenAIChatResponse): ProviderTurn {
  const choice = response.choices[0];
  if (choice === undefined) {
    throw new TypeError("the chat completion has no choices");
  }
  const { content, refusal, tool_calls, reasoning_content } = choice.message;
  const text = typeof content === "string" || content == null ? (content ?? "") : joinParts(content.filter((p) => p.type === "text").map((p) => p.text ?? ""));
  const toolCalls: ProviderToolCall[] = (tool_calls ?? []).map((c) => ({
    id: c.id,
    name: c.function.name,
    arguments: typeof c.function.arguments === "string" ? c.function.arguments : JSON.stringify(c.function.arguments),
  }));
  const usage = response.usage ?? {};
  return {
    messages: [{ role: "ROLE_ASSISTANT", content: text || (refusal ?? ""), toolCalls, reasoningContent: reasoning_content ?? "" }],
    usage: {
      inputTokens: usage.prompt_tokens ?? 0,
      cachedInputTokens: usage.prompt_tokens_details?.cached_tokens ?? 0,
      outputTokens: usage.completion_tokens ?? 0,
      finishReason: choice.finish_reason ?? "",
    },
  };
}

/**
 * OpenAI Chat Completions: a View → the request's `messages` (system first, assistant
 * `tool_calls`, `tool` messages), `tools` and `prompt_cache_key`; a chat completion → the assistant
 * message to append and the usage to report; recorded Chat messages → messages to append. Plain
 * JSON shapes: no OpenAI SDK is needed.
 */
import type { MessageInput } from "../config.js";
import { unconvertible } from "../errors.js";
import type { Message, View } from "../model.js";
import { requestTools } from "../tools.js";
import { type ProviderToolCall, type ProviderTurn, type RequestOptions, joinParts } from "./common.js";

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

/** The converted part of a request: add `model`, … and send. */
export interface OpenAIChatRequest {
  messages: OpenAIChatMessage[];
  tools?: unknown[];
  prompt_cache_key?: string;
}

/** A recorded Chat Completions message, as a transcript or trace keeps it (the request's shape, content parts and object arguments allowed). */
export interface OpenAIChatRecordedMessage {
  role: string;
  content?: string | { type: string; text?: string }[] | null;
  name?: string | null;
  tool_calls?: { id: string; function: { name: string; arguments: string | object } }[] | null;
  tool_call_id?: string | null;
  reasoning_content?: string | null;
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

export interface OpenAIChatOptions extends RequestOptions {
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
 * the server placed it), tool calls of type "function", tool results with `tool_call_id`, the
 * session's `tools` (read_tool_result added when the view hides a result), and the view's
 * `prompt_cache_key`.
 */
export function toOpenAIChat(view: View, options: OpenAIChatOptions = {}): OpenAIChatRequest {
  const request: OpenAIChatRequest = { messages: view.messages.map((m) => toOpenAIChatMessage(m, options)) };
  const tools = requestTools(options.tools, view, "openai_chat");
  if (tools.length > 0) request.tools = tools;
  if (view.promptCacheKey) request.prompt_cache_key = view.promptCacheKey;
  return request;
}

/** A message's content as text: a string, or its text parts joined with a newline (null = ""). */
function contentText(content: string | { type: string; text?: string }[] | null | undefined): string {
  return typeof content === "string" || content == null ? (content ?? "") : joinParts(content.filter((p) => p.type === "text").map((p) => p.text ?? ""));
}

function toolCallsOf(calls: { id: string; function: { name: string; arguments: string | object } }[] | null | undefined): ProviderToolCall[] {
  return (calls ?? []).map((c) => ({
    id: c.id,
    name: c.function.name,
    arguments: typeof c.function.arguments === "string" ? c.function.arguments : JSON.stringify(c.function.arguments),
  }));
}

const FROM_ROLES = { system: "ROLE_SYSTEM", developer: "ROLE_SYSTEM", user: "ROLE_USER", assistant: "ROLE_ASSISTANT", tool: "ROLE_TOOL" } as const;

/**
 * Recorded Chat Completions messages (a transcript kept in that format, a trace) as messages to
 * append: roles one to one (`developer` as system), content as text (parts joined with a newline),
 * `tool_calls`, `tool_call_id`, `reasoning_content` and `name` kept.
 */
export function fromOpenAIChatMessages(messages: readonly OpenAIChatRecordedMessage[]): MessageInput[] {
  return messages.map((m, index) => {
    const role = Object.hasOwn(FROM_ROLES, m.role) ? FROM_ROLES[m.role as keyof typeof FROM_ROLES] : undefined;
    if (role === undefined) {
      throw unconvertible(`message ${index}: role ${JSON.stringify(m.role)} is not system, developer, user, assistant or tool`);
    }
    const name = m.name ?? "";
    if (role === "ROLE_TOOL") {
      return { role, toolCallId: m.tool_call_id ?? "", content: contentText(m.content), name };
    }
    return { role, content: contentText(m.content), toolCalls: toolCallsOf(m.tool_calls), reasoningContent: m.reasoning_content ?? "", name };
  });
}

/**
 * The first choice's message (content or refusal, tool calls, `reasoning_content` where the
 * provider sends it) and the usage: prompt_tokens, prompt_tokens_details.cached_tokens,
 * completion_tokens, finish_reason.
 */
export function fromOpenAIChat(response: OpenAIChatResponse): ProviderTurn {
  const choice = response.choices[0];
  if (choice === undefined) {
    throw unconvertible("the chat completion has no choices");
  }
  const { content, refusal, tool_calls, reasoning_content } = choice.message;
  const text = contentText(content);
  const toolCalls = toolCallsOf(tool_calls);
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

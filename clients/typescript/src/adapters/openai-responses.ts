/**
 * OpenAI Responses: a View → `instructions` (the system prompt) and `input` items (`message`,
 * `function_call`, `function_call_output`) with `tools` and `prompt_cache_key`; a response's output
 * items → the assistant message (text, tool calls, reasoning summary) and the usage. Plain JSON shapes.
 */
import type { Message, View } from "../model.js";
import { requestTools } from "../tools.js";
import { type ProviderToolCall, type ProviderTurn, type RequestOptions, joinParts } from "./common.js";

export type OpenAIResponsesInputItem =
  | { type: "message"; role: "user" | "assistant" | "system"; content: string }
  | { type: "function_call"; call_id: string; name: string; arguments: string }
  | { type: "function_call_output"; call_id: string; output: string };

/** The converted part of a request: add `model`, … and send. */
export interface OpenAIResponsesRequest {
  instructions?: string;
  input: OpenAIResponsesInputItem[];
  tools?: unknown[];
  prompt_cache_key?: string;
}

/** The parts of a response the adapter reads. */
export interface OpenAIResponsesResponse {
  status?: string | null;
  output: { type: string; content?: { type: string; text?: string; refusal?: string }[]; call_id?: string; name?: string; arguments?: string; summary?: { text?: string }[] }[];
  usage?: { input_tokens?: number; output_tokens?: number; input_tokens_details?: { cached_tokens?: number | null } | null } | null;
}

const ROLES = { ROLE_SYSTEM: "system", ROLE_USER: "user", ROLE_ASSISTANT: "assistant" } as const;

function inputItems(m: Message): OpenAIResponsesInputItem[] {
  if (m.role === "ROLE_TOOL") {
    return [{ type: "function_call_output", call_id: m.toolCallId, output: m.content }];
  }
  const text: OpenAIResponsesInputItem[] = m.content || m.toolCalls.length === 0 ? [{ type: "message", role: ROLES[m.role], content: m.content }] : [];
  return [...text, ...m.toolCalls.map((c) => ({ type: "function_call" as const, call_id: c.id, name: c.name, arguments: c.arguments }))];
}

/**
 * The request for a view: a leading system message becomes `instructions`; every other message
 * becomes input items — a `message` for its text, a `function_call` per tool call, a
 * `function_call_output` per tool result. Reasoning is not sent back (its items are opaque).
 * `tools`: the session's, in Responses format (read_tool_result added when the view hides a result).
 */
export function toOpenAIResponses(view: View, options: RequestOptions = {}): OpenAIResponsesRequest {
  const [first, ...rest] = view.messages;
  const hasSystem = first?.role === "ROLE_SYSTEM";
  const request: OpenAIResponsesRequest = { input: (hasSystem ? rest : view.messages).flatMap(inputItems) };
  if (hasSystem) request.instructions = first.content;
  const tools = requestTools(options.tools, view, "openai_responses");
  if (tools.length > 0) request.tools = tools;
  if (view.promptCacheKey) request.prompt_cache_key = view.promptCacheKey;
  return request;
}

/**
 * The output items as one assistant message (output text, function calls, reasoning summary text
 * as `reasoning_content`) and the usage: input_tokens, input_tokens_details.cached_tokens,
 * output_tokens, and the response `status` as the finish reason.
 */
export function fromOpenAIResponses(response: OpenAIResponsesResponse): ProviderTurn {
  const texts: string[] = [];
  const reasoning: string[] = [];
  const toolCalls: ProviderToolCall[] = [];
  for (const item of response.output) {
    if (item.type === "message") {
      for (const part of item.content ?? []) {
        if (part.type === "output_text") texts.push(part.text ?? "");
        else if (part.type === "refusal") texts.push(part.refusal ?? "");
      }
    } else if (item.type === "function_call") {
      toolCalls.push({ id: item.call_id ?? "", name: item.name ?? "", arguments: item.arguments ?? "" });
    } else if (item.type === "reasoning") {
      reasoning.push(...(item.summary ?? []).map((part) => part.text ?? ""));
    }
  }
  const usage = response.usage ?? {};
  return {
    messages: [{ role: "ROLE_ASSISTANT", content: joinParts(texts), toolCalls, reasoningContent: joinParts(reasoning) }],
    usage: {
      inputTokens: usage.input_tokens ?? 0,
      cachedInputTokens: usage.input_tokens_details?.cached_tokens ?? 0,
      outputTokens: usage.output_tokens ?? 0,
      finishReason: response.status ?? "",
    },
  };
}

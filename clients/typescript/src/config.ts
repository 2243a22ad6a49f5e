import { create } from "@bufbuild/protobuf";
import {
  type Message,
  MessageSchema,
  Role,
  type SessionConfig,
  SessionConfigSchema,
  type ToolCall,
  ToolCallSchema,
} from "./gen/ctxfold/v1/context_service_pb.js";

/** An int64 value: the SDK accepts numbers or bigints; responses carry bigints. */
export type Int64 = number | bigint;

/** Converts a number or bigint to the bigint the generated code wants (undefined stays undefined). */
export function toBigInt(value: Int64): bigint;
export function toBigInt(value: Int64 | undefined): bigint | undefined;
export function toBigInt(value: Int64 | undefined): bigint | undefined {
  if (value === undefined) {
    return undefined;
  }
  if (typeof value === "bigint") {
    return value;
  }
  if (!Number.isInteger(value)) {
    throw new RangeError(`expected an integer, got ${value}`);
  }
  return BigInt(value);
}

/**
 * Session settings in idiomatic form. Every field but `contextWindow` is optional; an omitted
 * field means "the server's default" (see SessionConfig in the proto).
 */
export interface SessionConfigOptions {
  /** The model's context window in tokens. Required, > 0. */
  contextWindow: Int64;
  /** Maintenance trigger as a share of the window; default 0.80, range [0.30, 0.95]. */
  compactRatio?: number;
  /** Share of the window a fold keeps verbatim as the recent tail; default 0.16, (0, 0.5]. */
  tailRatio?: number;
  /** Output tokens requested from the provider; counted in every estimate. */
  maxOutputTokens?: Int64;
  /** Upper bound of one summary in tokens; default 8192. */
  summaryMaxTokens?: Int64;
  /** Bound of a tool result's visible content in UTF-8 bytes; default 32768, [4096, 1048576]. */
  toolContentMaxBytes?: Int64;
  /** The agent's system prompt; first message of every view. */
  systemPrompt?: string;
  /** Provider tool schemas: a JSON array string or any JSON-serialisable array. */
  tools?: string | readonly unknown[];
  /** Name of a summarizer configured on the server; default "extractive". */
  summarizer?: string;
  /** Provider prompt-cache TTL in seconds. */
  cacheTtlSeconds?: Int64;
  /** Prompt-cache key; derived from the session id when empty. */
  promptCacheKey?: string;
  /** The model the agent calls (telemetry, cache TTL defaults). */
  model?: string;
}

function checkRange(name: string, value: number | undefined, ok: (v: number) => boolean, range: string): void {
  if (value !== undefined && value !== 0 && !ok(value)) {
    throw new RangeError(`${name} must be in ${range}, got ${value}`);
  }
}

/**
 * Builds a SessionConfig from idiomatic options, checking the documented ranges locally (the
 * server validates again and answers INVALID_CONFIG).
 */
export function buildSessionConfig(options: SessionConfigOptions): SessionConfig {
  const window = toBigInt(options.contextWindow);
  if (window <= 0n) {
    throw new RangeError(`contextWindow must be > 0, got ${window}`);
  }
  checkRange("compactRatio", options.compactRatio, (v) => v >= 0.3 && v <= 0.95, "[0.30, 0.95]");
  checkRange("tailRatio", options.tailRatio, (v) => v > 0 && v <= 0.5, "(0, 0.5]");
  const toolBytes = options.toolContentMaxBytes === undefined ? undefined : Number(options.toolContentMaxBytes);
  checkRange("toolContentMaxBytes", toolBytes, (v) => v >= 4096 && v <= 1048576, "[4096, 1048576]");
  for (const [name, value] of [
    ["maxOutputTokens", options.maxOutputTokens],
    ["summaryMaxTokens", options.summaryMaxTokens],
    ["cacheTtlSeconds", options.cacheTtlSeconds],
  ] as const) {
    if (value !== undefined && toBigInt(value) < 0n) {
      throw new RangeError(`${name} must be >= 0, got ${value}`);
    }
  }
  const tools = options.tools === undefined || typeof options.tools === "string" ? options.tools : JSON.stringify(options.tools);
  return create(SessionConfigSchema, {
    contextWindow: window,
    compactRatio: options.compactRatio,
    tailRatio: options.tailRatio,
    maxOutputTokens: toBigInt(options.maxOutputTokens),
    summaryMaxTokens: toBigInt(options.summaryMaxTokens),
    toolContentMaxBytes: toBigInt(options.toolContentMaxBytes),
    systemPrompt: options.systemPrompt,
    toolsJson: tools,
    summarizer: options.summarizer,
    cacheTtlSeconds: toBigInt(options.cacheTtlSeconds),
    promptCacheKey: options.promptCacheKey,
    model: options.model,
  });
}

/**
 * Fluent, typed builder of a SessionConfig.
 *
 * ```ts
 * const config = sessionConfig(128_000).maxOutputTokens(4096).systemPrompt("You are …").build();
 * ```
 */
export class SessionConfigBuilder {
  private readonly options: SessionConfigOptions;

  constructor(contextWindow: Int64) {
    this.options = { contextWindow };
  }

  compactRatio(value: number): this {
    this.options.compactRatio = value;
    return this;
  }
  tailRatio(value: number): this {
    this.options.tailRatio = value;
    return this;
  }
  maxOutputTokens(value: Int64): this {
    this.options.maxOutputTokens = value;
    return this;
  }
  summaryMaxTokens(value: Int64): this {
    this.options.summaryMaxTokens = value;
    return this;
  }
  toolContentMaxBytes(value: Int64): this {
    this.options.toolContentMaxBytes = value;
    return this;
  }
  systemPrompt(value: string): this {
    this.options.systemPrompt = value;
    return this;
  }
  /** Provider tool schemas: a JSON array string or an array that is JSON-serialised. */
  tools(value: string | readonly unknown[]): this {
    this.options.tools = value;
    return this;
  }
  summarizer(value: string): this {
    this.options.summarizer = value;
    return this;
  }
  cacheTtlSeconds(value: Int64): this {
    this.options.cacheTtlSeconds = value;
    return this;
  }
  promptCacheKey(value: string): this {
    this.options.promptCacheKey = value;
    return this;
  }
  model(value: string): this {
    this.options.model = value;
    return this;
  }
  /** The options collected so far (a copy). */
  toOptions(): SessionConfigOptions {
    return { ...this.options };
  }
  /** Validates the documented ranges and returns the SessionConfig message. */
  build(): SessionConfig {
    return buildSessionConfig(this.options);
  }
}

/** Starts a SessionConfig builder for a model with the given context window (tokens). */
export function sessionConfig(contextWindow: Int64): SessionConfigBuilder {
  return new SessionConfigBuilder(contextWindow);
}

/** Anything createSession/fork accept as a config. */
export type SessionConfigInput = SessionConfig | SessionConfigOptions | SessionConfigBuilder;

/** @internal Normalises a SessionConfigInput to the message. */
export function toSessionConfig(input: SessionConfigInput): SessionConfig {
  if (input instanceof SessionConfigBuilder) {
    return input.build();
  }
  if ("$typeName" in input) {
    return input;
  }
  return buildSessionConfig(input);
}

/** Config overrides for fork(): every set field replaces the source session's value. */
export type SessionConfigOverrides = Partial<SessionConfigOptions>;

/** @internal Builds the override message of a fork (no range checks for unset fields). */
export function toConfigOverrides(overrides: SessionConfigOverrides | SessionConfig): SessionConfig {
  if ("$typeName" in overrides) {
    return overrides;
  }
  const tools =
    overrides.tools === undefined || typeof overrides.tools === "string" ? overrides.tools : JSON.stringify(overrides.tools);
  return create(SessionConfigSchema, {
    contextWindow: toBigInt(overrides.contextWindow),
    compactRatio: overrides.compactRatio,
    tailRatio: overrides.tailRatio,
    maxOutputTokens: toBigInt(overrides.maxOutputTokens),
    summaryMaxTokens: toBigInt(overrides.summaryMaxTokens),
    toolContentMaxBytes: toBigInt(overrides.toolContentMaxBytes),
    systemPrompt: overrides.systemPrompt,
    toolsJson: tools,
    summarizer: overrides.summarizer,
    cacheTtlSeconds: toBigInt(overrides.cacheTtlSeconds),
    promptCacheKey: overrides.promptCacheKey,
    model: overrides.model,
  });
}

// ---------------------------------------------------------------------------------------------
// Messages

/** A tool call in idiomatic form; `arguments` may be an object (JSON-serialised). */
export interface ToolCallInput {
  id: string;
  name: string;
  arguments?: string | Record<string, unknown>;
}

/** A message to append, in idiomatic form (or a generated Message). */
export interface MessageInput {
  role: Role;
  content?: string;
  toolCalls?: readonly (ToolCallInput | ToolCall)[];
  toolCallId?: string;
  reasoningContent?: string;
  pinned?: boolean;
  name?: string;
}

/** Extra fields for the message helpers. */
export type MessageExtras = Pick<MessageInput, "reasoningContent" | "pinned" | "name">;

/** @internal */
export function toToolCall(call: ToolCallInput | ToolCall): ToolCall {
  if ("$typeName" in call) {
    return call;
  }
  const args = call.arguments === undefined || typeof call.arguments === "string" ? call.arguments : JSON.stringify(call.arguments);
  return create(ToolCallSchema, { id: call.id, name: call.name, arguments: args ?? "" });
}

/** @internal Normalises a MessageInput (or Message) to the message. Output-only fields are dropped by the server. */
export function toMessage(input: MessageInput | Message): Message {
  if ("$typeName" in input) {
    return input;
  }
  return create(MessageSchema, {
    role: input.role,
    content: input.content ?? "",
    toolCalls: (input.toolCalls ?? []).map(toToolCall),
    toolCallId: input.toolCallId ?? "",
    reasoningContent: input.reasoningContent ?? "",
    pinned: input.pinned ?? false,
    name: input.name ?? "",
  });
}

/** A system message. */
export function systemMessage(content: string, extras: MessageExtras = {}): MessageInput {
  return { role: Role.SYSTEM, content, ...extras };
}

/** A user turn. */
export function userMessage(content: string, extras: MessageExtras = {}): MessageInput {
  return { role: Role.USER, content, ...extras };
}

/** A model answer, optionally with tool calls. */
export function assistantMessage(
  content: string,
  toolCalls: readonly (ToolCallInput | ToolCall)[] = [],
  extras: MessageExtras = {},
): MessageInput {
  return { role: Role.ASSISTANT, content, toolCalls, ...extras };
}

/** The result of the tool call `toolCallId`. */
export function toolResultMessage(toolCallId: string, content: string, extras: MessageExtras = {}): MessageInput {
  return { role: Role.TOOL, toolCallId, content, ...extras };
}

/** A tool call for assistantMessage(). */
export function toolCall(id: string, name: string, args: string | Record<string, unknown> = {}): ToolCallInput {
  return { id, name, arguments: args };
}

/**
 * What the SDK takes as input: session settings (plain options or a fluent builder) and messages
 * to append, converted here to the generated messages. A setting outside its documented range is
 * refused here as the server would refuse it (INVALID_CONFIG, domain client.ctxfold.dev, metadata
 * `field`); checks that need the whole config stay the server's.
 */
import { create } from "@bufbuild/protobuf";
import { ErrorReason, invalidArgument } from "./errors.js";
import * as pb from "./gen/ctxfold/v1/context_service_pb.js";
import { type Role, enumNumber } from "./model.js";

/** Converts an integer number to the bigint of an int64 field. */
export function int64(value: number | bigint): bigint {
  if (typeof value === "bigint") {
    return value;
  }
  if (!Number.isSafeInteger(value)) {
    throw new RangeError(`expected an integer, got ${value}`);
  }
  return BigInt(value);
}

/**
 * Session settings. Every field but `contextWindow` is optional; an omitted field takes the
 * server's default (the SPEC defaults, listed here).
 */
export interface SessionConfigOptions {
  /** The model's context window in tokens. Required, > 0. */
  contextWindow: number;
  /** Maintenance trigger as a share of the window; default 0.80, range [0.30, 0.95]. */
  compactRatio?: number;
  /** Share of the window a fold keeps verbatim as the recent tail; default 0.08, (0, 0.5]. */
  tailRatio?: number;
  /** Output tokens requested from the provider; counted in every estimate. Default 0. */
  maxOutputTokens?: number;
  /** Upper bound of one summary in tokens; default min(8192, contextWindow / 8), at least 256. */
  summaryMaxTokens?: number;
  /** Bound of a tool result's visible content in UTF-8 bytes; default 32768, [4096, 1048576]. */
  toolContentMaxBytes?: number;
  /** The agent's system prompt; the first message of every view. */
  systemPrompt?: string;
  /**
   * Provider tool schemas: a JSON array string, or an array that is serialised to one. Both are sent
   * as the one JSON form every ctxfold SDK writes (JSON.stringify's), so the same tools cost the
   * same tokens whichever SDK created the session.
   */
  tools?: string | readonly unknown[];
  /** A summarizer configured on the server; default "extractive". */
  summarizer?: string;
  /** The provider's prompt-cache TTL in seconds; default: the provider's. */
  cacheTtlSeconds?: number;
  /** The prompt-cache key; default: derived from the session id. */
  promptCacheKey?: string;
  /** The model the agent calls (telemetry, cache TTL defaults). */
  model?: string;
  /** Turn off the task anchor (the opening user message kept verbatim after the system prompt). */
  disableTaskAnchor?: boolean;
  /**
   * Where a fold starts in the background, as a share of the window: undefined is the server's
   * default (compactRatio − 0.05 for a summarizer that calls a model, off for "extractive"), 0 turns
   * background folds off, otherwise within [0.10, compactRatio).
   */
  prefoldRatio?: number;
}

/**
 * Fluent builder of session settings.
 *
 * ```ts
 * await client.createSession(sessionConfig(128_000).maxOutputTokens(4096).systemPrompt("You are …"));
 * ```
 */
export class SessionConfigBuilder {
  private readonly options: SessionConfigOptions;

  constructor(contextWindow: number) {
    this.options = { contextWindow };
  }

  private with<K extends keyof SessionConfigOptions>(key: K, value: SessionConfigOptions[K]): this {
    this.options[key] = value;
    return this;
  }

  compactRatio(value: number): this {
    return this.with("compactRatio", value);
  }
  tailRatio(value: number): this {
    return this.with("tailRatio", value);
  }
  maxOutputTokens(value: number): this {
    return this.with("maxOutputTokens", value);
  }
  summaryMaxTokens(value: number): this {
    return this.with("summaryMaxTokens", value);
  }
  toolContentMaxBytes(value: number): this {
    return this.with("toolContentMaxBytes", value);
  }
  systemPrompt(value: string): this {
    return this.with("systemPrompt", value);
  }
  tools(value: string | readonly unknown[]): this {
    return this.with("tools", value);
  }
  summarizer(value: string): this {
    return this.with("summarizer", value);
  }
  cacheTtlSeconds(value: number): this {
    return this.with("cacheTtlSeconds", value);
  }
  promptCacheKey(value: string): this {
    return this.with("promptCacheKey", value);
  }
  model(value: string): this {
    return this.with("model", value);
  }
  disableTaskAnchor(value = true): this {
    return this.with("disableTaskAnchor", value);
  }
  prefoldRatio(value: number): this {
    return this.with("prefoldRatio", value);
  }
  /** The options collected so far (a copy). */
  build(): SessionConfigOptions {
    return { ...this.options };
  }
}

/** Starts a builder for a model with this context window (tokens). */
export function sessionConfig(contextWindow: number): SessionConfigBuilder {
  return new SessionConfigBuilder(contextWindow);
}

/** What createSession takes. */
export type SessionConfigInput = SessionConfigOptions | SessionConfigBuilder;

/** Fork overrides: each set field replaces the source session's value. */
export type SessionConfigOverrides = Partial<SessionConfigOptions>;

const optionalInt64 = (value: number | undefined): bigint | undefined => (value === undefined ? undefined : int64(value));

/** The field is named as in the proto (and in the server's answer to the same mistake). */
const invalidConfig = (field: string, why: string) => invalidArgument(ErrorReason.INVALID_CONFIG, field, `config.${field}: ${why}`);

/** The documented ranges of the settings that are set (0 = unset, the server's default). */
function checkRanges(o: SessionConfigOverrides, creating: boolean): void {
  const window = o.contextWindow ?? 0;
  if (window < 0 || (creating && window === 0)) {
    throw invalidConfig("context_window", `is required and must be > 0, got ${window}`);
  }
  if (o.compactRatio && !(o.compactRatio >= 0.3 && o.compactRatio <= 0.95)) {
    throw invalidConfig("compact_ratio", `must be within [0.30, 0.95], got ${o.compactRatio}`);
  }
  if (o.tailRatio && !(o.tailRatio > 0 && o.tailRatio <= 0.5)) {
    throw invalidConfig("tail_ratio", `must be within (0, 0.5], got ${o.tailRatio}`);
  }
  const counts = { max_output_tokens: o.maxOutputTokens, summary_max_tokens: o.summaryMaxTokens, cache_ttl_seconds: o.cacheTtlSeconds };
  for (const [field, value] of Object.entries(counts)) {
    if ((value ?? 0) < 0) throw invalidConfig(field, `must be >= 0, got ${value}`);
  }
  if (o.prefoldRatio !== undefined && o.prefoldRatio !== 0 && !(o.prefoldRatio >= 0.1 && o.prefoldRatio < 1)) {
    throw invalidConfig("prefold_ratio", `must be 0 (off) or within [0.10, compact_ratio), got ${o.prefoldRatio}`);
  }
  if (o.toolContentMaxBytes && !(o.toolContentMaxBytes >= 4096 && o.toolContentMaxBytes <= 1_048_576)) {
    throw invalidConfig("tool_content_max_bytes", `must be within [4096, 1048576], got ${o.toolContentMaxBytes}`);
  }
}

/** The tools as sent: an array written, JSON text normalized (both by JSON.stringify). */
function toolsJson(tools: string | readonly unknown[] | undefined): string | undefined {
  if (typeof tools !== "string") return tools === undefined ? undefined : JSON.stringify(tools);
  if (tools === "") return tools;
  try {
    return JSON.stringify(JSON.parse(tools));
  } catch (err) {
    throw invalidConfig("tools_json", `is not JSON (${(err as Error).message})`);
  }
}

/**
 * @internal The generated SessionConfig of settings (`creating`: a new session's, which needs its
 * window) or fork overrides (unset fields stay zero).
 */
export function toProtoConfig(input: SessionConfigInput | SessionConfigOverrides, creating: boolean): pb.SessionConfig {
  const o = input instanceof SessionConfigBuilder ? input.build() : input;
  checkRanges(o, creating);
  return create(pb.SessionConfigSchema, {
    contextWindow: optionalInt64(o.contextWindow),
    compactRatio: o.compactRatio,
    tailRatio: o.tailRatio,
    maxOutputTokens: optionalInt64(o.maxOutputTokens),
    summaryMaxTokens: optionalInt64(o.summaryMaxTokens),
    toolContentMaxBytes: optionalInt64(o.toolContentMaxBytes),
    systemPrompt: o.systemPrompt,
    toolsJson: toolsJson(o.tools),
    summarizer: o.summarizer,
    cacheTtlSeconds: optionalInt64(o.cacheTtlSeconds),
    promptCacheKey: o.promptCacheKey,
    model: o.model,
    disableTaskAnchor: o.disableTaskAnchor,
    prefoldRatio: o.prefoldRatio,
  });
}

// ---------------------------------------------------------------------------------------------
// Messages

/** A tool call to append; `arguments` may be an object (serialised to JSON). */
export interface ToolCallInput {
  id: string;
  name: string;
  arguments?: string | Readonly<Record<string, unknown>>;
}

/** A message to append. A Message read from the SDK is one too (its output fields are ignored). */
export interface MessageInput {
  role: Role;
  content?: string;
  toolCalls?: readonly ToolCallInput[];
  toolCallId?: string;
  reasoningContent?: string;
  pinned?: boolean;
  name?: string;
}

/** Optional fields of the message helpers. */
export type MessageExtras = Pick<MessageInput, "reasoningContent" | "pinned" | "name">;

/** @internal */
export function toProtoMessage(input: MessageInput): pb.Message {
  return create(pb.MessageSchema, {
    role: enumNumber(pb.RoleSchema, input.role),
    content: input.content ?? "",
    toolCalls: (input.toolCalls ?? []).map((call) =>
      create(pb.ToolCallSchema, {
        id: call.id,
        name: call.name,
        arguments: typeof call.arguments === "object" ? JSON.stringify(call.arguments) : (call.arguments ?? ""),
      }),
    ),
    toolCallId: input.toolCallId ?? "",
    reasoningContent: input.reasoningContent ?? "",
    pinned: input.pinned ?? false,
    name: input.name ?? "",
  });
}

/** A system message. */
export function systemMessage(content: string, extras: MessageExtras = {}): MessageInput {
  return { role: "ROLE_SYSTEM", content, ...extras };
}

/** A user turn. */
export function userMessage(content: string, extras: MessageExtras = {}): MessageInput {
  return { role: "ROLE_USER", content, ...extras };
}

/** A model answer, optionally with tool calls (arguments given as objects are written with JSON.stringify). */
export function assistantMessage(content: string, toolCalls: readonly ToolCallInput[] = [], extras: MessageExtras = {}): MessageInput {
  return { role: "ROLE_ASSISTANT", content, toolCalls, ...extras };
}

/** The result of the tool call `toolCallId`. */
export function toolResultMessage(toolCallId: string, content: string, extras: MessageExtras = {}): MessageInput {
  return { role: "ROLE_TOOL", toolCallId, content, ...extras };
}

/**
 * The typed results of the SDK: plain objects with camelCase fields, `number` for the proto's
 * int64 fields (every count, seq and token figure fits in 2^53) and enum values as their proto
 * names ("ROLE_USER", "FOLD_STAGE_PASS_COMMITTED"), so they print as names. The name unions are
 * the generated JSON types of the enums, so they follow the proto. The generated protobuf-es
 * messages stay internal to this layer (and reachable as `@ctxfold/client/proto`).
 */
import type { DescEnum } from "@bufbuild/protobuf";
import { type Timestamp, timestampDate } from "@bufbuild/protobuf/wkt";
import * as pb from "./gen/ctxfold/v1/context_service_pb.js";

/** The author of a message. */
export type Role = Exclude<pb.RoleJson, "ROLE_UNSPECIFIED">;
/** What maintenance a prepare or compact performed. */
export type Action = pb.ActionJson;
/** The provider's prompt cache, as judged by the server. */
export type CacheState = pb.CacheStateJson;
/** The step of maintenance a FoldProgress event reports. */
export type FoldStage = pb.FoldStageJson;
/** Why a fold or compact folded nothing. */
export type NotFoldedReason = pb.NotFoldedReasonJson;

/** The proto name of an enum number; a number this SDK version does not know reads as its digits. */
export function enumName<N extends string>(schema: DescEnum, value: number): N {
  return (schema.value[value]?.name ?? String(value)) as N;
}

/** The enum number of a proto name (throws TypeError for a name the enum does not have). */
export function enumNumber(schema: DescEnum, name: string): number {
  const value = schema.values.find((v) => v.name === name);
  if (value === undefined) {
    throw new TypeError(`${schema.typeName} has no value ${JSON.stringify(name)}`);
  }
  return value.number;
}

/** One tool call of an assistant message. */
export interface ToolCall {
  id: string;
  name: string;
  /** The arguments as the model wrote them (usually a JSON object). */
  arguments: string;
}

/** A message of the transcript or of a view. */
export interface Message {
  /** The canonical message's id ("" for the summary and the configured system prompt in a view). */
  id: string;
  /** Position in the session's transcript, from 1. */
  seq: number;
  role: Role;
  content: string;
  toolCalls: ToolCall[];
  /** For ROLE_TOOL: the call this result answers. */
  toolCallId: string;
  reasoningContent: string;
  pinned: boolean;
  /** The reference read_tool_result reads this message's whole stored text by, where the server set one. */
  resultRef: string;
  /** For tool results: size of the raw result in UTF-8 bytes. */
  rawBytes: number;
  /** For tool results: `content` is bounded and shorter than the raw result. */
  truncated: boolean;
  /** In a view: the checkpoint summary message. */
  summary: boolean;
  /** In a view: a tool result shown pruned (head, marker, tail). */
  pruned: boolean;
  name: string;
  /** Estimated tokens of the message as rendered. */
  tokens: number;
  /** On an abandoned branch (after a rewind). */
  abandoned: boolean;
  createTime: Date | undefined;
}

/** A session's effective configuration (defaults filled in by the server). */
export interface SessionConfig {
  contextWindow: number;
  compactRatio: number;
  tailRatio: number;
  maxOutputTokens: number;
  summaryMaxTokens: number;
  toolContentMaxBytes: number;
  systemPrompt: string;
  /** The provider tool schemas as a JSON array. */
  toolsJson: string;
  summarizer: string;
  cacheTtlSeconds: number;
  promptCacheKey: string;
  model: string;
  disableTaskAnchor: boolean;
  /**
   * Where background folds start (a share of the window); 0 when they are off, undefined when the
   * server did not say (an older server).
   */
  prefoldRatio: number | undefined;
}

/** A session of one agent conversation. */
export interface Session {
  id: string;
  config: SessionConfig;
  /** The seq of the newest live message (0 when empty). */
  headSeq: number;
  /** The head checkpoint ("" when nothing was folded). */
  checkpointId: string;
  createTime: Date | undefined;
  updateTime: Date | undefined;
  forkedFromSessionId: string;
  forkedAtSeq: number;
}

/** The whole provider-visible context to send to the model. */
export interface View {
  /** The whole view: system, at most one summary, kept messages and the recent tail. */
  messages: Message[];
  /** The whole request with the reserved max_output_tokens: what the trigger and hard limit compare. */
  estimatedTokens: number;
  /**
   * The input alone (estimatedTokens without max_output_tokens): compare it with the input tokens
   * the provider reports, or report it with observeUsage when a provider reports none.
   */
  estimatedInputTokens: number;
  /** Pass it (or the view) to observeUsage. */
  viewVersion: number;
  action: Action;
  cacheState: CacheState;
  /** The prompt-cache key to send with the request. */
  promptCacheKey: string;
  /** The head checkpoint rendered in the view ("" when nothing was folded). */
  checkpointId: string;
  /** Leading messages identical to the previous view (the cacheable prefix). */
  stablePrefixMessages: number;
  viewMessageCount: number;
  /** compact_ratio × context_window. */
  triggerTokens: number;
  /** context_window − max_output_tokens − 256. */
  hardLimitTokens: number;
  /** The messages this call appended, with ids and seqs. */
  appended: Message[];
  notFoldedReason: NotFoldedReason;
  notFoldedDetail: string;
  /** For a compact dry run: the summary the fold would install. */
  candidateSummary: string;
  /** The folded-results index of the head checkpoint, readable with readToolResult. */
  foldedResultsRef: string;
}

/** A maintenance progress event of prepare or compact. */
export interface FoldProgress {
  stage: FoldStage;
  passIndex: number;
  passesPlanned: number;
  tokensBefore: number;
  tokensAfter: number;
  checkpointId: string;
  message: string;
  /** For FOLD_STAGE_SUMMARY_DELTA: the next piece of the summary text. */
  summaryDelta: string;
  summarizer: string;
}

/** A whole stored tool result, its bytes checked against the server's SHA-256. */
export interface ToolResult {
  text: string;
  /** Lowercase hex SHA-256 of the UTF-8 bytes. */
  sha256: string;
  /** Size in UTF-8 bytes. */
  totalBytes: number;
  resultRef: string;
}

/** One page of a stored tool result, as one ReadToolResult call answered it. */
export interface ToolResultPage {
  /** Whole UTF-8 characters. */
  data: string;
  offset: number;
  /** Where the next page starts (total_bytes at the end). */
  nextOffset: number;
  totalBytes: number;
  sha256: string;
  /** This page reaches the end of the result. */
  complete: boolean;
  resultRef: string;
}

/** A committed fold with its summary. */
export interface Checkpoint {
  id: string;
  parentId: string;
  /** The seq of the last message the checkpoint covers. */
  positionSeq: number;
  summary: string;
  summaryTokens: number;
  keptMessageIds: string[];
  foldedResultsRef: string;
  summarizer: string;
  createTime: Date | undefined;
  /** The session's head checkpoint is this one or descends from it. */
  onHeadChain: boolean;
}

/** A maintenance step of the context state. */
export interface Receipt {
  operation_id: string;
  /** applied | noop | blocked | failed */
  status: string;
  /** prune | summary | noop */
  action: string;
  tokens_in: number;
  tokens_out: number;
  reason: string;
  time: number;
  /** In `last_receipt`. */
  tokens_saved?: number;
}

/**
 * The session's context state document (schema version 3), as getContextState() returns it: the
 * server's bookkeeping, for diagnostics, with the server's (snake_case) field names. A newer server
 * may add fields.
 */
export interface ContextState {
  schema_version: number;
  fingerprint: string;
  generation: number;
  transcript_version: number;
  checkpoint_id: string | null;
  covered_count: number;
  summary_hash: string;
  /** Message id → tokens of its pruned stub. */
  pruned: Record<string, number>;
  projection_version: number;
  source_tokens: number;
  projection_tokens: number;
  prompt_cache_key: string;
  /** warm | cold | unknown */
  cache_state: string;
  last_activity: number;
  calibration: number;
  views: { version: number; estimated_tokens: number }[];
  failed_fold_tokens: number;
  receipts: Receipt[];
  last_receipt: Receipt | null;
  telemetry: Record<string, number>;
  [field: string]: unknown;
}

/** What observeUsage answered. */
export interface UsageResult {
  /** The session's calibration factor after this observation (reported / estimated). */
  calibration: number;
  /** This observation changed the calibration (out-of-bounds ones are ignored). */
  calibrationAccepted: boolean;
}

/** The provider's usage of one request, as observeUsage takes it (the adapters produce it). */
export interface Usage {
  inputTokens: number;
  /** Of inputTokens, those served from the provider's prompt cache. */
  cachedInputTokens?: number;
  outputTokens?: number;
  /** stop, length, tool_calls, end_turn, completed, … */
  finishReason?: string;
}

// ---------------------------------------------------------------------------------------------
// From the generated messages (internal).

function date(ts: Timestamp | undefined): Date | undefined {
  return ts === undefined ? undefined : timestampDate(ts);
}

/** @internal */
export function toolCallOf(call: pb.ToolCall): ToolCall {
  return { id: call.id, name: call.name, arguments: call.arguments };
}

/** @internal */
export function messageOf(m: pb.Message): Message {
  return {
    id: m.id,
    seq: Number(m.seq),
    role: enumName<Role>(pb.RoleSchema, m.role),
    content: m.content,
    toolCalls: m.toolCalls.map(toolCallOf),
    toolCallId: m.toolCallId,
    reasoningContent: m.reasoningContent,
    pinned: m.pinned,
    resultRef: m.resultRef,
    rawBytes: Number(m.rawBytes),
    truncated: m.truncated,
    summary: m.summary,
    pruned: m.pruned,
    name: m.name,
    tokens: Number(m.tokens),
    abandoned: m.abandoned,
    createTime: date(m.createTime),
  };
}

/** @internal */
export function sessionConfigOf(c: pb.SessionConfig | undefined): SessionConfig {
  return {
    contextWindow: Number(c?.contextWindow ?? 0n),
    compactRatio: c?.compactRatio ?? 0,
    tailRatio: c?.tailRatio ?? 0,
    maxOutputTokens: Number(c?.maxOutputTokens ?? 0n),
    summaryMaxTokens: Number(c?.summaryMaxTokens ?? 0n),
    toolContentMaxBytes: Number(c?.toolContentMaxBytes ?? 0n),
    systemPrompt: c?.systemPrompt ?? "",
    toolsJson: c?.toolsJson ?? "",
    summarizer: c?.summarizer ?? "",
    cacheTtlSeconds: Number(c?.cacheTtlSeconds ?? 0n),
    promptCacheKey: c?.promptCacheKey ?? "",
    model: c?.model ?? "",
    disableTaskAnchor: c?.disableTaskAnchor ?? false,
    prefoldRatio: c?.prefoldRatio,
  };
}

/** @internal */
export function sessionOf(s: pb.Session | undefined): Session {
  if (s === undefined) {
    throw new TypeError("the server answered without a session");
  }
  return {
    id: s.id,
    config: sessionConfigOf(s.config),
    headSeq: Number(s.headSeq),
    checkpointId: s.checkpointId,
    createTime: date(s.createTime),
    updateTime: date(s.updateTime),
    forkedFromSessionId: s.forkedFromSessionId,
    forkedAtSeq: Number(s.forkedAtSeq),
  };
}

/** @internal The view of a result whose (whole) messages are already resolved. */
export function viewOf(r: pb.PreparedContext, messages: Message[]): View {
  return {
    messages,
    estimatedTokens: Number(r.estimatedTokens),
    estimatedInputTokens: Number(r.estimatedInputTokens),
    viewVersion: Number(r.viewVersion),
    action: enumName<Action>(pb.ActionSchema, r.action),
    cacheState: enumName<CacheState>(pb.CacheStateSchema, r.cacheState),
    promptCacheKey: r.promptCacheKey,
    checkpointId: r.checkpointId,
    stablePrefixMessages: Number(r.stablePrefixMessages),
    viewMessageCount: Number(r.viewMessageCount),
    triggerTokens: Number(r.triggerTokens),
    hardLimitTokens: Number(r.hardLimitTokens),
    appended: r.appended.map(messageOf),
    notFoldedReason: enumName<NotFoldedReason>(pb.NotFoldedReasonSchema, r.notFoldedReason),
    notFoldedDetail: r.notFoldedDetail,
    candidateSummary: r.candidateSummary,
    foldedResultsRef: r.foldedResultsRef,
  };
}

/** @internal */
export function progressOf(p: pb.FoldProgress): FoldProgress {
  return {
    stage: enumName<FoldStage>(pb.FoldStageSchema, p.stage),
    passIndex: p.passIndex,
    passesPlanned: p.passesPlanned,
    tokensBefore: Number(p.tokensBefore),
    tokensAfter: Number(p.tokensAfter),
    checkpointId: p.checkpointId,
    message: p.message,
    summaryDelta: p.summaryDelta,
    summarizer: p.summarizer,
  };
}

/** @internal */
export function pageOf(p: pb.ReadToolResultResponse): ToolResultPage {
  return {
    data: p.data,
    offset: Number(p.offset),
    nextOffset: Number(p.nextOffset),
    totalBytes: Number(p.totalBytes),
    sha256: p.sha256,
    complete: p.complete,
    resultRef: p.resultRef,
  };
}

/** @internal */
export function checkpointOf(c: pb.Checkpoint | undefined): Checkpoint {
  if (c === undefined) {
    throw new TypeError("the server answered without a checkpoint");
  }
  return {
    id: c.id,
    parentId: c.parentId,
    positionSeq: Number(c.positionSeq),
    summary: c.summary,
    summaryTokens: Number(c.summaryTokens),
    keptMessageIds: [...c.keptMessageIds],
    foldedResultsRef: c.foldedResultsRef,
    summarizer: c.summarizer,
    createTime: date(c.createTime),
    onHeadChain: c.onHeadChain,
  };
}

import { createHash, randomUUID } from "node:crypto";
import type * as http2 from "node:http2";
import { type DescMessage, type MessageInitShape, ScalarType, create } from "@bufbuild/protobuf";
import { type ReflectMessage, reflect } from "@bufbuild/protobuf/reflect";
import { type CallOptions as ConnectCallOptions, type Client, Code, type Interceptor, type Transport, createClient } from "@connectrpc/connect";
import { createAsyncIterable } from "@connectrpc/connect/protocol";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";
import * as pb from "./gen/ctxfold/v1/context_service_pb.js";
import { type MessageInput, type SessionConfigInput, type SessionConfigOverrides, int64, toProtoConfig, toProtoMessage } from "./config.js";
import { CtxfoldError, ErrorReason, invalidArgument, protocolViolation, sdkError } from "./errors.js";
import {
  type Checkpoint,
  type ContextState,
  type FoldProgress,
  type Message,
  type Session,
  type ToolResult,
  type ToolResultPage,
  type Usage,
  type UsageResult,
  type View,
  checkpointOf,
  messageOf,
  pageOf,
  progressOf,
  sessionOf,
  viewOf,
} from "./model.js";
import { type ToolCallRequest, budgetAnswer, isModelMistake, pageAnswer, parseToolCall } from "./tools.js";
import { type TraceContext, injectTraceContext } from "./trace.js";
import { USER_AGENT } from "./version.js";
import { ViewCache, applyDelta } from "./views.js";

/** TLS settings: PEM strings or Buffers; `cert` + `key` enable mutual TLS. */
export interface TlsOptions {
  /** CA bundle that signs the server certificate (default: the system roots). */
  ca?: string | Buffer;
  /** Client certificate for mutual TLS. */
  cert?: string | Buffer;
  /** Client private key for mutual TLS. */
  key?: string | Buffer;
  /** Server name to verify (SNI), when it differs from the address host. */
  serverName?: string;
}

export interface CtxfoldClientOptions {
  /** "host:port", or a URL "http://host:port" / "https://host:port". */
  address: string;
  /** Bearer token sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  /** TLS: true for the system roots, or CA / client certificate options. Implied by an https:// address. */
  tls?: boolean | TlsOptions;
  /** Deadline of unary calls in milliseconds (default 30 000; 0 = none). */
  timeoutMs?: number;
  /** Deadline of the prepare and compact streams in milliseconds (default 600 000; 0 = none). */
  streamTimeoutMs?: number;
  /** Inject the active OpenTelemetry context when @opentelemetry/api is installed (default true). */
  openTelemetry?: boolean;
  /** An explicit trace context for every call without one of its own (e.g. from a non-OTel tracer). */
  traceContext?: () => TraceContext | undefined;
  /** Sessions whose last view is kept for deltas (default 256, least recently used evicted; 0 = no deltas). */
  viewCacheSize?: number;
  /** Extra connect interceptors (ignored with `transport`). */
  interceptors?: Interceptor[];
  /** Extra node:http2 session options (ignored with `transport`). */
  nodeOptions?: http2.SecureClientSessionOptions;
  /** Use this connect Transport instead of a gRPC one over HTTP/2 (tests, custom setups). */
  transport?: Transport;
}

/** Options every call takes. */
export interface CallOptions {
  /** Deadline of this call in milliseconds (overrides the client's; 0 = none). */
  timeoutMs?: number;
  /** Cancels the call. */
  signal?: AbortSignal;
  /** Extra request metadata. */
  headers?: Headers | Record<string, string> | [string, string][];
  /** Explicit W3C trace context for this call (wins over OpenTelemetry). */
  traceparent?: string;
  tracestate?: string;
}

/** An idempotency key: a retried call with the same key is applied once (default: a fresh UUIDv4). */
export interface IdempotentOptions extends CallOptions {
  requestId?: string;
}

export interface PrepareOptions extends IdempotentOptions {
  /** Messages appended before preparing (the user turn, the answer and its tool results, …). */
  append?: readonly MessageInput[];
  /** The provider rejected the last view as too long: maintain even below the trigger. */
  overflow?: boolean;
  /** Called for each FoldProgress event, in order, before the result. */
  onProgress?: (progress: FoldProgress) => void;
}

export interface CompactOptions extends CallOptions {
  /** Extra instructions for the summary (what to keep in focus). */
  focus?: string;
  /** Tokens of the newest history to keep verbatim (default: the minimal kept set). */
  keepTokens?: number;
  /** Make the candidate view and summary and return them without installing anything. */
  dryRun?: boolean;
  onProgress?: (progress: FoldProgress) => void;
}

export interface RetryOptions extends IdempotentOptions {
  onProgress?: (progress: FoldProgress) => void;
}

/** One item of prepareEvents() / compactEvents(): progress events, then exactly one result. */
export type PrepareEvent = { kind: "progress"; progress: FoldProgress } | { kind: "result"; view: View };

/** A stored tool result: its `result_ref` (a string), or the id of the tool call it answers. */
export type ToolResultRef = string | { resultRef: string } | { toolCallId: string };

export interface ReadToolResultOptions extends CallOptions {
  /** Bytes per page request: 4..24576 (default 16384). */
  pageBytes?: number;
}

/** The largest page ReadToolResult serves, the smallest, and the largest list pages. */
const MAX_PAGE_BYTES = 24576;
const MIN_PAGE_BYTES = 4;
const MAX_PAGE_SIZE = 1000;
const MAX_CHECKPOINT_PAGE_SIZE = 100;

export interface ToolResultPagesOptions extends ReadToolResultOptions {
  /** UTF-8 byte offset of the first page (on a character boundary; default 0). */
  offset?: number;
}

export interface ListOptions extends CallOptions {
  /** Items per page request (default: the server's). */
  pageSize?: number;
}

export interface ListMessagesOptions extends ListOptions {
  /** Also list messages abandoned by rewind (marked `abandoned`). */
  includeAbandoned?: boolean;
}

export interface ForkOptions extends CallOptions {
  /** Each set field replaces the source session's value. */
  config?: SessionConfigOverrides;
}

/** Where fork() cuts: the source's head, or a seq (the fork holds the messages up to it). */
export type ForkPoint = "head" | number;

/** The default page of readToolResult / toolResultPages (the server's maximum is 24576). */
export const DEFAULT_PAGE_BYTES = 16384;

const DEFAULT_TIMEOUT_MS = 30_000;
const DEFAULT_STREAM_TIMEOUT_MS = 600_000;

const badOption = (field: string, message: string) => invalidArgument(ErrorReason.INVALID_CLIENT_ARGUMENT, field, message);

/** The client options this SDK cannot use, refused before any connection is made. */
function checkOptions(options: CtxfoldClientOptions): void {
  if (!options.address && options.transport === undefined) throw badOption("address", "address is required, e.g. \"127.0.0.1:50051\"");
  if (options.token !== undefined && (options.token === "" || /\s/.test(options.token))) {
    throw badOption("token", "token must be a non-empty string without whitespace");
  }
  if (typeof options.tls === "object" && (options.tls.cert === undefined) !== (options.tls.key === undefined)) {
    throw badOption("tls", "tls.cert and tls.key go together (mutual TLS)");
  }
  for (const field of ["timeoutMs", "streamTimeoutMs", "viewCacheSize"] as const) {
    if ((options[field] ?? 0) < 0) throw badOption(field, `${field} must be >= 0, not ${options[field]}`);
  }
}

/** The session id of a call, refused when empty (as the server would: SESSION_ID_REQUIRED). */
function sessionIdOf(sessionId: string): string {
  if (!sessionId) throw invalidArgument(ErrorReason.SESSION_ID_REQUIRED, "session_id", "session_id is required");
  return sessionId;
}

/** A list's page size: 0 (the server's default) up to the server's maximum. */
function pageSizeOf(pageSize: number | undefined, maximum = MAX_PAGE_SIZE): number {
  const size = pageSize ?? 0;
  if (!(size >= 0 && size <= maximum)) {
    throw invalidArgument(ErrorReason.INVALID_PAGE_SIZE, "page_size", `page_size must be within [0, ${maximum}], got ${size}`);
  }
  return size;
}

/** The seq of a message to rewind before (edit, retry): a stored message's, >= 1. */
function storedSeq(at: number | Message): number {
  const seq = typeof at === "number" ? at : at.seq;
  if (!(seq >= 1)) throw invalidArgument(ErrorReason.SEQ_OUT_OF_RANGE, "seq", `not the seq of a stored message: ${seq}`);
  return seq;
}

/** "host:port" or URL → base URL. */
export function baseUrlFor(address: string, tls: boolean): string {
  if (/^https?:\/\//i.test(address)) {
    return address.replace(/\/+$/, "");
  }
  return `${tls ? "https" : "http"}://${address}`;
}

/**
 * The transport, refusing a request that holds text which is not Unicode (a lone surrogate, e.g. a
 * string cut between the halves of an emoji) as the server refuses a NUL: INVALID_TEXT, `field` the
 * path in the request ("messages[1].content"). Encoded as it is, it would reach the server as U+FFFD.
 */
function textChecked(transport: Transport): Transport {
  return {
    unary(method, signal, timeoutMs, header, input, contextValues) {
      checkText(method.input, input);
      return transport.unary(method, signal, timeoutMs, header, input, contextValues);
    },
    async stream(method, signal, timeoutMs, header, input, contextValues) {
      const requests: MessageInitShape<typeof method.input>[] = [];
      for await (const request of input) {
        checkText(method.input, request);
        requests.push(request);
      }
      return transport.stream(method, signal, timeoutMs, header, createAsyncIterable(requests), contextValues);
    },
  };
}

function checkText<Desc extends DescMessage>(schema: Desc, input: MessageInitShape<Desc>): void {
  const field = notUnicodeField(reflect(schema, create(schema, input)), "");
  if (field) throw invalidArgument(ErrorReason.INVALID_TEXT, field, `${field} is not valid Unicode text (a lone surrogate)`);
}

/** The path of the first string field that holds a lone surrogate, or "". */
function notUnicodeField(message: ReflectMessage, prefix: string): string {
  for (const field of message.fields) {
    if (!message.isSet(field)) continue;
    const path = prefix + field.name;
    if (field.fieldKind === "scalar" && field.scalar === ScalarType.STRING) {
      if (LONE_SURROGATE.test(message.get(field))) return path;
    } else if (field.fieldKind === "message") {
      const found = notUnicodeField(message.get(field), `${path}.`);
      if (found) return found;
    } else if (field.fieldKind === "list") {
      const list = message.get(field);
      for (let i = 0; i < list.size; i++) {
        const item = list.get(i);
        const found = field.listKind === "message"
          ? notUnicodeField(item as ReflectMessage, `${path}[${i}].`)
          : typeof item === "string" && LONE_SURROGATE.test(item) ? `${path}[${i}]` : "";
        if (found) return found;
      }
    }
  }
  return "";
}

// With the u flag a surrogate pair is one code point, so only a lone surrogate matches.
const LONE_SURROGATE = /\p{Surrogate}/u;

type MaintenanceItem = { event: { case: "progress"; value: pb.FoldProgress } | { case: "result"; value: pb.PreparedContext } | { case: undefined } };

/**
 * A client of ctxfold's ContextService over gRPC (HTTP/2). Every method throws CtxfoldError; the
 * operations and their defaults are those of clients/README.md. Call close() when done.
 *
 * ```ts
 * const client = new CtxfoldClient({ address: "127.0.0.1:50051" });
 * const session = await client.createSession(sessionConfig(128_000).maxOutputTokens(4096));
 * const view = await client.prepare(session.id, { append: [userMessage("hi")], onProgress: (p) => console.log(p.stage) });
 * ```
 */
export class CtxfoldClient {
  /** The generated connect client, for anything this layer does not cover (it throws ConnectError). */
  readonly raw: Client<typeof pb.ContextService>;
  private readonly options: CtxfoldClientOptions;
  private readonly sessionManager: Http2SessionManager | undefined;
  private readonly views: ViewCache;

  constructor(options: CtxfoldClientOptions) {
    checkOptions(options);
    this.options = options;
    this.views = new ViewCache(options.viewCacheSize ?? 256);
    let transport = options.transport;
    if (transport === undefined) {
      const tls = options.tls;
      const baseUrl = baseUrlFor(options.address, Boolean(tls) || /^https:\/\//i.test(options.address));
      const nodeOptions: http2.SecureClientSessionOptions = { ...options.nodeOptions };
      if (typeof tls === "object") {
        if (tls.ca !== undefined) nodeOptions.ca = tls.ca;
        if (tls.cert !== undefined) nodeOptions.cert = tls.cert;
        if (tls.key !== undefined) nodeOptions.key = tls.key;
        if (tls.serverName !== undefined) nodeOptions.servername = tls.serverName;
      }
      this.sessionManager = new Http2SessionManager(baseUrl, {}, nodeOptions);
      transport = createGrpcTransport({ baseUrl, sessionManager: this.sessionManager, interceptors: options.interceptors ?? [] });
    }
    this.raw = createClient(pb.ContextService, textChecked(transport));
  }

  /** Closes the HTTP/2 connection (and any open streams). */
  close(): void {
    this.sessionManager?.abort();
    this.views.clear();
  }

  // -------------------------------------------------------------------------------------------
  // sessions

  /** Creates a session; the server fills in the defaults and validates (INVALID_CONFIG). */
  async createSession(config: SessionConfigInput, opts?: CallOptions): Promise<Session> {
    const request = { config: toProtoConfig(config, true) };
    const res = await this.unary(opts, (o) => this.raw.createSession(request, o));
    return sessionOf(res.session);
  }

  async getSession(sessionId: string, opts?: CallOptions): Promise<Session> {
    const request = { sessionId: sessionIdOf(sessionId) };
    const res = await this.unary(opts, (o) => this.raw.getSession(request, o));
    return sessionOf(res.session);
  }

  /** The caller's sessions, newest first, one page request at a time. */
  listSessions(opts: ListOptions = {}): AsyncGenerator<Session, void, undefined> {
    return this.pages(opts, async (pageToken, o) => {
      const res = await this.raw.listSessions({ pageSize: pageSizeOf(opts.pageSize), pageToken }, o);
      return { items: res.sessions.map(sessionOf), next: res.nextPageToken };
    });
  }

  /** Deletes a session (and forgets its cached view). */
  async deleteSession(sessionId: string, opts?: CallOptions): Promise<void> {
    const request = { sessionId: sessionIdOf(sessionId) };
    await this.unary(opts, (o) => this.raw.deleteSession(request, o));
    this.views.delete(sessionId);
  }

  // -------------------------------------------------------------------------------------------
  // transcript

  /** Appends messages atomically; returns them with `id`, `seq` and (tool results) `resultRef`. */
  async appendMessages(sessionId: string, messages: readonly MessageInput[], opts: IdempotentOptions = {}): Promise<Message[]> {
    const request = { sessionId: sessionIdOf(sessionId), messages: messages.map(toProtoMessage), requestId: opts.requestId ?? randomUUID() };
    const res = await this.unary(opts, (o) => this.raw.appendMessages(request, o));
    return res.messages.map(messageOf);
  }

  /** The transcript in seq order, one page request at a time. */
  listMessages(sessionId: string, opts: ListMessagesOptions = {}): AsyncGenerator<Message, void, undefined> {
    return this.pages(opts, async (pageToken, o) => {
      const request = { sessionId: sessionIdOf(sessionId), pageSize: pageSizeOf(opts.pageSize), pageToken, includeAbandoned: opts.includeAbandoned ?? false };
      const res = await this.raw.listMessages(request, o);
      return { items: res.messages.map(messageOf), next: res.nextPageToken };
    });
  }

  // -------------------------------------------------------------------------------------------
  // prepare / compact

  /** Appends `append`, maintains the context when needed and returns the whole view to send. */
  async prepare(sessionId: string, opts: PrepareOptions = {}): Promise<View> {
    return drain(this.prepareEvents(sessionId, opts), opts.onProgress);
  }

  /**
   * prepare() as an async iterator: each progress event, then one `result` with the whole view
   * (also the generator's return value). Breaking out of the loop cancels the call.
   */
  async *prepareEvents(sessionId: string, opts: PrepareOptions = {}): AsyncGenerator<PrepareEvent, View, undefined> {
    sessionIdOf(sessionId);
    const requestId = opts.requestId ?? randomUUID();
    const base = this.views.get(sessionId);
    const known = base?.viewVersion ?? 0;
    const append = (opts.append ?? []).map(toProtoMessage);
    const overflow = opts.overflow ?? false;
    const answer = yield* this.maintenance(opts, (o) =>
      this.raw.prepare({ sessionId, append, overflow, knownViewVersion: int64(known), requestId }, o),
    );
    let result = answer;
    let messages = answer.delta
      ? applyDelta({ messages: answer.messages.map(messageOf), viewMessageCount: Number(answer.viewMessageCount) }, base, known)
      : wholeMessages(answer);
    if (messages === undefined) {
      // The delta does not fit the view held here: ask once for the whole view, appending nothing and
      // asking for no second overflow maintenance (both happened); the view keeps what this call appended.
      this.views.delete(sessionId);
      const whole = yield* this.maintenance(opts, (o) => this.raw.prepare({ sessionId, requestId }, o));
      result = { ...whole, appended: answer.appended };
      messages = wholeMessages(result);
    }
    const view = viewOf(result, messages);
    this.views.set(sessionId, view);
    yield { kind: "result", view };
    return view;
  }

  /** Folds history into a summary checkpoint now; a failed compact is an error (COMPACT_FAILED). */
  async compact(sessionId: string, opts: CompactOptions = {}): Promise<View> {
    return drain(this.compactEvents(sessionId, opts), opts.onProgress);
  }

  /** compact() as an async iterator, like prepareEvents(). */
  async *compactEvents(sessionId: string, opts: CompactOptions = {}): AsyncGenerator<PrepareEvent, View, undefined> {
    const keepTokens = opts.keepTokens ?? 0;
    if (!(keepTokens >= 0)) throw invalidArgument(ErrorReason.INVALID_REQUEST, "keep_tokens", `keep_tokens must be >= 0, not ${keepTokens}`);
    const request = { sessionId: sessionIdOf(sessionId), focus: opts.focus ?? "", keepTokens: int64(keepTokens), dryRun: opts.dryRun ?? false };
    const result = yield* this.maintenance(opts, (o) => this.raw.compact(request, o));
    const view = viewOf(result, wholeMessages(result));
    if (!request.dryRun) {
      this.views.set(sessionId, view);
    }
    yield { kind: "result", view };
    return view;
  }

  /** The last view prepared for this session by this client (undefined when none is held). */
  lastView(sessionId: string): View | undefined {
    return this.views.get(sessionId);
  }

  /** Records the provider's usage of a view (calibration and statistics; it never maintains). */
  async observeUsage(sessionId: string, view: View | number, usage: Usage, opts?: CallOptions): Promise<UsageResult> {
    const request = {
      sessionId: sessionIdOf(sessionId),
      viewVersion: int64(typeof view === "number" ? view : view.viewVersion),
      inputTokens: int64(usage.inputTokens),
      cachedInputTokens: int64(usage.cachedInputTokens ?? 0),
      outputTokens: int64(usage.outputTokens ?? 0),
      finishReason: usage.finishReason ?? "",
    };
    const res = await this.unary(opts, (o) => this.raw.observeUsage(request, o));
    return { calibration: res.calibration, calibrationAccepted: res.calibrationAccepted };
  }

  /** The session's context state document (schema version 3): the server's bookkeeping, for diagnostics. */
  async getContextState(sessionId: string, opts?: CallOptions): Promise<ContextState> {
    const request = { sessionId: sessionIdOf(sessionId) };
    const res = await this.unary(opts, (o) => this.raw.getContextState(request, o));
    return JSON.parse(res.stateJson) as ContextState;
  }

  // -------------------------------------------------------------------------------------------
  // lineage

  /** A new session holding this one's transcript up to `at`: "head", or a seq (>= 1). */
  async fork(sessionId: string, at: ForkPoint, opts: ForkOptions = {}): Promise<Session> {
    if (at !== "head" && !(Number.isSafeInteger(at) && at >= 1)) {
      // The wire's 0 means "the head"; a seq must never turn into it by accident.
      throw invalidArgument(ErrorReason.SEQ_OUT_OF_RANGE, "at_seq", `fork at "head" or a seq >= 1, not ${at}`);
    }
    const config = opts.config ? toProtoConfig(opts.config, false) : undefined;
    const request = { sessionId: sessionIdOf(sessionId), atSeq: at === "head" ? 0n : int64(at), config };
    const res = await this.unary(opts, (o) => this.raw.fork(request, o));
    return sessionOf(res.session);
  }

  /** Moves the head back to `toSeq` (0 = empty); later messages become abandoned. */
  async rewind(sessionId: string, toSeq: number, opts?: CallOptions): Promise<Session> {
    if (!(toSeq >= 0)) throw invalidArgument(ErrorReason.SEQ_OUT_OF_RANGE, "to_seq", `to_seq must be >= 0 (0 = empty), not ${toSeq}`);
    const request = { sessionId: sessionIdOf(sessionId), toSeq: int64(toSeq) };
    const res = await this.unary(opts, (o) => this.raw.rewind(request, o));
    this.views.delete(sessionId);
    return sessionOf(res.session);
  }

  /** Replaces the message at `at` (a seq or the Message): rewinds before it, appends `message`; returns the new version. */
  async edit(sessionId: string, at: number | Message, message: MessageInput, opts: IdempotentOptions = {}): Promise<Message> {
    await this.rewind(sessionId, storedSeq(at) - 1, opts);
    const [edited] = await this.appendMessages(sessionId, [message], opts);
    return edited!;
  }

  /** Retries a model answer (a seq or the Message): rewinds before it and prepares again. */
  async retry(sessionId: string, answer: number | Message, opts: RetryOptions = {}): Promise<View> {
    await this.rewind(sessionId, storedSeq(answer) - 1, opts);
    return this.prepare(sessionId, opts);
  }

  // -------------------------------------------------------------------------------------------
  // tool results

  /**
   * The whole raw tool result, read page by page and checked against the server's size and
   * SHA-256 (CtxfoldError DATA_LOSS / RESULT_CHECKSUM_MISMATCH otherwise).
   */
  async readToolResult(sessionId: string, ref: ToolResultRef, opts: ReadToolResultOptions = {}): Promise<ToolResult> {
    const chunks: string[] = [];
    let last: ToolResultPage | undefined;
    for await (const page of this.toolResultPages(sessionId, ref, opts)) {
      chunks.push(page.data);
      last = page;
    }
    const text = chunks.join("");
    const bytes = Buffer.byteLength(text, "utf8");
    const sha256 = createHash("sha256").update(text, "utf8").digest("hex");
    if (last === undefined || !last.complete || bytes !== last.totalBytes || sha256 !== last.sha256) {
      throw sdkError(
        Code.DataLoss,
        ErrorReason.RESULT_CHECKSUM_MISMATCH,
        `the pages of ${last?.resultRef ?? "the result"} (${bytes} bytes) do not hash to the server's sha256`,
        { result_ref: last?.resultRef ?? "", expected_sha256: last?.sha256 ?? "", actual_sha256: sha256 },
      );
    }
    return { text, sha256, totalBytes: bytes, resultRef: last.resultRef };
  }

  /** The pages of a stored tool result from `offset` on, one ReadToolResult request per page. */
  async *toolResultPages(sessionId: string, ref: ToolResultRef, opts: ToolResultPagesOptions = {}): AsyncGenerator<ToolResultPage, void, undefined> {
    sessionIdOf(sessionId);
    let named = typeof ref === "string" ? { resultRef: ref } : ref;
    if (!("resultRef" in named ? named.resultRef : named.toolCallId)) {
      throw invalidArgument(ErrorReason.RESULT_REF_REQUIRED, "result_ref", "name the tool result by result_ref or tool_call_id");
    }
    let offset = opts.offset ?? 0;
    if (!(offset >= 0)) throw invalidArgument(ErrorReason.OFFSET_OUT_OF_RANGE, "offset", `offset must be >= 0, not ${offset}`);
    const pageBytes = opts.pageBytes ?? DEFAULT_PAGE_BYTES;
    if (!(pageBytes >= MIN_PAGE_BYTES && pageBytes <= MAX_PAGE_BYTES)) {
      throw invalidArgument(ErrorReason.LIMIT_OUT_OF_RANGE, "page_bytes", `page_bytes must be within [${MIN_PAGE_BYTES}, ${MAX_PAGE_BYTES}], not ${pageBytes}`);
    }
    const limit = int64(pageBytes);
    let first: ToolResultPage | undefined;
    for (;;) {
      const request = {
        sessionId,
        resultRef: "resultRef" in named ? named.resultRef : "",
        toolCallId: "toolCallId" in named ? named.toolCallId : "",
        offset: int64(offset),
        limit,
      };
      const page = pageOf(await this.unary(opts, (o) => this.raw.readToolResult(request, o)));
      first ??= page;
      const disagrees = page.totalBytes !== first.totalBytes || page.sha256 !== first.sha256 || page.resultRef !== first.resultRef;
      if (disagrees || page.offset !== offset || (!page.complete && page.nextOffset <= offset)) {
        throw protocolViolation(`page at offset ${offset} of ${page.resultRef} disagrees with the pages before it or does not advance`);
      }
      yield page;
      if (page.complete) {
        return;
      }
      offset = page.nextOffset;
      // Later pages name the result by its ref: a tool call id could become ambiguous meanwhile.
      named = { resultRef: page.resultRef };
    }
  }

  // -------------------------------------------------------------------------------------------
  // checkpoints

  /** The session's checkpoints, newest first, each with its summary. */
  listCheckpoints(sessionId: string, opts: ListMessagesOptions = {}): AsyncGenerator<Checkpoint, void, undefined> {
    return this.pages(opts, async (pageToken, o) => {
      const pageSize = pageSizeOf(opts.pageSize, MAX_CHECKPOINT_PAGE_SIZE);
      const request = { sessionId: sessionIdOf(sessionId), pageSize, pageToken, includeAbandoned: opts.includeAbandoned ?? false };
      const res = await this.raw.listCheckpoints(request, o);
      return { items: res.checkpoints.map(checkpointOf), next: res.nextPageToken };
    });
  }

  async getCheckpoint(sessionId: string, checkpointId: string, opts?: CallOptions): Promise<Checkpoint> {
    const request = { sessionId: sessionIdOf(sessionId), checkpointId };
    const res = await this.unary(opts, (o) => this.raw.getCheckpoint(request, o));
    return checkpointOf(res.checkpoint);
  }

  // -------------------------------------------------------------------------------------------
  // the model's tools

  /**
   * Answers a model's call of read_tool_result or context_budget with the text to append as its
   * tool result, or undefined for any other tool (the agent runs its own). The model's mistakes
   * (bad arguments, an unknown ref, a bad offset) come back as a short `error: …` text it can act
   * on; failures of the service itself (unavailable, unknown session) throw CtxfoldError. One page
   * is one ReadToolResult request of DEFAULT_PAGE_BYTES.
   */
  async dispatchToolCall(sessionId: string, call: ToolCallRequest, opts?: CallOptions): Promise<string | undefined> {
    const parsed = parseToolCall(call);
    if (parsed === undefined) {
      return undefined;
    }
    if (parsed.kind === "bad") {
      return parsed.answer;
    }
    if (parsed.kind === "budget") {
      return budgetAnswer(this.lastView(sessionId));
    }
    try {
      const pages = this.toolResultPages(sessionId, parsed.resultRef, { ...opts, offset: parsed.offset });
      const first = await pages.next();
      await pages.return();
      return first.done ? "" : pageAnswer(first.value);
    } catch (err) {
      if (isModelMistake(err)) {
        return `error: ${err.reason}: ${err.message}`;
      }
      throw err;
    }
  }

  // -------------------------------------------------------------------------------------------
  // plumbing

  private async callOptions(opts: CallOptions | undefined, streaming: boolean): Promise<ConnectCallOptions> {
    const headers = new Headers(opts?.headers);
    if (this.options.token && !headers.has("authorization")) {
      headers.set("authorization", `Bearer ${this.options.token}`);
    }
    if (!headers.has("user-agent")) {
      headers.set("user-agent", USER_AGENT);
    }
    const explicit: TraceContext | undefined = opts?.traceparent
      ? { traceparent: opts.traceparent, tracestate: opts.tracestate }
      : this.options.traceContext?.();
    await injectTraceContext(headers, explicit, this.options.openTelemetry ?? true);
    const clientDefault = streaming
      ? (this.options.streamTimeoutMs ?? DEFAULT_STREAM_TIMEOUT_MS)
      : (this.options.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    const timeoutMs = opts?.timeoutMs ?? clientDefault;
    return { headers, signal: opts?.signal, timeoutMs: timeoutMs > 0 ? timeoutMs : undefined };
  }

  private async unary<T>(opts: CallOptions | undefined, call: (o: ConnectCallOptions) => Promise<T>): Promise<T> {
    const callOpts = await this.callOptions(opts, false);
    try {
      return await call(callOpts);
    } catch (err) {
      throw CtxfoldError.from(err);
    }
  }

  /** A lazy iterator over every page of a list call. */
  private async *pages<T>(
    opts: CallOptions,
    fetch: (pageToken: string, o: ConnectCallOptions) => Promise<{ items: T[]; next: string }>,
  ): AsyncGenerator<T, void, undefined> {
    const seen = new Set<string>();
    let pageToken = "";
    do {
      const page = await this.unary(opts, (o) => fetch(pageToken, o));
      yield* page.items;
      if (seen.has(page.next)) {
        throw protocolViolation(`the server repeated the page token ${JSON.stringify(page.next)}`);
      }
      seen.add(page.next);
      pageToken = page.next;
    } while (pageToken);
  }

  /**
   * Runs one prepare/compact stream: yields its progress, returns its result. However the loop
   * ends (the caller breaks out, a violation, an error), the call is aborted, so no stream or
   * deadline timer outlives it.
   */
  private async *maintenance(
    opts: CallOptions,
    open: (o: ConnectCallOptions) => AsyncIterable<MaintenanceItem>,
  ): AsyncGenerator<PrepareEvent, pb.PreparedContext, undefined> {
    const callOpts = await this.callOptions(opts, true);
    const call = new AbortController();
    const abort = () => call.abort(opts.signal?.reason);
    opts.signal?.addEventListener("abort", abort, { once: true });
    if (opts.signal?.aborted) abort();
    let result: pb.PreparedContext | undefined;
    try {
      for await (const item of open({ ...callOpts, signal: call.signal })) {
        if (result !== undefined) {
          throw protocolViolation("the stream went on after its result");
        }
        if (item.event.case === "progress") {
          yield { kind: "progress", progress: progressOf(item.event.value) };
        } else if (item.event.case === "result") {
          result = item.event.value;
        }
      }
    } catch (err) {
      throw CtxfoldError.from(err);
    } finally {
      opts.signal?.removeEventListener("abort", abort);
      call.abort();
    }
    if (result === undefined) {
      throw sdkError(Code.Unavailable, ErrorReason.STREAM_ENDED_WITHOUT_RESULT, "the stream closed without its result");
    }
    return result;
  }
}

/** The messages of an answer that must hold the whole view (a compact, or a prepare without a known version). */
function wholeMessages(result: pb.PreparedContext): Message[] {
  if (result.delta || BigInt(result.messages.length) !== result.viewMessageCount) {
    throw protocolViolation(`a whole view of ${result.messages.length} messages says it has ${result.viewMessageCount} (delta ${result.delta})`);
  }
  return result.messages.map(messageOf);
}

/** Runs an event stream to its end, feeding progress to the callback; returns the view. */
async function drain(events: AsyncGenerator<PrepareEvent, View, undefined>, onProgress?: (p: FoldProgress) => void): Promise<View> {
  for (;;) {
    const next = await events.next();
    if (next.done) {
      return next.value;
    }
    if (next.value.kind === "progress") {
      onProgress?.(next.value.progress);
    }
  }
}

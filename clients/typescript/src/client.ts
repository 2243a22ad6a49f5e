import { createHash } from "node:crypto";
import type * as http2 from "node:http2";
import { create } from "@bufbuild/protobuf";
import {
  type CallOptions as ConnectCallOptions,
  type Client,
  Code,
  type Interceptor,
  type Transport,
  createClient,
} from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";
import {
  type AppendMessagesResponse,
  ContextService,
  type FoldProgress,
  type Message,
  type ObserveUsageResponse,
  type PreparedContext,
  PreparedContextSchema,
  type ReadToolResultResponse,
  Role,
  type Session,
  type SessionConfig,
} from "./gen/ctxfold/v1/context_service_pb.js";
import {
  type Int64,
  type MessageInput,
  type SessionConfigInput,
  type SessionConfigOverrides,
  toBigInt,
  toConfigOverrides,
  toMessage,
  toSessionConfig,
} from "./config.js";
import { CtxfoldError, ErrorReason } from "./errors.js";
import { type TraceContext, injectTraceContext } from "./trace.js";
import { type CachedView, ViewCache, applyView } from "./views.js";

/** TLS settings. PEM strings or Buffers; `cert` + `key` enable mutual TLS. */
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
  /** TLS: true for system roots, or CA / client cert options. Implied by an https:// address. */
  tls?: boolean | TlsOptions;
  /** Default deadline of unary calls in milliseconds (none when unset). */
  timeoutMs?: number;
  /** Default deadline of the streaming calls Prepare and Compact (folds can take a while); default: timeoutMs. */
  streamTimeoutMs?: number;
  /** Inject the active OpenTelemetry context when @opentelemetry/api is installed (default true). */
  openTelemetry?: boolean;
  /** An explicit trace context for every call without one of its own (e.g. from a non-OTel tracer). */
  traceContext?: () => TraceContext | undefined;
  /** Sessions whose last full view is kept for delta Prepare (default 256; 0 disables deltas). */
  viewCacheSize?: number;
  /** Extra connect interceptors (ignored when `transport` is given). */
  interceptors?: Interceptor[];
  /** Extra node:http2 session options (ignored when `transport` is given). */
  nodeOptions?: http2.SecureClientSessionOptions;
  /** Use this connect Transport instead of building a gRPC one (tests, custom setups). */
  transport?: Transport;
}

/** Per-call options. */
export interface CallOptions {
  /** Deadline of this call in milliseconds (overrides the client default; 0 = none). */
  timeoutMs?: number;
  /** Cancels the call. */
  signal?: AbortSignal;
  /** Extra request metadata. */
  headers?: Headers | Record<string, string> | [string, string][];
  /** Explicit W3C trace context for this call (wins over OpenTelemetry). */
  traceparent?: string;
  tracestate?: string;
}

export interface PrepareOptions extends CallOptions {
  /** Messages appended before preparing (the user turn, tool results, …). */
  append?: readonly (MessageInput | Message)[];
  /** The provider rejected the last view as too long: maintain even below the trigger. */
  overflow?: boolean;
  /** Idempotency key of the append. */
  requestId?: string;
  /** Ask for a delta against the cached last view (default true). The result is always the full view. */
  delta?: boolean;
  /** Called for each FoldProgress event, in order, before the result. */
  onProgress?: (progress: FoldProgress) => void;
}

export interface CompactOptions extends CallOptions {
  /** Extra instructions for the summary (what to keep in focus). */
  focus?: string;
  onProgress?: (progress: FoldProgress) => void;
}

/**
 * The result of prepare()/compact(): the PreparedContext with `messages` always holding the FULL
 * view to send to the model (a delta from the server is applied to the cached previous view).
 * `delta` tells whether the server sent only the new tail.
 */
export type PreparedView = PreparedContext;

/** One item of prepareEvents()/compactEvents(). */
export type PrepareEvent = { kind: "progress"; progress: FoldProgress } | { kind: "result"; view: PreparedView };

export interface AppendResult {
  /** The appended messages with id, seq and (tool results) result_ref. */
  messages: Message[];
  /** The session after the append. */
  session: Session;
}

export interface UsageReport {
  /** The view_version of the prepared view that was sent. */
  viewVersion: Int64;
  inputTokens: Int64;
  cachedInputTokens?: Int64;
  outputTokens?: Int64;
  /** stop, length, tool_calls, … */
  finishReason?: string;
}

/** Names a stored tool result: by its result_ref, or by the tool call id when unique. */
export type ToolResultRef = { resultRef: string } | { toolCallId: string };

export interface ReadPageOptions extends CallOptions {
  /** UTF-8 byte offset (on a character boundary). */
  offset?: Int64;
  /** Page size in bytes: 4..24576 (server default 16384). */
  limit?: Int64;
}

export interface WholeToolResult {
  /** The full raw result. */
  text: string;
  /** Its size in UTF-8 bytes. */
  totalBytes: number;
  /** Lowercase hex SHA-256 of the UTF-8 bytes (checked). */
  sha256: string;
  resultRef: string;
  /** Pages read. */
  pages: number;
}

export interface ListOptions extends CallOptions {
  /** Items per page: 1..1000 (server default 100). */
  pageSize?: number;
}

export interface ListMessagesOptions extends ListOptions {
  /** Also list messages abandoned by rewind (marked `abandoned`). */
  includeAbandoned?: boolean;
}

export interface ForkOptions extends CallOptions {
  /** The fork holds messages up to and including this seq (default: the head). */
  atSeq?: Int64;
  /** Config overrides: each set field replaces the source's value. */
  config?: SessionConfigOverrides | SessionConfig;
}

export interface RetryOptions extends PrepareOptions {
  /** Seq of the assistant answer to retry (default: the newest live assistant message). */
  assistantSeq?: Int64;
}

/** "host:port" or URL → base URL. */
export function baseUrlFor(address: string, tls: boolean): string {
  if (/^https?:\/\//i.test(address)) {
    return address.replace(/\/+$/, "");
  }
  return `${tls ? "https" : "http"}://${address}`;
}

/**
 * A client of ctxfold's ContextService over gRPC (HTTP/2).
 *
 * ```ts
 * const client = new CtxfoldClient({ address: "127.0.0.1:50051", token: process.env.CTXFOLD_TOKEN });
 * const session = await client.createSession(sessionConfig(128_000).maxOutputTokens(4096));
 * const view = await client.prepare(session.id, { append: [userMessage("hi")], onProgress: console.log });
 * ```
 *
 * Every method throws CtxfoldError. Call close() when done (it closes the HTTP/2 connection).
 */
export class CtxfoldClient {
  /** The generated connect client, for anything the helpers do not cover (throws ConnectError). */
  readonly raw: Client<typeof ContextService>;
  private readonly options: CtxfoldClientOptions;
  private readonly sessionManager: Http2SessionManager | undefined;
  private readonly views: ViewCache;

  constructor(options: CtxfoldClientOptions) {
    this.options = options;
    this.views = new ViewCache(options.viewCacheSize ?? 256);
    let transport = options.transport;
    if (!transport) {
      const tlsOpt = options.tls;
      const useTls = Boolean(tlsOpt) || /^https:\/\//i.test(options.address);
      const baseUrl = baseUrlFor(options.address, useTls);
      const nodeOptions: http2.SecureClientSessionOptions = { ...(options.nodeOptions ?? {}) };
      if (tlsOpt && typeof tlsOpt === "object") {
        if (tlsOpt.ca !== undefined) nodeOptions.ca = tlsOpt.ca;
        if (tlsOpt.cert !== undefined) nodeOptions.cert = tlsOpt.cert;
        if (tlsOpt.key !== undefined) nodeOptions.key = tlsOpt.key;
        if (tlsOpt.serverName !== undefined) nodeOptions.servername = tlsOpt.serverName;
      }
      this.sessionManager = new Http2SessionManager(baseUrl, {}, nodeOptions);
      transport = createGrpcTransport({
        baseUrl,
        sessionManager: this.sessionManager,
        interceptors: options.interceptors ?? [],
      });
    }
    this.raw = createClient(ContextService, transport);
  }

  /** Closes the HTTP/2 connection (and any open streams). The client cannot be used afterwards. */
  close(): void {
    this.sessionManager?.abort();
    this.views.clear();
  }

  // -------------------------------------------------------------------------------------------
  // plumbing

  private async callOptions(opts: CallOptions | undefined, streaming: boolean): Promise<ConnectCallOptions> {
    const headers = new Headers(opts?.headers);
    if (this.options.token && !headers.has("authorization")) {
      headers.set("authorization", `Bearer ${this.options.token}`);
    }
    const explicit: TraceContext | undefined = opts?.traceparent
      ? { traceparent: opts.traceparent, tracestate: opts.tracestate }
      : this.options.traceContext?.();
    await injectTraceContext(headers, explicit, this.options.openTelemetry ?? true);
    const defaultTimeout = streaming ? (this.options.streamTimeoutMs ?? this.options.timeoutMs) : this.options.timeoutMs;
    const timeoutMs = opts?.timeoutMs ?? defaultTimeout;
    return {
      headers,
      signal: opts?.signal,
      timeoutMs: timeoutMs && timeoutMs > 0 ? timeoutMs : undefined,
    };
  }

  private async unary<T>(opts: CallOptions | undefined, call: (o: ConnectCallOptions) => Promise<T>): Promise<T> {
    const callOpts = await this.callOptions(opts, false);
    try {
      return await call(callOpts);
    } catch (err) {
      throw CtxfoldError.from(err);
    }
  }

  // -------------------------------------------------------------------------------------------
  // sessions

  /** Creates a session. `config` may be a builder, idiomatic options or a SessionConfig. */
  async createSession(config: SessionConfigInput, opts?: CallOptions): Promise<Session> {
    const message = toSessionConfig(config);
    const res = await this.unary(opts, (o) => this.raw.createSession({ config: message }, o));
    return res.session!;
  }

  async getSession(sessionId: string, opts?: CallOptions): Promise<Session> {
    const res = await this.unary(opts, (o) => this.raw.getSession({ sessionId }, o));
    return res.session!;
  }

  /** Deletes a session and everything only it refers to. */
  async deleteSession(sessionId: string, opts?: CallOptions): Promise<void> {
    await this.unary(opts, (o) => this.raw.deleteSession({ sessionId }, o));
    this.views.delete(sessionId);
  }

  /** All sessions of the caller's tenant, newest first, fetched page by page. */
  async *listSessions(opts?: ListOptions): AsyncGenerator<Session, void, undefined> {
    let pageToken = "";
    do {
      const res = await this.unary(opts, (o) => this.raw.listSessions({ pageSize: opts?.pageSize ?? 0, pageToken }, o));
      yield* res.sessions;
      pageToken = res.nextPageToken;
    } while (pageToken);
  }

  // -------------------------------------------------------------------------------------------
  // transcript

  /** Appends messages atomically; returns them with id and seq. */
  async append(
    sessionId: string,
    messages: readonly (MessageInput | Message)[],
    opts?: CallOptions & { requestId?: string },
  ): Promise<AppendResult> {
    const res: AppendMessagesResponse = await this.unary(opts, (o) =>
      this.raw.appendMessages({ sessionId, messages: messages.map(toMessage), requestId: opts?.requestId ?? "" }, o),
    );
    return { messages: res.messages, session: res.session! };
  }

  /** The canonical transcript in seq order, fetched page by page. */
  async *listMessages(sessionId: string, opts?: ListMessagesOptions): AsyncGenerator<Message, void, undefined> {
    let pageToken = "";
    do {
      const res = await this.unary(opts, (o) =>
        this.raw.listMessages(
          { sessionId, pageSize: opts?.pageSize ?? 0, pageToken, includeAbandoned: opts?.includeAbandoned ?? false },
          o,
        ),
      );
      yield* res.messages;
      pageToken = res.nextPageToken;
    } while (pageToken);
  }

  // -------------------------------------------------------------------------------------------
  // prepare / compact

  /**
   * Appends `append`, runs maintenance when needed and returns the full view to send to the model.
   * Progress events of a prune or fold go to `onProgress`. Uses deltas under the hood.
   */
  async prepare(sessionId: string, opts: PrepareOptions = {}): Promise<PreparedView> {
    return drain(this.prepareEvents(sessionId, opts), opts.onProgress);
  }

  /**
   * The iterator form of prepare(): yields each progress event, then one `result` event with the
   * full view (which is also the generator's return value). Breaking out cancels the call.
   */
  async *prepareEvents(sessionId: string, opts: PrepareOptions = {}): AsyncGenerator<PrepareEvent, PreparedView, undefined> {
    const base = opts.delta === false ? undefined : this.views.get(sessionId);
    const known = base?.viewVersion ?? 0n;
    const callOpts = await this.callOptions(opts, true);
    const request = {
      sessionId,
      append: (opts.append ?? []).map(toMessage),
      overflow: opts.overflow ?? false,
      knownViewVersion: known,
      requestId: opts.requestId ?? "",
    };
    let result: PreparedContext | undefined;
    try {
      for await (const res of this.raw.prepare(request, callOpts)) {
        if (res.event.case === "progress") {
          yield { kind: "progress", progress: res.event.value };
        } else if (res.event.case === "result") {
          result = res.event.value;
        }
      }
    } catch (err) {
      throw CtxfoldError.from(err);
    }
    if (!result) {
      throw CtxfoldError.client(Code.Internal, ErrorReason.CLIENT_NO_RESULT, "Prepare stream ended without a result");
    }
    let view = this.resolve(sessionId, result, base, known);
    if (!view) {
      // The delta did not fit the cached view: ask again for the whole view (nothing to append).
      this.views.delete(sessionId);
      const full = await this.prepare(sessionId, { ...opts, append: [], requestId: undefined, delta: false, onProgress: undefined });
      view = full;
    }
    yield { kind: "result", view };
    return view;
  }

  /** Folds history into a summary checkpoint now (manual compaction); returns the new full view. */
  async compact(sessionId: string, opts: CompactOptions = {}): Promise<PreparedView> {
    return drain(this.compactEvents(sessionId, opts), opts.onProgress);
  }

  /** The iterator form of compact(). */
  async *compactEvents(sessionId: string, opts: CompactOptions = {}): AsyncGenerator<PrepareEvent, PreparedView, undefined> {
    const callOpts = await this.callOptions(opts, true);
    let result: PreparedContext | undefined;
    try {
      for await (const res of this.raw.compact({ sessionId, focus: opts.focus ?? "" }, callOpts)) {
        if (res.event.case === "progress") {
          yield { kind: "progress", progress: res.event.value };
        } else if (res.event.case === "result") {
          result = res.event.value;
        }
      }
    } catch (err) {
      throw CtxfoldError.from(err);
    }
    if (!result) {
      throw CtxfoldError.client(Code.Internal, ErrorReason.CLIENT_NO_RESULT, "Compact stream ended without a result");
    }
    const view = this.resolve(sessionId, result, undefined, 0n);
    if (!view) {
      throw CtxfoldError.client(Code.Internal, ErrorReason.CLIENT_DELTA_MISMATCH, "Compact answered a delta without a base view");
    }
    yield { kind: "result", view };
    return view;
  }

  private resolve(sessionId: string, result: PreparedContext, base: CachedView | undefined, known: bigint): PreparedView | undefined {
    const messages = applyView(result, base, known);
    if (!messages) {
      return undefined;
    }
    this.views.set(sessionId, { viewVersion: result.viewVersion, messages });
    if (!result.delta) {
      return result;
    }
    return create(PreparedContextSchema, { ...result, messages });
  }

  /** Forgets the cached view of a session (the next prepare() asks for the whole view). */
  forgetView(sessionId: string): void {
    this.views.delete(sessionId);
  }

  /** Records the provider's usage for a prepared view (calibration and statistics only). */
  async observeUsage(sessionId: string, usage: UsageReport, opts?: CallOptions): Promise<ObserveUsageResponse> {
    return this.unary(opts, (o) =>
      this.raw.observeUsage(
        {
          sessionId,
          viewVersion: toBigInt(usage.viewVersion),
          inputTokens: toBigInt(usage.inputTokens),
          cachedInputTokens: toBigInt(usage.cachedInputTokens ?? 0),
          outputTokens: toBigInt(usage.outputTokens ?? 0),
          finishReason: usage.finishReason ?? "",
        },
        o,
      ),
    );
  }

  // -------------------------------------------------------------------------------------------
  // tool results

  /** Reads one page of a stored raw tool result. */
  async readToolResult(sessionId: string, ref: ToolResultRef, opts: ReadPageOptions = {}): Promise<ReadToolResultResponse> {
    return this.unary(opts, (o) =>
      this.raw.readToolResult(
        {
          sessionId,
          resultRef: "resultRef" in ref ? ref.resultRef : "",
          toolCallId: "toolCallId" in ref ? ref.toolCallId : "",
          offset: toBigInt(opts.offset ?? 0),
          limit: toBigInt(opts.limit ?? 0),
        },
        o,
      ),
    );
  }

  /** Every page of a stored tool result from `offset` on, in order. */
  async *toolResultPages(sessionId: string, ref: ToolResultRef, opts: ReadPageOptions = {}): AsyncGenerator<ReadToolResultResponse, void, undefined> {
    let offset = toBigInt(opts.offset ?? 0);
    // After the first page, name the result by its ref (a tool call id could become ambiguous).
    let current: ToolResultRef = ref;
    for (;;) {
      const page = await this.readToolResult(sessionId, current, { ...opts, offset });
      yield page;
      if (page.complete || page.nextOffset >= page.totalBytes) {
        return;
      }
      if (page.nextOffset <= offset) {
        throw CtxfoldError.client(Code.DataLoss, ErrorReason.CLIENT_INTEGRITY, `ReadToolResult made no progress at offset ${offset}`);
      }
      offset = page.nextOffset;
      if (page.resultRef) {
        current = { resultRef: page.resultRef };
      }
    }
  }

  /**
   * Reads a whole stored tool result by paging and checks its size and SHA-256 against the
   * server's (throws CtxfoldError CLIENT_INTEGRITY on mismatch).
   */
  async readWholeToolResult(sessionId: string, ref: ToolResultRef, opts: Omit<ReadPageOptions, "offset"> = {}): Promise<WholeToolResult> {
    const chunks: string[] = [];
    let last: ReadToolResultResponse | undefined;
    let pages = 0;
    for await (const page of this.toolResultPages(sessionId, ref, opts)) {
      chunks.push(page.data);
      last = page;
      pages++;
    }
    const text = chunks.join("");
    const bytes = Buffer.from(text, "utf8");
    const sha256 = createHash("sha256").update(bytes).digest("hex");
    if (!last || BigInt(bytes.length) !== last.totalBytes || sha256 !== last.sha256) {
      throw CtxfoldError.client(Code.DataLoss, ErrorReason.CLIENT_INTEGRITY, "tool result bytes do not match the server's size/sha256", {
        expected_sha256: last?.sha256 ?? "",
        actual_sha256: sha256,
      });
    }
    return { text, totalBytes: bytes.length, sha256, resultRef: last.resultRef, pages };
  }

  // -------------------------------------------------------------------------------------------
  // lineage: fork, rewind, edit, retry

  /** A new session holding this one's transcript up to `atSeq` (default: the head). */
  async fork(sessionId: string, opts: ForkOptions = {}): Promise<Session> {
    const res = await this.unary(opts, (o) =>
      this.raw.fork(
        {
          sessionId,
          atSeq: toBigInt(opts.atSeq ?? 0),
          config: opts.config ? toConfigOverrides(opts.config) : undefined,
        },
        o,
      ),
    );
    return res.session!;
  }

  /** Moves the head back to `toSeq` (0 = empty); later messages become abandoned. */
  async rewind(sessionId: string, toSeq: Int64, opts?: CallOptions): Promise<Session> {
    const res = await this.unary(opts, (o) => this.raw.rewind({ sessionId, toSeq: toBigInt(toSeq) }, o));
    this.views.delete(sessionId);
    return res.session!;
  }

  /**
   * Replaces the message at `seq` with `replacement`: rewinds to seq − 1 (the old message and
   * everything after it become abandoned) and appends the new version.
   */
  async edit(
    sessionId: string,
    seq: Int64,
    replacement: MessageInput | Message | readonly (MessageInput | Message)[],
    opts?: CallOptions & { requestId?: string },
  ): Promise<AppendResult> {
    const at = toBigInt(seq);
    if (at < 1n) {
      throw new RangeError(`seq must be >= 1, got ${seq}`);
    }
    await this.rewind(sessionId, at - 1n, opts);
    const messages = Array.isArray(replacement) ? replacement : [replacement as MessageInput | Message];
    return this.append(sessionId, messages, opts);
  }

  /**
   * Retries a model answer: rewinds to the seq before the assistant message (default: the newest
   * live one) and prepares again, returning the view to send to the model.
   */
  async retry(sessionId: string, opts: RetryOptions = {}): Promise<PreparedView> {
    let seq = opts.assistantSeq === undefined ? undefined : toBigInt(opts.assistantSeq);
    if (seq === undefined) {
      for await (const message of this.listMessages(sessionId, { ...opts, pageSize: 1000 })) {
        if (message.role === Role.ASSISTANT && !message.abandoned) {
          seq = message.seq;
        }
      }
    }
    if (seq === undefined || seq < 1n) {
      throw CtxfoldError.client(Code.FailedPrecondition, ErrorReason.CLIENT_NO_ASSISTANT_MESSAGE, `session ${sessionId} has no assistant message to retry`, {
        session_id: sessionId,
      });
    }
    await this.rewind(sessionId, seq - 1n, opts);
    const { assistantSeq: _ignored, ...prepareOpts } = opts;
    return this.prepare(sessionId, prepareOpts);
  }

  // -------------------------------------------------------------------------------------------
  // state

  /** The session's context state ("sidecar", schema v3) parsed from JSON. */
  async getContextState(sessionId: string, opts?: CallOptions): Promise<Record<string, unknown>> {
    const res = await this.unary(opts, (o) => this.raw.getContextState({ sessionId }, o));
    return JSON.parse(res.stateJson) as Record<string, unknown>;
  }
}

/** Runs an event generator to its end, feeding progress to the callback; returns the view. */
async function drain(events: AsyncGenerator<PrepareEvent, PreparedView, undefined>, onProgress?: (p: FoldProgress) => void): Promise<PreparedView> {
  let view: PreparedView | undefined;
  for await (const event of events) {
    if (event.kind === "progress") {
      onProgress?.(event.progress);
    } else {
      view = event.view;
    }
  }
  if (!view) {
    throw CtxfoldError.client(Code.Internal, ErrorReason.CLIENT_NO_RESULT, "stream ended without a result");
  }
  return view;
}

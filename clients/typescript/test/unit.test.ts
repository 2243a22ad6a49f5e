/**
 * Unit tests: the hand-written layer against an in-memory ContextService (connect router
 * transport), plus the pure pieces (config builder, errors, delta application, trace context).
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, describe, it } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { anyPack } from "@bufbuild/protobuf/wkt";
import { ConnectError, type ServiceImpl, createRouterTransport } from "@connectrpc/connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { ROOT_CONTEXT, TraceFlags, context, propagation, trace } from "@opentelemetry/api";
import {
  Action,
  Code,
  ContextService,
  CtxfoldClient,
  CtxfoldError,
  ErrorInfoSchema,
  ErrorReason,
  FoldStage,
  type Message,
  MessageSchema,
  type PrepareRequest,
  type PreparedContext,
  PreparedContextSchema,
  Role,
  SessionConfigSchema,
  SessionSchema,
  ViewCache,
  applyView,
  assistantMessage,
  baseUrlFor,
  buildSessionConfig,
  grpcCodeName,
  isValidTraceparent,
  sessionConfig,
  toMessage,
  toolCall,
  toolResultMessage,
  userMessage,
} from "@ctxfold/client";
import { StatusSchema } from "@ctxfold/client/gen/google/rpc/status_pb";

const clients: CtxfoldClient[] = [];
after(() => clients.forEach((c) => c.close()));

/** A client over an in-memory ContextService with the given handlers. */
function fakeClient(impl: Partial<ServiceImpl<typeof ContextService>>, options: Partial<ConstructorParameters<typeof CtxfoldClient>[0]> = {}) {
  const transport = createRouterTransport((router) => router.service(ContextService, impl));
  const client = new CtxfoldClient({ address: "in-memory", transport, ...options });
  clients.push(client);
  return client;
}

function msg(seq: number, content: string, role = Role.USER): Message {
  return create(MessageSchema, { id: `m${seq}`, seq: BigInt(seq), role, content });
}

function view(version: number, messages: Message[], extra: { delta?: boolean; viewMessageCount?: bigint; action?: Action } = {}): PreparedContext {
  return create(PreparedContextSchema, {
    messages,
    viewVersion: BigInt(version),
    viewMessageCount: BigInt(messages.length),
    action: Action.NONE,
    ...extra,
  });
}

describe("session config builder", () => {
  it("builds a typed SessionConfig with defaults left at zero", () => {
    const config = sessionConfig(128_000)
      .compactRatio(0.75)
      .maxOutputTokens(4096)
      .systemPrompt("sys")
      .tools([{ type: "function", function: { name: "ls" } }])
      .model("gpt-x")
      .build();
    assert.equal(config.contextWindow, 128_000n);
    assert.equal(config.compactRatio, 0.75);
    assert.equal(config.tailRatio, 0);
    assert.equal(config.maxOutputTokens, 4096n);
    assert.equal(config.toolsJson, '[{"type":"function","function":{"name":"ls"}}]');
    assert.equal(config.summarizer, "");
    assert.equal(config.model, "gpt-x");
  });

  it("rejects values outside the documented ranges", () => {
    assert.throws(() => sessionConfig(0).build(), RangeError);
    assert.throws(() => sessionConfig(1000).compactRatio(0.99).build(), /compactRatio/);
    assert.throws(() => sessionConfig(1000).tailRatio(0.6).build(), /tailRatio/);
    assert.throws(() => sessionConfig(1000).toolContentMaxBytes(100).build(), /toolContentMaxBytes/);
    assert.throws(() => buildSessionConfig({ contextWindow: 1.5 }), /integer/);
    assert.throws(() => buildSessionConfig({ contextWindow: 1000, maxOutputTokens: -1 }), /maxOutputTokens/);
  });

  it("turns message helpers into messages", () => {
    const m = toMessage(assistantMessage("thinking", [toolCall("c1", "ls", { dir: "." })], { pinned: true }));
    assert.equal(m.role, Role.ASSISTANT);
    assert.equal(m.toolCalls[0]?.arguments, '{"dir":"."}');
    assert.equal(m.pinned, true);
    const t = toMessage(toolResultMessage("c1", "a.txt"));
    assert.equal(t.role, Role.TOOL);
    assert.equal(t.toolCallId, "c1");
    assert.equal(toMessage(userMessage("hi")).content, "hi");
    const already = create(MessageSchema, { role: Role.SYSTEM, content: "x" });
    assert.equal(toMessage(already), already);
  });

  it("builds base URLs from addresses", () => {
    assert.equal(baseUrlFor("127.0.0.1:50051", false), "http://127.0.0.1:50051");
    assert.equal(baseUrlFor("example.com:443", true), "https://example.com:443");
    assert.equal(baseUrlFor("https://example.com/", false), "https://example.com");
  });
});

describe("errors", () => {
  it("decodes grpc-status-details-bin into reason and metadata", () => {
    const info = create(ErrorInfoSchema, { reason: "SESSION_NOT_FOUND", domain: "ctxfold.dev", metadata: { session_id: "s1" } });
    const status = create(StatusSchema, { code: 5, message: "session 's1' not found", details: [anyPack(ErrorInfoSchema, info)] });
    const trailer = new Headers({
      "grpc-status": "5",
      "grpc-message": encodeURIComponent("session 's1' not found"),
      "grpc-status-details-bin": Buffer.from(toBinary(StatusSchema, status)).toString("base64").replace(/=+$/, ""),
    });
    const connectErr = findTrailerError(trailer);
    assert.ok(connectErr);
    const err = CtxfoldError.from(connectErr);
    assert.ok(err instanceof Error);
    assert.equal(err.code, Code.NotFound);
    assert.equal(err.codeName, "NOT_FOUND");
    assert.equal(err.reason, "SESSION_NOT_FOUND");
    assert.equal(err.domain, "ctxfold.dev");
    assert.deepEqual({ ...err.metadata }, { session_id: "s1" });
    assert.equal(err.rawMessage, "session 's1' not found");
    assert.equal(err.message, "[NOT_FOUND] SESSION_NOT_FOUND: session 's1' not found");
    assert.ok(err.is("SESSION_NOT_FOUND"));
  });

  it("wraps errors without details and non-connect errors", () => {
    const plain = CtxfoldError.from(new ConnectError("boom", Code.Unavailable));
    assert.equal(plain.reason, "");
    assert.equal(plain.codeName, "UNAVAILABLE");
    const other = CtxfoldError.from(new TypeError("bad"));
    assert.equal(other.code, Code.Unknown);
    assert.ok(other.cause instanceof TypeError);
    assert.equal(CtxfoldError.from(plain), plain);
    assert.equal(grpcCodeName(16), "UNAUTHENTICATED");
    assert.equal(grpcCodeName(99), "UNKNOWN");
  });

  it("surfaces handler errors from unary and streaming calls", async () => {
    const fail = () => {
      throw new ConnectError("no such session", Code.NotFound, undefined, [
        { desc: ErrorInfoSchema, value: { reason: "SESSION_NOT_FOUND", domain: "ctxfold.dev", metadata: { session_id: "x" } } },
      ]);
    };
    const client = fakeClient({
      getSession: fail,
      async *prepare() {
        yield { event: { case: "progress", value: { stage: FoldStage.PLANNED } } };
        fail();
      },
    });
    await assert.rejects(client.getSession("x"), (e: unknown) => e instanceof CtxfoldError && e.reason === "SESSION_NOT_FOUND" && e.metadata.session_id === "x");
    const seen: FoldStage[] = [];
    await assert.rejects(
      client.prepare("x", { onProgress: (p) => seen.push(p.stage) }),
      (e: unknown) => e instanceof CtxfoldError && e.code === Code.NotFound && e.reason === "SESSION_NOT_FOUND",
    );
    assert.deepEqual(seen, [FoldStage.PLANNED]);
  });

  it("reports a stream that ends without a result", async () => {
    const client = fakeClient({
      async *prepare() {
        yield { event: { case: "progress", value: { stage: FoldStage.PLANNED } } };
      },
    });
    await assert.rejects(client.prepare("s"), (e: unknown) => e instanceof CtxfoldError && e.reason === ErrorReason.CLIENT_NO_RESULT);
  });
});

describe("delta views", () => {
  it("applyView concatenates a delta onto the base and checks the count", () => {
    const base = { viewVersion: 3n, messages: [msg(1, "a"), msg(2, "b")] };
    const delta = view(4, [msg(3, "c")], { delta: true, viewMessageCount: 3n });
    assert.deepEqual(applyView(delta, base, 3n)?.map((m) => m.content), ["a", "b", "c"]);
    assert.equal(applyView(delta, undefined, 3n), undefined, "no base");
    assert.equal(applyView(delta, base, 2n), undefined, "base of another version");
    assert.equal(applyView(view(4, [msg(3, "c")], { delta: true, viewMessageCount: 5n }), base, 3n), undefined, "count mismatch");
    assert.deepEqual(applyView(view(5, [msg(9, "z")]), base, 3n)?.map((m) => m.content), ["z"], "a full view replaces");
  });

  it("ViewCache evicts the least recently used session", () => {
    const cache = new ViewCache(2);
    cache.set("a", { viewVersion: 1n, messages: [] });
    cache.set("b", { viewVersion: 1n, messages: [] });
    cache.get("a");
    cache.set("c", { viewVersion: 1n, messages: [] });
    assert.ok(cache.get("a") && cache.get("c") && !cache.get("b"));
    const off = new ViewCache(0);
    off.set("a", { viewVersion: 1n, messages: [] });
    assert.equal(off.size, 0);
  });

  it("sends known_view_version, rebuilds the full view, and refetches when a delta does not fit", async () => {
    const requests: PrepareRequest[] = [];
    const replies: PreparedContext[] = [
      view(1, [msg(1, "a")]),
      view(2, [msg(2, "b")], { delta: true, viewMessageCount: 2n }),
      view(3, [msg(3, "c")], { delta: true, viewMessageCount: 7n }), // does not add up
      view(3, [msg(1, "a"), msg(2, "b"), msg(3, "c")]), // the refetch
    ];
    const client = fakeClient({
      async *prepare(req) {
        requests.push(req);
        yield { event: { case: "result", value: replies.shift()! } };
      },
      rewind: (req) => ({ session: create(SessionSchema, { id: req.sessionId, headSeq: req.toSeq }) }),
    });
    const v1 = await client.prepare("s", { append: [userMessage("a")] });
    assert.deepEqual(v1.messages.map((m) => m.content), ["a"]);
    const v2 = await client.prepare("s", { append: [userMessage("b")] });
    assert.equal(v2.delta, true);
    assert.deepEqual(v2.messages.map((m) => m.content), ["a", "b"]);
    const v3 = await client.prepare("s", { append: [userMessage("c")], requestId: "r3" });
    assert.deepEqual(v3.messages.map((m) => m.content), ["a", "b", "c"]);
    assert.deepEqual(requests.map((r) => r.knownViewVersion), [0n, 1n, 2n, 0n]);
    assert.deepEqual(requests.map((r) => r.append.length), [1, 1, 1, 0], "the refetch appends nothing");
    assert.equal(requests[3]?.requestId, "");

    // Rewind forgets the cached view.
    await client.rewind("s", 1);
    replies.push(view(4, [msg(1, "a")]));
    await client.prepare("s");
    assert.equal(requests.at(-1)?.knownViewVersion, 0n);
  });

  it("yields progress events in order, then the result", async () => {
    const client = fakeClient({
      async *prepare() {
        for (const stage of [FoldStage.PLANNED, FoldStage.PASS_STARTED, FoldStage.SUMMARY_DELTA, FoldStage.PASS_COMMITTED]) {
          yield { event: { case: "progress", value: { stage, passIndex: 1, passesPlanned: 1, summaryDelta: stage === FoldStage.SUMMARY_DELTA ? "sum" : "" } } };
        }
        yield { event: { case: "result", value: view(7, [msg(1, "summary")], { action: Action.FOLDED }) } };
      },
    });
    const kinds: string[] = [];
    const gen = client.prepareEvents("s");
    for await (const e of gen) kinds.push(e.kind === "progress" ? FoldStage[e.progress.stage] : `result:${Action[e.view.action]}`);
    assert.deepEqual(kinds, ["PLANNED", "PASS_STARTED", "SUMMARY_DELTA", "PASS_COMMITTED", "result:FOLDED"]);
  });
});

describe("tool result paging", () => {
  const raw = "héllo wörld ✓ ".repeat(300);
  const bytes = Buffer.from(raw);
  const sha = createHash("sha256").update(bytes).digest("hex");

  function pager(corrupt = false) {
    const refsSeen: string[] = [];
    const client = fakeClient({
      readToolResult(req) {
        refsSeen.push(req.resultRef || `call:${req.toolCallId}`);
        let end = Math.min(bytes.length, Number(req.offset) + Number(req.limit || 1000n));
        while (end < bytes.length && (bytes[end]! & 0xc0) === 0x80) end--;
        const data = bytes.subarray(Number(req.offset), end).toString("utf8");
        return {
          data: corrupt && end === bytes.length ? data.slice(0, -1) + "!" : data,
          offset: req.offset,
          nextOffset: BigInt(end),
          totalBytes: BigInt(bytes.length),
          sha256: sha,
          complete: end === bytes.length,
          resultRef: "rr_1",
        };
      },
    });
    return { client, refsSeen };
  }

  it("reads a whole result page by page and checks size and sha256", async () => {
    const { client, refsSeen } = pager();
    const whole = await client.readWholeToolResult("s", { toolCallId: "c1" }, { limit: 333 });
    assert.equal(whole.text, raw);
    assert.equal(whole.sha256, sha);
    assert.equal(whole.totalBytes, bytes.length);
    assert.equal(whole.pages, refsSeen.length);
    assert.equal(refsSeen[0], "call:c1");
    assert.ok(refsSeen.slice(1).every((r) => r === "rr_1"), "later pages use the result_ref");
  });

  it("detects a corrupted reassembly", async () => {
    const { client } = pager(true);
    await assert.rejects(client.readWholeToolResult("s", { resultRef: "rr_1" }), (e: unknown) => e instanceof CtxfoldError && e.reason === ErrorReason.CLIENT_INTEGRITY);
  });
});

describe("metadata: bearer token and trace context", () => {
  function headerEcho(options: Partial<ConstructorParameters<typeof CtxfoldClient>[0]> = {}) {
    const seen: Headers[] = [];
    const client = fakeClient(
      {
        getSession(req, ctx) {
          seen.push(ctx.requestHeader);
          return { session: create(SessionSchema, { id: req.sessionId }) };
        },
        createSession(req, ctx) {
          seen.push(ctx.requestHeader);
          return { session: create(SessionSchema, { id: "new", config: req.config }) };
        },
      },
      options,
    );
    return { client, seen };
  }

  it("sends the bearer token", async () => {
    const { client, seen } = headerEcho({ token: "secret-token-0123456789" });
    await client.getSession("s");
    assert.equal(seen[0]?.get("authorization"), "Bearer secret-token-0123456789");
  });

  it("sends an explicit traceparent and validates it", async () => {
    const { client, seen } = headerEcho();
    const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    await client.getSession("s", { traceparent: tp, tracestate: "vendor=1" });
    assert.equal(seen[0]?.get("traceparent"), tp);
    assert.equal(seen[0]?.get("tracestate"), "vendor=1");
    assert.ok(isValidTraceparent(tp));
    assert.ok(!isValidTraceparent("00-00000000000000000000000000000000-b7ad6b7169203331-01"));
    await assert.rejects(client.getSession("s", { traceparent: "garbage" }), TypeError);
  });

  it("injects the active OpenTelemetry context when a propagator is registered", async () => {
    const { client, seen } = headerEcho();
    await client.getSession("s");
    assert.equal(seen[0]?.get("traceparent"), null, "no propagator registered: nothing injected");

    // What the OpenTelemetry Node SDK registers: an async-context manager and the W3C propagator.
    const contextManager = new AsyncLocalStorageContextManager().enable();
    context.setGlobalContextManager(contextManager);
    propagation.setGlobalPropagator(new W3CTraceContextPropagator());
    try {
      const spanContext = { traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", traceFlags: TraceFlags.SAMPLED };
      const active = trace.setSpanContext(ROOT_CONTEXT, spanContext);
      await context.with(active, () => client.getSession("s"));
      assert.equal(seen[1]?.get("traceparent"), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");

      // An explicit traceparent wins over the active context.
      const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
      await context.with(active, () => client.getSession("s", { traceparent: tp }));
      assert.equal(seen[2]?.get("traceparent"), tp);

      // It can be switched off per client.
      const { client: quiet, seen: quietSeen } = headerEcho({ openTelemetry: false });
      await context.with(active, () => quiet.getSession("s"));
      assert.equal(quietSeen[0]?.get("traceparent"), null);
    } finally {
      propagation.disable();
      context.disable();
    }
  });

  it("uses a client-level trace context provider", async () => {
    const tp = "00-11111111111111111111111111111111-2222222222222222-01";
    const { client, seen } = headerEcho({ traceContext: () => ({ traceparent: tp }) });
    await client.createSession(create(SessionConfigSchema, { contextWindow: 1000n }));
    assert.equal(seen[0]?.get("traceparent"), tp);
  });
});

/**
 * What the SDK decides on its own, where a real server cannot make it happen on demand: against an
 * in-memory ContextService (connect router transport) — request ids, the user agent, delta
 * recovery, a stream without a result, a corrupted reassembly, retry listing nothing, trace
 * context — plus the pure pieces (errors from the generated enum, the view cache, the tool answers).
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { anyPack, durationFromMs } from "@bufbuild/protobuf/wkt";
import { ConnectError, type ServiceImpl, createRouterTransport } from "@connectrpc/connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { ROOT_CONTEXT, TraceFlags, context, propagation, trace } from "@opentelemetry/api";
import {
  Code,
  CLIENT_ERROR_DOMAIN,
  CtxfoldClient,
  type CtxfoldClientOptions,
  CtxfoldError,
  ErrorReason,
  USER_AGENT,
  VERSION,
  assistantMessage,
  isCtxfoldError,
  isValidTraceparent,
  sessionConfig,
  toAnthropicMessages,
  toOpenAIChat,
  toolDefinitions,
  userMessage,
} from "@ctxfold/client";
import * as pb from "@ctxfold/client/proto";
import { budgetAnswer, pageAnswer, parseToolCall } from "../src/tools.js";
import { messageOf, viewOf } from "../src/model.js";
import { ViewCache, applyDelta } from "../src/views.js";
import { PACKAGE_DIR, REPO_ROOT } from "./server.js";

const clients: CtxfoldClient[] = [];
after(() => clients.forEach((c) => c.close()));

/** A client over an in-memory ContextService with these handlers. */
function fakeClient(impl: Partial<ServiceImpl<typeof pb.ContextService>>, options: Partial<CtxfoldClientOptions> = {}) {
  const transport = createRouterTransport((router) => router.service(pb.ContextService, impl));
  const client = new CtxfoldClient({ address: "in-memory", transport, ...options });
  clients.push(client);
  return client;
}

function msg(seq: number, content: string): pb.Message {
  return create(pb.MessageSchema, { id: `m${seq}`, seq: BigInt(seq), role: pb.Role.USER, content });
}

function answer(version: number, messages: pb.Message[], extra: Partial<{ delta: boolean; viewMessageCount: bigint; action: pb.Action; appended: pb.Message[] }> = {}) {
  return create(pb.PreparedContextSchema, {
    messages,
    viewVersion: BigInt(version),
    viewMessageCount: BigInt(messages.length),
    action: pb.Action.NONE,
    ...extra,
  });
}

const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe("version and user agent", () => {
  it("has one version: package.json, the SDK constant and the repository's VERSION agree", () => {
    const pkg = JSON.parse(readFileSync(join(PACKAGE_DIR, "package.json"), "utf8")) as { version: string };
    assert.equal(VERSION, pkg.version);
    assert.equal(VERSION, readFileSync(join(REPO_ROOT, "VERSION"), "utf8").trim());
    assert.equal(USER_AGENT, `ctxfold-typescript/${VERSION}`);
  });

  it("ships the project's licence: the package LICENSE is the repository's, and package.json names it", () => {
    const pkg = JSON.parse(readFileSync(join(PACKAGE_DIR, "package.json"), "utf8")) as { license: string; files: string[] };
    assert.equal(readFileSync(join(PACKAGE_DIR, "LICENSE"), "utf8"), readFileSync(join(REPO_ROOT, "LICENSE"), "utf8"));
    assert.match(readFileSync(join(REPO_ROOT, "LICENSE"), "utf8"), /^MIT License/);
    assert.equal(pkg.license, "MIT");
    assert.ok(pkg.files.includes("LICENSE"));
  });

  it("publishes as a public scoped package that runs nothing on a consumer's install", () => {
    const pkg = JSON.parse(readFileSync(join(PACKAGE_DIR, "package.json"), "utf8")) as { name: string; publishConfig?: { access?: string }; scripts: Record<string, string> };
    assert.match(pkg.name, /^@ctxfold\//);
    assert.equal(pkg.publishConfig?.access, "public", "a scoped package publishes restricted unless it says public");
    for (const hook of ["preinstall", "install", "postinstall", "prepare"]) {
      assert.equal(pkg.scripts[hook], undefined, `npm runs (and warns about) "${hook}" on installs`);
    }
    assert.equal(pkg.scripts.prepack, "npm run build", "npm pack and npm publish build first");
  });

  it("names itself in the user agent of every call", async () => {
    const seen: (string | null)[] = [];
    const client = fakeClient({
      getSession(req, ctx) {
        seen.push(ctx.requestHeader.get("user-agent"));
        return { session: create(pb.SessionSchema, { id: req.sessionId }) };
      },
      async *prepare(_req, ctx) {
        seen.push(ctx.requestHeader.get("user-agent"));
        yield { event: { case: "result", value: answer(1, []) } };
      },
    });
    await client.getSession("s");
    await client.prepare("s");
    assert.deepEqual(seen, [USER_AGENT, USER_AGENT]);
  });
});

describe("errors", () => {
  it("offers every reason of the generated enum as a constant, the SDK's own three among them, and nothing else", () => {
    const generated = pb.ErrorReasonSchema.values.filter((v) => v.number !== 0).map((v) => v.name);
    assert.deepEqual(Object.keys(ErrorReason), generated);
    for (const own of ["STREAM_ENDED_WITHOUT_RESULT", "RESULT_CHECKSUM_MISMATCH", "PROTOCOL_VIOLATION"]) {
      assert.ok(generated.includes(own), `${own} is an ErrorReason of the proto`);
    }
    assert.equal(ErrorReason.SESSION_NOT_FOUND, "SESSION_NOT_FOUND");
    assert.ok(!("STALE_CONTEXT" in ErrorReason), "the server never sends STALE_CONTEXT");
  });

  it("decodes ErrorInfo and RetryInfo from grpc-status-details-bin", () => {
    const info = create(pb.ErrorInfoSchema, { reason: "SESSION_BUSY", domain: "ctxfold.dev", metadata: { session_id: "s1" } });
    const retry = create(pb.RetryInfoSchema, { retryDelay: durationFromMs(1500) });
    const status = create(pb.StatusSchema, { code: 14, message: "busy", details: [anyPack(pb.ErrorInfoSchema, info), anyPack(pb.RetryInfoSchema, retry)] });
    const trailer = new Headers({
      "grpc-status": "14",
      "grpc-message": "busy",
      "grpc-status-details-bin": Buffer.from(toBinary(pb.StatusSchema, status)).toString("base64").replace(/=+$/, ""),
    });
    const err = CtxfoldError.from(findTrailerError(trailer));
    assert.equal(err.code, Code.Unavailable);
    assert.equal(err.codeName, "UNAVAILABLE");
    assert.equal(err.reason, ErrorReason.SESSION_BUSY);
    assert.equal(err.domain, "ctxfold.dev", "a server error keeps the server's domain, as sent");
    assert.deepEqual({ ...err.metadata }, { session_id: "s1" });
    assert.equal(err.retryDelayMs, 1500);
    assert.equal(err.message, "busy", "the message as written, as in the other SDKs");
    assert.equal(String(err), "CtxfoldError: UNAVAILABLE SESSION_BUSY: busy");
  });

  it("wraps transport failures without details", () => {
    const plain = CtxfoldError.from(new ConnectError("boom", Code.Unavailable));
    assert.equal(plain.reason, "");
    assert.equal(plain.domain, "");
    assert.equal(plain.retryDelayMs, undefined);
    assert.equal(CtxfoldError.from(new TypeError("bad")).code, Code.Unknown);
  });

  it("reports a stream that closes without its result as UNAVAILABLE / STREAM_ENDED_WITHOUT_RESULT", async () => {
    const client = fakeClient({
      async *prepare() {
        yield { event: { case: "progress", value: { stage: pb.FoldStage.PLANNED } } };
      },
    });
    const stages: string[] = [];
    await assert.rejects(
      client.prepare("s", { onProgress: (p) => stages.push(p.stage) }),
      (e: unknown) =>
        e instanceof CtxfoldError &&
        e.code === Code.Unavailable &&
        e.reason === ErrorReason.STREAM_ENDED_WITHOUT_RESULT &&
        e.domain === "client.ctxfold.dev", // raised by the SDK itself, not the server
    );
    assert.deepEqual(stages, ["FOLD_STAGE_PLANNED"], "progress printed by name");
  });
});

describe("a server that breaks the protocol: INTERNAL / PROTOCOL_VIOLATION", () => {
  const violation = (e: unknown) =>
    e instanceof CtxfoldError && e.code === Code.Internal && e.reason === ErrorReason.PROTOCOL_VIOLATION && e.domain === CLIENT_ERROR_DOMAIN;

  it("a list whose page token repeats", async () => {
    let pages = 0;
    const client = fakeClient({
      listSessions() {
        pages++;
        return { sessions: [create(pb.SessionSchema, { id: `s${pages}` })], nextPageToken: "again" };
      },
    });
    await assert.rejects(async () => {
      for await (const _ of client.listSessions()) {
        assert.ok(pages <= 2, "stopped at the repeated token");
      }
    }, violation);
  });

  it("a stream going on after its result", async () => {
    const client = fakeClient({
      async *prepare() {
        yield { event: { case: "result", value: answer(1, []) } };
        yield { event: { case: "progress", value: { stage: pb.FoldStage.PLANNED } } };
      },
    });
    // No deadline: the in-memory handler, left suspended, would keep its deadline timer running.
    await assert.rejects(client.prepare("s", { timeoutMs: 0 }), violation);
  });

  it("a whole view whose count disagrees", async () => {
    const client = fakeClient({
      async *prepare() {
        yield { event: { case: "result", value: answer(1, [msg(1, "a")], { viewMessageCount: 2n }) } };
      },
    });
    await assert.rejects(client.prepare("s"), violation);
  });

  it("pages of one result that disagree", async () => {
    const client = fakeClient({
      readToolResult(req) {
        const first = req.offset === 0n;
        return { data: "abcd", offset: req.offset, nextOffset: req.offset + 4n, totalBytes: 8n, sha256: first ? "a".repeat(64) : "b".repeat(64), complete: !first, resultRef: "r1" };
      },
    });
    await assert.rejects(client.readToolResult("s", "r1", { pageBytes: 4 }), violation);
  });
});

describe("request ids", () => {
  it("sends a fresh UUIDv4 on every append and prepare without one, and the caller's when given", async () => {
    const ids: string[] = [];
    const client = fakeClient({
      appendMessages(req) {
        ids.push(req.requestId);
        return { messages: req.messages.map((m, i) => ({ ...m, seq: BigInt(i + 1) })) };
      },
      async *prepare(req) {
        ids.push(req.requestId);
        yield { event: { case: "result", value: answer(1, []) } };
      },
    });
    await client.appendMessages("s", [userMessage("a")]);
    await client.appendMessages("s", [userMessage("a")]);
    await client.prepare("s", { append: [userMessage("b")] });
    await client.prepare("s", { requestId: "mine" });
    assert.ok(ids.slice(0, 3).every((id) => UUID_V4.test(id)), ids.join(" "));
    assert.equal(new Set(ids.slice(0, 3)).size, 3);
    assert.equal(ids[3], "mine");
  });
});

describe("delta views", () => {
  it("applyDelta appends a delta to the base of its version and checks the count", () => {
    const base = { viewVersion: 3, messages: ["a", "b"] };
    const delta = (count: number) => ({ messages: ["c"], viewMessageCount: count });
    assert.deepEqual(applyDelta(delta(3), base, 3), ["a", "b", "c"]);
    assert.equal(applyDelta(delta(3), undefined, 3), undefined, "no base");
    assert.equal(applyDelta(delta(3), base, 2), undefined, "base of another version");
    assert.equal(applyDelta(delta(5), base, 3), undefined, "the count does not add up");
  });

  it("the view cache holds 256 sessions by default, least recently used evicted", async () => {
    const cache = new ViewCache(2);
    const view = viewOf(answer(1, []), []);
    cache.set("a", view);
    cache.set("b", view);
    cache.get("a");
    cache.set("c", view);
    assert.ok(cache.get("a") && cache.get("c") && !cache.get("b"));

    const client = fakeClient({
      async *prepare(req) {
        yield { event: { case: "result", value: answer(1, [msg(1, req.sessionId)]) } };
      },
    });
    for (let i = 0; i <= 256; i++) await client.prepare(`s${i}`);
    assert.equal(client.lastView("s0"), undefined, "the 257th session evicted the first");
    assert.equal(client.lastView("s1")?.messages[0]?.content, "s1");
  });

  it("re-prepares once without append or known version when a delta does not fit, never appending twice", async () => {
    const requests: pb.PrepareRequest[] = [];
    const replies = [
      answer(1, [msg(1, "a")]),
      answer(2, [msg(2, "b")], { delta: true, viewMessageCount: 2n }),
      answer(3, [msg(3, "c")], { delta: true, viewMessageCount: 7n, appended: [msg(3, "c")] }), // does not add up
      answer(3, [msg(1, "a"), msg(2, "b"), msg(3, "c")]), // the whole view
    ];
    const client = fakeClient({
      async *prepare(req) {
        requests.push(req);
        yield { event: { case: "result", value: replies.shift()! } };
      },
    });
    await client.prepare("s", { append: [userMessage("a")] });
    const v2 = await client.prepare("s", { append: [userMessage("b")] });
    assert.deepEqual(v2.messages.map((m) => m.content), ["a", "b"], "a delta is applied: the view is whole");
    const v3 = await client.prepare("s", { append: [userMessage("c")], overflow: true });
    assert.deepEqual(v3.messages.map((m) => m.content), ["a", "b", "c"]);
    assert.deepEqual(v3.appended.map((m) => m.content), ["c"], "the view says what the call appended, as in every SDK");
    assert.deepEqual(requests.map((r) => r.knownViewVersion), [0n, 1n, 2n, 0n]);
    assert.deepEqual(requests.map((r) => r.append.length), [1, 1, 1, 0], "the recovery appends nothing");
    assert.equal(requests[3]?.overflow, false, "the recovery asks for no second overflow maintenance");
    assert.equal(requests[3]?.requestId, requests[2]?.requestId, "the recovery is the same request");
  });
});

describe("lineage without listing", () => {
  it("retry rewinds before the answer and prepares: it lists nothing", async () => {
    const calls: string[] = [];
    const client = fakeClient({
      listMessages() {
        throw new ConnectError("retry must not list", Code.Internal);
      },
      rewind(req) {
        calls.push(`rewind ${req.toSeq}`);
        return { session: create(pb.SessionSchema, { id: req.sessionId, headSeq: req.toSeq }) };
      },
      async *prepare() {
        calls.push("prepare");
        yield { event: { case: "result", value: answer(2, [msg(1, "q")]) } };
      },
    });
    const view = await client.retry("s", 4);
    assert.deepEqual(calls, ["rewind 3", "prepare"]);
    assert.equal(view.messages[0]?.content, "q");
  });

  it("forks at the head only when asked to, never for a seq of 0", async () => {
    const atSeqs: bigint[] = [];
    const client = fakeClient({
      fork(req) {
        atSeqs.push(req.atSeq);
        return { session: create(pb.SessionSchema, { id: "f", headSeq: 4n }) };
      },
    });
    await client.fork("s", "head");
    await client.fork("s", 2);
    await assert.rejects(client.fork("s", 0), (e: unknown) => e instanceof CtxfoldError && e.code === Code.InvalidArgument && e.reason === ErrorReason.SEQ_OUT_OF_RANGE);
    assert.deepEqual(atSeqs, [0n, 2n]);
  });
});

describe("tool results", () => {
  it("reports pages that do not hash to the server's sha256 as DATA_LOSS / RESULT_CHECKSUM_MISMATCH", async () => {
    const client = fakeClient({
      readToolResult(req) {
        return { data: "tampered", offset: req.offset, nextOffset: 8n, totalBytes: 8n, sha256: "0".repeat(64), complete: true, resultRef: "r1" };
      },
    });
    await assert.rejects(
      client.readToolResult("s", "r1"),
      (e: unknown) => e instanceof CtxfoldError && e.code === Code.DataLoss && e.reason === ErrorReason.RESULT_CHECKSUM_MISMATCH,
    );
  });

  it("answers a model's tool call: pages with a footer, mistakes as text", () => {
    const page = { data: "abc", offset: 0, nextOffset: 3, totalBytes: 9, sha256: "", complete: false, resultRef: "r1" };
    assert.equal(pageAnswer(page), 'abc\n\n[read_tool_result: bytes 0-3 of 9; call read_tool_result with result_ref "r1" and offset 3 for more]');
    assert.equal(pageAnswer({ ...page, complete: true }), "abc");
    assert.equal(parseToolCall({ name: "bash", arguments: "{}" }), undefined, "not a ctxfold tool");
    assert.deepEqual(parseToolCall({ name: "read_tool_result", arguments: '{"result_ref": "r1", "offset": 7}' }), { kind: "read", resultRef: "r1", offset: 7 });
    assert.deepEqual(parseToolCall({ name: "read_tool_result", arguments: { result_ref: "r1" } }), { kind: "read", resultRef: "r1", offset: 0 });
    for (const bad of ["{", "[1]", '{"offset": 1}', '{"result_ref": "r1", "offset": -1}', '{"result_ref": "r1", "offset": 1.5}']) {
      const parsed = parseToolCall({ name: "read_tool_result", arguments: bad });
      assert.equal(parsed?.kind, "bad", bad);
      assert.match(parsed.kind === "bad" ? parsed.answer : "", /^error: invalid arguments/);
    }
    assert.equal(budgetAnswer(undefined), "error: no context prepared by this client yet");
  });

  it("refuses tool call arguments that are not a JSON object in an Anthropic request", () => {
    const view = viewOf(answer(1, []), []);
    const call = (args: string) => ({ ...messageOf(msg(1, "")), role: "ROLE_ASSISTANT" as const, toolCalls: [{ id: "c1", name: "ls", arguments: args }] });
    assert.deepEqual((toAnthropicMessages({ ...view, messages: [call("")] }).messages[0]?.content[0] as { input: unknown }).input, {});
    for (const bad of ["[1]", "not json", "3"]) {
      assert.throws(() => toAnthropicMessages({ ...view, messages: [call(bad)] }), (e: unknown) => isCtxfoldError(e, ErrorReason.INVALID_MESSAGE) && /tool call c1: arguments are not/.test(e.message));
    }
  });

  it("defines both tools in the three provider formats", () => {
    const chat = toolDefinitions("openai_chat") as { function: { name: string; parameters: { required?: string[] } } }[];
    assert.deepEqual(chat.map((t) => t.function.name), ["read_tool_result", "context_budget"]);
    assert.deepEqual(chat[0]?.function.parameters.required, ["result_ref"]);
    const responses = toolDefinitions("openai_responses") as { type: string; name: string }[];
    assert.deepEqual(responses.map((t) => [t.type, t.name]), [["function", "read_tool_result"], ["function", "context_budget"]]);
    const anthropic = toolDefinitions("anthropic") as { name: string; input_schema: { properties: Record<string, unknown> } }[];
    assert.deepEqual(Object.keys(anthropic[0]!.input_schema.properties), ["result_ref", "offset"]);
  });
});

describe("metadata: bearer token and trace context", () => {
  function headerEcho(options: Partial<CtxfoldClientOptions> = {}) {
    const seen: Headers[] = [];
    const client = fakeClient(
      {
        getSession(req, ctx) {
          seen.push(ctx.requestHeader);
          return { session: create(pb.SessionSchema, { id: req.sessionId }) };
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
    await assert.rejects(client.getSession("s", { traceparent: "garbage" }), (e: unknown) => isCtxfoldError(e, ErrorReason.INVALID_CLIENT_ARGUMENT));
  });

  it("injects the active OpenTelemetry context when a propagator is registered", async () => {
    const { client, seen } = headerEcho();
    await client.getSession("s");
    assert.equal(seen[0]?.get("traceparent"), null, "no propagator registered: nothing injected");

    // What the OpenTelemetry Node SDK registers: an async-context manager and the W3C propagator.
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
    propagation.setGlobalPropagator(new W3CTraceContextPropagator());
    try {
      const spanContext = { traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", traceFlags: TraceFlags.SAMPLED };
      const active = trace.setSpanContext(ROOT_CONTEXT, spanContext);
      await context.with(active, () => client.getSession("s"));
      assert.equal(seen[1]?.get("traceparent"), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");

      const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
      await context.with(active, () => client.getSession("s", { traceparent: tp }));
      assert.equal(seen[2]?.get("traceparent"), tp, "an explicit traceparent wins");

      const { client: quiet, seen: quietSeen } = headerEcho({ openTelemetry: false });
      await context.with(active, () => quiet.getSession("s"));
      assert.equal(quietSeen[0]?.get("traceparent"), null, "switched off per client");
    } finally {
      propagation.disable();
      context.disable();
    }
  });

  it("uses a client-level trace context provider", async () => {
    const tp = "00-11111111111111111111111111111111-2222222222222222-01";
    const { client, seen } = headerEcho({ traceContext: () => ({ traceparent: tp }) });
    await client.getSession("s");
    assert.equal(seen[0]?.get("traceparent"), tp);
  });
});

/** Asserts that `run` throws the SDK's own INVALID_ARGUMENT error with this reason; returns it. */
async function refused(reason: ErrorReason, run: () => unknown): Promise<CtxfoldError> {
  let thrown: unknown;
  try {
    await run();
  } catch (err) {
    thrown = err;
  }
  assert.ok(isCtxfoldError(thrown, reason), `expected ${reason}, got ${String(thrown)}`);
  assert.equal(thrown.code, Code.InvalidArgument);
  assert.equal(thrown.domain, CLIENT_ERROR_DOMAIN);
  return thrown;
}

describe("argument checks: the server's reason, the client's domain, before any call", () => {
  const calls: string[] = [];
  const client = fakeClient({
    getSession() {
      calls.push("getSession");
      return { session: create(pb.SessionSchema, { id: "s" }) };
    },
  });

  it("refuses client options it cannot use", async () => {
    const option = async (options: Partial<CtxfoldClientOptions>) =>
      (await refused(ErrorReason.INVALID_CLIENT_ARGUMENT, () => new CtxfoldClient({ address: "127.0.0.1:1", ...options }))).metadata.field;
    assert.equal(await option({ address: "" }), "address");
    assert.equal(await option({ token: "two words" }), "token");
    assert.equal(await option({ tls: { cert: "PEM" } }), "tls");
    assert.equal(await option({ timeoutMs: -1 }), "timeoutMs");
    assert.equal(await option({ viewCacheSize: -1 }), "viewCacheSize");
    await refused(ErrorReason.INVALID_CLIENT_ARGUMENT, () => toolDefinitions("openai_chat_v2" as never));
  });

  it("refuses a config out of its documented ranges, naming the field as the server does", async () => {
    const field = async (run: () => unknown) => (await refused(ErrorReason.INVALID_CONFIG, run)).metadata.field;
    assert.equal(await field(() => client.createSession({ contextWindow: -5 })), "context_window");
    assert.equal(await field(() => client.createSession(sessionConfig(0))), "context_window");
    assert.equal(await field(() => client.createSession(sessionConfig(8000).compactRatio(0.99))), "compact_ratio");
    assert.equal(await field(() => client.createSession(sessionConfig(8000).tailRatio(0.6))), "tail_ratio");
    assert.equal(await field(() => client.createSession(sessionConfig(8000).prefoldRatio(0.05))), "prefold_ratio");
    assert.equal(await field(() => client.createSession(sessionConfig(8000).prefoldRatio(1))), "prefold_ratio");
    assert.equal(await field(() => client.createSession(sessionConfig(8000).maxOutputTokens(-1))), "max_output_tokens");
    assert.equal(await field(() => client.createSession(sessionConfig(8000).toolContentMaxBytes(100))), "tool_content_max_bytes");
    assert.equal(await field(() => client.createSession(sessionConfig(8000).tools("[{"))), "tools_json");
    assert.equal(await field(() => client.fork("s", "head", { config: { cacheTtlSeconds: -1 } })), "cache_ttl_seconds");
  });

  it("refuses page sizes, page bytes, offsets, seqs and session ids the server would refuse", async () => {
    await refused(ErrorReason.SESSION_ID_REQUIRED, () => client.getSession(""));
    await refused(ErrorReason.INVALID_PAGE_SIZE, () => client.listSessions({ pageSize: 1001 }).next());
    await refused(ErrorReason.INVALID_PAGE_SIZE, () => client.listCheckpoints("s", { pageSize: 101 }).next());
    await refused(ErrorReason.LIMIT_OUT_OF_RANGE, () => client.readToolResult("s", "r1", { pageBytes: 3 }));
    await refused(ErrorReason.OFFSET_OUT_OF_RANGE, () => client.toolResultPages("s", "r1", { offset: -1 }).next());
    await refused(ErrorReason.RESULT_REF_REQUIRED, () => client.readToolResult("s", { toolCallId: "" }));
    await refused(ErrorReason.SEQ_OUT_OF_RANGE, () => client.rewind("s", -1));
    await refused(ErrorReason.INVALID_REQUEST, () => client.compact("s", { keepTokens: -1 }));
    await refused(ErrorReason.SEQ_OUT_OF_RANGE, () => client.edit("s", 0, userMessage("x")));
    await refused(ErrorReason.SEQ_OUT_OF_RANGE, () => client.retry("s", 0));
    assert.deepEqual(calls, [], "nothing reached the server");
  });

  it("refuses text that is not Unicode (a lone surrogate) as the server refuses a NUL, naming the field", async () => {
    // Encoded as it is, a lone surrogate would reach the server as U+FFFD: other text than the agent's.
    const cut = "😀".slice(0, 1);
    const appended = await refused(ErrorReason.INVALID_TEXT, () => client.appendMessages("s", [userMessage("fine"), userMessage(`log ${cut}`)]));
    assert.equal(appended.metadata.field, "messages[1].content");
    const call = assistantMessage("", [{ id: "c1", name: "bash", arguments: `{"cmd": "${cut}"}` }]);
    const prepared = await refused(ErrorReason.INVALID_TEXT, () => client.prepare("s", { append: [call] }));
    assert.equal(prepared.metadata.field, "append[0].tool_calls[0].arguments");
    const config = await refused(ErrorReason.INVALID_TEXT, () => client.createSession(sessionConfig(16000).systemPrompt(`be ${cut}`)));
    assert.equal(config.metadata.field, "config.system_prompt");
    assert.deepEqual(calls, [], "nothing reached the server");
  });
});

describe("prefold_ratio: presence both ways, and the background stages", () => {
  it("sends an explicit 0 (off) and a ratio, sends nothing when unset, and reads the server's value back with presence", async () => {
    const sent: pb.SessionConfig[] = [];
    let answered: number | undefined;
    const client = fakeClient({
      createSession(req) {
        sent.push(req.config ?? create(pb.SessionConfigSchema));
        return { session: create(pb.SessionSchema, { id: "s", config: { contextWindow: 8000n, prefoldRatio: answered } }) };
      },
    });
    answered = 0;
    const off = await client.createSession(sessionConfig(8000).prefoldRatio(0));
    answered = 0.75;
    const unset = await client.createSession({ contextWindow: 8000 });
    answered = undefined;
    const older = await client.createSession({ contextWindow: 8000, prefoldRatio: 0.5 });
    assert.equal(sent[0].prefoldRatio, 0, "an explicit 0 is sent");
    assert.equal(sent[1].prefoldRatio, undefined, "an unset ratio is not sent");
    assert.equal(sent[2].prefoldRatio, 0.5);
    assert.equal(off.config.prefoldRatio, 0, "off, as the server says");
    assert.equal(unset.config.prefoldRatio, 0.75, "the server's default, filled in");
    assert.equal(older.config.prefoldRatio, undefined, "a server that does not say leaves it undefined, not 0");
  });

  it("refuses a ratio outside {0} and [0.10, 1) before any call", async () => {
    const client = fakeClient({});
    for (const ratio of [-0.1, 0.05, 1, Number.NaN]) {
      const err = await refused(ErrorReason.INVALID_CONFIG, () => client.createSession({ contextWindow: 8000, prefoldRatio: ratio }));
      assert.equal(err.metadata.field, "prefold_ratio");
    }
    await refused(ErrorReason.INVALID_CONFIG, () => client.fork("s", "head", { config: { prefoldRatio: 0.05 } }));
  });

  it("prints the background fold stages by name", async () => {
    const client = fakeClient({
      async *prepare() {
        for (const stage of [pb.FoldStage.BACKGROUND_STARTED, pb.FoldStage.PREPARED_INSTALLED, pb.FoldStage.BACKGROUND_RUNNING]) {
          yield { event: { case: "progress", value: { stage } } };
        }
        yield { event: { case: "result", value: answer(1, []) } };
      },
    });
    const stages: string[] = [];
    await client.prepare("s", { onProgress: (p) => stages.push(p.stage) });
    assert.deepEqual(stages, ["FOLD_STAGE_BACKGROUND_STARTED", "FOLD_STAGE_PREPARED_INSTALLED", "FOLD_STAGE_BACKGROUND_RUNNING"]);
  });
});

describe("the tools of a provider request", () => {
  const bash = { type: "function", function: { name: "bash", parameters: { type: "object" } } };
  const read = toolDefinitions("openai_chat")[0];
  const shown = viewOf(answer(1, [msg(1, "hi")]), [messageOf(msg(1, "hi"))]);

  it("offers the session's tools, and read_tool_result once the view hides a result", () => {
    assert.equal(toOpenAIChat(shown).tools, undefined);
    assert.deepEqual(toOpenAIChat(shown, { tools: [bash] }).tools, [bash]);
    const bounded = { ...messageOf(msg(2, "head … tail")), role: "ROLE_TOOL" as const, toolCallId: "c1", truncated: true, resultRef: "tr_1" };
    const call = { ...messageOf(msg(1, "")), ...assistantMessage("", [{ id: "c1", name: "bash", arguments: "{}" }]) };
    const hidden = { ...shown, messages: [call as typeof bounded, bounded] };
    assert.deepEqual(toOpenAIChat(hidden, { tools: [bash] }).tools, [bash, read]);
    assert.deepEqual(toOpenAIChat(hidden, { tools: JSON.stringify([bash, read]) }).tools, [bash, read], "JSON text, as session.config.toolsJson");
    assert.deepEqual(toAnthropicMessages({ ...shown, foldedResultsRef: "tr_9" }).tools, [toolDefinitions("anthropic")[0]]);
  });
});

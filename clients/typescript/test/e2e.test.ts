/**
 * End-to-end tests against a real ctxfold server (subprocess on a free loopback port).
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { create } from "@bufbuild/protobuf";
import {
  Action,
  Code,
  CtxfoldClient,
  CtxfoldError,
  ErrorReason,
  FoldStage,
  type FoldProgress,
  type Message,
  type PrepareEvent,
  Role,
  SessionConfigSchema,
  assistantMessage,
  isCtxfoldError,
  sessionConfig,
  toolCall,
  toolResultMessage,
  userMessage,
} from "@ctxfold/client";
import { listFiles, runAgentLoop } from "../examples/agent_loop.js";
import { type RunningServer, startServer } from "./server.js";

/** Asserts that `promise` rejects with a CtxfoldError and returns it. */
async function rejection(promise: Promise<unknown>): Promise<CtxfoldError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof CtxfoldError, `expected CtxfoldError, got ${String(err)}`);
    return err;
  }
  assert.fail("expected the call to fail");
}

/** A comparable projection of a view message. */
function shape(m: Message) {
  return { id: m.id, seq: m.seq, role: m.role, content: m.content, summary: m.summary, pruned: m.pruned, toolCallId: m.toolCallId };
}

/** Fills a 4000-token session with tool-call pairs until a prepare folds; returns the events. */
async function fillUntilFold(client: CtxfoldClient, sessionId: string, maxPairs = 10) {
  const progress: FoldProgress[] = [];
  for (let i = 1; i <= maxPairs; i++) {
    const id = `fill_${i}`;
    const view = await client.prepare(sessionId, {
      append: [assistantMessage("", [toolCall(id, "list_files", { dir: `pkg/${i}` })]), toolResultMessage(id, listFiles(`pkg/${i}`))],
      onProgress: (p) => progress.push(p),
    });
    if (view.action === Action.FOLDED) {
      return { view, progress, pairs: i };
    }
  }
  assert.fail("no fold happened");
}

describe("ctxfold e2e (no auth)", () => {
  let server: RunningServer;
  let client: CtxfoldClient;

  before(async () => {
    server = await startServer();
    client = new CtxfoldClient({ address: server.address, timeoutMs: 30_000 });
  });
  after(async () => {
    client?.close();
    await server?.stop();
  });

  it("runs a session's lifecycle: create, get, list, append, list messages, state, fork, delete", async () => {
    const session = await client.createSession(sessionConfig(8000).maxOutputTokens(512).systemPrompt("be brief").tools([{ type: "function", function: { name: "noop", parameters: {} } }]));
    assert.match(session.id, /\S/);
    assert.equal(session.config?.contextWindow, 8000n);
    assert.equal(session.config?.compactRatio, 0.8, "defaults are filled in");
    assert.equal(session.config?.summarizer, "extractive");
    assert.equal(session.headSeq, 0n);

    const other = await client.createSession({ contextWindow: 8000 });
    const got = await client.getSession(session.id);
    assert.equal(got.id, session.id);
    assert.equal(got.config?.systemPrompt, "be brief");

    const listed: string[] = [];
    for await (const s of client.listSessions({ pageSize: 1 })) listed.push(s.id);
    assert.ok(listed.includes(session.id) && listed.includes(other.id), "paging with page_size 1 reaches both sessions");
    assert.equal(new Set(listed).size, listed.length, "no session listed twice");

    const appended = await client.append(session.id, [userMessage("hello"), assistantMessage("hi there")], { requestId: "req-1" });
    assert.deepEqual(appended.messages.map((m) => m.seq), [1n, 2n]);
    assert.equal(appended.session.headSeq, 2n);
    const again = await client.append(session.id, [userMessage("hello"), assistantMessage("hi there")], { requestId: "req-1" });
    assert.deepEqual(again.messages.map((m) => m.id), appended.messages.map((m) => m.id), "request_id makes the append idempotent");

    const messages: Message[] = [];
    for await (const m of client.listMessages(session.id, { pageSize: 1 })) messages.push(m);
    assert.deepEqual(messages.map((m) => [m.role, m.content]), [[Role.USER, "hello"], [Role.ASSISTANT, "hi there"]]);

    const state = await client.getContextState(session.id);
    assert.equal(typeof state, "object");

    const fork = await client.fork(session.id, { atSeq: 1, config: { systemPrompt: "forked" } });
    assert.notEqual(fork.id, session.id);
    assert.equal(fork.headSeq, 1n);
    assert.equal(fork.forkedFromSessionId, session.id);
    assert.equal(fork.config?.systemPrompt, "forked");

    await client.deleteSession(session.id);
    const err = await rejection(client.getSession(session.id));
    assert.equal(err.reason, ErrorReason.SESSION_NOT_FOUND);
    assert.equal((await client.getSession(fork.id)).headSeq, 1n, "the fork survives its source");
    await client.deleteSession(fork.id);
    await client.deleteSession(other.id);
  });

  it("runs the README agent loop example, folding with progress events", async () => {
    const lines: string[] = [];
    const result = await runAgentLoop(client, { steps: 8, log: (l) => lines.push(l) });
    assert.ok(result.actions.includes(Action.FOLDED), `a fold happened: ${lines.join("\n")}`);
    const stages = result.progress.map((p) => p.stage);
    for (const stage of [FoldStage.PLANNED, FoldStage.PASS_STARTED, FoldStage.PASS_COMMITTED]) {
      assert.ok(stages.includes(stage), `progress has ${FoldStage[stage]}`);
    }
    const committed = result.progress.find((p) => p.stage === FoldStage.PASS_COMMITTED)!;
    assert.match(committed.checkpointId, /\S/);
    assert.ok(committed.tokensAfter < committed.tokensBefore);
    assert.ok(result.deltas > 0, "some views arrived as deltas");
    assert.match(result.finalAnswer, /Listed 8 directories/);
    assert.ok(result.lastView.messages.some((m) => m.summary), "the last view carries the summary message");
    assert.equal(result.lastView.messages[0]?.role, Role.SYSTEM);

    let count = 0;
    for await (const _ of client.listMessages(result.sessionId)) count++;
    assert.equal(count, 1 + 2 * 8 + 1, "the canonical transcript keeps every message");
  });

  it("offers prepare as an async iterator of progress events then the result", async () => {
    const session = await client.createSession(sessionConfig(4000).maxOutputTokens(256));
    await client.prepare(session.id, { append: [userMessage("inspect the repo")] });
    let events: PrepareEvent[] = [];
    for (let i = 1; i <= 10; i++) {
      events = [];
      const id = `it_${i}`;
      const gen = client.prepareEvents(session.id, {
        append: [assistantMessage("", [toolCall(id, "list_files", {})]), toolResultMessage(id, listFiles(`it/${i}`))],
      });
      for await (const event of gen) events.push(event);
      const last = events.at(-1)!;
      assert.equal(last.kind, "result");
      if (last.kind === "result" && last.view.action === Action.FOLDED) break;
    }
    assert.ok(events.length > 1, "progress events before the result");
    assert.ok(events.slice(0, -1).every((e) => e.kind === "progress"));
    assert.equal(events.filter((e) => e.kind === "result").length, 1);

    // Manual compaction streams the same way.
    await client.prepare(session.id, { append: [assistantMessage("", [toolCall("c1", "list_files", {})]), toolResultMessage("c1", listFiles("c1"))] });
    const progress: FoldProgress[] = [];
    const compacted = await client.compact(session.id, { focus: "keep file names", onProgress: (p) => progress.push(p) });
    assert.equal(compacted.action, Action.FOLDED);
    assert.ok(progress.some((p) => p.stage === FoldStage.PASS_COMMITTED));
    assert.ok(compacted.messages.some((m) => m.summary));
  });

  it("applies delta views and exposes the full view", async () => {
    const session = await client.createSession(sessionConfig(4000).maxOutputTokens(256).systemPrompt("delta test"));
    const first = await client.prepare(session.id, { append: [userMessage("start")] });
    assert.equal(first.delta, false, "nothing cached yet: a full view");

    const fresh = new CtxfoldClient({ address: server.address });
    try {
      const { view, pairs } = await fillUntilFold(client, session.id);
      assert.ok(pairs > 1);
      assert.equal(view.delta, false, "a fold changes the prefix: full view");

      const next = await client.prepare(session.id, {
        append: [assistantMessage("", [toolCall("d1", "list_files", {})]), toolResultMessage("d1", "small result")],
      });
      assert.equal(next.delta, true, "append-only growth arrives as a delta");
      assert.equal(BigInt(next.messages.length), next.viewMessageCount, "messages holds the whole view");
      assert.deepEqual(next.messages.slice(0, view.messages.length).map(shape), view.messages.map(shape), "the prefix is stable");
      assert.equal(next.messages.at(-1)?.content, "small result");

      // A client without the cached view gets the same view in full.
      const full = await fresh.prepare(session.id);
      assert.equal(full.delta, false);
      assert.deepEqual(next.messages.map(shape), full.messages.map(shape));

      // Opting out of deltas gives a full view as well.
      const noDelta = await client.prepare(session.id, { delta: false });
      assert.equal(noDelta.delta, false);
      assert.deepEqual(noDelta.messages.map(shape), full.messages.map(shape));
    } finally {
      fresh.close();
    }
  });

  it("round-trips a >32 KiB multi-byte tool result through ReadToolResult (exact bytes, sha256)", async () => {
    const session = await client.createSession({ contextWindow: 200_000 });
    const parts: string[] = [];
    for (let i = 0; Buffer.byteLength(parts.join("")) < 100 * 1024; i++) {
      parts.push(`${i}: naïve café — 日本語のテキスト — emoji 🚀🧪 — ελληνικά — ${"x".repeat(i % 13)}\n`);
    }
    const raw = parts.join("");
    const rawBytes = Buffer.byteLength(raw);
    const rawSha = createHash("sha256").update(raw, "utf8").digest("hex");

    const appended = await client.append(session.id, [
      userMessage("dump the log"),
      assistantMessage("", [toolCall("big_1", "read_log", { path: "/var/log/app.log" })]),
      toolResultMessage("big_1", raw),
    ]);
    const tool = appended.messages[2]!;
    assert.equal(tool.truncated, true, "the visible content is bounded");
    assert.equal(tool.rawBytes, BigInt(rawBytes));
    assert.ok(Buffer.byteLength(tool.content) <= 32 * 1024 + 512);
    assert.match(tool.resultRef, /\S/);
    assert.ok(tool.content.includes(tool.resultRef), "the marker names the result_ref");

    const whole = await client.readWholeToolResult(session.id, { resultRef: tool.resultRef }, { limit: 7001 });
    assert.equal(whole.text, raw);
    assert.equal(whole.totalBytes, rawBytes);
    assert.equal(whole.sha256, rawSha);
    assert.ok(whole.pages >= Math.ceil(rawBytes / 7001));

    const byCall = await client.readWholeToolResult(session.id, { toolCallId: "big_1" });
    assert.equal(Buffer.compare(Buffer.from(byCall.text), Buffer.from(raw)), 0);

    const page = await client.readToolResult(session.id, { resultRef: tool.resultRef }, { offset: 0, limit: 100 });
    assert.equal(page.offset, 0n);
    assert.ok(page.nextOffset <= 100n && page.nextOffset > 0n);
    assert.equal(page.complete, false);
    assert.equal(page.sha256, rawSha);

    // Offset 1 inside "0: naïve" is fine, but inside the two-byte "ï" it is not.
    const inside = Buffer.from(raw).indexOf(Buffer.from("ï")) + 1;
    const err = await rejection(client.readToolResult(session.id, { resultRef: tool.resultRef }, { offset: inside }));
    assert.equal(err.reason, ErrorReason.OFFSET_NOT_CHAR_BOUNDARY);
    assert.equal(err.code, Code.InvalidArgument);
  });

  it("edits a message: rewind before it and append the new version", async () => {
    const session = await client.createSession({ contextWindow: 8000 });
    await client.append(session.id, [userMessage("what is 2+2?"), assistantMessage("5")]);
    await client.append(session.id, [userMessage("are you sure?"), assistantMessage("yes")]);
    const edited = await client.edit(session.id, 3, userMessage("explain your answer"));
    assert.equal(edited.messages[0]?.seq, 3n);
    assert.equal(edited.session.headSeq, 3n);

    const live: Message[] = [];
    for await (const m of client.listMessages(session.id)) live.push(m);
    assert.deepEqual(live.map((m) => m.content), ["what is 2+2?", "5", "explain your answer"]);

    const all: Message[] = [];
    for await (const m of client.listMessages(session.id, { includeAbandoned: true })) all.push(m);
    assert.deepEqual(all.filter((m) => m.abandoned).map((m) => m.content).sort(), ["are you sure?", "yes"]);

    const view = await client.prepare(session.id);
    assert.deepEqual(view.messages.map((m) => m.content), ["what is 2+2?", "5", "explain your answer"]);
  });

  it("retries the last answer: rewind before it and prepare again", async () => {
    const session = await client.createSession({ contextWindow: 8000, systemPrompt: "sys" });
    const v1 = await client.prepare(session.id, { append: [userMessage("tell me a joke")] });
    await client.append(session.id, [assistantMessage("a bad joke")]);
    await client.observeUsage(session.id, { viewVersion: v1.viewVersion, inputTokens: 20, outputTokens: 5, finishReason: "stop" });

    const retried = await client.retry(session.id);
    assert.deepEqual(retried.messages.map((m) => m.content), ["sys", "tell me a joke"]);
    assert.equal((await client.getSession(session.id)).headSeq, 1n);
    await client.append(session.id, [assistantMessage("a better joke")]);

    const retriedAt = await client.retry(session.id, { assistantSeq: 2 });
    assert.equal(retriedAt.messages.at(-1)?.content, "tell me a joke");

    const empty = await client.createSession({ contextWindow: 8000 });
    const err = await rejection(client.retry(empty.id));
    assert.equal(err.reason, ErrorReason.CLIENT_NO_ASSISTANT_MESSAGE);
  });

  it("maps server errors to CtxfoldError with code, reason and metadata", async () => {
    const err = await rejection(client.getSession("s_does_not_exist"));
    assert.equal(err.name, "CtxfoldError");
    assert.equal(err.code, Code.NotFound);
    assert.equal(err.codeName, "NOT_FOUND");
    assert.equal(err.reason, "SESSION_NOT_FOUND");
    assert.equal(err.domain, "ctxfold.dev");
    assert.equal(err.metadata.session_id, "s_does_not_exist");
    assert.ok(isCtxfoldError(err, "SESSION_NOT_FOUND"));
    assert.match(err.message, /NOT_FOUND/);

    // Prepare is a stream: its errors map the same way.
    const prepErr = await rejection(client.prepare("s_does_not_exist", { append: [userMessage("x")] }));
    assert.equal(prepErr.reason, "SESSION_NOT_FOUND");

    const session = await client.createSession({ contextWindow: 8000 });
    await client.append(session.id, [userMessage("go"), assistantMessage("", [toolCall("t1", "run", {})])]);
    const pending = await rejection(client.append(session.id, [userMessage("are you done?")]));
    assert.equal(pending.code, Code.FailedPrecondition);
    assert.equal(pending.reason, "TOOL_RESULTS_PENDING");

    const invalid = await rejection(client.createSession(create(SessionConfigSchema, { contextWindow: 0n })));
    assert.equal(invalid.code, Code.InvalidArgument);
    assert.equal(invalid.reason, "INVALID_CONFIG");
  });

  it("honours deadlines and cancellation", async () => {
    const session = await client.createSession({ contextWindow: 8000 });
    const controller = new AbortController();
    controller.abort();
    const cancelled = await rejection(client.getSession(session.id, { signal: controller.signal }));
    assert.equal(cancelled.code, Code.Canceled);

    const slow = new CtxfoldClient({ address: server.address, timeoutMs: 1 });
    try {
      const late = await rejection(slow.prepare(session.id, { append: [userMessage("x".repeat(2000))] }));
      assert.equal(late.codeName, "DEADLINE_EXCEEDED");
    } finally {
      slow.close();
    }
  });
});

describe("ctxfold e2e (bearer tokens)", () => {
  const TOKEN_A = "token-for-tenant-a-0123456789";
  const TOKEN_B = "token-for-tenant-b-9876543210";
  let server: RunningServer;

  before(async () => {
    server = await startServer({ authTokens: { [TOKEN_A]: "tenant-a", [TOKEN_B]: "tenant-b" } });
  });
  after(async () => {
    await server?.stop();
  });

  it("sends the bearer token and keeps tenants apart", async () => {
    const anonymous = new CtxfoldClient({ address: server.address });
    const wrong = new CtxfoldClient({ address: server.address, token: "not-a-valid-token-at-all" });
    const a = new CtxfoldClient({ address: server.address, token: TOKEN_A });
    const b = new CtxfoldClient({ address: server.address, token: TOKEN_B });
    try {
      const noToken = await rejection(anonymous.createSession({ contextWindow: 8000 }));
      assert.equal(noToken.code, Code.Unauthenticated);
      assert.equal(noToken.reason, "UNAUTHENTICATED");
      assert.equal((await rejection(wrong.createSession({ contextWindow: 8000 }))).code, Code.Unauthenticated);

      const session = await a.createSession({ contextWindow: 8000 });
      const view = await a.prepare(session.id, { append: [userMessage("hi")] });
      assert.equal(view.messages.length, 1);

      const hidden = await rejection(b.getSession(session.id));
      assert.equal(hidden.reason, "SESSION_NOT_FOUND", "another tenant's session looks missing");
      const bIds: string[] = [];
      for await (const s of b.listSessions()) bIds.push(s.id);
      assert.ok(!bIds.includes(session.id));
      const aIds: string[] = [];
      for await (const s of a.listSessions()) aIds.push(s.id);
      assert.ok(aIds.includes(session.id));
    } finally {
      for (const c of [anonymous, wrong, a, b]) c.close();
    }
  });
});

function haveOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

describe("ctxfold e2e (mutual TLS)", { skip: haveOpenssl() ? false : "openssl not installed" }, () => {
  let server: RunningServer;
  let dir: string;
  let pem: { ca: string; clientCert: string; clientKey: string };

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "ctxfold-ts-pki-"));
    const ossl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
    const newKey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    ossl("req", "-x509", ...newKey, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=ctxfold test CA");
    await writeFile(join(dir, "server.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
    await writeFile(join(dir, "client.ext"), "extendedKeyUsage=clientAuth\n");
    for (const name of ["server", "client"]) {
      ossl("req", ...newKey, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=ctxfold test ${name}`);
      ossl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-extfile", `${name}.ext`, "-out", `${name}.pem`);
    }
    pem = {
      ca: await readFile(join(dir, "ca.pem"), "utf8"),
      clientCert: await readFile(join(dir, "client.pem"), "utf8"),
      clientKey: await readFile(join(dir, "client.key"), "utf8"),
    };
    server = await startServer({
      tls: { cert: join(dir, "server.pem"), key: join(dir, "server.key"), clientCa: join(dir, "ca.pem") },
      probe: { tls: { ca: pem.ca, cert: pem.clientCert, key: pem.clientKey } },
    });
  });
  after(async () => {
    await server?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("connects with a CA and a client certificate, and fails without the certificate", async () => {
    const good = new CtxfoldClient({ address: server.address, tls: { ca: pem.ca, cert: pem.clientCert, key: pem.clientKey }, timeoutMs: 10_000 });
    const noCert = new CtxfoldClient({ address: server.address, tls: { ca: pem.ca }, timeoutMs: 10_000 });
    try {
      const session = await good.createSession({ contextWindow: 8000 });
      assert.equal((await good.getSession(session.id)).id, session.id);
      const err = await rejection(noCert.getSession(session.id));
      // TLS 1.3 rejects the missing client certificate after the client's handshake is done, so
      // the transport sees the connection reset (CANCELLED / UNAVAILABLE), never an RPC answer.
      assert.ok([Code.Canceled, Code.Unavailable, Code.Unknown, Code.Internal].includes(err.code), `transport-level failure, got ${err.codeName}`);
    } finally {
      good.close();
      noCert.close();
    }
  });
});

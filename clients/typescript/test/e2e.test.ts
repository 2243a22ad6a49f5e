/**
 * End-to-end tests against a real ctxfold server (a subprocess on a free loopback port): what the
 * conformance scenarios do not cover — the README agent loop over a recorded trace, typed results,
 * the iterator forms, deltas across clients, exact bytes of a multi-byte tool result, deadlines
 * and cancellation, bearer tokens and mutual TLS.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import {
  Code,
  CtxfoldClient,
  CtxfoldError,
  ErrorReason,
  type FoldProgress,
  type Message,
  type PrepareEvent,
  assistantMessage,
  sessionConfig,
  toolResultMessage,
  userMessage,
} from "@ctxfold/client";
import { PACKAGE_DIR, REPO_ROOT, type RunningServer, startServer } from "./server.js";

const TRACE = join(REPO_ROOT, "clients", "conformance", "fixtures", "agent_trace.json");

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

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

/** A ~1500-byte tool result that differs per call. */
const listing = (dir: string) => Array.from({ length: 40 }, (_, i) => `-rw-r--r-- 1 agent ${(i * 7919) % 90000} ${dir}/part_${i}.ts`).join("\n");

/** Appends tool-call pairs to a 4000-token session until a prepare folds. */
async function fillUntilFold(client: CtxfoldClient, sessionId: string) {
  const progress: FoldProgress[] = [];
  for (let i = 1; i <= 12; i++) {
    const id = `fill_${i}`;
    const view = await client.prepare(sessionId, {
      append: [assistantMessage("", [{ id, name: "list_files", arguments: { dir: `pkg/${i}` } }]), toolResultMessage(id, listing(`pkg/${i}`))],
      onProgress: (p) => progress.push(p),
    });
    if (view.action === "ACTION_FOLDED") return { view, progress };
  }
  assert.fail("no fold happened");
}

describe("ctxfold e2e", () => {
  let server: RunningServer;
  let client: CtxfoldClient;

  before(async () => {
    server = await startServer();
    client = new CtxfoldClient({ address: server.address });
  });
  after(async () => {
    client?.close();
    await server?.stop();
  });

  it("runs the README agent loop over the shared recorded trace: folds with progress, reads truncated results back", async () => {
    const output = execFileSync("node", [join(PACKAGE_DIR, "dist", "esm", "examples", "agent_loop.js"), TRACE, server.address], { encoding: "utf8" });
    const summary = /(\d+) model calls, (\d+) folds, (\d+) read_tool_result calls; last view: (\d+) messages, ~(\d+) input tokens/.exec(output);
    assert.ok(summary, output.slice(-2000));
    const [calls, folds, reads, , tokens] = summary.slice(1).map(Number) as [number, number, number, number, number];
    assert.ok(folds >= 1 && reads >= 1, summary[0]);
    assert.match(output, /fold FOLD_STAGE_PASS_COMMITTED: \d+ -> \d+ tokens/, "progress is printed by stage name");
    assert.doesNotMatch(output, /FOLD_STAGE_SUMMARY_DELTA/, "summary deltas are not printed");
    assert.ok(tokens <= 12000 - 1024 - 256, "the last view fits under the hard limit");

    const sessionId = /^session (\S+):/m.exec(output)![1]!;
    const transcript = await collect(client.listMessages(sessionId));
    const trace = JSON.parse(await readFile(TRACE, "utf8")) as { messages: { role: string }[] };
    const recordedAnswers = trace.messages.filter((m) => m.role === "assistant").length;
    assert.equal(transcript.filter((m) => m.role === "ROLE_ASSISTANT").length, calls, "every model call's answer was appended");
    assert.equal(calls, recordedAnswers + reads, "each recorded answer, plus one call per read");
    const readAnswers = transcript.filter((m) => m.role === "ROLE_TOOL" && m.toolCallId.startsWith("read_"));
    assert.equal(readAnswers.length, reads);
    assert.ok(readAnswers.every((m) => m.rawBytes > 0 && !m.content.startsWith("error:")), "every read was answered with a page");
  });

  it("returns typed results: numbers, dates, enum names; lists every page; appends idempotently", async () => {
    const session = await client.createSession(sessionConfig(8000).maxOutputTokens(512).systemPrompt("be brief"));
    assert.equal(session.config.contextWindow, 8000);
    assert.equal(session.config.compactRatio, 0.8, "the server's defaults are filled in");
    assert.equal(session.config.summarizer, "extractive");
    assert.equal(session.config.prefoldRatio, 0, "background folds are off for the extractive summarizer");
    const ahead = await client.createSession(sessionConfig(8000).prefoldRatio(0.5));
    assert.equal(ahead.config.prefoldRatio, 0.5);
    assert.ok(session.createTime instanceof Date);
    const other = await client.createSession({ contextWindow: 8000 });

    const ids = (await collect(client.listSessions({ pageSize: 1 }))).map((s) => s.id);
    assert.ok(ids.includes(session.id) && ids.includes(other.id), "page size 1 reaches both");
    assert.equal(new Set(ids).size, ids.length);

    const appended = await client.appendMessages(session.id, [userMessage("hello"), assistantMessage("hi there")], { requestId: "req-1" });
    assert.deepEqual(appended.map((m) => [m.seq, m.role]), [[1, "ROLE_USER"], [2, "ROLE_ASSISTANT"]]);
    const again = await client.appendMessages(session.id, [userMessage("hello"), assistantMessage("hi there")], { requestId: "req-1" });
    assert.deepEqual(again.map((m) => m.id), appended.map((m) => m.id), "the same request_id appends once");
    const fresh = await client.appendMessages(session.id, [userMessage("more")]);
    assert.equal(fresh[0]?.seq, 3, "without a request_id each call appends");

    const messages = await collect(client.listMessages(session.id, { pageSize: 1 }));
    assert.deepEqual(messages.map((m) => m.content), ["hello", "hi there", "more"]);
    const view = await client.prepare(session.id);
    assert.equal(JSON.stringify({ action: view.action, cacheState: view.cacheState }), '{"action":"ACTION_NONE","cacheState":"CACHE_STATE_UNKNOWN"}');

    const fork = await client.fork(session.id, 1, { config: { systemPrompt: "forked" } });
    assert.deepEqual([fork.headSeq, fork.forkedFromSessionId, fork.config.systemPrompt], [1, session.id, "forked"]);
    await client.deleteSession(session.id);
    assert.equal((await rejection(client.getSession(session.id))).reason, ErrorReason.SESSION_NOT_FOUND);
    assert.equal((await client.getSession(fork.id)).headSeq, 1, "the fork outlives its source");
    await Promise.all([fork.id, other.id].map((id) => client.deleteSession(id)));
  });

  it("streams prepare and compact as async iterators: progress events by name, then one result", async () => {
    const session = await client.createSession(sessionConfig(4000).maxOutputTokens(256));
    await client.prepare(session.id, { append: [userMessage("inspect the repo")] });
    const { progress } = await fillUntilFold(client, session.id);
    const stages = progress.map((p) => p.stage);
    for (const stage of ["FOLD_STAGE_PLANNED", "FOLD_STAGE_PASS_STARTED", "FOLD_STAGE_PASS_COMMITTED"] as const) {
      assert.ok(stages.includes(stage), `progress has ${stage}`);
    }
    const committed = progress.find((p) => p.stage === "FOLD_STAGE_PASS_COMMITTED")!;
    assert.ok(committed.tokensAfter < committed.tokensBefore && committed.checkpointId !== "");

    await client.prepare(session.id, { append: [assistantMessage("", [{ id: "c1", name: "ls" }]), toolResultMessage("c1", listing("c1"))] });
    const events: PrepareEvent[] = await collect(client.compactEvents(session.id, { focus: "keep file names" }));
    const last = events.at(-1);
    assert.equal(last?.kind, "result");
    assert.ok(events.slice(0, -1).every((e) => e.kind === "progress") && events.length > 1);
    assert.equal(last?.kind === "result" && last.view.action, "ACTION_FOLDED");
    assert.ok(last?.kind === "result" && last.view.messages.some((m) => m.summary));
  });

  it("gives the same whole view from a delta as another client gets in full", async () => {
    const session = await client.createSession(sessionConfig(4000).maxOutputTokens(256).systemPrompt("delta test"));
    await client.prepare(session.id, { append: [userMessage("start")] });
    const { view } = await fillUntilFold(client, session.id);
    const next = await client.prepare(session.id, { append: [assistantMessage("", [{ id: "d1", name: "ls" }]), toolResultMessage("d1", "small result")] });
    assert.equal(next.messages.length, next.viewMessageCount);
    assert.equal(next.messages.at(-1)?.content, "small result");
    const shape = (m: Message) => [m.id, m.seq, m.role, m.content, m.summary];
    assert.deepEqual(next.messages.slice(0, view.messages.length).map(shape), view.messages.map(shape), "the prefix is stable");
    const other = new CtxfoldClient({ address: server.address });
    try {
      const full = await other.prepare(session.id);
      assert.deepEqual(full.messages.map(shape), next.messages.map(shape));
    } finally {
      other.close();
    }
  });

  it("reads a >32 KiB multi-byte tool result back exactly, and pages it one request per page", async () => {
    const session = await client.createSession({ contextWindow: 200_000 });
    const parts: string[] = [];
    for (let i = 0; Buffer.byteLength(parts.join("")) < 100 * 1024; i++) parts.push(`${i}: naïve café — 日本語 — 🚀🧪 — ${"x".repeat(i % 13)}\n`);
    const raw = parts.join("");
    const appended = await client.appendMessages(session.id, [
      userMessage("dump the log"),
      assistantMessage("", [{ id: "big_1", name: "read_log", arguments: { path: "/var/log/app.log" } }]),
      toolResultMessage("big_1", raw),
    ]);
    const tool = appended[2]!;
    assert.ok(tool.truncated && tool.rawBytes === Buffer.byteLength(raw) && tool.content.includes(tool.resultRef));

    const whole = await client.readToolResult(session.id, tool.resultRef, { pageBytes: 7001 });
    assert.equal(whole.text, raw);
    assert.equal(whole.sha256, createHash("sha256").update(raw, "utf8").digest("hex"));
    assert.equal((await client.readToolResult(session.id, { toolCallId: "big_1" })).text, raw);

    const pages = await collect(client.toolResultPages(session.id, tool.resultRef, { pageBytes: 24576 }));
    assert.equal(pages.length, Math.ceil(whole.totalBytes / 24576));
    assert.ok(pages.every((p, i) => p.offset === (i === 0 ? 0 : pages[i - 1]!.nextOffset) && p.complete === (i === pages.length - 1)));

    const inside = Buffer.from(raw).indexOf(Buffer.from("ï")) + 1;
    const err = await rejection(collect(client.toolResultPages(session.id, tool.resultRef, { offset: inside })));
    assert.deepEqual([err.code, err.reason], [Code.InvalidArgument, ErrorReason.OFFSET_NOT_CHAR_BOUNDARY]);
  });

  it("maps server errors of unary and streaming calls to CtxfoldError with code, reason and metadata", async () => {
    const err = await rejection(client.getSession("s_does_not_exist"));
    assert.deepEqual([err.name, err.code, err.codeName, err.reason], ["CtxfoldError", Code.NotFound, "NOT_FOUND", ErrorReason.SESSION_NOT_FOUND]);
    assert.equal(err.metadata.session_id, "s_does_not_exist");
    const streamErr = await rejection(client.prepare("s_does_not_exist", { append: [userMessage("x")] }));
    assert.equal(streamErr.reason, ErrorReason.SESSION_NOT_FOUND);
  });

  it("honours deadlines and AbortSignal, on unary calls and streams", async () => {
    const session = await client.createSession({ contextWindow: 8000 });
    const aborted = await rejection(client.getSession(session.id, { signal: AbortSignal.abort() }));
    assert.equal(aborted.code, Code.Canceled);
    const late = await rejection(client.prepare(session.id, { append: [userMessage("x".repeat(2000))], timeoutMs: 1 }));
    assert.equal(late.codeName, "DEADLINE_EXCEEDED");

    const controller = new AbortController();
    const events = client.prepareEvents(session.id, { append: [userMessage("hi")], signal: controller.signal });
    controller.abort();
    assert.equal((await rejection(collect(events))).code, Code.Canceled);
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
    const a = new CtxfoldClient({ address: server.address, token: TOKEN_A });
    const b = new CtxfoldClient({ address: server.address, token: TOKEN_B });
    try {
      const noToken = await rejection(anonymous.createSession({ contextWindow: 8000 }));
      assert.deepEqual([noToken.code, noToken.reason], [Code.Unauthenticated, ErrorReason.UNAUTHENTICATED]);
      const session = await a.createSession({ contextWindow: 8000 });
      assert.equal((await a.prepare(session.id, { append: [userMessage("hi")] })).messages.length, 1);
      assert.equal((await rejection(b.getSession(session.id))).reason, ErrorReason.SESSION_NOT_FOUND, "another tenant's session looks missing");
      assert.ok(!(await collect(b.listSessions())).some((s) => s.id === session.id));
    } finally {
      for (const c of [anonymous, a, b]) c.close();
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

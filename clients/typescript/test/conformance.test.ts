/**
 * The language-neutral conformance scenarios (clients/conformance/scenarios/*.json, format in
 * clients/README.md), one test per scenario file, against a real `ctxfold serve`.
 */
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import {
  CtxfoldClient,
  type Message,
  type MessageInput,
  type SessionConfigOptions,
  type ToolFormat,
  type ToolResultRef,
  type View,
  fromAnthropicMessages,
  fromOpenAIChat,
  fromOpenAIChatMessages,
  fromOpenAIResponses,
  isCtxfoldError,
  toAnthropicMessages,
  toOpenAIChat,
  toOpenAIResponses,
  toolDefinitions,
} from "@ctxfold/client";
import { REPO_ROOT, type RunningServer, startServer } from "./server.js";

const CONFORMANCE_DIR = join(REPO_ROOT, "clients", "conformance");
const SCENARIO_DIR = join(CONFORMANCE_DIR, "scenarios");
const FIXTURE_DIR = join(CONFORMANCE_DIR, "fixtures");

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type JsonObject = { [key: string]: Json };

// ---- canonical JSON --------------------------------------------------------------------------

const snake = (key: string) => key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const camel = (key: string) => key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());

/** The canonical form of a typed result: snake_case keys, dates as ISO strings, unset as null. */
function canonical(value: unknown): Json {
  if (value === undefined || value === null) return null;
  if (value instanceof Date) return value.toISOString();
  if (Array.isArray(value)) return value.map(canonical);
  if (typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [snake(k), canonical(v)]));
  }
  return value as Json;
}

/** A canonical (snake_case) object as the SDK's camelCase input, recursively. */
function camelized(value: Json): unknown {
  if (Array.isArray(value)) return value.map(camelized);
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [camel(k), camelized(v)]));
  }
  return value;
}

/** A message to append as the SDK takes it (canonical messages from a result included). */
const messageInput = (json: Json): MessageInput => camelized(json) as MessageInput;

/** Session settings from their proto JSON form (`tools_json` is the option `tools`). */
function configOf(json: Json | undefined): SessionConfigOptions {
  const { toolsJson, ...rest } = (camelized(json ?? {}) as SessionConfigOptions & { toolsJson?: string });
  return toolsJson === undefined ? rest : { ...rest, tools: toolsJson };
}

const MESSAGE_DEFAULTS: Message = {
  id: "",
  seq: 0,
  role: "ROLE_USER",
  content: "",
  toolCalls: [],
  toolCallId: "",
  reasoningContent: "",
  pinned: false,
  resultRef: "",
  rawBytes: 0,
  truncated: false,
  summary: false,
  pruned: false,
  name: "",
  tokens: 0,
  abandoned: false,
  createTime: undefined,
};

/** A View from its canonical JSON (a saved result, or a partial view in a fixture): missing fields take their defaults. */
function viewOf(json: Json): View {
  const v = camelized(json) as Partial<View> & { messages?: Partial<Message>[] };
  const messages = (v.messages ?? []).map((m) => ({ ...MESSAGE_DEFAULTS, ...m }));
  return {
    estimatedTokens: 0,
    estimatedInputTokens: 0,
    viewVersion: 0,
    action: "ACTION_NONE",
    cacheState: "CACHE_STATE_UNKNOWN",
    promptCacheKey: "",
    checkpointId: "",
    stablePrefixMessages: 0,
    viewMessageCount: messages.length,
    triggerTokens: 0,
    hardLimitTokens: 0,
    notFoldedReason: "NOT_FOLDED_REASON_UNSPECIFIED",
    notFoldedDetail: "",
    candidateSummary: "",
    foldedResultsRef: "",
    ...v,
    appended: (v.appended ?? []).map((m) => ({ ...MESSAGE_DEFAULTS, ...m })),
    messages,
  };
}

/** The provider response → messages + usage, the messages in their canonical (proto) form. */
function turnCanonical(turn: { messages: MessageInput[]; usage: object }): Json {
  return canonical({ messages: turn.messages.map((m) => ({ ...MESSAGE_DEFAULTS, ...m, toolCalls: m.toolCalls ?? [] })), usage: turn.usage });
}

// ---- values, substitution, paths, matchers ---------------------------------------------------

/** What lookup() gives for a missing last key: only `{"present": false}` accepts it. */
const ABSENT = Symbol("absent");

function lookup(value: Json, path: string): Json {
  return lookupOrAbsent(value, path, false) as Json;
}

function lookupOrAbsent(value: Json, path: string, absentOk: boolean): Json | typeof ABSENT {
  const parts = path === "" ? [] : path.split(".");
  for (const [i, part] of parts.entries()) {
    if (absentOk && i === parts.length - 1 && value !== null && typeof value === "object" && !Array.isArray(value) && !(part in value)) {
      return ABSENT;
    }
    if (part === "length" && (Array.isArray(value) || typeof value === "string")) {
      value = value.length;
    } else if (Array.isArray(value)) {
      assert.ok(/^\d+$/.test(part) && Number(part) < value.length, `no index ${part} in a list of ${value.length} (path ${path})`);
      value = value[Number(part)]!;
    } else if (value !== null && typeof value === "object") {
      assert.ok(part in value, `no ${JSON.stringify(part)} in [${Object.keys(value).join(", ")}] (path ${path})`);
      value = value[part]!;
    } else {
      assert.fail(`cannot take ${part} of ${JSON.stringify(value)} (path ${path})`);
    }
  }
  return value;
}

function resolve(value: Json, saved: Readonly<Record<string, Json>>): Json {
  if (typeof value === "string" && value.startsWith("$")) {
    const [name, ...path] = value.slice(1).split(".");
    assert.ok(name! in saved, `nothing saved as ${name} (have ${Object.keys(saved).join(", ")})`);
    return lookup(saved[name!]!, path.join("."));
  }
  if (Array.isArray(value)) return value.map((v) => resolve(v, saved));
  if (value !== null && typeof value === "object") {
    if ("$repeat" in value) return String(value.$repeat).repeat(Number(value.times));
    if ("$json" in value) return JSON.stringify(resolve(value.$json!, saved));
    if ("$tool_definitions" in value) return toolDefinitions(value.$tool_definitions as ToolFormat) as Json[];
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, resolve(v, saved)]));
  }
  return value;
}

function isPresent(value: Json | typeof ABSENT): boolean {
  if (value === ABSENT) return false;
  if (Array.isArray(value)) return value.length > 0;
  if (value !== null && typeof value === "object") return Object.keys(value).length > 0;
  return value !== null && value !== "" && value !== 0 && value !== false;
}

function check(actual: Json | typeof ABSENT, matcher: Json, saved: Readonly<Record<string, Json>>, where: string): void {
  const isPresentMatcher = matcher !== null && typeof matcher === "object" && !Array.isArray(matcher) && "present" in matcher;
  assert.ok(actual !== ABSENT || isPresentMatcher, `${where}: no such key`);
  if (matcher !== null && typeof matcher === "object" && !Array.isArray(matcher) && Object.keys(matcher).length === 1) {
    const [[kind, expected]] = Object.entries(matcher) as [[string, Json]];
    switch (kind) {
      case "contains":
        assert.ok(typeof actual === "string" && actual.includes(String(expected)), `${where}: ${JSON.stringify(actual)?.slice(0, 300)} does not contain ${JSON.stringify(expected)}`);
        return;
      case "matches":
        assert.ok(typeof actual === "string" && new RegExp(String(expected)).test(actual), `${where}: ${JSON.stringify(actual)} !~ ${String(expected)}`);
        return;
      case "gte":
        assert.ok(typeof actual === "number" && actual >= Number(expected), `${where}: ${JSON.stringify(actual)} < ${String(expected)}`);
        return;
      case "lte":
        assert.ok(typeof actual === "number" && actual <= Number(expected), `${where}: ${JSON.stringify(actual)} > ${String(expected)}`);
        return;
      case "present":
        assert.equal(isPresent(actual), expected, `${where}: ${JSON.stringify(actual)} is ${isPresent(actual) ? "" : "not "}present`);
        return;
      case "equals_saved":
        assert.deepEqual(actual, resolve(expected, saved), `${where}: not ${String(expected)}`);
        return;
    }
  }
  assert.deepEqual(actual, matcher, where);
}

// ---- operations ------------------------------------------------------------------------------

const fixture = (name: string): unknown => JSON.parse(readFileSync(join(FIXTURE_DIR, name), "utf8"));

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

function refOf(args: JsonObject): ToolResultRef {
  return typeof args.tool_call_id === "string" ? { toolCallId: args.tool_call_id } : String(args.result_ref ?? "");
}

/** Runs one operation on session `id` with resolved args and returns its canonical result. */
async function run(client: CtxfoldClient, op: string, id: string, args: JsonObject): Promise<Json> {
  const num = (key: string): number | undefined => (args[key] === undefined ? undefined : Number(args[key]));
  switch (op) {
    case "create_session": {
      const config = configOf(args.config);
      return canonical(await client.createSession(args.tools === undefined ? config : { ...config, tools: args.tools as Json[] }));
    }
    case "get_session":
      return canonical(await client.getSession(id));
    case "list_sessions":
      return canonical({ sessions: await collect(client.listSessions({ pageSize: num("page_size") })) });
    case "delete_session":
      await client.deleteSession(id);
      return {};
    case "append_messages": {
      const messages = (args.messages as Json[]).map(messageInput);
      return canonical({ messages: await client.appendMessages(id, messages, { requestId: args.request_id as string | undefined }) });
    }
    case "list_messages":
      return canonical({ messages: await collect(client.listMessages(id, { includeAbandoned: args.include_abandoned === true, pageSize: num("page_size") })) });
    case "prepare":
    case "prepare_events": {
      const opts = { append: ((args.append ?? []) as Json[]).map(messageInput), overflow: args.overflow === true, requestId: args.request_id as string | undefined };
      return op === "prepare" ? canonical(await client.prepare(id, opts)) : events(client.prepareEvents(id, opts));
    }
    case "compact":
    case "compact_events": {
      const opts = { focus: args.focus as string | undefined, keepTokens: num("keep_tokens"), dryRun: args.dry_run === true };
      return op === "compact" ? canonical(await client.compact(id, opts)) : events(client.compactEvents(id, opts));
    }
    case "observe_usage": {
      const view = args.view !== undefined ? Number(lookup(args.view, "view_version")) : Number(args.view_version);
      const usage = { inputTokens: Number(args.input_tokens), cachedInputTokens: num("cached_input_tokens"), outputTokens: num("output_tokens"), finishReason: args.finish_reason as string | undefined };
      return canonical(await client.observeUsage(id, view, usage));
    }
    case "get_context_state":
      return (await client.getContextState(id)) as Json;
    case "fork": {
      const config = args.config === undefined ? undefined : configOf(args.config);
      return canonical(await client.fork(id, args.at_head === true ? "head" : Number(args.at_seq), { config }));
    }
    case "rewind":
      return canonical(await client.rewind(id, Number(args.to_seq)));
    case "edit":
      return canonical(await client.edit(id, Number(args.seq), messageInput(args.message!), { requestId: args.request_id as string | undefined }));
    case "retry":
      return canonical(await client.retry(id, Number(args.answer_seq)));
    case "read_tool_result":
      return canonical(await client.readToolResult(id, refOf(args), { pageBytes: num("page_bytes") }));
    case "tool_result_pages":
      return canonical({ pages: await collect(client.toolResultPages(id, refOf(args), { offset: num("offset"), pageBytes: num("page_bytes") })) });
    case "list_checkpoints":
      return canonical({ checkpoints: await collect(client.listCheckpoints(id, { includeAbandoned: args.include_abandoned === true, pageSize: num("page_size") })) });
    case "get_checkpoint":
      return canonical(await client.getCheckpoint(id, String(args.checkpoint_id)));
    case "dispatch_tool_call":
      return { content: (await client.dispatchToolCall(id, { name: String(args.name), arguments: args.arguments as string })) ?? null };
    case "tool_definitions":
      return { tools: toolDefinitions(args.format as ToolFormat) as Json[] };
    case "to_openai_chat":
      return toOpenAIChat(viewOf(args.view!), { tools: args.tools as Json[] | undefined }) as unknown as Json;
    case "to_openai_responses":
      return toOpenAIResponses(viewOf(args.view!), { tools: args.tools as Json[] | undefined }) as unknown as Json;
    case "to_anthropic_messages":
      return toAnthropicMessages(viewOf(args.view!), { tools: args.tools as Json[] | undefined }) as unknown as Json;
    case "from_openai_chat":
      return turnCanonical(fromOpenAIChat(fixture(String(args.fixture)) as Parameters<typeof fromOpenAIChat>[0]));
    case "from_openai_responses":
      return turnCanonical(fromOpenAIResponses(fixture(String(args.fixture)) as Parameters<typeof fromOpenAIResponses>[0]));
    case "from_anthropic_messages":
      return turnCanonical(fromAnthropicMessages(fixture(String(args.fixture)) as Parameters<typeof fromAnthropicMessages>[0]));
    case "from_openai_chat_messages":
      return turnCanonical({ messages: fromOpenAIChatMessages(args.messages as unknown as Parameters<typeof fromOpenAIChatMessages>[0]), usage: {} });
    default:
      assert.fail(`unknown operation ${op}`);
  }
}

async function events(stream: AsyncIterable<{ kind: "progress"; progress: object } | { kind: "result"; view: View }>): Promise<Json> {
  const progress: object[] = [];
  let result: View | undefined;
  for await (const event of stream) {
    if (event.kind === "progress") progress.push(event.progress);
    else result = event.view;
  }
  return canonical({ progress, result });
}

interface Step {
  op: string;
  args?: JsonObject;
  save?: string;
  expect?: Record<string, Json>;
  error?: { code: string; reason: string; domain?: string };
  repeat?: number;
}

interface Scenario {
  name: string;
  config?: JsonObject;
  steps: Step[];
}

/** The session a step acts on: `args.session` (a saved Session, or a literal id), else `$session`. */
function sessionIdOf(args: JsonObject, saved: Readonly<Record<string, Json>>): string {
  const named = args.session ?? saved.session ?? "";
  return typeof named === "string" ? named : String(lookup(named, "id"));
}

async function runScenario(client: CtxfoldClient, scenario: Scenario): Promise<void> {
  const saved: Record<string, Json> = {};
  if (scenario.config !== undefined) {
    saved.session = canonical(await client.createSession(configOf(scenario.config)));
  }
  for (const [index, step] of scenario.steps.entries()) {
    for (let round = 0; round < (step.repeat ?? 1); round++) {
      const where = `step ${index + 1} (${step.op})${step.repeat ? ` round ${round + 1}` : ""}`;
      const args = resolve(step.args ?? {}, saved) as JsonObject;
      const id = sessionIdOf(args, saved);
      let result: Json;
      try {
        result = await run(client, step.op, id, args);
      } catch (err) {
        if (step.error === undefined) throw err;
        assert.ok(isCtxfoldError(err), `${where}: expected CtxfoldError, got ${String(err)}`);
        assert.deepEqual({ code: err.codeName, reason: err.reason, domain: err.domain }, { domain: err.domain, ...step.error }, `${where}: ${err}`);
        continue;
      }
      assert.equal(step.error, undefined, `${where}: expected ${JSON.stringify(step.error)}, got ${JSON.stringify(result).slice(0, 500)}`);
      for (const [path, matcher] of Object.entries(step.expect ?? {})) {
        check(lookupOrAbsent(result, path, true), matcher, saved, `${where} ${path}`);
      }
      if (step.save !== undefined) saved[step.save] = result;
    }
  }
}

describe("conformance scenarios", () => {
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

  for (const file of readdirSync(SCENARIO_DIR).filter((f) => f.endsWith(".json")).sort()) {
    const scenario = JSON.parse(readFileSync(join(SCENARIO_DIR, file), "utf8")) as Scenario;
    it(`${file}: ${scenario.name}`, async () => {
      await runScenario(client, scenario);
    });
  }
});

/**
 * The README agent loop: a recorded agent trace (OpenAI chat format, as in tests/data/traces)
 * replayed through ctxfold. Each model turn: prepare (append what is new, fold when full, progress
 * printed) → the view as an OpenAI Chat request (adapter) → the model (here: the recorded answer)
 * → its messages and usage back through the adapter → observeUsage → tool calls answered, ctxfold's
 * own read_tool_result by the dispatcher, the others from the trace.
 *
 *   node dist/esm/examples/agent_loop.js TRACE.json [host:port]
 */
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import {
  CtxfoldClient,
  type MessageInput,
  type OpenAIChatRequest,
  type OpenAIChatResponse,
  type View,
  dispatchToolCall,
  fromOpenAIChat,
  sessionConfig,
  toOpenAIChat,
  toolDefinitions,
  toolResultMessage,
  userMessage,
} from "@ctxfold/client";

/** One message of a recorded trace (OpenAI chat format). */
interface Recorded {
  role: "system" | "user" | "assistant" | "tool";
  content: string | null;
  tool_calls?: { id: string; type: "function"; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
}

/**
 * The model, faked from the recording: it answers with the recorded assistant message, except
 * that when the newest tool result is one ctxfold shortened, it first reads the omitted part with
 * read_tool_result, as the marker in the result tells it to. It bills `promptTokens` of input.
 */
function recordedModel(request: OpenAIChatRequest, recorded: Recorded, promptTokens: number): OpenAIChatResponse {
  const last = request.messages.at(-1);
  const usage = { prompt_tokens: promptTokens, completion_tokens: 64, prompt_tokens_details: { cached_tokens: 0 } };
  const fromAgentTool = last?.role === "tool" && !last.tool_call_id?.startsWith("read_");
  const marker = fromAgentTool ? /ReadToolResult\(result_ref="([^"]+)"(?:, offset=(\d+))?/.exec(last.content ?? "") : null;
  if (marker) {
    const args = JSON.stringify({ result_ref: marker[1], offset: Number(marker[2] ?? 0) });
    const call = { id: `read_${marker[1]}`, type: "function" as const, function: { name: "read_tool_result", arguments: args } };
    return { choices: [{ message: { content: null, tool_calls: [call] }, finish_reason: "tool_calls" }], usage };
  }
  return { choices: [{ message: recorded, finish_reason: recorded.tool_calls?.length ? "tool_calls" : "stop" }], usage };
}

export interface LoopResult {
  sessionId: string;
  turns: number;
  folds: number;
  reads: number;
  lastView: View | undefined;
}

/** Replays the trace at `tracePath` through ctxfold and returns what happened. */
export async function runAgentLoop(client: CtxfoldClient, tracePath: string, log: (line: string) => void = console.log): Promise<LoopResult> {
  const trace = JSON.parse(readFileSync(tracePath, "utf8")) as { messages: Recorded[]; tools?: unknown[] };
  const [system, ...messages] = trace.messages;
  const tools = [...(trace.tools ?? []), ...toolDefinitions("openai_chat")];
  const session = await client.createSession(
    sessionConfig(16000).systemPrompt(system?.content ?? "").tools(tools).toolContentMaxBytes(4096).maxOutputTokens(512),
  );
  const recordedResults = new Map(messages.filter((m) => m.role === "tool").map((m) => [m.tool_call_id, m.content ?? ""]));
  const result: LoopResult = { sessionId: session.id, turns: 0, folds: 0, reads: 0, lastView: undefined };
  let pending: MessageInput[] = [];

  for (const recorded of messages) {
    if (recorded.role === "user") pending.push(userMessage(recorded.content ?? ""));
    if (recorded.role !== "assistant") continue; // tool results come from the tools below
    for (let answered = false; !answered; ) {
      const view = await client.prepare(session.id, {
        append: pending,
        onProgress: (p) => log(`  ${p.stage} ${p.passIndex}/${p.passesPlanned} ${p.tokensBefore} -> ${p.tokensAfter} tokens`),
      });
      log(`turn ${++result.turns}: ${view.messages.length} messages, ~${view.estimatedTokens} tokens, ${view.action}`);
      if (view.action === "ACTION_FOLDED") result.folds++;
      const request = { model: "recorded", ...toOpenAIChat(view), tools };
      const reply = fromOpenAIChat(recordedModel(request, recorded, view.estimatedTokens));
      await client.observeUsage(session.id, view, reply.usage);
      pending = [...reply.messages];
      answered = true;
      for (const call of reply.messages.flatMap((m) => m.toolCalls)) {
        const answer = await dispatchToolCall(client, session.id, call);
        if (answer !== undefined) {
          result.reads++;
          answered = false; // the model read a result back; the recorded answer is still to come
        }
        pending.push(toolResultMessage(call.id, answer ?? recordedResults.get(call.id) ?? ""));
      }
      result.lastView = view;
    }
  }
  await client.appendMessages(session.id, pending);
  return result;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [tracePath, address = "127.0.0.1:50051"] = process.argv.slice(2);
  if (!tracePath) throw new Error("usage: agent_loop.js TRACE.json [host:port]");
  const client = new CtxfoldClient({ address, token: process.env.CTXFOLD_TOKEN });
  try {
    const r = await runAgentLoop(client, tracePath);
    console.log(`done: ${r.turns} model turns, ${r.folds} folds, ${r.reads} results read back with read_tool_result`);
  } finally {
    client.close();
  }
}

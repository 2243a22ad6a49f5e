/**
 * The ctxfold agent loop over a recorded trace: the same program in every SDK's README.
 *
 *   node agent_loop.js TRACE.json [HOST:PORT]
 *
 * A recorded coding-agent run stands in for the model and its tools: each model call answers with
 * the trace's next assistant message (as an OpenAI Chat Completions response), and the recorded tool
 * outputs answer the tool calls. When the last tool result came back truncated, the fake model first
 * reads it with the read_tool_result tool, which the SDK's dispatcher answers.
 */
import { readFileSync } from "node:fs";
import {
  CtxfoldClient,
  type FoldProgress,
  type MessageInput,
  type OpenAIChatRequest,
  type OpenAIChatResponse,
  type View,
  fromOpenAIChat,
  fromOpenAIChatMessages,
  sessionConfig,
  toOpenAIChat,
  toolDefinitions,
  toolResultMessage,
} from "@ctxfold/client";

/** A message of the recorded trace (OpenAI Chat format). */
interface Recorded {
  role: "system" | "user" | "assistant" | "tool";
  content: string | null;
  tool_calls?: { id: string; type: "function"; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
}

function printProgress(event: FoldProgress): void {
  if (!event.summaryDelta) {
    console.log(`  fold ${event.stage}: ${event.tokensBefore} -> ${event.tokensAfter} tokens. ${event.message}`);
  }
}

/** The fake model's token count: a quarter of the UTF-8 bytes of `value` as compact JSON. */
function tokens(value: unknown): number {
  return Math.floor(Buffer.byteLength(JSON.stringify(value)) / 4);
}

/** A Chat Completions response: a read_tool_result call for a truncated last tool result, else the next recorded assistant message (taken off `turns`). */
function fakeModel(request: OpenAIChatRequest, view: View, turns: Recorded[]): OpenAIChatResponse {
  const last = view.messages.at(-1)!;
  let message: Recorded;
  if (last.truncated && !last.toolCallId.startsWith("read_")) {
    const args = JSON.stringify({ result_ref: last.resultRef });
    const call = { id: `read_${last.seq}`, type: "function" as const, function: { name: "read_tool_result", arguments: args } };
    message = { role: "assistant", content: null, tool_calls: [call] };
  } else {
    message = turns.shift()!;
  }
  const usage = { prompt_tokens: tokens(request), completion_tokens: tokens(message) };
  const finishReason = message.tool_calls?.length ? "tool_calls" : "stop";
  return { choices: [{ message, finish_reason: finishReason }], usage };
}

async function main(client: CtxfoldClient, tracePath: string): Promise<void> {
  const trace = JSON.parse(readFileSync(tracePath, "utf8")) as { messages: Recorded[]; tools: unknown[] };
  const recorded = trace.messages;
  const outputs = new Map(recorded.filter((m) => m.role === "tool").map((m) => [m.tool_call_id, m.content ?? ""]));
  const turns = recorded.slice(1).filter((m) => m.role === "user" || m.role === "assistant");
  const config = sessionConfig(12000)
    .maxOutputTokens(1024)
    .toolContentMaxBytes(4096)
    .systemPrompt(recorded[0]!.content ?? "")
    .tools([...trace.tools, ...toolDefinitions("openai_chat")]);
  const session = await client.createSession(config);
  console.log(`session ${session.id}: ${turns.length} recorded turns`);
  let pending: MessageInput[] = [];
  let view: View | undefined;
  let calls = 0;
  let folds = 0;
  let reads = 0;
  while (turns.length > 0) {
    if (turns[0]!.role === "user") {
      pending.push(...fromOpenAIChatMessages([turns.shift()!]));
      continue;
    }
    view = await client.prepare(session.id, { append: pending, onProgress: printProgress });
    if (view.action === "ACTION_FOLDED") folds++;
    const response = fakeModel(toOpenAIChat(view, { tools: session.config.toolsJson }), view, turns);
    const reply = fromOpenAIChat(response);
    await client.observeUsage(session.id, view, reply.usage);
    calls++;
    pending = [...reply.messages];
    for (const call of reply.messages[0]!.toolCalls) {
      const answer = await client.dispatchToolCall(session.id, call);
      if (answer !== undefined) reads++;
      pending.push(toolResultMessage(call.id, answer ?? outputs.get(call.id) ?? "(no output recorded)"));
    }
  }
  await client.appendMessages(session.id, pending);
  console.log(`${calls} model calls, ${folds} folds, ${reads} read_tool_result calls; last view: ${view?.messages.length} messages, ~${view?.estimatedInputTokens} input tokens`);
}

const client = new CtxfoldClient({ address: process.argv[3] ?? "127.0.0.1:50051" });
try {
  await main(client, process.argv[2]!);
} finally {
  client.close();
}

/**
 * A runnable agent loop against ctxfold, with a fake model (canned answers) and a fake tool.
 *
 *   CTXFOLD_ADDRESS=127.0.0.1:50051 [CTXFOLD_TOKEN=…] node dist/examples/agent_loop.js
 *
 * Each step: prepare (appending the user turn, or the previous answer and its tool results) →
 * "call the model" with the prepared view → observe usage → run the tools the model asked for.
 * The window is small (4000 tokens) so the history soon folds into a summary checkpoint.
 */
import { pathToFileURL } from "node:url";
import {
  Action,
  CtxfoldClient,
  FoldStage,
  type FoldProgress,
  type MessageInput,
  type PreparedView,
  assistantMessage,
  sessionConfig,
  toolCall,
  toolResultMessage,
  userMessage,
} from "@ctxfold/client";

/** What the (fake) model answered. */
interface ModelAnswer {
  content: string;
  toolCalls: { id: string; name: string; arguments: Record<string, unknown> }[];
  usage: { inputTokens: number; outputTokens: number; finishReason: string };
}

/**
 * A stand-in for the provider: a script of canned answers. It asks to list one directory per
 * call until it has made `steps` calls, then answers. A real agent would send `view.messages`
 * (and `view.promptCacheKey`) to its model here and get the usage back from the provider.
 */
class FakeModel {
  private calls = 0;
  constructor(private readonly steps: number) {}

  complete(view: PreparedView): ModelAnswer {
    const usage = { inputTokens: Number(view.estimatedTokens), outputTokens: 40, finishReason: "tool_calls" };
    if (this.calls < this.steps) {
      this.calls++;
      const id = `call_${this.calls}`;
      return { content: "", toolCalls: [{ id, name: "list_files", arguments: { dir: `src/module_${this.calls}` } }], usage };
    }
    return {
      content: `Listed ${this.steps} directories; the biggest file is in src/module_3.`,
      toolCalls: [],
      usage: { ...usage, finishReason: "stop" },
    };
  }
}

/** A fake tool: a ~1500-character directory listing with varied names and sizes. */
export function listFiles(dir: string): string {
  const lines: string[] = [];
  for (let i = 0; lines.join("\n").length < 1500; i++) {
    const size = ((i * 7919 + dir.length * 104729) % 90000) + 120;
    lines.push(`-rw-r--r--  1 agent staff ${String(size).padStart(6)} 2025-01-${String((i % 28) + 1).padStart(2, "0")} ${dir}/part_${i}_${(size % 97).toString(36)}.ts`);
  }
  return lines.join("\n");
}

export interface AgentLoopOptions {
  /** Tool-call steps before the final answer (default 8). */
  steps?: number;
  /** Log lines (default console.log). */
  log?: (line: string) => void;
}

export interface AgentLoopResult {
  sessionId: string;
  /** Every FoldProgress event seen, in order. */
  progress: FoldProgress[];
  /** The action of each prepare, in order. */
  actions: Action[];
  /** How many prepared views arrived as deltas. */
  deltas: number;
  finalAnswer: string;
  lastView: PreparedView;
}

/** Runs one task through the agent loop and returns what happened. */
export async function runAgentLoop(client: CtxfoldClient, options: AgentLoopOptions = {}): Promise<AgentLoopResult> {
  const steps = options.steps ?? 8;
  const log = options.log ?? console.log;
  const session = await client.createSession(
    sessionConfig(4000).maxOutputTokens(256).systemPrompt("You are a careful coding agent. Use tools to inspect the repository.").model("fake-model"),
  );
  log(`session ${session.id}`);

  const progress: FoldProgress[] = [];
  const actions: Action[] = [];
  let deltas = 0;
  const model = new FakeModel(steps);
  let pending: MessageInput[] = [userMessage("List the source directories and tell me where the biggest file is.")];

  for (let step = 0; step <= steps + 1; step++) {
    // 1. Append what is new and get the view that fits the window (folding if needed).
    const view = await client.prepare(session.id, {
      append: pending,
      onProgress: (p) => {
        progress.push(p);
        const detail = p.stage === FoldStage.SUMMARY_DELTA ? `${p.summaryDelta.length} chars of summary` : p.message;
        log(`  fold ${FoldStage[p.stage]} (pass ${p.passIndex}/${p.passesPlanned}): ${detail}`);
      },
    });
    actions.push(view.action);
    if (view.delta) deltas++;
    log(`step ${step}: ${view.messages.length} messages, ~${view.estimatedTokens} tokens, action ${Action[view.action]}${view.delta ? " (delta)" : ""}`);

    // 2. Call the model with view.messages (fake).
    const answer = model.complete(view);

    // 3. Report the provider's usage for that view.
    await client.observeUsage(session.id, { viewVersion: view.viewVersion, ...answer.usage });

    // 4. Run the tools it asked for; their results go with the answer into the next prepare.
    const assistant = assistantMessage(
      answer.content,
      answer.toolCalls.map((c) => toolCall(c.id, c.name, c.arguments)),
    );
    if (answer.toolCalls.length === 0) {
      await client.append(session.id, [assistant]);
      log(`answer: ${answer.content}`);
      return { sessionId: session.id, progress, actions, deltas, finalAnswer: answer.content, lastView: view };
    }
    pending = [assistant, ...answer.toolCalls.map((c) => toolResultMessage(c.id, listFiles(String(c.arguments.dir))))];
  }
  throw new Error("the fake model never answered");
}

// Run directly: node dist/examples/agent_loop.js
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const client = new CtxfoldClient({
    address: process.env.CTXFOLD_ADDRESS ?? "127.0.0.1:50051",
    token: process.env.CTXFOLD_TOKEN,
    timeoutMs: 30_000,
  });
  try {
    const result = await runAgentLoop(client);
    console.log(`done: ${result.actions.filter((a) => a === Action.FOLDED).length} fold(s), ${result.progress.length} progress events, ${result.deltas} delta views`);
  } finally {
    client.close();
  }
}

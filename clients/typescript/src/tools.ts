/**
 * Tools the model can call: `read_tool_result` (page through any stored result whose
 * `result_ref` the view shows — a bounded tool result, a pruned one, the folded-results index)
 * and `context_budget` (how full the window is). The definitions come in the three provider
 * formats; `client.dispatchToolCall()` answers such a call with the text to append as its tool
 * result, and the adapters offer read_tool_result in a request whose view hides a result.
 */
import { type CtxfoldError, ErrorReason, invalidArgument, isCtxfoldError } from "./errors.js";
import type { Message, ToolResultPage, View } from "./model.js";

export const READ_TOOL_RESULT = "read_tool_result";
export const CONTEXT_BUDGET = "context_budget";

/** The provider formats of toolDefinitions(). */
export type ToolFormat = "openai_chat" | "openai_responses" | "anthropic";

interface ToolSpec {
  name: string;
  description: string;
  parameters: { type: "object"; properties: Record<string, unknown>; required?: string[] };
}

const SPECS: readonly ToolSpec[] = [
  {
    name: READ_TOOL_RESULT,
    description:
      "Read a stored tool result by its result_ref, one page at a time. Use it when the context shows " +
      "a result_ref for output that was shortened or folded away, including the folded-results index.",
    parameters: {
      type: "object",
      properties: {
        result_ref: { type: "string", description: "The result_ref named in the context." },
        offset: {
          type: "integer",
          minimum: 0,
          default: 0,
          description: "UTF-8 byte offset to read from; each page names the next offset.",
        },
      },
      required: ["result_ref"],
    },
  },
  {
    name: CONTEXT_BUDGET,
    description:
      "Report how full the context window is: the tokens of the current context, the level at which " +
      "older history is folded into a summary, and the hard limit.",
    parameters: { type: "object", properties: {} },
  },
];

/** The definitions of read_tool_result and context_budget in a provider's tool format. */
export function toolDefinitions(format: ToolFormat): Record<string, unknown>[] {
  return SPECS.map((spec) => {
    switch (format) {
      case "openai_chat":
        return { type: "function", function: { name: spec.name, description: spec.description, parameters: spec.parameters } };
      case "openai_responses":
        // Responses function tools default to strict, whose schemas cannot have optional fields (offset).
        return { type: "function", name: spec.name, description: spec.description, parameters: spec.parameters, strict: false };
      case "anthropic":
        return { name: spec.name, description: spec.description, input_schema: spec.parameters };
      default:
        throw invalidArgument(
          ErrorReason.INVALID_CLIENT_ARGUMENT,
          "format",
          `unknown tool format ${JSON.stringify(format)}: openai_chat, openai_responses or anthropic`,
        );
    }
  });
}

/**
 * Whether the view shows something only in part that read_tool_result reads whole: a bounded or
 * pruned message, or a summary (whose folded-results index names the folded results).
 */
function hidesResults(view: View): boolean {
  return view.foldedResultsRef !== "" || view.messages.some((m: Message) => m.truncated || m.pruned || m.summary);
}

/** The name of a tool definition in any of the three formats. */
function toolName(tool: unknown): unknown {
  const t = tool as { name?: unknown; function?: { name?: unknown } } | null;
  return t?.function?.name ?? t?.name;
}

/**
 * @internal The tools of a provider request: the session's (an array, or its JSON text), then the
 * read_tool_result definition of `format` when the view hides a result and no tool of that name is given.
 */
export function requestTools(tools: string | readonly unknown[] | undefined, view: View, format: ToolFormat): unknown[] {
  let given: unknown;
  try {
    given = typeof tools === "string" ? (tools === "" ? [] : JSON.parse(tools)) : [...(tools ?? [])];
  } catch (err) {
    throw invalidArgument(ErrorReason.INVALID_CONFIG, "tools", `not JSON (${(err as Error).message})`);
  }
  if (!Array.isArray(given)) throw invalidArgument(ErrorReason.INVALID_CONFIG, "tools", "tools must be a JSON array");
  if (hidesResults(view) && !given.some((tool) => toolName(tool) === READ_TOOL_RESULT)) {
    given.push(toolDefinitions(format)[0]);
  }
  return given;
}

/** True for the names of the tools above. */
export function isCtxfoldTool(name: string): boolean {
  return SPECS.some((spec) => spec.name === name);
}

/** A model's tool call: its name and arguments (the JSON text the model wrote, or parsed). */
export interface ToolCallRequest {
  name: string;
  arguments: string | Readonly<Record<string, unknown>>;
}

/** The answers to a model's mistake, which the model can act on (other failures throw). */
const MODEL_MISTAKES: ReadonlySet<string> = new Set([
  ErrorReason.RESULT_REF_REQUIRED,
  ErrorReason.RESULT_REF_NOT_FOUND,
  ErrorReason.RESULT_REF_AMBIGUOUS,
  ErrorReason.OFFSET_OUT_OF_RANGE,
  ErrorReason.OFFSET_NOT_CHAR_BOUNDARY,
  ErrorReason.INVALID_REQUEST,
]);

/** @internal Whether `err` refused a call as the model's mistake (the dispatcher answers those). */
export function isModelMistake(err: unknown): err is CtxfoldError {
  return isCtxfoldError(err) && MODEL_MISTAKES.has(err.reason);
}

/** A parsed call: what to read, or the answer to a malformed call. */
type ParsedCall = { kind: "read"; resultRef: string; offset: number } | { kind: "budget" } | { kind: "bad"; answer: string };

/** The call of a ctxfold tool (undefined when `name` is not one: the agent runs its own tools). */
export function parseToolCall(call: ToolCallRequest): ParsedCall | undefined {
  if (!isCtxfoldTool(call.name)) {
    return undefined;
  }
  let decoded: unknown;
  if (typeof call.arguments === "string") {
    try {
      decoded = JSON.parse(call.arguments || "{}");
    } catch (err) {
      return { kind: "bad", answer: `error: invalid arguments: not JSON (${(err as Error).message})` };
    }
  } else {
    decoded = call.arguments;
  }
  if (typeof decoded !== "object" || decoded === null || Array.isArray(decoded)) {
    return { kind: "bad", answer: "error: invalid arguments: expected a JSON object" };
  }
  if (call.name === CONTEXT_BUDGET) {
    return { kind: "budget" };
  }
  const { result_ref: ref, offset = 0 } = decoded as { result_ref?: unknown; offset?: unknown };
  if (typeof ref !== "string" || ref === "") {
    return { kind: "bad", answer: 'error: invalid arguments: "result_ref" (a string from the context) is required' };
  }
  if (typeof offset !== "number" || !Number.isSafeInteger(offset) || offset < 0) {
    return { kind: "bad", answer: 'error: invalid arguments: "offset" must be a non-negative integer' };
  }
  return { kind: "read", resultRef: ref, offset };
}

/** The page's text, with a footer naming the next offset when the result continues. */
export function pageAnswer(page: ToolResultPage): string {
  if (page.complete) {
    return page.data;
  }
  return (
    `${page.data}\n\n[${READ_TOOL_RESULT}: bytes ${page.offset}-${page.nextOffset} of ${page.totalBytes}; ` +
    `call ${READ_TOOL_RESULT} with result_ref "${page.resultRef}" and offset ${page.nextOffset} for more]`
  );
}

/** The answer of context_budget for the last view this client prepared. */
export function budgetAnswer(view: View | undefined): string {
  if (view === undefined) {
    return "error: no context prepared by this client yet";
  }
  return JSON.stringify({ estimated_tokens: view.estimatedTokens, trigger_tokens: view.triggerTokens, hard_limit_tokens: view.hardLimitTokens });
}

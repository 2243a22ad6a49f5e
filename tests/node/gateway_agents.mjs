// Agent loops written against the official OpenAI and Anthropic Node SDKs, pointed at the gateway
// (argv[2]) with nothing else changed. tests/test_gateway_node.py scripts the fake upstream behind
// it, runs this file and checks what the upstream received; this prints what the agent saw as JSON.
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

const gateway = process.argv[2];
const out = {};

async function chatLoop() {
  const openai = new OpenAI({ baseURL: `${gateway}/v1`, apiKey: "sk-node", maxRetries: 0,
                              defaultHeaders: { "x-ctxfold-session": "node-chat" } });
  const tools = [{ type: "function", function: { name: "read_file", parameters: { type: "object" } } }];
  const messages = [{ role: "system", content: "You are terse." }, { role: "user", content: "Read a.py and b.py." }];
  const stream = await openai.chat.completions.create({ model: "gpt-4.1", messages, tools, stream: true });
  const calls = [];
  for await (const chunk of stream) {
    for (const call of chunk.choices[0]?.delta?.tool_calls ?? []) {
      calls[call.index] ??= { id: call.id, type: "function", function: { name: "", arguments: "" } };
      calls[call.index].function.name += call.function?.name ?? "";
      calls[call.index].function.arguments += call.function?.arguments ?? "";
    }
  }
  messages.push({ role: "assistant", content: null, tool_calls: calls });
  for (const call of calls) messages.push({ role: "tool", tool_call_id: call.id, content: `text of ${call.id}` });
  const { data, response } = await openai.chat.completions.create({ model: "gpt-4.1", messages, tools }).withResponse();
  out.chat = { calls: calls.length, answer: data.choices[0].message.content,
               session: response.headers.get("x-ctxfold-session"), sent: messages };
}

async function anthropicLoop() {
  const anthropic = new Anthropic({ baseURL: gateway, apiKey: "sk-ant-node", maxRetries: 0,
                                    defaultHeaders: { "x-ctxfold-session": "node-anthropic" } });
  const request = { model: "claude-sonnet-4-6", max_tokens: 2048, system: "You are terse.",
                    thinking: { type: "enabled", budget_tokens: 1024 },
                    tools: [{ name: "bash", input_schema: { type: "object" } }] };
  const messages = [{ role: "user", content: "What is in this folder?" }];
  const first = await anthropic.messages.create({ ...request, messages });
  messages.push({ role: "assistant", content: first.content });
  const use = first.content.find((block) => block.type === "tool_use");
  messages.push({ role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "a.py b.py" }] });
  const stream = anthropic.messages.stream({ ...request, messages });
  const final = await stream.finalMessage();
  out.anthropic = { signature: first.content.find((block) => block.type === "thinking").signature,
                    answer: final.content.find((block) => block.type === "text").text };
}

async function responsesLoop() {
  const openai = new OpenAI({ baseURL: `${gateway}/v1`, apiKey: "sk-node", maxRetries: 0,
                              defaultHeaders: { "x-ctxfold-session": "node-responses" } });
  const input = [{ role: "user", content: "List the files." }];
  const first = await openai.responses.create({ model: "o4-mini", instructions: "Be brief.", input, store: false });
  input.push(...first.output);
  const call = first.output.find((item) => item.type === "function_call");
  input.push({ type: "function_call_output", call_id: call.call_id, output: "a.py b.py" });
  let text = "";
  const events = await openai.responses.create({ model: "o4-mini", instructions: "Be brief.", input, store: false,
                                                 stream: true });
  for await (const event of events) if (event.type === "response.output_text.delta") text += event.delta;
  out.responses = { answer: text, items: input.length };
}

await chatLoop();
await anthropicLoop();
await responsesLoop();
console.log(JSON.stringify(out));

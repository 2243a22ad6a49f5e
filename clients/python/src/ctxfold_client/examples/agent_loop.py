"""The ctxfold agent loop over a recorded trace: the same program in every SDK's README.

    python agent_loop.py TRACE.json [HOST:PORT]

A recorded coding-agent run stands in for the model and its tools: each model call answers with the
trace's next assistant message (as an OpenAI Chat Completions response), and the recorded tool
outputs answer the tool calls. When the last tool result came back truncated, the fake model first
reads it with the read_tool_result tool, which the SDK's dispatcher answers.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ctxfold_client import (
    Client,
    FoldProgress,
    Message,
    SessionConfig,
    View,
    adapters,
    tool_definitions,
    tool_result,
)

chat = adapters.openai_chat


def print_progress(event: FoldProgress) -> None:
    if not event.summary_delta:
        print(f"  fold {event.stage}: {event.tokens_before} -> {event.tokens_after} tokens. {event.message}")


def tokens(value: Any) -> int:
    """The fake model's token count: a quarter of the UTF-8 bytes of `value` as compact JSON."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()) // 4


def fake_model(request: dict[str, Any], view: View, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """A Chat Completions response: a read_tool_result call for a truncated last tool result, else
    the next recorded assistant message (taken off `turns`)."""
    last = view.messages[-1]
    if last.truncated and not last.tool_call_id.startswith("read_"):
        arguments = json.dumps({"result_ref": last.result_ref})
        call = {
            "id": f"read_{last.seq}",
            "type": "function",
            "function": {"name": "read_tool_result", "arguments": arguments},
        }
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
    else:
        message = turns.pop(0)
    usage = {"prompt_tokens": tokens(request), "completion_tokens": tokens(message)}
    finish_reason = "tool_calls" if message.get("tool_calls") else "stop"
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}], "usage": usage}


def main(trace_path: str, address: str) -> int:
    with open(trace_path, encoding="utf-8") as file:
        trace = json.load(file)
    recorded = trace["messages"]
    outputs = {m["tool_call_id"]: m["content"] for m in recorded if m["role"] == "tool"}
    turns = [m for m in recorded[1:] if m["role"] in ("user", "assistant")]
    config = SessionConfig(
        context_window=12000,
        max_output_tokens=1024,
        tool_content_max_bytes=4096,
        system_prompt=recorded[0]["content"],
        tools=trace["tools"] + tool_definitions("openai_chat"),
    )
    with Client(address) as client:
        session = client.create_session(config)
        print(f"session {session.id}: {len(turns)} recorded turns")
        pending: list[Message] = []
        calls = folds = reads = 0
        while turns:
            if turns[0]["role"] == "user":
                pending.extend(chat.from_messages([turns.pop(0)]))
                continue
            view = client.prepare(session.id, pending, on_progress=print_progress)
            folds += view.folded
            response = fake_model(chat.to_request(view, tools=session.config.tools), view, turns)
            reply = chat.from_response(response)
            client.observe_usage(session.id, view, reply.usage)
            calls += 1
            pending = list(reply.messages)
            for call in reply.messages[0].tool_calls:
                answer = client.dispatch_tool_call(session.id, call.name, call.arguments)
                reads += answer is not None
                output = answer if answer is not None else outputs.get(call.id, "(no output recorded)")
                pending.append(tool_result(call.id, output))
        client.append_messages(session.id, pending)
        print(
            f"{calls} model calls, {folds} folds, {reads} read_tool_result calls; last view: "
            f"{len(view.messages)} messages, ~{view.estimated_input_tokens} input tokens"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1:50051"))

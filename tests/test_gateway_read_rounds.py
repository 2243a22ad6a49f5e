"""The read tool answered inside the gateway: when the view hides a result (here a tool result over
the session's bound), `read_tool_result` is offered; the model's calls of it are answered from
ReadToolResult and the upstream asked again, streamed or not, in all three APIs, and the agent
sees one ordinary answer without a tool it did not define."""

from __future__ import annotations

import re
from typing import Any

import openai
import orjson
import pytest

from ctxfold.engine import estimator
from fake_upstream import CHAT, MESSAGES, RESPONSES, Call, Reply
from gateway_fixtures import Stack, anthropic_agent, openai_agent, stack

__all__ = ["stack"]

BASH_CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
BIG_RESULT = "\n".join(f"line {n}: nothing unusual here" for n in range(2000)) + "\nline 2000: THE NEEDLE\n"


def reads_first(body: dict[str, Any]) -> Reply:
    """Reads the first result ref the request shows, unless it holds a read answer already."""
    text = orjson.dumps(body).decode()
    refs = re.findall(r"tr_[a-z2-7]{16}", text)
    offered = "read_tool_result" in orjson.dumps(body.get("tools", [])).decode()
    if offered and refs and "read_tool_result: bytes" not in text:
        return Reply(
            text="Let me look.",
            calls=(Call("read_1", "read_tool_result", orjson.dumps({"result_ref": refs[0]}).decode()),),
        )
    return Reply(text="Found it.")


def answered_reads(path: str, stack: Stack) -> list[str]:
    return [
        s.raw.decode() for s in stack.upstream.seen if s.path == path and "read_tool_result: bytes" in s.raw.decode()
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_chat(stack: Stack, stream: bool) -> None:
    agent = openai_agent(stack.url, f"read-chat-{stream}", "sk-r")
    stack.upstream.reply(CHAT, reads_first, reads_first)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "Find the needle in the log."},
        {"role": "assistant", "content": None, "tool_calls": [BASH_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": BIG_RESULT},
    ]  # fmt: skip
    if stream:
        chunks = [
            c
            async for c in await agent.chat.completions.create(
                model="gpt-4.1", messages=messages, tools=tools, stream=True
            )
        ]  # type: ignore[arg-type]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    else:
        raw = await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=messages, tools=tools)  # type: ignore[arg-type]
        assert raw.headers["x-ctxfold-read-rounds"] == "1"
        message = raw.parse().choices[0].message
        text, calls = message.content or "", message.tool_calls
        assert not calls
    assert text.endswith("Found it.")
    assert answered_reads(CHAT, stack)


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic(stack: Stack, stream: bool) -> None:
    agent = anthropic_agent(stack.url, f"read-anthropic-{stream}", "sk-r")
    stack.upstream.reply(MESSAGES, reads_first, reads_first)
    messages = [
        {"role": "user", "content": "Find the needle in the log."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": BIG_RESULT}]},
    ]
    request = {"model": "claude-sonnet-4-6", "max_tokens": 1024, "messages": messages,
               "tools": [{"name": "bash", "input_schema": {"type": "object"}}]}  # fmt: skip
    if stream:
        async with agent.messages.stream(**request) as events:  # type: ignore[arg-type]
            message = await events.get_final_message()
    else:
        message = await agent.messages.create(**request)  # type: ignore[arg-type]
    # a stream shows every round's text; a JSON answer is the last round's
    expected = ["Let me look.", "Found it."] if stream else ["Found it."]
    assert [b.text for b in message.content if b.type == "text"] == expected
    assert message.stop_reason == "end_turn"
    assert answered_reads(MESSAGES, stack)


@pytest.mark.parametrize("stream", [False, True])
async def test_responses(stack: Stack, stream: bool) -> None:
    agent = openai_agent(stack.url, f"read-responses-{stream}", "sk-r")
    stack.upstream.reply(RESPONSES, reads_first, reads_first)
    items = [
        {"role": "user", "content": "Find the needle in the log."},
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": BIG_RESULT},
    ]
    if stream:
        async with agent.responses.stream(model="gpt-5", input=items) as events:  # type: ignore[arg-type]
            numbers = [e.sequence_number async for e in events]
            response = await events.get_final_response()
        assert numbers == list(range(len(numbers)))
    else:
        response = await agent.responses.create(model="gpt-5", input=items)  # type: ignore[arg-type]
    assert [i.type for i in response.output] == ["message", "message"] if stream else ["message"]
    assert response.output_text.endswith("Found it.")
    assert answered_reads(RESPONSES, stack)


async def test_the_rounds_are_bounded_and_never_show_the_read_tool(stack: Stack) -> None:
    agent = openai_agent(stack.url, "read-forever", "sk-r")
    forever = Reply(text="Again.", calls=(Call("r", "read_tool_result", '{"result_ref": "tr_aaaaaaaaaaaaaaaa"}'),))
    stack.upstream.reply(CHAT, *[forever] * 10)
    messages = [
        {"role": "user", "content": "Find it."},
        {"role": "assistant", "content": None, "tool_calls": [BASH_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": BIG_RESULT},
    ]  # fmt: skip
    raw = await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=messages)  # type: ignore[arg-type]
    assert raw.headers["x-ctxfold-read-rounds"] == "4"
    choice = raw.parse().choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    stack.upstream.script.pop(CHAT)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_read_gets_only_the_room_the_view_leaves_under_the_trigger(stack: Stack, stream: bool) -> None:
    """A window whose trigger the view nearly fills: the page read is cut to the room left, so the
    round that carries it stays under the trigger (a full 16 KiB page would not)."""
    window = 8000  # the view (~3,100 tokens after a prune) leaves ~2,700 bytes for reading
    agent = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="sk-r", max_retries=0,
                               default_headers={"x-ctxfold-session": f"read-room-{stream}",
                                                "x-ctxfold-context-window": str(window)})  # fmt: skip
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "Find the needle in the log."},
        {"role": "assistant", "content": None, "tool_calls": [BASH_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": BIG_RESULT},
        {"role": "user", "content": "Context: " + "the build runs nightly on four workers. " * 200},
    ]  # fmt: skip
    before = len(stack.upstream.seen)
    stack.upstream.reply(CHAT, reads_first, reads_first)
    try:
        answer = await agent.chat.completions.create(model="gpt-4.1", messages=messages, tools=tools, stream=stream)  # type: ignore[call-overload]
        if stream:
            [chunk async for chunk in answer]
    finally:
        stack.upstream.script.pop(CHAT, None)
    rounds = [s for s in stack.upstream.seen[before:] if s.path == CHAT]
    assert len(rounds) == 2 and "read_tool_result: bytes" in rounds[1].raw.decode()  # read, cut short
    read = next(m["content"] for m in rounds[1].body["messages"] if m.get("tool_call_id") == "read_1")
    assert 256 <= len(read.encode()) < 16384
    sizes = [estimator.count_text(orjson.dumps(s.body["messages"]).decode()) for s in rounds]
    assert max(sizes) <= int(window * 0.8), sizes

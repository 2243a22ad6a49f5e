"""The gateway under the official `openai` Python SDK, against the fake upstream: Chat Completions
and Responses, streamed and not, tool-call loops with parallel calls, encrypted reasoning items."""

from __future__ import annotations

import json

import aiohttp
import pytest

from fake_upstream import CHAT, RESPONSES, Call, Reply
from gateway_fixtures import Stack, openai_agent, stack

__all__ = ["stack"]


SYSTEM = {"role": "system", "content": "You are a careful coding agent."}


async def test_a_chat_answer_reaches_the_agent_byte_for_byte(stack: Stack) -> None:
    agent = openai_agent(stack.url, "chat-bytes", "sk-test-1")
    messages = [SYSTEM, {"role": "user", "content": "Say hello."}]
    raw = await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=messages, max_tokens=20_000)  # type: ignore[arg-type]
    assert raw.http_response.content == stack.upstream.sent[-1]
    assert raw.parse().choices[0].message.content == "ok"
    assert raw.headers["x-ctxfold-action"] == "none"
    # What went upstream: a few dozen tokens, without the 20,000 the session reserves for the answer.
    assert 0 < int(raw.headers["x-ctxfold-view-tokens"]) < 100
    session_id = raw.headers["x-ctxfold-session"]
    assert [m.content for m in await stack.transcript(session_id)] == [SYSTEM["content"], "Say hello."]
    upstream = stack.upstream.last(CHAT).body
    assert upstream["messages"] == messages
    assert upstream["prompt_cache_key"]
    assert "authorization" in {k.lower() for k in stack.upstream.last(CHAT).headers}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_loop_with_parallel_calls_appends_each_turn_once(stack: Stack, stream: bool) -> None:
    agent = openai_agent(stack.url, f"chat-tools-{stream}", "sk-test-1")
    calls = (Call("call_a", "read_file", '{"path": "a.py"}'), Call("call_b", "read_file", '{"path": "b.py"}'))
    stack.upstream.reply(CHAT, Reply(text="", calls=calls), Reply(text="Both files are fine."))
    messages: list[dict[str, object]] = [SYSTEM, {"role": "user", "content": "Check a.py and b.py."}]
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    for _ in range(2):
        if stream:
            events = await agent.chat.completions.create(
                model="gpt-4.1", messages=messages, tools=tools, stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )  # fmt: skip
            text, tool_calls = "", {}
            async for chunk in events:
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    for call in choice.delta.tool_calls or []:
                        entry = tool_calls.setdefault(call.index, {"id": call.id, "arguments": "", "name": ""})
                        entry["name"] += call.function.name or "" if call.function else ""
                        entry["arguments"] += call.function.arguments or "" if call.function else ""
            reply = {"role": "assistant", "content": text or None}
            if tool_calls:
                reply["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in tool_calls.values()
                ]
        else:
            answer = await agent.chat.completions.create(model="gpt-4.1", messages=messages, tools=tools)  # type: ignore[arg-type]
            reply = answer.choices[0].message.model_dump(exclude_none=True)
        messages.append(reply)
        for call in reply.get("tool_calls", []):  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"contents of {call['id']}"})
    assert text if stream else True
    final = await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=messages, tools=tools)  # type: ignore[arg-type]
    transcript = await stack.transcript(final.headers["x-ctxfold-session"])
    assert [m.role.name for m in transcript] == ["SYSTEM", "USER", "ASSISTANT", "TOOL", "TOOL", "ASSISTANT"]
    assert [c.id for c in transcript[2].tool_calls] == ["call_a", "call_b"]
    assert stack.upstream.last(CHAT).body["messages"] == messages


async def test_a_streamed_chat_answer_reaches_the_agent_byte_for_byte(stack: Stack) -> None:
    agent = openai_agent(stack.url, "chat-stream-bytes", "sk-test-1")
    stack.upstream.reply(CHAT, Reply(text="A longer answer, streamed in pieces of eight characters."))
    async with agent.chat.completions.with_streaming_response.create(
        model="gpt-4.1",
        messages=[SYSTEM, {"role": "user", "content": "Stream."}],
        stream=True,  # type: ignore[list-item]
    ) as response:
        received = b"".join([chunk async for chunk in response.iter_bytes()])
        assert response.headers["x-ctxfold-action"] == "none"
    assert received == stack.upstream.sent[-1]


async def test_a_custom_tools_call_is_a_call_of_the_transcript_and_goes_upstream_as_sent(stack: Stack) -> None:
    """GPT-5's custom tools in Chat: a call of `type: custom` carries a free-form `input`, which the
    transcript keeps as the call's arguments; the upstream gets the call in its own shape."""
    agent = openai_agent(stack.url, "chat-custom-tool", "sk-test-1")
    patch = "*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = 2\n*** End Patch"
    call = {"id": "call_p", "type": "custom", "custom": {"name": "apply_patch", "input": patch}}
    messages: list[dict[str, object]] = [
        SYSTEM,
        {"role": "user", "content": "Set x to 2."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_p", "content": "Done."},
    ]
    tools = [{"type": "custom", "custom": {"name": "apply_patch"}}]
    raw = await agent.chat.completions.with_raw_response.create(model="gpt-5", messages=messages, tools=tools)  # type: ignore[arg-type]
    assert "x-ctxfold-warning" not in raw.headers, raw.headers["x-ctxfold-warning"]
    transcript = await stack.transcript(raw.headers["x-ctxfold-session"])
    assert [(c.id, c.name, c.arguments) for c in transcript[2].tool_calls] == [("call_p", "apply_patch", patch)]
    assert transcript[3].tool_call_id == "call_p"
    assert stack.upstream.last(CHAT).body["messages"] == messages


async def test_empty_messages_are_kept_in_the_transcript_not_a_reason_to_bypass_ctxfold(stack: Stack) -> None:
    """A model's empty answer, an empty system prompt or user message: the server refuses a message with no
    text, calls or reasoning unless its payload carries JSON, and every request holding one went upstream
    without ctxfold (fail open), none of its messages in the transcript."""
    agent = openai_agent(stack.url, "chat-empty-messages", "sk-test-1")
    messages = [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": ""},
    ]
    raw = await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=messages)  # type: ignore[arg-type]
    assert "x-ctxfold-warning" not in raw.headers, raw.headers["x-ctxfold-warning"]
    transcript = await stack.transcript(raw.headers["x-ctxfold-session"])
    assert [m.content for m in transcript] == ["", "Go.", "", ""]
    assert stack.upstream.last(CHAT).body["messages"] == messages


async def test_a_message_of_a_role_ctxfold_does_not_read_is_forwarded_with_the_request_as_sent(stack: Stack) -> None:
    """The legacy functions API (an assistant's `function_call`, answered by a `function` message): the
    provider judges it; the gateway forwards the request unchanged and says why in its warning header."""
    agent = openai_agent(stack.url, "chat-function-role", "sk-test-1")
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "What is 6 x 7?"},
        {"role": "assistant", "content": None, "function_call": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}},
        {"role": "function", "name": "multiply", "content": "42"},
    ]
    before = len(stack.upstream.seen)
    raw = await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=messages)  # type: ignore[arg-type]
    assert raw.http_response.content == stack.upstream.sent[-1]
    assert "messages[2]" in raw.headers["x-ctxfold-warning"] and "'function'" in raw.headers["x-ctxfold-warning"]
    assert len(stack.upstream.seen) == before + 1
    assert stack.upstream.seen[-1].body == {"model": "gpt-4.1", "messages": messages}


async def test_responses_keep_reasoning_items_and_call_ids_verbatim(stack: Stack) -> None:
    agent = openai_agent(stack.url, "responses-reasoning", "sk-test-1")
    stack.upstream.reply(
        RESPONSES,
        Reply(
            text="", calls=(Call("call_1", "shell", '{"cmd": "ls"}'),), reasoning=(("List files.", "gAAAAB-enc-1=="),)
        ),
        Reply(text="Done."),
    )
    items: list[object] = [{"role": "user", "content": "What is in this folder?"}]
    first = await agent.responses.create(model="o4-mini", instructions="Be brief.", input=items, store=False)  # type: ignore[arg-type]
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": "call_1", "output": "a.py b.py"})
    raw = await agent.responses.with_raw_response.create(
        model="o4-mini", instructions="Be brief.", input=items, store=False
    )  # type: ignore[arg-type]
    assert raw.http_response.content == stack.upstream.sent[-1]
    sent = stack.upstream.last(RESPONSES).body
    assert sent["instructions"] == "Be brief."
    assert sent["input"] == items
    reasoning = next(i for i in sent["input"] if isinstance(i, dict) and i.get("type") == "reasoning")
    assert reasoning["encrypted_content"] == "gAAAAB-enc-1=="
    transcript = await stack.transcript(raw.headers["x-ctxfold-session"])
    assert [m.role.name for m in transcript] == ["SYSTEM", "USER", "ASSISTANT", "TOOL"]
    assert transcript[2].reasoning_content == "List files."
    payload = transcript[2].provider_payload
    assert payload is not None and "gAAAAB-enc-1==" in payload.json
    assert json.loads(payload.json)[1]["id"].startswith("fc_")


async def test_a_local_shell_calls_output_answers_the_call_its_id_names(stack: Stack) -> None:
    """`local_shell_call_output` names its call by `id` (it has no `call_id`): read as a result without a
    call id, the server refused it and every request of the conversation went upstream without ctxfold."""
    agent = openai_agent(stack.url, "responses-local-shell", "sk-test-1")
    items = [
        {"role": "user", "content": "List the files."},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_ls", "status": "completed",
         "action": {"type": "exec", "command": ["ls"], "env": {}}},
        {"type": "local_shell_call_output", "id": "call_ls", "output": "a.py"},
    ]  # fmt: skip
    raw = await agent.responses.with_raw_response.create(model="codex-mini-latest", input=items)  # type: ignore[arg-type]
    assert "x-ctxfold-warning" not in raw.headers, raw.headers["x-ctxfold-warning"]
    transcript = await stack.transcript(raw.headers["x-ctxfold-session"])
    assert [(c.id, c.name) for c in transcript[1].tool_calls] == [("call_ls", "local_shell")]
    assert (transcript[2].tool_call_id, transcript[2].content) == ("call_ls", "a.py")
    assert stack.upstream.last(RESPONSES).body["input"] == items


async def test_a_streamed_response_passes_event_by_event(stack: Stack) -> None:
    agent = openai_agent(stack.url, "responses-stream", "sk-test-1")
    stack.upstream.reply(RESPONSES, Reply(text="Streaming through the gateway works."))
    async with agent.responses.stream(model="gpt-5", input="Stream please.") as events:
        text = "".join([e.delta async for e in events if e.type == "response.output_text.delta"])
        final = await events.get_final_response()
    assert text == "Streaming through the gateway works."
    assert final.usage is not None and final.usage.input_tokens > 0


async def test_a_websocket_upgrade_is_refused_at_once_so_the_agent_streams_over_http(stack: Stack) -> None:
    """Codex CLI opens the Responses API as a WebSocket first (GET /v1/responses, Upgrade: websocket).
    The gateway serves HTTP only: 426 Upgrade Required in OpenAI's error shape, and Codex falls back to
    POST with SSE at once; nothing reaches the upstream."""
    before = len(stack.upstream.seen)
    headers = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Authorization": "Bearer sk-test-1"}  # fmt: skip
    async with aiohttp.ClientSession() as http, http.get(f"{stack.url}/v1/responses", headers=headers) as answer:
        assert answer.status == 426
        error = (await answer.json())["error"]
    assert "WebSockets are not served" in error["message"]
    assert len(stack.upstream.seen) == before


@pytest.mark.parametrize("call_id", ["", "call_0"])
async def test_calls_of_empty_or_repeated_ids_are_kept_in_the_transcript_and_go_upstream_as_sent(
    stack: Stack, call_id: str
) -> None:
    """Local models send `id: ""`, or one id for every call of a turn: the server takes a call only with an id of
    its own in its message, and every request holding one went upstream without ctxfold. Canonical gives each
    such call one and each result the call it answers, in order; the upstream gets the agent's ids, a result
    cut to the session's bound (rendered from its fields) too; an edited result rewinds to just before it."""
    agent = openai_agent(stack.url, f"chat-call-ids-{call_id}", "sk-test-1")
    calls = [
        {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": f'{{"n":{n}}}'}} for n in (1, 2)
    ]
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "Run both."},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": call_id, "content": "first " * 20_000},  # over the bound: cut in the view
        {"role": "tool", "tool_call_id": call_id, "content": "second"},
    ]  # fmt: skip
    session_id = ""
    for turn in range(3):
        raw = await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=messages)  # type: ignore[arg-type]
        assert "x-ctxfold-warning" not in raw.headers, raw.headers["x-ctxfold-warning"]
        session_id = raw.headers["x-ctxfold-session"]
        sent = stack.upstream.last(CHAT).body["messages"]
        assert [m.get("tool_call_id") for m in sent] == [m.get("tool_call_id") for m in messages], turn
        assert (
            sent[1]["tool_calls"] == calls and sent[3] == messages[3] and sent[2]["content"] != messages[2]["content"]
        )
        if turn == 0:
            messages += [{"role": "assistant", "content": "Both ran."}, {"role": "user", "content": "Thanks."}]
        elif turn == 1:
            messages[3] = {"role": "tool", "tool_call_id": call_id, "content": "second, edited"}
    transcript = await stack.transcript(session_id)
    own = [call.id for call in transcript[1].tool_calls]
    assert len(set(own)) == 2 and [m.tool_call_id for m in transcript[2:4]] == own
    assert transcript[3].content == "second, edited" and len(transcript) == len(messages)


async def test_results_answering_the_last_requests_calls_are_read_with_the_calls_they_answer(stack: Stack) -> None:
    """A request that ends with the model's calls (a local server takes it), then the same with their results:
    recognized by its bytes, the results were read without the calls and a result of an id left empty named
    none (INVALID_MESSAGE: this turn and every one after it went upstream without ctxfold)."""
    agent = openai_agent(stack.url, "chat-results-after-calls", "sk-test-1")
    call = {"id": "", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a careful coding agent. " * 10},
        {"role": "user", "content": "Run it."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    result = {"role": "tool", "tool_call_id": "", "content": "ran"}
    for added in ([result], [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Again."}], []):
        raw = await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=messages)  # type: ignore[arg-type]
        assert "x-ctxfold-warning" not in raw.headers, raw.headers["x-ctxfold-warning"]
        messages += added
    transcript = await stack.transcript(raw.headers["x-ctxfold-session"])
    assert [m.content for m in transcript] == [m["content"] or "" for m in messages]

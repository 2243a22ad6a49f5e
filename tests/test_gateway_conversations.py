"""Conversations through the gateway over many turns: divergence rewinds (an edit, a retry), folds
(the upstream never gets more than the trigger after the first fold, every message the agent sent
stays in canonical), the read tool answered inside the gateway, errors in the provider's shape,
fail open / fail closed, tenants, and restarts of the gateway and of the server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import re
import threading
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from ctxfold_client import Action, Message, Role, View

from conftest import free_port, settings_for
from ctxfold.engine import estimator
from ctxfold.gateway import contexts as gateway_contexts
from ctxfold.gateway import handler as gateway_handler
from ctxfold.gateway import pieces as gateway_pieces
from ctxfold.gateway import reconcile as gateway_reconcile
from ctxfold.gateway.app import start_gateway
from ctxfold.server import start
from fake_upstream import CHAT, RESPONSES, Call, FakeUpstream, Reply
from gateway_fixtures import Stack, gateway_settings, make_stack, openai_agent, stack

__all__ = ["stack"]

SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


async def ask(agent: openai.AsyncOpenAI, messages: list[dict[str, Any]]) -> Any:
    return await agent.chat.completions.with_raw_response.create(model="gpt-4.1", messages=messages, tools=TOOLS)  # type: ignore[arg-type]


async def test_an_edit_rewinds_and_keeps_the_old_branch_readable(stack: Stack) -> None:
    agent = openai_agent(stack.url, "edit")
    history = [SYSTEM, {"role": "user", "content": "Fix the bug in a.py"}]
    first = await ask(agent, history)
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "Also b.py"}]
    await ask(agent, history)
    edited = [SYSTEM, {"role": "user", "content": "Fix the bug in c.py"}]
    raw = await ask(agent, edited)
    session_id = raw.headers["x-ctxfold-session"]
    assert session_id == first.headers["x-ctxfold-session"]
    assert [m.content for m in await stack.transcript(session_id)] == [SYSTEM["content"], "Fix the bug in c.py"]
    everything = await stack.transcript(session_id, include_abandoned=True)
    assert {m.content for m in everything if m.abandoned} == {"Fix the bug in a.py", "ok", "Also b.py"}


async def test_a_retry_rewinds_to_before_the_answer(stack: Stack) -> None:
    agent = openai_agent(stack.url, "retry")
    history = [SYSTEM, {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "9"},
               {"role": "user", "content": "That is not prime."}]  # fmt: skip
    await ask(agent, history)
    raw = await ask(agent, history[:2])  # the agent drops the bad answer and asks again
    assert [m.content for m in await stack.transcript(raw.headers["x-ctxfold-session"])] == [
        SYSTEM["content"],
        "Name a prime.",
    ]


async def test_a_history_longer_than_one_append_is_kept_whole_and_edited_far_back(stack: Stack) -> None:
    """An agent that comes to the gateway mid-session sends more messages than one append may carry
    (the server's 1000): they are appended in several, and an edit far back re-appends as many."""
    agent = openai_agent(stack.url, "long-history")
    history: list[dict[str, Any]] = [SYSTEM]
    for n in range(1300):
        history += [{"role": "user", "content": f"question {n}"}, {"role": "assistant", "content": f"answer {n}"}]
    history.append({"role": "user", "content": "and now?"})
    raw = await ask(agent, history)
    assert "x-ctxfold-warning" not in raw.headers, raw.headers["x-ctxfold-warning"]
    session_id = raw.headers["x-ctxfold-session"]
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    await ask(agent, history)
    assert [m.content for m in await stack.transcript(session_id)] == [m["content"] for m in history]
    edited = [*history[:3], {"role": "assistant", "content": "another answer 0"}, *history[4:]]
    raw = await ask(agent, edited)
    assert "x-ctxfold-warning" not in raw.headers, raw.headers["x-ctxfold-warning"]
    assert [m.content for m in await stack.transcript(session_id)] == [m["content"] for m in edited]
    abandoned = [m for m in await stack.transcript(session_id, include_abandoned=True) if m.abandoned]
    assert len(abandoned) == len(history) - 3


async def test_a_history_larger_than_one_request_is_kept_whole(stack: Stack) -> None:
    """Tool results that add up to more than the server takes in one request (20 MiB) are appended
    in several requests."""
    agent = openai_agent(stack.url, "large-history")
    history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Read the logs."}]
    for n in range(6):
        call = {"id": f"log_{n}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"log_{n}", "content": f"{n}" * (4 << 20)})
    raw = await ask(agent, history)
    assert "x-ctxfold-warning" not in raw.headers, raw.headers["x-ctxfold-warning"]
    transcript = await stack.transcript(raw.headers["x-ctxfold-session"])
    assert [m.raw_bytes or len(m.content) for m in transcript][3::2] == [4 << 20] * 6


async def test_a_large_request_is_read_reconciled_and_rewritten_off_the_event_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing a history, fingerprinting it, making its new messages canonical, cutting them into appends
    and rewriting it take time in proportion to its messages (seconds for a few hundred thousand small
    ones): for a request of more than `OFFLOAD_MIN_OBJECTS` JSON objects they run in the CPU pool
    (`ctxfold.cpu`), so other agents' requests go on meanwhile; a smaller one's run at once. A resent
    request that inserts that many is not read on the loop as an appended turn: it takes the full path."""
    threads: dict[str, list[str]] = {}

    def recorded(module: Any, name: str) -> None:
        function = getattr(module, name)

        def call(*args: Any) -> Any:
            threads.setdefault(name, []).append(threading.current_thread().name)
            return function(*args)

        monkeypatch.setattr(module, name, call)

    recorded(gateway_handler, "parsed")
    recorded(gateway_handler, "rewritten_upstream")
    recorded(gateway_contexts, "reconciled_request")
    recorded(gateway_reconcile, "append_batches")  # called by reconciled_request
    recorded(gateway_contexts, "new_pieces")
    agent = openai_agent(stack.url, "off-the-loop")
    small = [SYSTEM, {"role": "user", "content": "Count the lines."}]
    await ask(agent, small)
    here = [threading.current_thread().name]
    small_steps = ("parsed", "reconciled_request", "append_batches", "rewritten_upstream")
    assert threads == dict.fromkeys(small_steps, here), threads
    threads.clear()
    lines = range(gateway_pieces.OFFLOAD_MIN_OBJECTS)
    large = [*small, *({"role": "user", "content": f"line {n}"} for n in lines)]
    await ask(agent, [*large, {"role": "user", "content": "Count them now."}])
    assert threads.keys() == {"parsed", "reconciled_request", "append_batches", "rewritten_upstream"}
    assert all(name.startswith("ctxfold-cpu") for names in threads.values() for name in names), threads


async def test_without_a_header_one_conversation_keeps_one_session(stack: Stack) -> None:
    agent = openai_agent(stack.url)
    one = [SYSTEM, {"role": "user", "content": "Task one"}]
    two = [SYSTEM, {"role": "user", "content": "Task two"}]
    first = await ask(agent, one)
    again = await ask(agent, [*one, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}])
    other = await ask(agent, two)
    assert first.headers["x-ctxfold-session"] == again.headers["x-ctxfold-session"]
    assert other.headers["x-ctxfold-session"] != first.headers["x-ctxfold-session"]
    other_key = await ask(openai_agent(stack.url, api_key="sk-another"), one)
    assert other_key.headers["x-ctxfold-session"] != first.headers["x-ctxfold-session"]


async def test_one_session_header_under_two_api_keys_is_two_sessions(stack: Stack) -> None:
    history = [SYSTEM, {"role": "user", "content": "hello"}]
    first = await ask(openai_agent(stack.url, "shared-name", api_key="sk-alice"), history)
    second = await ask(openai_agent(stack.url, "shared-name", api_key="sk-bob"), history)
    assert first.headers["x-ctxfold-session"] != second.headers["x-ctxfold-session"]


def read_then_answer(body: dict[str, Any]) -> Reply:
    """The model reads the first stored result it is shown when the gateway offers the read tool."""
    offered = any(t.get("function", {}).get("name") == "read_tool_result" for t in body.get("tools", []))
    answered = any(
        m.get("role") == "tool" and str(m.get("tool_call_id", "")).startswith("read_") for m in body["messages"]
    )
    refs = re.findall(r"tr_[a-z2-7]{16}", orjson.dumps(body["messages"]).decode())
    if offered and refs and not answered:
        return Reply(
            text="", calls=(Call("read_1", "read_tool_result", orjson.dumps({"result_ref": refs[0]}).decode()),)
        )
    return Reply(text="", calls=(Call(f"call_{len(body['messages'])}", "bash", '{"cmd": "cat big.log"}'),))


async def test_folds_keep_the_upstream_under_the_trigger_and_canonical_whole(stack: Stack) -> None:
    window = 6000
    agent = openai_agent(stack.url, "folding", window=window)
    history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Find the failing line in big.log."}]
    stack.upstream.reply(CHAT, *[read_then_answer] * 60)
    seen_before = len(stack.upstream.seen)
    actions, folded_at = [], None
    for turn in range(24):
        raw = await ask(agent, history)
        sent = list(history)
        actions.append(raw.headers["x-ctxfold-action"])
        view_tokens = int(raw.headers["x-ctxfold-view-tokens"])
        if folded_at is not None:
            assert view_tokens <= int(window * 0.8), f"turn {turn}: {view_tokens} tokens went upstream"
        elif actions[-1] == "folded":
            folded_at = turn
        message = raw.parse().choices[0].message
        assert all(c.function.name != "read_tool_result" for c in message.tool_calls or [])
        # The read tool is offered only with room to read: a read call is never cut from a turn.
        assert message.tool_calls, f"turn {turn}: the model's call was cut"
        history.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            log = "\n".join(f"{turn}:{line} INFO all good at step {line}" for line in range(60))
            history.append({"role": "tool", "tool_call_id": call.id, "content": log})
    stack.upstream.script.pop(CHAT)
    assert folded_at is not None, actions
    session_id = raw.headers["x-ctxfold-session"]
    transcript = await stack.transcript(session_id)
    assert [(m.role.name.lower(), m.content) for m in transcript] == [(m["role"], m.get("content") or "") for m in sent]
    last = stack.upstream.last(CHAT).body
    assert len(last["messages"]) < len(history)
    rounds = [s for s in stack.upstream.seen if s.path == CHAT and '"read_1"' in s.raw.decode()]
    assert rounds, "the read tool was never called"
    assert any('"tool_call_id":"read_1"' in s.raw.decode() for s in rounds)  # answered inside the gateway
    # Every request after the first fold, read rounds too, stays under the trigger (counted on the
    # messages' JSON, a little above ctxfold's own estimate of them).
    chats = [s for s in stack.upstream.seen[seen_before:] if s.path == CHAT]
    folded = next(i for i, s in enumerate(chats) if len(s.body["messages"]) < len(chats[i - 1].body["messages"]))
    sizes = [estimator.count_text(orjson.dumps(s.body["messages"]).decode()) for s in chats[folded:]]
    assert max(sizes) <= int(window * 0.8), sizes


async def test_errors_come_in_the_providers_shape(stack: Stack) -> None:
    agent = openai_agent(stack.url, "errors")
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.post(f"{stack.url}/v1/chat/completions", data=b"{not json") as answer:
            assert answer.status == 400
            assert (await answer.json())["error"]["type"] == "invalid_request_error"
        async with http.post(f"{stack.url}/v1/messages", data=b"[1]") as answer:
            body = await answer.json()
            assert answer.status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    limited = orjson.dumps({"error": {"message": "slow down", "type": "rate_limit_error", "code": None}})
    stack.upstream.reply(CHAT, Reply(status=429, error_body=limited))
    with pytest.raises(openai.RateLimitError) as raised:
        await agent.chat.completions.create(model="gpt-4.1", messages=[SYSTEM, {"role": "user", "content": "hi"}])  # type: ignore[list-item]
    assert raised.value.response.content == limited
    small = openai_agent(stack.url, "too-long", window=1000)
    with pytest.raises(openai.BadRequestError) as too_long:
        messages = [{"role": "system", "content": "rule " * 5000}, {"role": "user", "content": "hi"}]
        await small.chat.completions.create(model="gpt-4.1", messages=messages)  # type: ignore[arg-type]
    assert too_long.value.code == "context_length_exceeded"


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_ctxfold_unreachable_fails_open_or_closed(tmp_path: Path, fail_mode: str) -> None:
    upstream = FakeUpstream()
    await upstream.start()
    settings = gateway_settings(free_port(), upstream, fail_mode=fail_mode, timeout_seconds=2.0)
    gateway = await start_gateway(settings)
    try:
        agent = openai_agent(f"http://127.0.0.1:{gateway.port}", "down")
        messages = [SYSTEM, {"role": "user", "content": "hi"}]
        if fail_mode == "open":
            raw = await ask(agent, messages)
            assert "unreachable" in raw.headers["x-ctxfold-warning"]
            assert upstream.last(CHAT).raw == orjson.dumps({"model": "gpt-4.1", "messages": messages, "tools": TOOLS})
        else:
            with pytest.raises(openai.APIStatusError) as raised:
                await ask(agent, messages)
            assert raised.value.status_code == 503
            assert "unreachable" in raised.value.message
            assert not upstream.seen
    finally:
        await gateway.stop()
        await upstream.stop()


async def test_restarts_of_the_gateway_and_the_server_lose_nothing(tmp_path: Path) -> None:
    async for running in make_stack(tmp_path):
        history = [SYSTEM, {"role": "user", "content": "Long task."}]
        for turn in range(3):
            raw = await ask(openai_agent(running.url, "restarts"), history)
            history += [{"role": "assistant", "content": f"step {turn}"}, {"role": "user", "content": f"go on {turn}"}]
        session_id = raw.headers["x-ctxfold-session"]
        # a new gateway process knows nothing of the session: it reads the transcript's fingerprints
        await running.gateway.stop()
        running.gateway = await start_gateway(gateway_settings(running.server.port, running.upstream))
        raw = await ask(openai_agent(running.url, "restarts"), history)
        assert raw.headers["x-ctxfold-session"] == session_id
        # the server restarts on its database (same port) under the running gateway
        port, database = running.server.port, running.server.settings.database_url()
        await running.server.stop(grace=0.5)
        running.server = await start(dataclasses.replace(settings_for(database), listen=f"127.0.0.1:{port}"))
        history += [{"role": "assistant", "content": "after"}, {"role": "user", "content": "and now?"}]
        raw = await ask(openai_agent(running.url, "restarts"), history)
        assert raw.headers["x-ctxfold-action"] == "none" and "x-ctxfold-warning" not in raw.headers
        everything = await running.transcript(session_id, include_abandoned=True)
        assert [m.content for m in everything] == [m["content"] for m in history]
        assert not any(m.abandoned for m in everything)


# ---- a resent request recognized by its bytes ----------------------------------------------------------

LONG_SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 12}  # past the bucket's bytes


async def post_chat(
    stack: Stack, body: dict[str, Any], session: str = "", path: str = CHAT, compact: bool = False
) -> tuple[int, str]:
    """A request whose bytes this test writes (Python's spaced JSON, which the gateway never writes,
    unless `compact`)."""
    data = orjson.dumps(body) if compact else json.dumps(body).encode()
    headers = {"Authorization": "Bearer sk-test", "Content-Type": "application/json"}
    if session:
        headers["x-ctxfold-session"] = session
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{stack.url}{path}", data=data, headers=headers) as answer,
    ):
        return answer.status, answer.headers.get("x-ctxfold-session", "")


def without_cache_key(body: dict[str, Any]) -> dict[str, Any]:
    assert body.pop("prompt_cache_key")
    return body


async def test_an_appended_turn_is_spliced_into_the_last_upstream_body_and_anything_else_rewritten(
    stack: Stack,
) -> None:
    history: list[dict[str, Any]] = [LONG_SYSTEM, {"role": "user", "content": "Fix the bug in a.py"}]
    body: dict[str, Any] = {"model": "gpt-4.1", "messages": history, "tools": TOOLS, "temperature": 0.1}

    async def turn(content: str) -> dict[str, Any]:
        history.extend([{"role": "assistant", "content": "ok"}, {"role": "user", "content": content}])
        status, _ = await post_chat(stack, body, "spliced")
        assert status == 200
        return stack.upstream.last(CHAT).__dict__  # path, headers, raw

    await post_chat(stack, body, "spliced")
    for number in range(3):
        seen = await turn(f"and now file {number}.py")
        assert without_cache_key(orjson.loads(seen["raw"])) == body  # the whole request, as sent
        assert json.dumps(history[-1]).encode() in seen["raw"]  # the agent's own bytes: nothing re-serialized
    body["temperature"] = 0.7  # another field changed: the request is rewritten whole
    seen = await turn("warmer")
    assert without_cache_key(orjson.loads(seen["raw"])) == body
    assert json.dumps(history[-1]).encode() not in seen["raw"]
    history[-1]["content"] = "warmer, and b.py"  # an edit of the last message: a rewind
    status, _ = await post_chat(stack, body, "spliced")
    assert status == 200 and without_cache_key(stack.upstream.last(CHAT).body) == body
    seen = await turn("then c.py")  # and the next turn is recognized again
    assert without_cache_key(orjson.loads(seen["raw"])) == body
    assert json.dumps(history[-1]).encode() in seen["raw"]
    _, session_id = await post_chat(stack, body, "spliced")
    assert [m.content for m in await stack.transcript(session_id)] == [m["content"] for m in history]


async def test_a_resent_request_that_inserts_many_messages_is_read_off_the_event_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recognizing an appended turn by its bytes reads the inserted messages on the event loop (Python per
    message): a request that inserts more than `OFFLOAD_MIN_OBJECTS` takes the full path, read in the pool."""
    threads: dict[str, list[str]] = {}
    for name in ("new_pieces", "reconciled_request"):
        function = getattr(gateway_contexts, name)

        def call(*args: Any, name: str = name, function: Any = function) -> Any:
            threads.setdefault(name, []).append(threading.current_thread().name)
            return function(*args)

        monkeypatch.setattr(gateway_contexts, name, call)
    history: list[dict[str, Any]] = [LONG_SYSTEM, {"role": "user", "content": "Count the lines."}]
    body = {"model": "gpt-4.1", "messages": history}
    await post_chat(stack, body, "many-inserted")
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "A few more:"}]
    await post_chat(stack, body, "many-inserted")
    assert "new_pieces" in threads  # recognized by its bytes
    threads.clear()
    history += [{"role": "user", "content": f"line {n}"} for n in range(gateway_pieces.OFFLOAD_MIN_OBJECTS + 1)]
    status, session_id = await post_chat(stack, body, "many-inserted")
    assert status == 200 and "new_pieces" not in threads, threads
    assert all(name.startswith("ctxfold-cpu") for name in threads["reconciled_request"]), threads
    assert len(await stack.transcript(session_id)) == len(history)


async def test_conversations_opening_alike_each_continue_their_own_history(stack: Stack) -> None:
    """Without a header, conversations with one system prompt and API key share a bucket: each
    resent request must find its own session."""
    histories = [[LONG_SYSTEM, {"role": "user", "content": f"Task {n}"}] for n in range(3)]
    sessions = set()
    for step in range(3):
        for history in histories:
            history += [{"role": "assistant", "content": f"step {step}"}, {"role": "user", "content": "go on"}]
            body = {"model": "gpt-4.1", "messages": history}
            status, session_id = await post_chat(stack, body)
            assert status == 200 and without_cache_key(stack.upstream.last(CHAT).body) == body
            sessions.add(session_id)
    assert len(sessions) == 3


async def test_one_resent_request_sent_twice_at_once_is_appended_once(stack: Stack) -> None:
    history: list[dict[str, Any]] = [LONG_SYSTEM, {"role": "user", "content": "Fix the bug"}]
    body = {"model": "gpt-4.1", "messages": history}
    await post_chat(stack, body, "twice")
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and the test"}]
    answers = await asyncio.gather(post_chat(stack, body, "twice"), post_chat(stack, body, "twice"))
    assert [status for status, _ in answers] == [200, 200]
    assert [m.content for m in await stack.transcript(answers[0][1])] == [m["content"] for m in history]


async def test_a_new_conversation_opened_by_requests_at_once_is_appended_once(stack: Stack) -> None:
    """Requests of a conversation this gateway has not seen, at once (an agent's parallel calls, retries):
    one session state and one turn each; each opened its own before, so they appended the history over
    each other and could fail with a 500."""
    history = [LONG_SYSTEM, {"role": "user", "content": "Fix the bug"}, {"role": "assistant", "content": "ok"},
               {"role": "user", "content": "and the test"}]  # fmt: skip
    body = {"model": "gpt-4.1", "messages": history}
    answers = await asyncio.gather(*(post_chat(stack, body, "at-once") for _ in range(8)))
    assert [status for status, _ in answers] == [200] * 8
    everything = await stack.transcript(answers[0][1], include_abandoned=True)
    assert [m.content for m in everything] == [m["content"] for m in history]


async def test_a_transcript_that_keeps_moving_under_a_request_fails_open_with_a_reason(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer appending between every read and append of this request (another gateway, an
    SDK): after one reload and retry the request goes upstream unchanged, saying why (it was a 500)."""

    async def moved(*_args: object) -> None:
        raise gateway_contexts.TranscriptMoved

    monkeypatch.setattr(gateway_contexts.Contexts, "_reconcile_and_prepare", moved)
    body = {"model": "gpt-4.1", "messages": [LONG_SYSTEM, {"role": "user", "content": "moving"}]}
    headers = {"Authorization": "Bearer sk-test", "x-ctxfold-session": "moving"}
    async with aiohttp.ClientSession() as http, http.post(f"{stack.url}{CHAT}", json=body, headers=headers) as answer:
        assert answer.status == 200
        assert "CONCURRENT_MODIFICATION" in answer.headers["x-ctxfold-warning"]
    assert stack.upstream.last(CHAT).body == body  # fail open: the agent's own request


async def test_responses_turns_are_spliced_unless_they_continue_the_last_assistant_turn(stack: Stack) -> None:
    items: list[dict[str, Any]] = [{"role": "user", "content": "List the files, then read each."}]
    body = {"model": "o4-mini", "instructions": LONG_SYSTEM["content"], "input": items, "store": False}

    async def send() -> bytes:
        status, _ = await post_chat(stack, body, "responses-spliced", RESPONSES)
        assert status == 200
        seen = stack.upstream.last(RESPONSES)
        assert without_cache_key(seen.body) == body
        return seen.raw

    await send()
    for number in range(3):
        turn = [
            {"type": "reasoning", "id": f"rs_{number}", "summary": [], "encrypted_content": f"gAAAA-{number}=="},
            {"type": "function_call", "call_id": f"call_{number}", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"call_{number}", "output": f"file {number}"},
        ]
        items.extend(turn)
        assert json.dumps(turn)[1:-1].encode() in await send()  # the agent's bytes, spliced
    items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done"}]})
    await send()
    more = {"type": "function_call", "call_id": "call_x", "name": "shell", "arguments": "{}"}
    items.append(more)  # it joins the assistant turn above: rewritten whole
    assert json.dumps(more).encode() not in await send()
    _, session_id = await post_chat(stack, body, "responses-spliced", RESPONSES)
    roles = [m.role.name for m in await stack.transcript(session_id)]
    assert roles == ["SYSTEM", "USER", *["ASSISTANT", "TOOL"] * 3, "ASSISTANT"]


@pytest.mark.parametrize("seed", range(3))
async def test_random_appends_edits_retries_and_changed_fields_reach_the_upstream_as_sent(
    stack: Stack, seed: int
) -> None:
    rng = random.Random(seed)
    history: list[dict[str, Any]] = [LONG_SYSTEM, {"role": "user", "content": f"task {seed}"}]
    body: dict[str, Any] = {"model": "gpt-4.1", "messages": history, "temperature": 0.0}
    session_id = ""
    for step in range(30):
        match rng.choice(["append", "append", "append", "edit", "retry", "field", "again", "encoding"]):
            case "append":
                for _ in range(rng.randint(1, 3)):
                    role = rng.choice(["user", "assistant"])
                    history.append({"role": role, "content": f"step {step} " + "x" * rng.randint(0, 300)})
            case "edit" if len(history) > 2:
                history[rng.randrange(1, len(history))]["content"] += " (edited)"
            case "retry" if len(history) > 3:
                del history[-rng.randint(1, 2) :]
            case "field":
                body["temperature"] = round(rng.random(), 2)
            case _:
                pass  # the same request again, or in other bytes
        status, session_id = await post_chat(stack, body, f"random-{seed}", compact=rng.random() < 0.2)
        assert status == 200
        assert without_cache_key(stack.upstream.last(CHAT).body) == body, f"step {step}"
    assert [m.content for m in await stack.transcript(session_id)] == [m["content"] for m in history]


async def test_a_session_recognized_by_bytes_stays_among_those_kept_while_others_come_and_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_contexts, "MAX_SESSIONS", 2)
    async for running in make_stack(tmp_path):
        history: list[dict[str, Any]] = [LONG_SYSTEM, {"role": "user", "content": "the long task"}]
        body = {"model": "gpt-4.1", "messages": history}
        for turn in range(4):  # between its turns, another conversation each time
            history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"step {turn}"}]
            assert (await post_chat(running, body, "kept"))[0] == 200
            if turn:  # recognized: the agent's own bytes went upstream
                assert json.dumps(history[-1]).encode() in running.upstream.last(CHAT).raw
            assert (await post_chat(running, {"model": "gpt-4.1", "messages": history[:2]}, f"other-{turn}"))[0] == 200


async def test_a_resent_request_with_a_malformed_suffix_is_refused_in_the_providers_shape(stack: Stack) -> None:
    history: list[dict[str, Any]] = [LONG_SYSTEM, {"role": "user", "content": "the task"}]
    body = {"model": "gpt-4.1", "messages": history, "temperature": 0.5}
    assert (await post_chat(stack, body, "malformed"))[0] == 200
    raw = json.dumps(body).encode()
    close = raw.rindex(b"]")
    headers = {"Authorization": "Bearer sk-test", "x-ctxfold-session": "malformed"}
    async with aiohttp.ClientSession() as http:
        for suffix in (b', {"role":', b', {"role": "robot", "content": "x"}', b", 42"):
            data = raw[:close] + suffix + raw[close:]
            async with http.post(f"{stack.url}{CHAT}", data=data, headers=headers) as answer:
                assert answer.status == 400, suffix
                assert (await answer.json())["error"]["type"] == "invalid_request_error"
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    assert (await post_chat(stack, body, "malformed"))[0] == 200
    assert json.dumps(history[-1]).encode() in stack.upstream.last(CHAT).raw  # still recognized


async def next_turn(stack: Stack, history: list[dict[str, Any]], session: str) -> bool:
    """One more turn of a conversation; whether it was recognized by its bytes."""
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"more {len(history)}"}]
    body = {"model": "gpt-4.1", "messages": history}
    assert (await post_chat(stack, body, session))[0] == 200
    assert without_cache_key(stack.upstream.last(CHAT).body) == body
    return json.dumps(history[-1]).encode() in stack.upstream.last(CHAT).raw


async def test_kept_request_bytes_stay_within_their_budget_the_least_recently_used_going_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's last request and the SDK's view of it (about 40 kB here) count in one budget: when it is full,
    the least recently used session's go, its next request takes the full path and its Prepare answers the
    whole view. Without the views counted, a gateway kept a view per session for up to 4,096 sessions."""
    monkeypatch.setattr(gateway_contexts, "MAX_KEPT_BYTES", 50_000)  # room for one conversation's, not two
    async for running in make_stack(tmp_path):
        contexts = running.gateway.gateway.contexts
        a, b = ([LONG_SYSTEM, {"role": "user", "content": f"task {name} " + "z" * 9000}] for name in "ab")
        await next_turn(running, a, "a")
        assert await next_turn(running, a, "a")
        await next_turn(running, b, "b")  # b's request and view are kept: a's, the least recently used, go
        assert await next_turn(running, b, "b")
        ids = {state.key[1].rpartition(":")[2]: state.session_id for state in contexts._sessions.values()}
        assert [contexts.client.last_view(ids[name]) is not None for name in ("a", "b")] == [False, True]
        assert contexts._kept_bytes <= gateway_contexts.MAX_KEPT_BYTES
        assert not await next_turn(running, a, "a")  # the full path, and a is kept again
        assert await next_turn(running, a, "a")
        assert [contexts.client.last_view(ids[name]) is not None for name in ("a", "b")] == [True, False]
        assert [m.content for m in await running.transcript(ids["a"])] == [m["content"] for m in a]


def test_a_views_bytes_are_counted_from_what_it_grew_by_or_whole_after_a_fold() -> None:
    def view(version: int, *contents: str) -> View:
        messages = tuple(Message(role=Role.USER, content=c) for c in contents)
        return View(messages=messages, estimated_tokens=0, view_version=version, action=Action.NONE)

    per_message = gateway_contexts.VIEW_MESSAGE_BYTES
    first = gateway_contexts.view_bytes(view(2, "ab", "cde"), 0, 0)
    assert first == 5 + 2 * per_message
    grown = view(3, "ab", "cde", "f")
    assert gateway_contexts.view_bytes(grown, 2, 1_000_000) == 1_000_000 + 1 + per_message  # the new message only
    folded = view(1 << 32 | 2, "summary", "f")  # a new generation: counted whole
    assert gateway_contexts.view_bytes(folded, 3, 1_000_000) == 8 + 2 * per_message


async def hang_up_after(url: str, path: str, body: dict[str, Any], last_event: bytes) -> bytes:
    """Posts a streamed request and closes the connection once `last_event` has arrived, before the
    stream's end (as Codex CLI does): what it received."""
    port = int(url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = orjson.dumps(body)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sk-test\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")  # fmt: skip
    writer.write(head.encode() + payload)
    received = b""
    while last_event not in received:
        chunk = await reader.read(65536)
        assert chunk, received
        received += chunk
    writer.transport.abort()
    return received


@pytest.mark.parametrize("managed", [True, False], ids=["managed", "forwarded_unchanged"])
async def test_an_agent_hanging_up_at_its_last_event_is_no_error_and_its_usage_counts(
    stack: Stack, managed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Codex CLI closes a stream once `response.completed` is in, before the end of the HTTP body. The
    gateway answers nothing more, logs no error, and still reports the usage of a managed answer."""
    stack.upstream.reply(RESPONSES, Reply(text="Done.", end_delay=0.3))
    body: dict[str, Any] = {"model": "gpt-5", "input": f"Hang up early ({managed}).", "stream": True}
    if not managed:  # a stored conversation: forwarded unchanged
        body["previous_response_id"] = "resp_1"
    received = await hang_up_after(stack.url, "/v1/responses", body, b"response.completed")
    await asyncio.sleep(0.6)  # the upstream's end, then the gateway's write to the closed connection
    assert b"HTTP/1.1 200" in received
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    if managed:
        session_id = re.search(rb"x-ctxfold-session: (\S+)", received, re.I).group(1).decode()  # type: ignore[union-attr]
        state = await stack.ctxfold.get_context_state(session_id)
        assert state["telemetry"]["observations"] == 1

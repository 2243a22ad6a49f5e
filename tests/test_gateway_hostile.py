"""Requests no agent should send, through the gateway: valid requests of each API with fields replaced
by values of the wrong type, removed or added, alone or continuing a conversation, with odd ctxfold
headers; and answers no provider should send. The gateway answers each request in the provider's shape
or forwards it, relays each answer as it came; it never fails with a 5xx and keeps serving."""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ctxfold.gateway.app import start_gateway
from fake_upstream import CHAT, MESSAGES, RESPONSES
from gateway_fixtures import Stack, gateway_settings, stack

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

__all__ = ["stack"]

PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
IMAGE_URL = f"data:image/png;base64,{PIXEL}"
VALID: dict[str, dict[str, Any]] = {
    CHAT: {
        "model": "gpt-4.1",
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": IMAGE_URL}}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a\nb"},
            {"role": "user", "content": "go on"},
        ],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
    },
    RESPONSES: {
        "model": "gpt-4.1",
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}", "id": "fc_1"},
            {"type": "function_call_output", "call_id": "c1", "output": "out"},
            {"role": "user", "content": [{"type": "input_text", "text": "more"},
                                         {"type": "input_image", "image_url": IMAGE_URL}]},
        ],
        "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}],
    },
    MESSAGES: {
        "model": "claude-sonnet-4-6",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": PIXEL}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "out"}]}]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "next"},
        ],
        "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
    },
}  # fmt: skip
HISTORY = {CHAT: "messages", RESPONSES: "input", MESSAGES: "messages"}
ODD_VALUES: list[Any] = [
    None, 0, -1, 2**70, 1.5e308, True, "", "x", "\u0000", "line\nbreak", "é" * 3, [], {}, [None],
    {"a": None}, [[[]]], "x" * 5000, {"type": None}, [{"type": "text"}], {"role": "user"},
]  # fmt: skip
ODD_HEADERS: dict[str, list[str]] = {
    "x-ctxfold-context-window": ["-5", "abc", "99999999999999999999", "999", "0x10", " 5000"],
    "x-ctxfold-session": ["a" * 5000, " ", "été"],
    "anthropic-beta": ["context-1m-2025-08-07", "x" * 3000, ","],
}
HEADERS = {"Authorization": "Bearer sk-test", "x-api-key": "sk-test", "anthropic-version": "2023-06-01",
           "Content-Type": "application/json"}  # fmt: skip


def _places(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from _places(inner, (*at, key))


def mutated(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """`body` with one to three of its fields replaced by an odd value, removed, or joined by one."""
    out = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        places = [p for p in _places(out) if p]
        if not places:
            break
        *parents, key = rng.choice(places)
        parent = out
        for step in parents:
            parent = parent[step]
        choice, odd = rng.random(), copy.deepcopy(rng.choice(ODD_VALUES))
        if choice < 0.6:
            parent[key] = odd
        elif choice < 0.8:
            del parent[key]
        elif isinstance(parent, list):
            parent.insert(key, odd)
        else:
            parent[f"extra_{rng.randint(0, 9)}"] = odd
    return out


def hostile_request(rng: random.Random) -> tuple[str, dict[str, Any], dict[str, str]]:
    """A path, a body and headers: a mutated request, or a valid history continued by a mutated message."""
    path = rng.choice(sorted(VALID))
    valid, headers = VALID[path], dict(HEADERS)
    if rng.random() < 0.5:
        history = valid[HISTORY[path]]
        extra = mutated({"message": rng.choice(history[1:])}, rng).get("message")
        body = {**copy.deepcopy(valid), HISTORY[path]: [*copy.deepcopy(history), extra]}
        headers["x-ctxfold-session"] = f"conversation-{rng.randint(0, 3)}"
    else:
        body = mutated(valid, rng)
    if rng.random() < 0.3:
        body["stream"] = True
    for name, values in ODD_HEADERS.items():
        if rng.random() < 0.07:
            headers[name] = rng.choice(values)
    return path, body, headers


async def post(http: aiohttp.ClientSession, stack: Stack, path: str, body: Any, headers: dict[str, str]) -> tuple[
    int, dict[str, str], str
]:  # fmt: skip
    async with http.post(f"{stack.url}{path}", data=json.dumps(body), headers=headers) as answer:
        return answer.status, dict(answer.headers), await answer.text()


async def test_mutated_requests_never_fail_the_gateway(stack: Stack) -> None:
    rng = random.Random(23)
    failed = []
    async with aiohttp.ClientSession() as http:
        for _ in range(450):
            path, body, headers = hostile_request(rng)
            status, _, text = await post(http, stack, path, body, headers)
            if status >= 500:
                failed.append((status, path, json.dumps(body)[:300], text[:200]))
        assert not failed, f"{len(failed)} requests failed the gateway, first: {failed[0]}"
        for path, body in VALID.items():  # and it keeps serving
            assert (await post(http, stack, path, body, {**HEADERS, "x-ctxfold-session": f"after-{path}"}))[0] == 200


async def test_a_role_of_the_wrong_type_is_a_bad_request_in_the_providers_shape(stack: Stack) -> None:
    body = copy.deepcopy(VALID[CHAT])
    body["messages"][1]["role"] = {"role": "user"}
    async with aiohttp.ClientSession() as http:
        status, _, text = await post(http, stack, CHAT, body, HEADERS)
    assert status == 400
    assert json.loads(text)["error"]["message"].startswith("messages[1].role")


async def test_a_window_header_beyond_the_servers_bounds_is_a_bad_request(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        # "²" is a digit to str.isdigit, not to int(); int() refuses more than 4,300 digits: both were a 500.
        for window in ("999", "100000001", "99999999999999999999", "5000²", "1" * 5000):
            headers = {**HEADERS, "x-ctxfold-context-window": window}
            status, _, text = await post(http, stack, MESSAGES, VALID[MESSAGES], headers)
            assert status == 400, window
            assert json.loads(text)["error"]["type"] == "invalid_request_error"


async def test_a_warning_header_quoting_the_request_cannot_be_broken_by_it(stack: Stack) -> None:
    body = copy.deepcopy(VALID[RESPONSES])
    body["input"].append({"type": "odd\r\nx-injected: 1\u0000é", "data": 1})
    async with aiohttp.ClientSession() as http:
        status, headers, _ = await post(http, stack, RESPONSES, body, HEADERS)
    assert status == 200  # forwarded as sent, with a warning
    assert "x-injected" not in {name.lower() for name in headers}
    warning = headers["x-ctxfold-warning"]
    assert "odd\\r\\nx-injected: 1\\x00\\xe9" in warning and warning.isprintable() and warning.isascii()


ANSWERS: dict[str, dict[str, Any]] = {
    CHAT: {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "ok", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "read_tool_result", "arguments": '{"result_ref": "tr_x"}'}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
    RESPONSES: {"id": "r", "object": "response", "status": "completed", "output": [
        {"type": "function_call", "call_id": "c1", "name": "read_tool_result", "arguments": "{}"}],
        "usage": {"input_tokens": 5, "output_tokens": 1}},
    MESSAGES: {"id": "m", "type": "message", "role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "t1", "name": "read_tool_result", "input": {"result_ref": 5}}],
        "usage": {"input_tokens": 5, "output_tokens": 1}},
}  # fmt: skip


class OddUpstream:
    """A provider answering 200 with seeded mutations of a valid answer (streamed: as events, some not
    JSON); it keeps the last non-streamed body it sent."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.sent = b""
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("POST", "/{path:.*}", self.answer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def answer(self, request: web.Request) -> web.StreamResponse:
        answer = mutated(ANSWERS[request.path], self.rng)
        if not (await request.json()).get("stream"):
            self.sent = json.dumps(answer).encode() if self.rng.random() > 0.1 else b"{not json"
            return web.Response(body=self.sent, content_type="application/json")
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for event in [answer, *(mutated(answer, self.rng) for _ in range(self.rng.randint(0, 3)))]:
            data = json.dumps(event) if self.rng.random() > 0.1 else "{not json"
            await stream.write(f"event: {event.get('type')}\ndata: {data}\n\n".encode())
        await stream.write_eof()
        return stream


async def test_odd_answers_of_the_upstream_reach_the_agent_as_they_came(stack: Stack) -> None:
    """Answers with fields of the wrong type (usage, choices, calls of the read tool) or not JSON: the
    agent gets each as the upstream sent it, never a 5xx (reading their usage raised before)."""
    rng = random.Random(5)
    upstream = OddUpstream(rng)
    base_url = await upstream.start()
    settings = gateway_settings(stack.server.port, stack.upstream)
    gateway = await start_gateway(replace(settings, openai_base_url=base_url, anthropic_base_url=base_url))
    history = {CHAT: {"messages": [{"role": "user", "content": "look " * 3000}]},
               RESPONSES: {"input": [{"role": "user", "content": "look " * 3000}]},
               MESSAGES: {"messages": [{"role": "user", "content": "look " * 3000}], "max_tokens": 10}}  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            for number in range(120):
                path = rng.choice(sorted(history))
                body = {"model": VALID[path]["model"], **history[path], "stream": rng.random() < 0.5}
                headers = {**HEADERS, "x-ctxfold-session": f"odd-{number % 4}", "x-ctxfold-context-window": "8000"}
                url = f"http://127.0.0.1:{gateway.port}{path}"
                async with http.post(url, data=json.dumps(body), headers=headers) as answer:
                    data = await answer.read()
                    assert answer.status == 200, (path, data[:200])
                    if not body["stream"] and answer.headers.get("x-ctxfold-read-rounds", "0") == "0":
                        # As sent, but for the calls of ctxfold's read tool left unanswered, which are cut.
                        cut = b'"read_tool_result"' in upstream.sent and b'"read_tool_result"' not in data
                        assert data == upstream.sent or cut
    finally:
        await gateway.stop()
        assert upstream.runner is not None
        await upstream.runner.cleanup()


async def test_a_body_above_the_gateways_limit_is_refused_in_the_providers_shape(stack: Stack) -> None:
    body = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "x" * (65 << 20)}]}
    async with aiohttp.ClientSession() as http:
        status, _, text = await post(http, stack, MESSAGES, body, HEADERS)
    assert status == 413
    assert json.loads(text)["error"]["type"] == "request_too_large"


async def cut_answer(request: web.Request) -> web.StreamResponse:
    """An answer that breaks off after its first event (its whole length announced when not streamed)."""
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "par"}}]}\n\n'
    streamed = bool((await request.json()).get("stream"))
    headers = {"Content-Type": "text/event-stream"} if streamed else {"Content-Length": "1000"}
    answer = web.StreamResponse(headers=headers)
    await answer.prepare(request)
    await answer.write(event)
    assert request.transport is not None
    request.transport.close()
    return answer


@contextlib.asynccontextmanager
async def before_an_odd_upstream(stack: Stack, answer: Handler) -> AsyncIterator[str]:
    """The URL of a gateway (with the stack's server) in front of an upstream answering every request with `answer`."""
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    settings = gateway_settings(stack.server.port, stack.upstream)
    gateway = await start_gateway(replace(settings, openai_base_url=base_url, anthropic_base_url=base_url))
    try:
        yield f"http://127.0.0.1:{gateway.port}"
    finally:
        await gateway.stop()
        await runner.cleanup()


async def test_an_answer_the_upstream_breaks_off_breaks_off_for_the_agent_without_a_500(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """A JSON answer cut short is a 502 in the provider's shape; a stream cut short is cut short for the agent
    too (ended cleanly it would pass for whole). Both were an unhandled error (a 500, a traceback)."""
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}
    async with before_an_odd_upstream(stack, cut_answer) as url, aiohttp.ClientSession() as http:
        async with http.post(f"{url}{CHAT}", json=body, headers=HEADERS) as answer:
            assert answer.status == 502
            assert "broke off" in (await answer.json())["error"]["message"]
        for path in (CHAT, "/v1/models"):  # ctxfold's stream and one passed through
            async with http.post(f"{url}{path}", json={**body, "stream": True}, headers=HEADERS) as answer:
                assert answer.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await answer.read()
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_a_body_not_in_its_content_encoding_is_a_bad_request_in_the_providers_shape(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """A `Content-Encoding: gzip` body that is not gzip was a 500 (and an error logged as aiohttp read on);
    a body passed through above the gateway's limit was aiohttp's plain-text 413."""
    headers = {**HEADERS, "Content-Encoding": "gzip"}
    async with aiohttp.ClientSession() as http:
        for path in (CHAT, RESPONSES, MESSAGES, "/v1/models"):
            async with http.post(f"{stack.url}{path}", data=b"not gzip", headers=headers) as answer:
                assert answer.status == 400, path
                error = (await answer.json())["error"]
                assert error["type"] == "invalid_request_error" and "content-encoding" in error["message"]
        above = gzip.compress(b'{"messages": "' + b"x" * (65 << 20) + b'"}', compresslevel=1)
        async with http.post(f"{stack.url}/v1/messages/count_tokens", data=above, headers=headers) as answer:
            assert answer.status == 413
            assert (await answer.json())["error"]["type"] == "request_too_large"
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


CHUNK = {"choices": [{"index": 0, "delta": {"content": "ok"}}]}


async def gzipped_answer(request: web.Request) -> web.StreamResponse:
    """A provider compressing its answers whatever the request's Accept-Encoding (as some proxies do)."""
    streamed = bool((await request.json()).get("stream"))
    body = b"data: " + json.dumps(CHUNK).encode() + b"\n\n" if streamed else json.dumps(ANSWERS[CHAT]).encode()
    headers = {"Content-Type": "text/event-stream" if streamed else "application/json", "Content-Encoding": "gzip"}
    return web.Response(body=gzip.compress(body), headers=headers)


async def test_an_answer_compressed_by_the_upstream_reaches_the_agent_with_its_content_encoding(stack: Stack) -> None:
    """The gateway relays the upstream's bytes as they came, compressed ones too: without their
    Content-Encoding header (it was dropped as hop-by-hop) the agent got gzip bytes to read as JSON."""
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}
    # aiohttp's client decompresses what its Content-Encoding says.
    async with before_an_odd_upstream(stack, gzipped_answer) as url, aiohttp.ClientSession() as http:
        for path, stream in ((CHAT, False), (CHAT, True), ("/v1/models", False)):
            async with http.post(f"{url}{path}", json={**body, "stream": stream}, headers=HEADERS) as answer:
                assert answer.status == 200
                assert json.loads((await answer.text()).removeprefix("data: ")) == (CHUNK if stream else ANSWERS[CHAT])

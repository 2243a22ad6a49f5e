"""A fake model provider on loopback speaking OpenAI Chat Completions, OpenAI Responses and Anthropic
Messages, streamed (SSE) and not, for the gateway's tests and benchmark.

Each request takes the next scripted `Reply` for its API (then a default text answer). It records
every request (path, headers, raw body) and every answer's exact bytes, so a test can check what
the upstream received and that the agent got what the upstream sent, byte for byte."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Reply:
    text: str = "ok"
    calls: tuple[Call, ...] = ()
    thinking: tuple[tuple[str, str], ...] = ()  # (text, signature), Anthropic only
    reasoning: tuple[tuple[str, str], ...] = ()  # (summary, encrypted_content), Responses only
    status: int = 200
    error_body: bytes = b""  # the body of a non-200 answer
    end_delay: float = 0.0  # seconds a stream stays open after its last event


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> dict[str, Any]:
        value = orjson.loads(self.raw)
        assert isinstance(value, dict)
        return value


@dataclass
class FakeUpstream:
    script: dict[str, deque[Reply | Callable[[dict[str, Any]], Reply]]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)  # each answer's body bytes, in order
    port: int = 0
    _runner: web.AppRunner | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def reply(self, path: str, *replies: Reply | Callable[[dict[str, Any]], Reply]) -> None:
        self.script.setdefault(path, deque()).extend(replies)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def last(self, path: str) -> Seen:
        return next(s for s in reversed(self.seen) if s.path == path)

    async def start(self, port: int = 0) -> None:
        app = web.Application(client_max_size=256 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append(Seen(request.path, dict(request.headers), raw))
        if request.path in ("/v1/models", "/v1/messages/count_tokens"):
            payload = orjson.dumps(
                {"object": "list", "data": [{"id": "fake-model", "object": "model"}], "echo": raw.decode()}
            )
            self.sent.append(payload)
            return web.Response(body=payload, content_type="application/json")
        body = orjson.loads(raw)
        queue = self.script.get(request.path)
        scripted = queue.popleft() if queue else Reply()
        reply = scripted(body) if callable(scripted) else scripted
        if reply.status != 200:
            self.sent.append(reply.error_body)
            return web.Response(status=reply.status, body=reply.error_body, content_type="application/json",
                                headers={"x-request-id": "req_fake"})  # fmt: skip
        input_tokens = len(raw) // 4
        number = next(self._ids)
        if body.get("stream"):
            events = STREAMS[request.path](reply, body, input_tokens, number)
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "x-request-id": f"req_{number}"}
            )
            await response.prepare(request)
            sent = b""
            async for event in events:
                sent += event
                await response.write(event)
            self.sent.append(sent)
            await asyncio.sleep(reply.end_delay)
            await response.write_eof()
            return response
        payload = orjson.dumps(ANSWERS[request.path](reply, body, input_tokens, number))
        self.sent.append(payload)
        return web.Response(body=payload, content_type="application/json", headers={"x-request-id": f"req_{number}"})


def _output_tokens(reply: Reply) -> int:
    return max(1, len(reply.text) // 4 + 10 * len(reply.calls))


# ---- OpenAI Chat Completions ------------------------------------------------------------------------


def _chat_answer(reply: Reply, body: dict[str, Any], input_tokens: int, number: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.calls
        ]
    output = _output_tokens(reply)
    return {
        "id": f"chatcmpl-{number}", "object": "chat.completion", "created": 1_800_000_000, "model": body.get("model"),
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if reply.calls else "stop"}],
        "usage": {"prompt_tokens": input_tokens, "completion_tokens": output, "total_tokens": input_tokens + output,
                  "prompt_tokens_details": {"cached_tokens": 0}},
    }  # fmt: skip


def _sse(data: Any, event: str = "") -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


async def _chat_stream(reply: Reply, body: dict[str, Any], input_tokens: int, number: int) -> AsyncIterator[bytes]:
    base = {"id": f"chatcmpl-{number}", "object": "chat.completion.chunk", "created": 1_800_000_000,
            "model": body.get("model")}  # fmt: skip

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(reply.text):
        await asyncio.sleep(0)
        yield chunk({"content": piece})
    for index, call in enumerate(reply.calls):
        yield chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                     "function": {"name": call.name, "arguments": ""}}]})  # fmt: skip
        yield chunk({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})
    yield chunk({}, "tool_calls" if reply.calls else "stop")
    if (body.get("stream_options") or {}).get("include_usage"):
        output = _output_tokens(reply)
        yield _sse({**base, "choices": [], "usage": {"prompt_tokens": input_tokens, "completion_tokens": output,
                                                      "total_tokens": input_tokens + output}})  # fmt: skip
    yield b"data: [DONE]\n\n"


def _pieces(text: str) -> list[str]:
    return [text[i : i + 8] for i in range(0, len(text), 8)]


# ---- OpenAI Responses ----------------------------------------------------------------------------------


def _responses_output(reply: Reply, number: int) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = [
        {"type": "reasoning", "id": f"rs_{number}_{i}", "summary": [{"type": "summary_text", "text": summary}],
         "encrypted_content": encrypted}
        for i, (summary, encrypted) in enumerate(reply.reasoning)
    ]  # fmt: skip
    if reply.text:
        output.append({"type": "message", "id": f"msg_{number}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": reply.text, "annotations": []}]})  # fmt: skip
    output += [
        {"type": "function_call", "id": f"fc_{number}_{i}", "call_id": c.id, "name": c.name, "arguments": c.arguments,
         "status": "completed"}
        for i, c in enumerate(reply.calls)
    ]  # fmt: skip
    return output


def _responses_answer(reply: Reply, body: dict[str, Any], input_tokens: int, number: int) -> dict[str, Any]:
    output = _output_tokens(reply)
    return {
        "id": f"resp_{number}", "object": "response", "created_at": 1_800_000_000, "status": "completed",
        "model": body.get("model"), "output": _responses_output(reply, number), "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": output,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": input_tokens + output},
    }  # fmt: skip


async def _responses_stream(reply: Reply, body: dict[str, Any], input_tokens: int, number: int) -> AsyncIterator[bytes]:
    sequence = itertools.count()
    final = _responses_answer(reply, body, input_tokens, number)
    start = {**final, "status": "in_progress", "output": [], "usage": None}
    yield _sse({"type": "response.created", "response": start, "sequence_number": next(sequence)}, "response.created")
    for index, item in enumerate(final["output"]):
        added = {**item, "status": "in_progress"} if "status" in item else item
        yield _sse({"type": "response.output_item.added", "output_index": index, "item": added,
                    "sequence_number": next(sequence)}, "response.output_item.added")  # fmt: skip
        if item["type"] == "message":
            for piece in _pieces(reply.text):
                await asyncio.sleep(0)
                yield _sse({"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                            "content_index": 0, "delta": piece, "sequence_number": next(sequence)},
                           "response.output_text.delta")  # fmt: skip
        yield _sse({"type": "response.output_item.done", "output_index": index, "item": item,
                    "sequence_number": next(sequence)}, "response.output_item.done")  # fmt: skip
    yield _sse(
        {"type": "response.completed", "response": final, "sequence_number": next(sequence)}, "response.completed"
    )


# ---- Anthropic Messages -------------------------------------------------------------------------------------


def _anthropic_content(reply: Reply) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": text, "signature": signature} for text, signature in reply.thinking
    ]
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": orjson.loads(c.arguments)} for c in reply.calls
    ]
    return content


def _anthropic_answer(reply: Reply, body: dict[str, Any], input_tokens: int, number: int) -> dict[str, Any]:
    return {
        "id": f"msg_{number:024d}", "type": "message", "role": "assistant", "model": body.get("model"),
        "content": _anthropic_content(reply), "stop_reason": "tool_use" if reply.calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": _output_tokens(reply),
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }  # fmt: skip


async def _anthropic_stream(reply: Reply, body: dict[str, Any], input_tokens: int, number: int) -> AsyncIterator[bytes]:
    final = _anthropic_answer(reply, body, input_tokens, number)
    start = {**final, "content": [], "stop_reason": None, "usage": {**final["usage"], "output_tokens": 1}}
    yield _sse({"type": "message_start", "message": start}, "message_start")
    for index, block in enumerate(final["content"]):
        kind = block["type"]
        empty = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                 "text": {"type": "text", "text": ""}, "tool_use": {**block, "input": {}}}[kind]  # fmt: skip
        yield _sse({"type": "content_block_start", "index": index, "content_block": empty}, "content_block_start")
        if kind == "thinking":
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]  # fmt: skip
        elif kind == "text":
            deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"])]
        else:
            deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}]
        for delta in deltas:
            await asyncio.sleep(0)
            yield _sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
        yield _sse({"type": "content_block_stop", "index": index}, "content_block_stop")
    yield _sse({"type": "message_delta", "delta": {"stop_reason": final["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": final["usage"]["output_tokens"]}}, "message_delta")  # fmt: skip
    yield _sse({"type": "message_stop"}, "message_stop")


ANSWERS = {CHAT: _chat_answer, RESPONSES: _responses_answer, MESSAGES: _anthropic_answer}
STREAMS = {CHAT: _chat_stream, RESPONSES: _responses_stream, MESSAGES: _anthropic_stream}


async def serve_forever(port: int) -> None:
    """The fake upstream alone, answering every request with the default reply (the benchmark's)."""
    upstream = FakeUpstream()
    await upstream.start(port)
    print(f"fake upstream serving on 127.0.0.1:{port}", flush=True)
    while True:
        upstream.seen.clear()  # the benchmark's requests: nothing is kept
        upstream.sent.clear()
        await asyncio.sleep(1)


if __name__ == "__main__":
    import sys

    asyncio.run(serve_forever(int(sys.argv[1])))

"""A real local HTTP server speaking the OpenAI Chat Completions and Anthropic Messages protocols,
for testing the LLM summarizers end to end through the official SDKs.

It records every request (path, headers, parsed JSON body) and answers deterministically: a short
structured summary naming the `tr_...` result refs and tool call ids found in the request. Each
request takes the next behaviour from a script (then a default):

    ok           a summary, streamed (SSE) or as one JSON document
    error500     HTTP 500 with a provider-shaped error body
    timeout      no answer until well after the client's timeout (`timeout_sleep` seconds)
    truncated    half a summary, finish_reason "length" (Anthropic: stop_reason "max_tokens")
    empty        content "" with a normal finish
    not_smaller  a "summary" longer than everything the request replayed
    stall        streams the first piece, then waits for `release()` (or a client disconnect)
    cut          streams half the summary, then ends the response cleanly without a finish reason
                 (no final chunk, no [DONE]; Anthropic: no message_delta / message_stop)
    close        closes the connection without answering

`kill(how)` stops answering from then on ("error500", "close", or "down": the listener is closed
and connections are refused) until `revive()`.

The server runs on 127.0.0.1 on an ephemeral port in a background thread (stdlib only)."""

from __future__ import annotations

import hashlib
import json
import re
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BEHAVIOURS = (
    "ok",
    "error500",
    "timeout",
    "truncated",
    "empty",
    "not_smaller",
    "stall",
    "cut",
    "close",
    "trickle",  # streams a keep-alive comment every 0.5 s and never finishes (until stall_limit)
    "huge",  # an 8 MiB summary
    "not_json",  # a 200 answer that is plain text, not a chat completion
    "wrong_shape",  # a 200 answer of another shape: no content (Anthropic), choices not a list (OpenAI)
    "bad_event",  # a text delta that is a number instead of a string
    "unsupported",  # native compaction: 400, as a provider answers for a model or beta without it
    "no_compaction",  # native compaction: a 200 answer without a compaction item or block
)
HUGE_SUMMARY_BYTES = 8 << 20
KILL_MODES = ("error500", "close", "down")
SECTIONS = (
    "Goal",
    "Decisions",
    "Files & code",
    "Commands & outcomes",
    "Errors & fixes",
    "Pending & next step",
)
_REF = re.compile(r"\btr_[0-9A-Za-z]+")


@dataclass
class Recorded:
    """One request as the fake received it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # the parsed JSON body (None if it was not JSON)
    behaviour: str
    answer: str = ""  # the text the fake answered with ("" when it answered no text)
    disconnected: bool = False  # the client went away before the answer was complete
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or []) if isinstance(self.body, dict) else []

    @property
    def streamed(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


# ---- deterministic answers ---------------------------------------------------------------------


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a JSON value, in document order."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def replayed(body: Any) -> list[Any]:
    """The replayed part of a summary request: everything before the final instruction (for
    Anthropic, the system blocks too; the instruction is the last block of the last turn)."""
    if not isinstance(body, dict):
        return []
    messages = list(body.get("messages") or [])
    if not messages:
        return []
    last = messages[-1]
    if isinstance(last.get("content"), list) and len(last["content"]) > 1:
        head = [*messages[:-1], {**last, "content": last["content"][:-1]}]
    else:
        head = messages[:-1]
    system = body.get("system")
    return ([system] if system else []) + head


def summary_for(body: Any) -> str:
    """The deterministic summary of one request: its shape, a content hash, the call ids and result
    refs it saw. No leading or trailing whitespace (the server strips summaries)."""
    parts = replayed(body)
    text = "\n".join(_strings(parts))
    refs = sorted(set(_REF.findall(text)))
    calls: list[str] = []
    for message in parts:
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or []:
            calls.append(call.get("id", ""))
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append(block.get("id", ""))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    lines = [f"[fake summary {digest}]"]
    body_lines = {
        "Goal": f"continue the task (read {len(parts)} replayed items, {len(text)} characters)",
        "Decisions": "none recorded",
        "Files & code": "none recorded",
        "Commands & outcomes": ", ".join(calls) or "none",
        "Errors & fixes": "none",
        "Pending & next step": "resume from here",
    }
    for name in SECTIONS:
        lines.append(f"## {name}\n- {body_lines[name]}")
    lines.append("Folded tool results: " + (", ".join(refs) or "none"))
    return "\n".join(lines)


def not_smaller_for(body: Any) -> str:
    """A "summary" longer than everything the request replayed (padded to outweigh the framing
    tokens a provider counts per replayed message)."""
    parts = replayed(body)
    padding = " ".join(f"pad{i}" for i in range(20 + 4 * len(parts)))
    return ("\n".join(_strings(parts)) + "\n" + padding).strip()


def pieces(text: str) -> list[str]:
    """How a text is streamed: line by line, long lines in 80-character pieces."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        out.extend(line[i : i + 80] for i in range(0, len(line), 80))
    return out


# ---- the HTTP server ---------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeProvider


class _Disconnected(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing --

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _wait(self, record: Recorded, until: threading.Event | None, seconds: float) -> None:
        """Waits `seconds` (or until `until` is set), noticing a client that goes away meanwhile."""
        fake = self.server.fake
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not fake.stopping.is_set():
            if until is not None and until.is_set():
                return
            if self._client_gone():
                record.disconnected = True
                raise _Disconnected
            time.sleep(0.02)

    def _head(self, status: int, content_type: str, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache")
        else:
            self.send_header("Content-Length", str(length))
        self.send_header("Connection", "close")
        self.end_headers()

    def _json(self, status: int, document: Any) -> None:
        data = json.dumps(document).encode()
        self._head(status, "application/json", len(data))
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, data: Any, event: str | None = None) -> None:
        text = (f"event: {event}\n" if event else "") + f"data: {json.dumps(data)}\n\n"
        self._chunk(text.encode())

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # -- the request --

    def do_POST(self) -> None:
        fake = self.server.fake
        self.close_connection = True
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        behaviour = fake._next_behaviour()
        record = Recorded("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body, behaviour)
        fake._record(record)
        try:
            if self.path.rstrip("/").endswith("/chat/completions"):
                self._openai(record)
            elif self.path.rstrip("/").endswith("/responses/compact"):
                self._openai_compact(record)
            elif (
                self.path.rstrip("/").endswith("/messages") and isinstance(body, dict) and "context_management" in body
            ):
                self._anthropic_compact(record)
            elif self.path.rstrip("/").endswith("/messages"):
                self._anthropic(record)
            else:
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
        except (_Disconnected, OSError):
            record.disconnected = True
        finally:
            record.done.set()

    def _common(self, record: Recorded, error: Any) -> tuple[str, bool] | None:
        """Handles the behaviours both protocols share; returns (text, truncated) to answer with, or
        None when the request was answered already (or deliberately not)."""
        fake = self.server.fake
        behaviour = record.behaviour
        if behaviour == "close":
            return None
        if behaviour == "error500":
            self._json(500, error)
            return None
        if behaviour == "timeout":
            self._wait(record, None, fake.timeout_sleep)
        if behaviour == "not_json":
            data = b"upstream proxy: hello"
            self._head(200, "text/plain", len(data))
            self.wfile.write(data)
            return None
        if behaviour == "trickle":
            self._head(200, "text/event-stream")
            deadline = time.monotonic() + fake.stall_limit
            while time.monotonic() < deadline and not fake.stopping.is_set():
                self._chunk(b": keep-alive\n\n")
                self._wait(record, None, 0.5)
            return None
        text = summary_for(record.body)
        if behaviour == "huge":
            return (text + "\n") * (HUGE_SUMMARY_BYTES // (len(text) + 1) + 1), False
        if behaviour == "truncated":
            return text[: len(text) // 2].strip(), True
        if behaviour == "empty":
            return "", False
        if behaviour == "not_smaller":
            return not_smaller_for(record.body), False
        return text, False

    def _stalled(self, record: Recorded, index: int) -> None:
        if record.behaviour == "stall" and index == 1:
            fake = self.server.fake
            fake.stalled.set()
            self._wait(record, fake.released, fake.stall_limit)

    def _streamed_pieces(self, record: Recorded, text: str) -> list[str]:
        if record.behaviour == "huge":
            return [text[i : i + (64 << 10)] for i in range(0, len(text), 64 << 10)]
        parts = pieces(text)
        if record.behaviour == "cut":
            record.answer = "".join(parts[: len(parts) // 2])
            return parts[: len(parts) // 2]
        return parts

    def _openai(self, record: Recorded) -> None:
        error = {"error": {"message": "scripted failure", "type": "server_error", "param": None, "code": None}}
        answer = self._common(record, error)
        if answer is None:
            return
        text, truncated = answer
        record.answer = text
        body = record.body if isinstance(record.body, dict) else {}
        model = str(body.get("model", "fake"))
        finish = "length" if truncated else "stop"
        usage = {
            "prompt_tokens": len(json.dumps(body.get("messages"))) // 4,
            "completion_tokens": max(1, len(text) // 4),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        content: Any = 5 if record.behaviour == "bad_event" else text
        if not record.streamed:
            choices: Any = [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish,
                    "logprobs": None,
                }
            ]
            if record.behaviour == "wrong_shape":
                choices = "none"
            self._json(
                200,
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": choices,
                    "usage": usage,
                },
            )
            return

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
            }

        self._head(200, "text/event-stream")
        first = chunk({"role": "assistant", "content": ""})
        self._event({**first, "choices": "none"} if record.behaviour == "wrong_shape" else first)
        for index, piece in enumerate(self._streamed_pieces(record, text), start=1):
            self._event(chunk({"content": 5 if record.behaviour == "bad_event" else piece}))
            self._stalled(record, index)
        if record.behaviour == "cut":
            self._end_chunks()
            return
        self._event(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
        self._chunk(b"data: [DONE]\n\n")
        self._end_chunks()

    def _openai_compact(self, record: Recorded) -> None:
        """`POST /v1/responses/compact` as OpenAI documents it: the input's user messages, then one
        `compaction` item with opaque `encrypted_content` (here derived from the input)."""
        if record.behaviour == "unsupported":
            error = {"message": "compaction is not supported for this model", "type": "invalid_request_error"}
            self._json(400, {"error": error})
            return
        if self._common(record, {"error": {"message": "scripted failure", "type": "server_error"}}) is None:
            return
        body = record.body if isinstance(record.body, dict) else {}
        items = list(body.get("input") or [])
        digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()
        users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
        output = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": u.get("content", "")}]}
            for u in users
        ]
        if record.behaviour != "no_compaction":
            record.answer = f"enc:{digest}"
            output.append({"type": "compaction", "id": f"cmp_{digest[:16]}", "encrypted_content": record.answer})
        usage = {
            "input_tokens": len(json.dumps(items)) // 4,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 64,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(json.dumps(items)) // 4 + 64,
        }
        answer = {"id": f"resp_{digest[:12]}", "object": "response.compaction", "created_at": 1, "output": output}
        self._json(200, {**answer, "usage": usage})

    def _anthropic_compact(self, record: Recorded) -> None:
        """A Messages request with the `compact_20260112` edit, paused after compaction: one `compaction`
        block whose `content` is the summary (stop_reason "compaction")."""
        if record.behaviour == "unsupported":
            self._json(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "unknown beta"}})
            return
        error = {"type": "error", "error": {"type": "api_error", "message": "scripted failure"}}
        answer = self._common(record, error)
        if answer is None:
            return
        text, _ = answer
        body = record.body if isinstance(record.body, dict) else {}
        content: list[dict[str, Any]] = [{"type": "text", "text": "ok"}]
        if record.behaviour != "no_compaction":
            record.answer = text
            content = [
                {
                    "type": "compaction",
                    "content": text,
                    "signature": "sig_" + hashlib.sha256(text.encode()).hexdigest()[:16],
                }
            ]
        self._json(
            200,
            {
                "id": "msg_compact",
                "type": "message",
                "role": "assistant",
                "model": str(body.get("model", "fake")),
                "content": content,
                "stop_reason": "compaction" if record.behaviour != "no_compaction" else "end_turn",
                "stop_sequence": None,
                "usage": {
                    "input_tokens": len(json.dumps(body.get("messages"))) // 4,
                    "output_tokens": max(1, len(text) // 4),
                },
            },
        )

    def _anthropic(self, record: Recorded) -> None:
        error = {"type": "error", "error": {"type": "api_error", "message": "scripted failure"}}
        answer = self._common(record, error)
        if answer is None:
            return
        text, truncated = answer
        record.answer = text
        body = record.body if isinstance(record.body, dict) else {}
        model = str(body.get("model", "fake"))
        stop = "max_tokens" if truncated else "end_turn"
        input_tokens = len(json.dumps(body.get("messages"))) // 4
        output_tokens = max(1, len(text) // 4)
        message = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        }
        if not record.streamed:
            message.update(
                content=[{"type": "text", "text": text}],
                stop_reason=stop,
                usage={"input_tokens": input_tokens, "output_tokens": output_tokens},
            )
            self._json(200, message)
            return
        if record.behaviour == "wrong_shape":
            del message["content"]
        self._head(200, "text/event-stream")
        self._event({"type": "message_start", "message": message}, "message_start")
        self._event(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            "content_block_start",
        )
        for index, piece in enumerate(self._streamed_pieces(record, text), start=1):
            self._event(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": 5 if record.behaviour == "bad_event" else piece},
                },
                "content_block_delta",
            )
            self._stalled(record, index)
        if record.behaviour == "cut":
            self._end_chunks()
            return
        self._event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        self._event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
            "message_delta",
        )
        self._event({"type": "message_stop"}, "message_stop")
        self._end_chunks()


class FakeProvider:
    """The fake provider. Use as a context manager, or `start()` / `stop()`."""

    def __init__(self, timeout_sleep: float = 3.0, stall_limit: float = 30.0):
        self.timeout_sleep = timeout_sleep  # how long "timeout" waits before answering
        self.stall_limit = stall_limit  # the longest a "stall" waits for release()
        self.stopping = threading.Event()
        self.released = threading.Event()
        self.stalled = threading.Event()  # a "stall" answer is waiting for release()
        self._lock = threading.Lock()
        self._requests: list[Recorded] = []
        self._script: deque[str] = deque()
        self._then = "ok"
        self._killed = ""
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- life cycle --

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FakeProvider:
        self.stopping.clear()
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.fake = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-provider", daemon=True
        )
        self._thread.start()
        return self

    def _close_listener(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def stop(self) -> None:
        """Stops listening and wakes every waiting answer (they then fail to reach their clients)."""
        self.stopping.set()
        self.released.set()
        self._close_listener()

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """The Anthropic SDK's base URL (it adds /v1/messages itself)."""
        return f"http://127.0.0.1:{self.port}"

    # -- scripting --

    def script(self, *behaviours: str, then: str = "ok") -> None:
        """The behaviours of the next requests, one each, then `then` for every later request."""
        for behaviour in (*behaviours, then):
            if behaviour not in BEHAVIOURS:
                raise ValueError(f"unknown behaviour {behaviour!r}; one of {BEHAVIOURS}")
        with self._lock:
            self._script = deque(behaviours)
            self._then = then

    def kill(self, how: str = "error500") -> None:
        """Stops answering: every later request gets a 500, has its connection closed, or (down) is
        refused because nothing listens any more."""
        if how not in KILL_MODES:
            raise ValueError(f"unknown kill mode {how!r}; one of {KILL_MODES}")
        with self._lock:
            self._killed = how
        if how == "down":
            self._close_listener()

    def revive(self) -> None:
        """Answers again (on the same port), following the script."""
        with self._lock:
            killed, self._killed = self._killed, ""
        if killed == "down" and self._server is None:
            self.start()

    def release(self) -> None:
        """Lets "stall" answers continue."""
        self.released.set()

    def reset(self) -> None:
        """Forgets requests and script, answers "ok" again, re-arms "stall"."""
        self.revive()
        with self._lock:
            self._requests.clear()
            self._script.clear()
            self._then = "ok"
        # New events rather than clear(): answers still stalled from before stay released.
        self.released = threading.Event()
        self.stalled = threading.Event()

    def _next_behaviour(self) -> str:
        with self._lock:
            if self._killed:
                return "close" if self._killed == "close" else "error500"
            return self._script.popleft() if self._script else self._then

    def _record(self, record: Recorded) -> None:
        with self._lock:
            self._requests.append(record)

    # -- inspection --

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def requests_where(self, predicate: Callable[[Recorded], bool]) -> list[Recorded]:
        return [r for r in self.requests if predicate(r)]

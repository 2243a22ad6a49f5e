"""Availability under the largest valid requests, against `ctxfold serve` (a real process):

a) health-check latency (count, p50, p99, max, checks over 100 ms), probed every 20 ms from a process
   of its own (`benchlib.health_probe`, so this client's own work on big requests does not delay the
   probes), and how often the server warned that its event loop was held 100 ms or more
   (`ctxfold.loop_lag`: a slow check without one waited outside the loop), while the server is idle
   and while it serves, one case at a time:
   - an AppendMessages of user messages of the largest size (`max_message_bytes`; the last one
     smaller) that fill one request (`max_receive_message_bytes`), or of --messages such messages;
   - an AppendMessages of one tool result of the largest size (`max_tool_result_bytes`, or as much as
     one request carries);
   - a Prepare whose append is the first case's messages (its answer carries them back);
   - --clients concurrent clients, each sending the first case's AppendMessages;
   - --clients concurrent clients, each a Prepare answered with its whole view: the first case's
     messages (appended by the previous case, or beforehand);
   - a Prepare that folds a session of --fold-messages short messages (a long session, or a hostile
     one: the engine's work grows with the message count, not the bytes), appended beforehand;
   - an AppendMessages twice as large as a request may be: gRPC refuses it (RESOURCE_EXHAUSTED) before
     copying it into Python, so the loop does not stall (a refusal by the handler would come after
     the copy);
b) the cost of one ReadToolResult page (16 KiB) of the largest result against one of a 1 MiB result
   (results are stored in independently compressed chunks, so the ratio should be about 1).

The server runs with the default limits unless --max-receive-message-bytes / --max-send-message-bytes /
--max-tool-result-bytes / --max-message-bytes are given (they are passed to `ctxfold serve`, and the loads follow them).

    python bench/availability.py [--backends sqlite,postgresql] [--postgres-url URL]"""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
import string
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl

from ctxfold import loop_lag
from ctxfold.config import Settings
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

MiB = 1 << 20
SLOW_MS = 100.0
IDLE_SECONDS = 2.0
# Room left in a request for everything but the contents (ids, roles, framing).
REQUEST_OVERHEAD_BYTES = 64 << 10
LARGEST_WINDOW = 100_000_000
CASES = ("idle", "append", "result", "prepare", "clients", "views", "fold", "oversized")
FOLD_WINDOW = 16_000
APPEND_MESSAGES_MAX = 1000  # the server's bound of one append's messages


def spaceless(size: int, seed: int) -> str:
    """Text without spaces, slow for the tokenizer (0.4 s per 4 MiB; one character repeated is slower, 2.4-3.3 s)."""
    block = "".join(random.Random(seed).choices(string.ascii_letters + string.digits, k=64 << 10))
    return (block * (size // len(block) + 1))[:size]


def incompressible(size: int, seed: int) -> str:
    """Base64 of random bytes: a tool result zstd cannot shrink much (as real logs and dumps are
    unlike `spaceless`, whose repeated block makes decompression look free)."""
    return base64.b64encode(random.Random(seed).randbytes(size * 3 // 4 + 3)).decode()[:size]


@dataclass(frozen=True)
class Limits:
    max_receive_message_bytes: int
    max_send_message_bytes: int
    max_message_bytes: int
    max_tool_result_bytes: int

    def serve_flags(self) -> list[str]:
        return [f"--{name.replace('_', '-')}={value}" for name, value in vars(self).items()]


@dataclass(frozen=True)
class Case:
    name: str
    request_mib: float
    client_seconds: float
    outcome: str
    latencies: list[float]
    loop_held: int  # the server's warnings that its event loop was held 100 ms or more

    def row(self) -> list[Any]:
        ms = [x * 1000 for x in self.latencies]
        return [
            self.name,
            self.request_mib,
            self.client_seconds,
            self.outcome,
            len(ms),
            bl.percentile(ms, 50),
            bl.percentile(ms, 99),
            max(ms, default=0.0),
            sum(x > SLOW_MS for x in ms),
            self.loop_held,
        ]


def loop_held(log_path: Path) -> int:
    """How often the server has logged that its event loop was held 100 ms or more (`ctxfold.loop_lag`)."""
    return log_path.read_text(errors="replace").count(loop_lag.HELD)


async def probed(
    address: str, log_path: Path, name: str, request_bytes: int, load: Callable[[], Awaitable[str]]
) -> Case:
    held = loop_held(log_path)
    async with bl.health_probe(address) as latencies:
        started = time.perf_counter()
        outcome = await load()
        took = time.perf_counter() - started
    await asyncio.sleep(2 * loop_lag.INTERVAL_SECONDS)  # the last lag is measured and logged
    return Case(name, request_bytes / MiB, took, outcome, latencies, loop_held(log_path) - held)


async def outcome_of(call: Awaitable[object]) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "OK"


async def prepared(stub: pb_grpc.ContextServiceAsyncStub, request: pb.PrepareRequest) -> int:
    """The Prepare's view: how many characters its messages show."""
    shown = 0
    async for event in stub.Prepare(request, timeout=600):
        shown = sum(len(m.content) for m in event.result.messages)
    return shown


async def page_costs(
    stub: pb_grpc.ContextServiceAsyncStub, session_id: str, call_ids: Sequence[str], pages: int
) -> list[float]:
    """Median milliseconds of one 16 KiB page of each result, read at offsets spread over it; the
    results take turns, so drift on a shared machine (caches, background writes) hits them alike."""
    totals = []
    for call_id in call_ids:
        first = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session_id, tool_call_id=call_id))
        totals.append(first.total_bytes)
    times: list[list[float]] = [[] for _ in call_ids]
    for index in range(pages):
        for call_id, total, samples in zip(call_ids, totals, times, strict=True):
            offset = index * max(total // pages, 1)
            request = pb.ReadToolResultRequest(session_id=session_id, tool_call_id=call_id, offset=offset)
            started = time.perf_counter()
            await stub.ReadToolResult(request)
            samples.append(time.perf_counter() - started)
    return [bl.median(samples) * 1000 for samples in times]


async def long_session(stub: pb_grpc.ContextServiceAsyncStub, messages: int) -> str:
    """A session of `messages` short user and assistant messages, far above its window's trigger, not folded."""
    config = pb.SessionConfig(context_window=FOLD_WINDOW)
    session_id = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
    turns = [
        pb.Message(role=pb.ROLE_USER, content=f"do step {n} in src/module_{n}.py")
        if n % 2 == 0
        else pb.Message(role=pb.ROLE_ASSISTANT, content=f"done step {n}")
        for n in range(messages)
    ]
    for start in range(0, messages, APPEND_MESSAGES_MAX):
        chunk = turns[start : start + APPEND_MESSAGES_MAX]
        await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session_id, messages=chunk), timeout=600)
    return session_id


async def run(
    database: bl.Database,
    work: Path,
    limits: Limits,
    max_messages: int,
    clients: int,
    selected: Sequence[str],
    fold_messages: int,
) -> None:
    per_request = limits.max_receive_message_bytes - REQUEST_OVERHEAD_BYTES
    messages_bytes = min(max_messages * limits.max_message_bytes, per_request)
    sizes = [limits.max_message_bytes] * (messages_bytes // limits.max_message_bytes)
    sizes += [messages_bytes % limits.max_message_bytes] if messages_bytes % limits.max_message_bytes else []
    count = len(sizes)
    over = 2 * limits.max_receive_message_bytes // limits.max_message_bytes + 1
    oversized = [pb.Message(role=pb.ROLE_USER, content=spaceless(limits.max_message_bytes, s)) for s in range(over)]
    messages = [pb.Message(role=pb.ROLE_USER, content=spaceless(size, seed)) for seed, size in enumerate(sizes)]
    result_bytes = min(limits.max_tool_result_bytes, per_request)
    result = pb.Message(role=pb.ROLE_TOOL, tool_call_id="big", content=incompressible(result_bytes, 7))
    log_path = work / f"serve-{database.backend}.log"
    async with bl.serve_process(database.url, log_path, *bl.QUIET, *limits.serve_flags()) as server:
        stub = server.stub
        config = pb.SessionConfig(context_window=LARGEST_WINDOW)

        async def session() -> str:
            return (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id

        tools = await session()
        small_call = pb.ToolCall(id="small", name="cat", arguments="{}")  # 1 MiB
        await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=tools,
                messages=[
                    pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[small_call]),
                    pb.Message(role=pb.ROLE_TOOL, tool_call_id="small", content=incompressible(MiB, 9)),
                    pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="big", name="cat", arguments="{}")]),
                ],
            )
        )
        users = [await session() for _ in range(clients + 2)]
        for answered in users[2:]:
            # The clients' large messages come after an answered opening: opening user messages are the task's
            # anchors, which a view shows bounded, and the views case must answer them whole.
            opening = [
                pb.Message(role=pb.ROLE_USER, content="Go on."),
                pb.Message(role=pb.ROLE_ASSISTANT, content="On it."),
            ]
            await stub.AppendMessages(pb.AppendMessagesRequest(session_id=answered, messages=opening))
        channels = [grpc.aio.insecure_channel(server.address, options=bl.CHANNEL_OPTIONS) for _ in range(clients)]

        def append(client_stub: pb_grpc.ContextServiceAsyncStub, session_id: str) -> Awaitable[str]:
            request = pb.AppendMessagesRequest(session_id=session_id, messages=messages)
            return outcome_of(client_stub.AppendMessages(request, timeout=600))

        def each_client(call: Callable[[pb_grpc.ContextServiceAsyncStub, str], Awaitable[str]]) -> Awaitable[str]:
            async def calls() -> str:
                stubs = [pb_grpc.ContextServiceStub(channel) for channel in channels]
                outcomes = await asyncio.gather(*(call(s, u) for s, u in zip(stubs, users[2:], strict=True)))
                return ",".join(sorted(set(outcomes)))

            return calls()

        async def whole_view(client_stub: pb_grpc.ContextServiceAsyncStub, session_id: str) -> None:
            shown = await prepared(client_stub, pb.PrepareRequest(session_id=session_id))
            if shown < messages_bytes // 2:  # the case would measure nothing
                raise RuntimeError(f"a view of the views case shows {shown} characters, not the whole messages")

        def view(client_stub: pb_grpc.ContextServiceAsyncStub, session_id: str) -> Awaitable[str]:
            return outcome_of(whole_view(client_stub, session_id))

        async def send_oversized(session_id: str) -> str:
            # A channel that lets it leave this process: the refusal must be the server's.
            options = [("grpc.max_send_message_length", 2 * len(oversized) * limits.max_message_bytes)]
            async with grpc.aio.insecure_channel(server.address, options=options) as channel:
                request = pb.AppendMessagesRequest(session_id=session_id, messages=oversized)
                return await outcome_of(pb_grpc.ContextServiceStub(channel).AppendMessages(request, timeout=600))

        loads: dict[str, tuple[str, int, Callable[[], Awaitable[str]]]] = {
            "idle": ("idle", 0, lambda: asyncio.sleep(IDLE_SECONDS, "OK")),
            "append": (f"append {count} x user message", messages_bytes, lambda: append(stub, users[0])),
            "result": (
                "append 1 x tool result",
                result_bytes,
                lambda: outcome_of(stub.AppendMessages(pb.AppendMessagesRequest(session_id=tools, messages=[result]))),
            ),
            "prepare": (
                f"prepare, append {count} x user message",
                messages_bytes,
                lambda: outcome_of(prepared(stub, pb.PrepareRequest(session_id=users[1], append=messages))),
            ),
            "clients": (
                f"{clients} clients x append {count} x user",
                clients * messages_bytes,
                lambda: each_client(append),
            ),
            "views": (f"{clients} clients x prepare, whole view", clients * messages_bytes, lambda: each_client(view)),
            "fold": (
                f"prepare folding {fold_messages:,} short messages",
                0,
                lambda: outcome_of(prepared(stub, pb.PrepareRequest(session_id=folding))),
            ),
            "oversized": (
                f"append {len(oversized)} x user message",
                len(oversized) * limits.max_message_bytes,
                lambda: send_oversized(users[0]),
            ),
        }
        folding = await long_session(stub, fold_messages) if "fold" in selected else ""
        if "views" in selected and "clients" not in selected[: selected.index("views")]:
            await each_client(append)  # the views to answer
        cases = [await probed(server.address, log_path, *loads[name]) for name in selected]
        for channel in channels:
            await channel.close()
        pages = await page_costs(stub, tools, ["big", "small"], 100) if "result" in selected else None
    header = ["load", "request MiB", "client s", "outcome", "checks", "p50 ms", "p99 ms", "max ms", f">{SLOW_MS:g} ms"]
    header.append(f"loop held >={loop_lag.WARN_SECONDS * 1000:g} ms")
    print(f"\n{database.backend}: {' '.join(limits.serve_flags())}, load average {bl.machine()['load_average']}")
    print(bl.render_table(header, [case.row() for case in cases]))
    if pages:
        big, small = pages
        print(
            f"b) one 16 KiB page: of a {result_bytes / MiB:g} MiB result {big:6.2f} ms, "
            f"of a 1 MiB result {small:6.2f} ms (ratio {big / small:4.2f})",
            flush=True,
        )


async def main_async(args: argparse.Namespace, backends: Sequence[str], limits: Limits) -> None:
    work = Path(f"/tmp/ctxfold-availability-{uuid.uuid4().hex[:6]}")
    for backend in backends:
        database = await bl.fresh_database(backend, work, args.postgres_url, "availability")
        try:
            await run(database, work, limits, args.messages, args.clients, args.cases, args.fold_messages)
        finally:
            await database.drop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite", help="sqlite,postgresql (default sqlite)")
    parser.add_argument("--postgres-url", default="", help="admin URL (default $CTXFOLD_TEST_POSTGRES_URL)")
    parser.add_argument("--messages", type=bl.positive_int, default=8, help="user messages per request, at most")
    parser.add_argument(
        "--cases",
        type=lambda text: text.split(","),
        default=CASES,
        help=f"loads to measure, in order (default {','.join(CASES)}); b) needs 'result'",
    )
    parser.add_argument("--clients", type=bl.positive_int, default=8, help="concurrent clients of the last case")
    parser.add_argument(
        "--fold-messages", type=bl.positive_int, default=100_000, help="messages of the session the fold case folds"
    )
    defaults = Settings()
    for name in Limits.__dataclass_fields__:
        parser.add_argument(f"--{name.replace('_', '-')}", type=bl.positive_int, default=getattr(defaults, name))
    args = parser.parse_args(argv)
    postgres_url = bl.postgres_url_arg(args.postgres_url)
    args.postgres_url = postgres_url
    backends = bl.backends_arg(args.backends, postgres_url, parser.error)
    limits = Limits(**{name: getattr(args, name) for name in Limits.__dataclass_fields__})
    asyncio.run(main_async(args, backends, limits))


if __name__ == "__main__":
    main()

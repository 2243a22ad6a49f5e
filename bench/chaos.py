"""kill -9 campaigns: an agent loop runs against `ctxfold serve` (a real process), the process is
killed with SIGKILL at a random moment (mid-append, mid-fold, mid-install), restarted on the same
database, and the session is checked:

- every acknowledged append is there, in order, and nothing was appended twice;
- seqs are contiguous from 1;
- the view holds at most one summary;
- every tool result reads back whole with the sha256 of what was sent;
- the next Prepare answers within seconds (no lease or lock left behind stalls it).

    python bench/chaos.py --trials 35 --backends sqlite,postgresql

PostgreSQL needs CTXFOLD_TEST_POSTGRES_URL (an admin URL; each trial makes its own database). The
test suite runs a few trials of the same `trial()` (tests/test_crash.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import benchlib as bl
import grpc

from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

# The Prepare after a restart must answer within this (the goal: no stall over 60 s).
PREPARE_DEADLINE_SECONDS = 60.0
WORDS = ("alpha", "beta", "gamma", "delta", "file", "line", "value", "error", "module", "import", "class", "data")


@dataclass
class Trial:
    backend: str
    killed_after_turns: int  # acknowledged turns when the process was killed
    prepare_seconds: float  # the first Prepare after the restart
    messages: int
    problems: list[str] = field(default_factory=list)


def tool_text(turn: int) -> str:
    """A tool result of a size that varies with the turn; every fourth is larger than what a view
    holds, so it is stored as a raw result and read back by ReadToolResult."""
    rng = random.Random(turn)
    size = 60_000 if turn % 4 == 3 else rng.randrange(500, 6000)
    text = " ".join(rng.choice(WORDS) for _ in range(size // 6))
    return f"[turn {turn}] " + text


def turn_messages(turn: int) -> list[pb.Message]:
    call = pb.ToolCall(id=f"call_{turn}", name="run", arguments=json.dumps({"cmd": f"step {turn}"}))
    return [
        pb.Message(role=pb.ROLE_ASSISTANT, content=f"step {turn}", tool_calls=[call]),
        pb.Message(role=pb.ROLE_TOOL, tool_call_id=f"call_{turn}", content=tool_text(turn)),
    ]


async def prepare(stub: pb_grpc.ContextServiceStub, request: pb.PrepareRequest, seconds: float) -> pb.PreparedContext:
    result = None
    async for event in stub.Prepare(request, timeout=seconds):
        if event.HasField("result"):
            result = event.result
    assert result is not None
    return result


async def agent(stub: pb_grpc.ContextServiceStub, session_id: str, acknowledged: list[int]) -> None:
    """Appends one call group per Prepare, with a request_id, until cancelled."""
    turn = len(acknowledged)
    while True:
        request = pb.PrepareRequest(session_id=session_id, append=turn_messages(turn), request_id=f"turn-{turn}")
        await prepare(stub, request, 120)
        acknowledged.append(turn)
        turn += 1


async def read_whole(stub: pb_grpc.ContextServiceStub, session_id: str, call_id: str) -> tuple[bytes, str]:
    data, offset, sha = b"", 0, ""
    while True:
        page = await stub.ReadToolResult(
            pb.ReadToolResultRequest(session_id=session_id, tool_call_id=call_id, offset=offset), timeout=30
        )
        data += page.data.encode()
        sha = page.sha256
        if page.complete:
            return data, sha
        offset = page.next_offset


async def check(
    stub: pb_grpc.ContextServiceStub, session_id: str, acknowledged: Sequence[int]
) -> tuple[int, list[str]]:
    problems = []
    messages: list[pb.Message] = []
    token = ""
    while True:
        page = await stub.ListMessages(
            pb.ListMessagesRequest(session_id=session_id, page_size=100, page_token=token), timeout=30
        )
        messages += page.messages
        token = page.next_page_token
        if not token:
            break
    if [m.seq for m in messages] != list(range(1, len(messages) + 1)):
        problems.append("seqs are not contiguous from 1")
    turns = [int(m.tool_call_id.removeprefix("call_")) for m in messages if m.role == pb.ROLE_TOOL]
    # Every acknowledged turn, in order, once; at most one more (committed, its answer lost in the kill).
    if turns[: len(acknowledged)] != list(acknowledged) or len(turns) > len(acknowledged) + 1:
        problems.append(f"acknowledged turns {list(acknowledged)} but stored {turns}")
    if len(turns) != len(set(turns)):
        problems.append("a turn was appended twice")
    for turn in turns:
        data, sha = await read_whole(stub, session_id, f"call_{turn}")
        sent = tool_text(turn).encode()
        if data != sent or sha != hashlib.sha256(sent).hexdigest():
            problems.append(f"tool result of turn {turn} does not read back as sent")
    return len(messages), problems


async def trial(
    backend: str,
    database_url: str,
    work: Path,
    kill_when: Callable[[list[int]], Awaitable[None]],
    summarizers: str = "{}",
    summarizer: str = "extractive",
) -> Trial:
    """One run: start, drive the agent until `kill_when(acknowledged)` returns, SIGKILL, restart, check."""
    log = work / f"serve-{uuid.uuid4().hex[:6]}.log"
    acknowledged: list[int] = []
    async with bl.serve_process(database_url, log, "--summarizers", summarizers) as server:
        stub = server.stub
        config = pb.SessionConfig(context_window=16_000, summarizer=summarizer)
        session_id = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
        running = asyncio.ensure_future(agent(stub, session_id, acknowledged))
        await kill_when(acknowledged)
        server.popen.send_signal(signal.SIGKILL)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            await running
    killed_after = len(acknowledged)
    async with bl.serve_process(database_url, log, "--summarizers", summarizers) as server:
        stub = server.stub
        started = time.perf_counter()
        problems = []
        try:
            await prepare(stub, pb.PrepareRequest(session_id=session_id), PREPARE_DEADLINE_SECONDS)
        except grpc.aio.AioRpcError as exc:
            problems.append(f"Prepare after the restart: {exc.code().name} {exc.details()}")
        took = time.perf_counter() - started
        view = await prepare(stub, pb.PrepareRequest(session_id=session_id), PREPARE_DEADLINE_SECONDS)
        if sum(m.summary for m in view.messages) > 1:
            problems.append("the view holds more than one summary")
        count, more = await check(stub, session_id, acknowledged)
    return Trial(backend, killed_after, took, count, problems + more)


async def campaign(trials: int, backends: Sequence[str], work: Path, seed: int) -> list[Trial]:
    rng = random.Random(seed)
    results = []
    for index in range(trials):
        backend = backends[index % len(backends)]
        # Kept afterwards (PostgreSQL databases too), for a look at what a failed trial left.
        url = (await bl.fresh_database(backend, work, bl.postgres_url_arg(""), f"chaos_{index}")).url
        delay = rng.uniform(0.5, 6.0)

        async def kill_after(acknowledged: list[int], delay: float = delay) -> None:
            await asyncio.sleep(delay)

        result = await trial(backend, url, work, kill_after)
        print(
            f"trial {index + 1:3d} {backend:10s} killed after {delay:4.1f} s ({result.killed_after_turns:3d} turns) "
            f"next Prepare {result.prepare_seconds * 1000:7.1f} ms  {result.messages:4d} messages  "
            + ("OK" if not result.problems else "FAIL: " + "; ".join(result.problems)),
            flush=True,
        )
        results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--backends", default="sqlite")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work", default="", help="directory for databases and logs (default: a temporary one)")
    args = parser.parse_args(argv)
    work = Path(args.work) if args.work else Path(f"/tmp/ctxfold-chaos-{uuid.uuid4().hex[:6]}")
    work.mkdir(parents=True, exist_ok=True)
    results = asyncio.run(campaign(args.trials, args.backends.split(","), work, args.seed))
    failed = [r for r in results if r.problems]
    stalls = [r for r in results if r.prepare_seconds > PREPARE_DEADLINE_SECONDS]
    seconds = [r.prepare_seconds for r in results]
    print(
        f"\n{len(results)} trials: {len(failed)} failed, {len(stalls)} stalls over {PREPARE_DEADLINE_SECONDS:.0f} s; "
        f"next Prepare median {statistics.median(seconds) * 1000:.1f} ms, max {max(seconds) * 1000:.1f} ms"
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

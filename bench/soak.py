"""Soak: a steady agent workload against `ctxfold serve` (a real process) for a while, with the
server's resident memory (VmRSS) sampled over time. Flat memory means nothing grows without bound.

    python bench/soak.py --seconds 600                  # mixed: Prepare, ReadToolResult, Fork, Rewind, Delete
    python bench/soak.py --workload rewinds --cycles 2000  # "append 2 call groups, Rewind(head-3)" on one session

Prints one row per sample (elapsed, operations, errors, RSS) and the growth of the last quarter's
median RSS over the first quarter's. PostgreSQL: --database postgresql://… (an empty database)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl
from chaos import prepare, turn_messages

from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc


@dataclass
class Soak:
    operations: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (elapsed s, operations, RSS KiB)


async def guarded(soak: Soak, name: str, call: object) -> object | None:
    try:
        result = await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        soak.errors[f"{name}: {exc.code().name}"] += 1
        return None
    soak.operations += 1
    return result


async def mixed_agent(stub: pb_grpc.ContextServiceStub, soak: Soak, stop: asyncio.Event, seed: int) -> None:
    """Sessions of 40 turns each: Prepare per turn, a ReadToolResult, a Fork and a Rewind now and
    then; finished sessions (and their forks) are deleted, so stored data stays bounded too."""
    while not stop.is_set():
        config = pb.SessionConfig(context_window=16_000)
        session = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
        created = [session]
        for turn in range(40):
            if stop.is_set():
                break
            request = pb.PrepareRequest(session_id=session, append=turn_messages(seed * 1000 + turn))
            await guarded(soak, "Prepare", prepare(stub, request, 60))
            read = pb.ReadToolResultRequest(session_id=session, tool_call_id=f"call_{seed * 1000 + turn}")
            await guarded(soak, "ReadToolResult", stub.ReadToolResult(read))
            if turn % 10 == 9:
                forked = await guarded(soak, "Fork", stub.Fork(pb.ForkRequest(session_id=session)))
                if isinstance(forked, pb.ForkResponse):
                    created.append(forked.session.id)
                head = (await stub.GetSession(pb.GetSessionRequest(session_id=session))).session.head_seq
                await guarded(soak, "Rewind", stub.Rewind(pb.RewindRequest(session_id=session, to_seq=head - 2)))
        for session_id in reversed(created):
            await guarded(soak, "DeleteSession", stub.DeleteSession(pb.DeleteSessionRequest(session_id=session_id)))


async def rewind_agent(stub: pb_grpc.ContextServiceStub, soak: Soak, cycles: int) -> None:
    """The issue's loop: append 2 call groups, Rewind(head - 3), on one session. The rewind lands
    after the first group's call, so the next cycle first answers that call."""
    config = pb.SessionConfig(context_window=100_000)
    session = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
    pending: list[pb.Message] = []
    for cycle in range(cycles):
        first, second = turn_messages(2 * cycle), turn_messages(2 * cycle + 1)
        request = pb.AppendMessagesRequest(session_id=session, messages=[*pending, *first, *second])
        appended = await guarded(soak, "AppendMessages", stub.AppendMessages(request))
        if isinstance(appended, pb.AppendMessagesResponse):
            head = appended.session.head_seq
            rewound = await guarded(soak, "Rewind", stub.Rewind(pb.RewindRequest(session_id=session, to_seq=head - 3)))
            pending = [first[1]] if rewound is not None else []
        if cycle % 50 == 0:
            listing = pb.ListMessagesRequest(session_id=session, page_size=10, include_abandoned=True)
            await guarded(soak, "ListMessages", stub.ListMessages(listing))
            await guarded(soak, "Fork", stub.Fork(pb.ForkRequest(session_id=session)))


async def sampler(pid: int, soak: Soak, every: float, stop: asyncio.Event) -> None:
    started = time.perf_counter()
    while True:
        sample = (time.perf_counter() - started, soak.operations, bl.rss_kib(pid))
        soak.samples.append(sample)
        errors = sum(soak.errors.values())
        print(f"{sample[0]:8.1f} s {sample[1]:8d} ops {errors:6d} errors {sample[2] / 1024:8.1f} MiB RSS", flush=True)
        if stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


async def run(args: argparse.Namespace, work: Path) -> Soak:
    database = args.database or f"sqlite:///{work / 'soak.db'}"
    soak = Soak()
    stop = asyncio.Event()
    async with bl.serve_process(database, work / "serve.log") as server:
        stub = server.stub
        sampling = asyncio.ensure_future(sampler(server.pid, soak, args.sample_seconds, stop))
        if args.workload == "rewinds":
            await rewind_agent(stub, soak, args.cycles)
        else:
            agents = [asyncio.ensure_future(mixed_agent(stub, soak, stop, seed)) for seed in range(args.clients)]
            await asyncio.sleep(args.seconds)
            stop.set()
            await asyncio.gather(*agents)
        stop.set()
        await sampling
    return soak


def growth(samples: Sequence[tuple[float, int, int]]) -> float:
    """The median RSS of the last quarter of samples over that of the first quarter (after warm-up)."""
    quarter = max(1, len(samples) // 4)
    first = statistics.median(s[2] for s in samples[1 : 1 + quarter] or samples[:1])
    last = statistics.median(s[2] for s in samples[-quarter:])
    return last / first if first else 0.0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("mixed", "rewinds"), default="mixed")
    parser.add_argument("--seconds", type=float, default=600.0, help="mixed: how long to run")
    parser.add_argument("--clients", type=int, default=4, help="mixed: concurrent agents")
    parser.add_argument("--cycles", type=int, default=2000, help="rewinds: append+rewind cycles")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--database", default="", help="default: a fresh SQLite file")
    args = parser.parse_args(argv)
    work = Path(f"/tmp/ctxfold-soak-{uuid.uuid4().hex[:6]}")
    work.mkdir(parents=True)
    soak = asyncio.run(run(args, work))
    print(f"\n{soak.operations} operations; errors: {dict(soak.errors) or 'none'}")
    print(f"RSS growth (median of last quarter / first quarter of samples): {growth(soak.samples):.2f}x")


if __name__ == "__main__":
    main()

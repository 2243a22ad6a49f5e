"""Availability under one large valid request, against `ctxfold serve` (a real process):

a) health-check latency (max, median) while one client appends 8 user messages of 4 MiB, and while
   it appends one 32 MiB tool result (probes on a thread of their own, every 20 ms);
b) the cost of one ReadToolResult page (16 KiB) of a 32 MiB result against one of a 1 MiB result
   (results are stored in independently compressed chunks, so the ratio should be about 1).

    python bench/availability.py [--database postgresql://…]"""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
import statistics
import string
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl

from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

MiB = 1 << 20


def spaceless(size: int, seed: int) -> str:
    block = "".join(random.Random(seed).choices(string.ascii_letters + string.digits, k=64 << 10))
    return (block * (size // len(block) + 1))[:size]


def incompressible(size: int, seed: int) -> str:
    """Base64 of random bytes: a tool result zstd cannot shrink much (as real logs and dumps are
    unlike `spaceless`, whose repeated block makes decompression look free)."""
    return base64.b64encode(random.Random(seed).randbytes(size * 3 // 4 + 3)).decode()[:size]


def probe_health(address: str, stop: threading.Event, latencies: list[float]) -> None:
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while not stop.is_set():
            started = time.perf_counter()
            health.Check(health_pb2.HealthCheckRequest(), timeout=120)
            latencies.append(time.perf_counter() - started)
            stop.wait(0.02)


async def health_during(address: str, request: pb.AppendMessagesRequest) -> tuple[float, float, float]:
    """(append seconds, max health ms, median health ms)."""
    latencies: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=probe_health, args=(address, stop, latencies), daemon=True)
    thread.start()
    async with grpc.aio.insecure_channel(address, options=bl.CHANNEL_OPTIONS) as channel:
        started = time.perf_counter()
        await pb_grpc.ContextServiceStub(channel).AppendMessages(request, timeout=600)
        took = time.perf_counter() - started
    stop.set()
    await asyncio.to_thread(thread.join)
    return took, max(latencies) * 1000, statistics.median(latencies) * 1000


async def page_costs(
    stub: pb_grpc.ContextServiceStub, session_id: str, call_ids: Sequence[str], pages: int
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
    return [statistics.median(samples) * 1000 for samples in times]


async def run(database: str, work: Path) -> None:
    async with bl.serve_process(database, work / "serve.log") as server:
        stub = server.stub
        config = pb.SessionConfig(context_window=1_000_000)
        users = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
        tools = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
        call = pb.ToolCall(id="big", name="cat", arguments="{}")
        small_call = pb.ToolCall(id="small", name="cat", arguments="{}")  # 1 MiB
        await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=tools,
                messages=[
                    pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[small_call]),
                    pb.Message(role=pb.ROLE_TOOL, tool_call_id="small", content=incompressible(MiB, 9)),
                    pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[call]),
                ],
            )
        )
        messages = [pb.Message(role=pb.ROLE_USER, content=spaceless(4 * MiB, seed)) for seed in range(8)]
        took, worst, median = await health_during(
            server.address, pb.AppendMessagesRequest(session_id=users, messages=messages)
        )
        print(f"a) 8 x 4 MiB user messages: append {took:6.2f} s; health max {worst:8.1f} ms, median {median:6.1f} ms")
        result = pb.Message(role=pb.ROLE_TOOL, tool_call_id="big", content=incompressible(32 * MiB, 7))
        took, worst, median = await health_during(
            server.address, pb.AppendMessagesRequest(session_id=tools, messages=[result])
        )
        print(f"a) 1 x 32 MiB tool result:  append {took:6.2f} s; health max {worst:8.1f} ms, median {median:6.1f} ms")
        big, small = await page_costs(stub, tools, ["big", "small"], 100)
        print(
            f"b) one 16 KiB page: of a 32 MiB result {big:6.2f} ms, of a 1 MiB result {small:6.2f} ms "
            f"(ratio {big / small:4.2f})"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", default="", help="default: a fresh SQLite file")
    args = parser.parse_args(argv)
    work = Path(f"/tmp/ctxfold-availability-{uuid.uuid4().hex[:6]}")
    work.mkdir(parents=True)
    asyncio.run(run(args.database or f"sqlite:///{work / 'a.db'}", work))


if __name__ == "__main__":
    main()

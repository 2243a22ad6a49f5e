"""`ctxfold serve` (a process of its own, as deployed) keeps answering health checks and other
sessions' Prepares while one client appends 8 user messages of the largest size allowed (4 MiB):
decoding, checking, token counting, hashing and answering that request never hold the event loop or
the GIL for long. The 100 ms goal is measured by `bench/availability.py`; this bound is generous for
a loaded CI machine and far below the seconds a frozen server takes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import free_port, fresh_database
from ctxfold.config import Settings
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_availability import spaceless_text

MiB = 1 << 20
ANSWER_WITHIN_SECONDS = 1.0
# A Prepare writes: on SQLite (one writer at a time) it can wait for the append's 32 MiB insert. A
# frozen server (contents tokenized on the event loop) takes several times this.
PREPARE_WITHIN_SECONDS = 5.0
OPTIONS = [("grpc.max_send_message_length", 64 * MiB), ("grpc.max_receive_message_length", 64 * MiB)]


@asynccontextmanager
async def serving(database: str, log: Path) -> AsyncIterator[str]:
    """`ctxfold serve` on a free loopback port; yields its address once health answers SERVING."""
    address = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "ctxfold.cli", "serve", "--listen", address, "--database", database]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXFOLD_")}
    with log.open("wb") as out:
        process = subprocess.Popen([*command, "--summarizers", "{}"], env=env, stdout=out, stderr=out)  # noqa: ASYNC220
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(300):
                try:
                    if (await health.Check(health_pb2.HealthCheckRequest(), timeout=1)).status == 1:
                        break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"ctxfold serve did not start; its log is {log}")
        yield address
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 30)


@asynccontextmanager
async def probing(address: str, probe: Callable[[grpc.Channel], None]) -> AsyncIterator[list[float]]:
    """Calls `probe` every 50 ms on a thread of its own; yields its latencies, complete when done."""
    latencies: list[float] = []
    stop = threading.Event()

    def loop() -> None:
        with grpc.insecure_channel(address) as channel:
            while not stop.is_set():
                started = time.perf_counter()
                probe(channel)
                latencies.append(time.perf_counter() - started)
                stop.wait(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield latencies
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 60)


async def test_health_and_another_sessions_prepare_answer_during_an_append_of_eight_largest_messages(
    backend: str, tmp_path: Path
) -> None:
    limit = Settings().max_message_bytes
    async with (
        serving(await fresh_database(backend, tmp_path), tmp_path / "serve.log") as address,
        grpc.aio.insecure_channel(address, options=OPTIONS) as channel,
    ):
        stub = pb_grpc.ContextServiceStub(channel)
        big = pb.SessionConfig(context_window=1_000_000)
        session = (await stub.CreateSession(pb.CreateSessionRequest(config=big))).session
        other = (
            await stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(context_window=8000)))
        ).session
        turn = [pb.Message(role=pb.ROLE_USER, content="what changed?")]

        def check_health(probe_channel: grpc.Channel) -> None:
            answer = health_pb2_grpc.HealthStub(probe_channel).Check(health_pb2.HealthCheckRequest(), timeout=60)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

        def prepare_other(probe_channel: grpc.Channel) -> None:
            request = pb.PrepareRequest(session_id=other.id, append=turn)
            events = list(pb_grpc.ContextServiceStub(probe_channel).Prepare(request, timeout=60))
            assert events[-1].HasField("result")
            turn[:] = [pb.Message(role=pb.ROLE_ASSISTANT, content="nothing"), turn[-1]]

        messages = [pb.Message(role=pb.ROLE_USER, content=spaceless_text(limit, seed)) for seed in range(8)]
        async with probing(address, check_health) as health, probing(address, prepare_other) as prepares:
            started = time.perf_counter()
            appended = await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=messages))
            took = time.perf_counter() - started
    assert [m.content for m in appended.messages] == [m.content for m in messages]
    assert took > 2 * ANSWER_WITHIN_SECONDS  # the append was slow enough to matter
    assert len(health) > 10 and max(health) < ANSWER_WITHIN_SECONDS, health
    assert len(prepares) > 5 and max(prepares) < PREPARE_WITHIN_SECONDS, prepares

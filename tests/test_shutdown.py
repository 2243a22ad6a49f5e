"""Shutdown under load: new calls are refused and calls still running when the grace period ends are
cancelled, each with UNAVAILABLE and SERVER_SHUTTING_DOWN and a retry delay — never a bare CANCELLED
or a status without an ErrorInfo — and what they committed stays."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc

from builders import call, create_session, prepare, result, user
from conftest import fresh_database, settings_for
from ctxfold.server import start
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import FakeProvider
from rpc_errors import error_info
from test_store_faults import contents, retry_delay
from traces import tool_output


def _shutting_down(error: grpc.aio.AioRpcError) -> None:
    assert error.code() == grpc.StatusCode.UNAVAILABLE, f"{error.code()}: {error.details()}"
    assert error_info(error).reason == pb.ErrorReason.Name(pb.SERVER_SHUTTING_DOWN)
    assert retry_delay(error) > 0


async def test_calls_running_past_the_grace_period_answer_server_shutting_down_and_keep_what_they_committed(
    backend: str, tmp_path: Path
) -> None:
    url = await fresh_database(backend, tmp_path)
    with FakeProvider() as fake:
        specs = json.dumps({"llm": {"type": "openai", "base_url": fake.base_url, "model": "m", "max_retries": 0}})
        running = await start(settings_for(url, summarizers=specs))
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
        stub = pb_grpc.ContextServiceStub(channel)
        folding = (await create_session(stub, context_window=12_000, summarizer="llm", prefold_ratio=0.0)).id
        await prepare(stub, folding, user("Investigate the flaky test"))
        for i in range(12):
            await stub.AppendMessages(
                pb.AppendMessagesRequest(
                    session_id=folding, messages=[call(f"c{i}"), result(f"c{i}", tool_output(i, 4000))]
                )
            )
        quiet = (await create_session(stub, context_window=64_000)).id
        fake.script("stall")
        fold = asyncio.ensure_future(prepare(stub, folding, user("go on")))
        await asyncio.to_thread(fake.stalled.wait, 30)  # the fold waits for the summarizer

        stopping = asyncio.create_task(running.stop(grace=1.0))
        while not running.admission.draining:  # noqa: ASYNC110 (a flag of the server, no event to wait on)
            await asyncio.sleep(0.01)
        try:
            await prepare(stub, quiet, user("a new call while the server drains"))
            raise AssertionError("a call after the drain began was served")
        except grpc.aio.AioRpcError as error:
            _shutting_down(error)
        try:
            await fold
            raise AssertionError("the stalled fold finished")
        except grpc.aio.AioRpcError as error:
            _shutting_down(error)
        await stopping
        await channel.close()
        fake.release()

    restarted = await start(settings_for(url))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{restarted.port}") as again:
            assert (await contents(pb_grpc.ContextServiceStub(again), folding))[-1] == "go on"
    finally:
        await restarted.stop(grace=0.5)


async def test_calls_arriving_as_the_server_stops_answer_server_shutting_down_never_a_bare_cancelled(
    tmp_path: Path,
) -> None:
    """Calls sent at once just before the stop: gRPC's stop cancelled those it had received but not yet handed
    to a handler with a bare CANCELLED (most of the fifty here); the drain now waits until calls stop arriving."""
    running = await start(settings_for(await fresh_database("sqlite", tmp_path)))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = pb_grpc.ContextServiceStub(channel)
        sid = (await create_session(stub, context_window=64_000)).id
        calls = [asyncio.ensure_future(stub.GetSession(pb.GetSessionRequest(session_id=sid))) for _ in range(50)]
        await running.stop(grace=0)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, grpc.aio.AioRpcError):
            _shutting_down(outcome)
        else:
            assert isinstance(outcome, pb.GetSessionResponse), outcome

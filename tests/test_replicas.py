"""Two `ctxfold serve` processes sharing one PostgreSQL database, as two replicas behind a balancer:
concurrent Prepare calls on one session install exactly one checkpoint and lose no append."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from builders import call, create_session, prepare, result, user
from conftest import free_port, fresh_database, stubs_for
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_prepare import assert_view_well_formed, state, transcript
from traces import tool_output


@pytest.fixture
async def serve_processes(tmp_path: Path) -> AsyncIterator[list[pb_grpc.ContextServiceStub]]:
    """Two `ctxfold serve` processes on one fresh PostgreSQL database: replicas as deployed, sharing
    nothing but the database (conftest's `replicas` are servers in this process, on either store)."""
    url = await fresh_database("postgresql", tmp_path)
    ports: list[int] = []
    while len(ports) < 2:  # two different ports: neither is taken before its process starts
        if (port := free_port()) not in ports:
            ports.append(port)
    processes = []
    try:
        for index, port in enumerate(ports):
            processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "ctxfold.cli",
                    "serve",
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--database",
                    url,
                    "--data-dir",
                    str(tmp_path / f"replica-{index}"),
                    env=os.environ.copy(),
                    stderr=subprocess.DEVNULL,
                )
            )
        async with stubs_for(ports) as stubs:
            yield stubs
    finally:
        for process in processes:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)


async def test_two_replicas_fold_one_session_once(serve_processes: list[pb_grpc.ContextServiceStub]) -> None:
    a, b = serve_processes
    session = await create_session(a, context_window=12_000)
    await prepare(a, session.id, user("Investigate the flaky test"))
    for i in range(12):
        await b.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id, messages=[call(f"c{i}"), result(f"c{i}", tool_output(i, 4000))]
            )
        )
    outcomes = await asyncio.gather(prepare(a, session.id, user("first")), prepare(b, session.id, user("second")))
    for outcome in outcomes:
        assert outcome.result.estimated_tokens <= outcome.result.hard_limit_tokens
        assert_view_well_formed(list(outcome.result.messages))
    contents = [m.content for m in await transcript(a, session.id)]
    assert contents.count("first") == 1 and contents.count("second") == 1
    assert len(contents) == 1 + 24 + 2
    telemetry = (await state(b, session.id))["telemetry"]
    assert isinstance(telemetry, dict) and telemetry["summary_applied"] == 1
    head = (await a.GetSession(pb.GetSessionRequest(session_id=session.id))).session
    assert head.checkpoint_id
    after = (await prepare(b, session.id)).result
    assert after.checkpoint_id == head.checkpoint_id
    assert sum(m.summary for m in after.messages) == 1

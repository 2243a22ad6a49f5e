"""Two servers (replicas) on one database: while one folds a session, the other waits for its fold
instead of asking the summarizer to summarize the same input again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc

from conftest import fresh_database, settings_for
from ctxfold.server import start
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import FakeProvider
from test_prepare import call, create, prepare, result, state, transcript, user
from traces import tool_output


async def test_a_second_replica_waits_for_the_first_ones_fold(backend: str, tmp_path: Path) -> None:
    with FakeProvider() as fake:
        url = await fresh_database(backend, tmp_path)
        specs = json.dumps({"llm": {"type": "openai", "base_url": fake.base_url, "model": "m", "max_retries": 0}})
        replicas = [await start(settings_for(url, summarizers=specs)) for _ in range(2)]
        try:
            async with (
                grpc.aio.insecure_channel(f"127.0.0.1:{replicas[0].port}") as first,
                grpc.aio.insecure_channel(f"127.0.0.1:{replicas[1].port}") as second,
            ):
                a, b = pb_grpc.ContextServiceStub(first), pb_grpc.ContextServiceStub(second)
                session = await create(a, context_window=12_000, summarizer="llm")
                await prepare(a, session.id, user("Investigate the flaky test"))
                for i in range(12):
                    await a.AppendMessages(
                        pb.AppendMessagesRequest(
                            session_id=session.id, messages=[call(f"c{i}"), result(f"c{i}", tool_output(i, 4000))]
                        )
                    )
                fake.script("stall")
                folding = asyncio.create_task(prepare(a, session.id))
                for _ in range(400):  # the fake answers on its own thread: poll until a's request arrives
                    if fake.requests:
                        break
                    await asyncio.sleep(0.05)
                waiting = asyncio.create_task(prepare(b, session.id))
                await asyncio.sleep(1.0)
                assert not waiting.done()  # b waits on a's lease rather than summarizing too
                fake.release()
                first_outcome, second_outcome = await asyncio.wait_for(asyncio.gather(folding, waiting), 30)
                assert first_outcome.result.action == pb.ACTION_FOLDED
                assert second_outcome.result.action == pb.ACTION_NONE
                assert second_outcome.result.checkpoint_id == first_outcome.result.checkpoint_id
                assert len(fake.requests) == 1
                telemetry = (await state(b, session.id))["telemetry"]
                assert isinstance(telemetry, dict) and telemetry["summary_applied"] == 1
                assert len(await transcript(b, session.id)) == 25
        finally:
            for replica in replicas:
                await replica.stop(grace=1.0)

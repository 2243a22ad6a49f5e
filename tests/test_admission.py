"""Admission under load: health checks are never refused, a busy session's queue is bounded and
fails fast (SESSION_BUSY with a RetryInfo delay), and one tenant cannot take the slots of another."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from conftest import fresh_database, settings_for
from ctxfold.server import start
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import FakeProvider
from rpc_errors import error_info
from traces import tool_output

TOKEN_A = "tok-alpha-0123456789abcdef"
TOKEN_B = "tok-bravo-0123456789abcdef"
A = (("authorization", f"Bearer {TOKEN_A}"),)
B = (("authorization", f"Bearer {TOKEN_B}"),)
PER_TENANT = 4
MiB = 1 << 20
REQUEST_BYTES = 3 * MiB  # large requests (1 MiB or more) in progress at once, in bytes
# The largest request, and so the bytes of large requests worked on at once (`RequestPacer`).
RECEIVE_BYTES = 2 * MiB + 64 * 1024


@dataclass
class Busy:
    fake: FakeProvider
    stub: pb_grpc.ContextServiceStub
    health: health_pb2_grpc.HealthStub


@pytest.fixture
async def busy(backend: str, tmp_path: Path) -> AsyncIterator[Busy]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")
    with FakeProvider() as fake:
        specs = json.dumps({"llm": {"type": "openai", "base_url": fake.base_url, "model": "m", "max_retries": 0}})
        settings = settings_for(
            await fresh_database(backend, tmp_path),
            summarizers=specs,
            auth_tokens_file=str(tokens),
            max_concurrent_rpcs=PER_TENANT + 2,
            max_concurrent_rpcs_per_tenant=PER_TENANT,
            max_waiting_per_session=1,
            max_concurrent_request_bytes=REQUEST_BYTES,
            max_receive_message_bytes=RECEIVE_BYTES,
        )
        running = await start(settings)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                yield Busy(fake, pb_grpc.ContextServiceStub(channel), health_pb2_grpc.HealthStub(channel))
        finally:
            fake.release()
            await running.stop(grace=1.0)


async def session_to_fold(stub: pb_grpc.ContextServiceStub) -> str:
    """A session of tenant A above its trigger: its next Prepare folds."""
    config = pb.SessionConfig(context_window=12_000, summarizer="llm", prefold_ratio=0.0)
    session_id = (await stub.CreateSession(pb.CreateSessionRequest(config=config), metadata=A)).session.id
    messages = [pb.Message(role=pb.ROLE_USER, content="Investigate the flaky test")]
    for i in range(12):
        call = pb.ToolCall(id=f"c{i}", name="bash", arguments='{"cmd":"ls"}')
        messages += [
            pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[call]),
            pb.Message(role=pb.ROLE_TOOL, tool_call_id=f"c{i}", content=tool_output(i, 4000)),
        ]
    await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session_id, messages=messages), metadata=A)
    return session_id


async def drain(call: grpc.aio.UnaryStreamCall[pb.PrepareRequest, pb.PrepareResponse]) -> None:
    async for _ in call:
        pass


async def until_requests(fake: FakeProvider, count: int) -> None:
    for _ in range(400):
        if len(fake.requests) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {count} summarizer requests, got {len(fake.requests)}")


async def refused(call: object, scope: str) -> float:
    """Awaits `call`, which must be refused as SESSION_BUSY for `scope`; returns the RetryInfo delay."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    info = error_info(caught.value)
    assert (info.reason, info.metadata["scope"]) == ("SESSION_BUSY", scope)
    status = rpc_status.from_call(caught.value)
    assert status is not None
    retry = error_details_pb2.RetryInfo()
    assert any(detail.Unpack(retry) for detail in status.details), "no RetryInfo"
    return retry.retry_delay.ToTimedelta().total_seconds()


async def test_health_and_other_tenants_answer_while_one_tenant_saturates_its_slots(busy: Busy) -> None:
    stub, fake = busy.stub, busy.fake
    fake.script(then="stall")  # every fold hangs until released
    sessions = [await session_to_fold(stub) for _ in range(3)]

    def prepare(session_id: str, overflow: bool = False) -> asyncio.Future[None]:
        request = pb.PrepareRequest(session_id=session_id, overflow=overflow)
        return asyncio.ensure_future(drain(stub.Prepare(request, metadata=A)))

    folds = [prepare(s) for s in sessions[:2]]
    await until_requests(fake, 2)
    # A view that fits is answered without waiting for the fold in flight; one the provider refused
    # (overflow) must be maintained, so it waits for that fold; a third is one too many: refused now.
    await asyncio.wait_for(prepare(sessions[0]), 5)
    waiting = prepare(sessions[0], overflow=True)
    await asyncio.sleep(0.3)
    overflowing = pb.PrepareRequest(session_id=sessions[0], overflow=True)
    delay = await asyncio.wait_for(refused(drain(stub.Prepare(overflowing, metadata=A)), "session"), 5)
    assert delay > 0
    folds.append(prepare(sessions[2]))
    await until_requests(fake, 3)
    # Tenant A has PER_TENANT calls in progress: its next call is refused, tenant B's is served.
    await asyncio.wait_for(refused(stub.ListSessions(pb.ListSessionsRequest(), metadata=A), "tenant"), 5)
    assert not (await stub.ListSessions(pb.ListSessionsRequest(), metadata=B, timeout=5)).sessions
    for _ in range(20):
        answer = await busy.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    fake.release()
    await asyncio.wait_for(asyncio.gather(*folds, waiting), 30)
    # Once the calls are done, tenant A is served again.
    assert len((await stub.ListSessions(pb.ListSessionsRequest(), metadata=A, timeout=5)).sessions) == 3


def user_text(size: int) -> str:
    return ("the build log says nothing new " * (size // 31 + 1))[:size]


async def test_a_prepare_waiting_after_its_large_append_holds_its_bytes_but_not_the_next_large_requests_turn(
    busy: Busy,
) -> None:
    """Large requests take turns, but a Prepare's turn ends once its append is stored: one that then
    waits for its session's fold does not hold up other large requests. Its bytes stay counted until
    its call ends: a large request past the server's bound is refused at once (SESSION_BUSY, scope
    server, with `limit_bytes` and a RetryInfo), small ones are served, and once the Prepare is done
    the refused request is accepted."""
    stub, fake = busy.stub, busy.fake
    fake.script(then="stall")
    folding = await session_to_fold(stub)
    fold = asyncio.ensure_future(drain(stub.Prepare(pb.PrepareRequest(session_id=folding), metadata=A)))
    await until_requests(fake, 1)
    # Must be maintained (overflow): waits for the fold in flight, after appending 1.5 MiB.
    big_turn = [pb.Message(role=pb.ROLE_USER, content=user_text(3 * MiB // 2))]
    overflowing = pb.PrepareRequest(session_id=folding, overflow=True, append=big_turn)
    waiting = asyncio.ensure_future(drain(stub.Prepare(overflowing, metadata=A)))
    for _ in range(200):
        listed = await stub.ListMessages(pb.ListMessagesRequest(session_id=folding, page_size=1000), metadata=A)
        if listed.messages[-1].content == big_turn[0].content:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the Prepare's append was not stored")
    config = pb.SessionConfig(context_window=10_000_000)
    other = (await stub.CreateSession(pb.CreateSessionRequest(config=config), metadata=B)).session.id

    def append(size: int) -> grpc.aio.UnaryUnaryCall[pb.AppendMessagesRequest, pb.AppendMessagesResponse]:
        messages = [pb.Message(role=pb.ROLE_USER, content=user_text(size))]
        return stub.AppendMessages(pb.AppendMessagesRequest(session_id=other, messages=messages), metadata=B)

    # 2.75 MiB with the Prepare's: admitted, and worked on at once although both do not fit in one
    # turn (RECEIVE_BYTES): the Prepare's turn ended with its append.
    await asyncio.wait_for(append(MiB + MiB // 4), 10)
    delay = await asyncio.wait_for(refused(append(2 * MiB), "server"), 10)  # 3.5 MiB: past the bound
    assert delay > 0
    await asyncio.wait_for(append(MiB // 2), 10)  # small requests are not counted
    assert not waiting.done()
    fake.release()
    await asyncio.wait_for(asyncio.gather(fold, waiting, return_exceptions=True), 30)
    stored = (await asyncio.wait_for(append(2 * MiB), 10)).messages
    assert len(stored[0].content) == 2 * MiB

"""The fold lease. Two servers (replicas) on one database: while one folds a session, the other
answers with the current view when it still fits (and waits for that fold only above the hard
ceiling, instead of summarizing the same input again). The lease is short and renewed while the fold
runs, so the lease of a holder that died (kill -9) runs out within seconds."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from sqlalchemy import select, update

from builders import call, create_session, prepare, result, user
from conftest import Replicas
from ctxfold.server import RunningServer
from ctxfold.service.exclusion import FOLD_LEASE_RENEW_SECONDS, FOLD_LEASE_SECONDS
from ctxfold.store import schema
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import FakeProvider
from test_prepare import state, transcript
from traces import tool_output


async def tool_session(stub: pb_grpc.ContextServiceStub) -> pb.Session:
    """A session above its trigger and below its hard ceiling (large results, prunable)."""
    # prefold_ratio 0: the fold these tests hold the lease for is the one a Prepare makes itself.
    session = await create_session(stub, context_window=12_000, summarizer="llm", prefold_ratio=0.0)
    await prepare(stub, session.id, user("Investigate the flaky test"))
    for i in range(12):
        await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id, messages=[call(f"c{i}"), result(f"c{i}", tool_output(i, 4000))]
            )
        )
    return session


async def fold_in_flight(fake: FakeProvider, stub: pb_grpc.ContextServiceStub, session_id: str) -> asyncio.Task[object]:
    """Starts a Prepare whose summarizer call stalls until `fake.release()`; returns once it stalls."""
    fake.script("stall")
    folding: asyncio.Task[object] = asyncio.create_task(prepare(stub, session_id))
    for _ in range(400):  # the fake answers on its own thread: poll until the request arrives
        if fake.stalled.is_set():
            return folding
        await asyncio.sleep(0.05)
    raise AssertionError("the fold never reached the summarizer")


async def lease_of(running: RunningServer, session_id: str) -> tuple[str | None, float | None]:
    s = schema.sessions.c
    async with running.store.engine.connect() as conn:
        row = (await conn.execute(select(s.fold_lease_owner, s.fold_lease_until).where(s.id == session_id))).one()
    return row.fold_lease_owner, row.fold_lease_until


@pytest.mark.parametrize("second", ["another replica", "the same replica"])
async def test_below_the_ceiling_a_second_call_answers_the_current_view_without_waiting(
    replicas: Replicas, second: str
) -> None:
    a, b = replicas.stubs[0], replicas.stubs[1 if second == "another replica" else 0]
    session = await tool_session(a)
    folding = await fold_in_flight(replicas.fake, a, session.id)
    answered = await asyncio.wait_for(prepare(b, session.id), 5)
    assert answered.result.action != pb.ACTION_FOLDED
    assert answered.result.estimated_tokens <= answered.result.hard_limit_tokens
    assert not folding.done()  # a still folds; b neither waited for it nor summarized too
    replicas.fake.release()
    first = await asyncio.wait_for(folding, 30)
    assert first.result.action == pb.ACTION_FOLDED  # type: ignore[attr-defined]
    again = await prepare(b, session.id)
    assert again.result.checkpoint_id == first.result.checkpoint_id  # type: ignore[attr-defined]
    assert len(replicas.fake.requests) == 1
    telemetry = (await state(b, session.id))["telemetry"]
    assert isinstance(telemetry, dict) and telemetry["summary_applied"] == 1
    assert len(await transcript(b, session.id)) == 25


async def test_above_the_ceiling_a_second_replica_waits_for_the_first_ones_fold(replicas: Replicas) -> None:
    a, b = replicas.stubs
    session = await create_session(a, context_window=12_000, summarizer="llm", prefold_ratio=0.0)
    # Plain text (nothing to prune), appended without Prepare: the view is above the hard ceiling. The
    # agent answers each note, so only the first one is the opening task anchor.
    noted = pb.Message(role=pb.ROLE_ASSISTANT, content="Noted.")
    for i in range(16):
        await a.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id, messages=[user(f"note {i}: " + tool_output(i, 3600)), noted]
            )
        )
    folding = await fold_in_flight(replicas.fake, a, session.id)
    waiting = asyncio.create_task(prepare(b, session.id))
    await asyncio.sleep(1.0)
    assert not waiting.done()  # b waits on a's lease rather than summarizing too
    replicas.fake.release()
    first, second = await asyncio.wait_for(asyncio.gather(folding, waiting), 30)
    assert first.result.action == pb.ACTION_FOLDED  # type: ignore[attr-defined]
    assert second.result.checkpoint_id == first.result.checkpoint_id
    assert len(replicas.fake.requests) == 1


async def test_the_lease_is_short_and_renewed_while_the_fold_runs(replicas: Replicas) -> None:
    a = replicas.stubs[0]
    session = await tool_session(a)
    folding = await fold_in_flight(replicas.fake, a, session.id)
    owner, until = await lease_of(replicas.running[0], session.id)
    assert owner and until is not None and until <= time.time() + FOLD_LEASE_SECONDS
    await asyncio.sleep(FOLD_LEASE_RENEW_SECONDS + 1.0)
    renewed_owner, renewed_until = await lease_of(replicas.running[0], session.id)
    assert renewed_owner == owner and renewed_until is not None and renewed_until > until
    replicas.fake.release()
    await asyncio.wait_for(folding, 30)
    assert await lease_of(replicas.running[0], session.id) == (None, None)


async def test_a_dead_holders_lease_does_not_stall_a_prepare_that_fits(replicas: Replicas) -> None:
    """What a kill -9 mid-fold leaves behind (a lease nobody renews): the next Prepare answers now."""
    a = replicas.stubs[0]
    session = await tool_session(a)
    s = schema.sessions.c
    async with replicas.running[0].store.engine.begin() as conn:
        await conn.execute(
            update(schema.sessions)
            .where(s.id == session.id)
            .values(fold_lease_owner="dead-replica", fold_lease_until=time.time() + 300)
        )
    answered = await asyncio.wait_for(prepare(a, session.id), 5)
    assert answered.result.estimated_tokens <= answered.result.hard_limit_tokens
    assert replicas.fake.requests == []
    assert answered.result.not_folded_reason == pb.NOT_FOLDED_REASON_FOLD_IN_PROGRESS
    assert "dead-replica" in answered.result.not_folded_detail  # who holds the lease


async def _hold_lease(running: RunningServer, session_id: str, owner: str) -> None:
    s = schema.sessions.c
    async with running.store.engine.begin() as conn:
        await conn.execute(
            update(schema.sessions)
            .where(s.id == session_id)
            .values(fold_lease_owner=owner, fold_lease_until=time.time() + 300)
        )


async def test_a_lease_whose_holder_died_on_this_host_is_taken_over_at_once(replicas: Replicas) -> None:
    """After kill -9 and a restart, the first Prepare above the trigger folds: the dead process's lease
    (its pid is gone) is not waited out."""
    a = replicas.stubs[0]
    session = await tool_session(a)
    finished = await asyncio.create_subprocess_exec("true")
    await finished.wait()
    await _hold_lease(replicas.running[0], session.id, f"{socket.gethostname()[:24]}:{finished.pid}:deadbeef:00000000")
    answered = await asyncio.wait_for(prepare(a, session.id), 30)
    assert answered.result.action == pb.ACTION_FOLDED
    assert answered.result.not_folded_reason == pb.NOT_FOLDED_REASON_UNSPECIFIED
    assert await lease_of(replicas.running[0], session.id) == (None, None)


async def test_a_lease_held_by_a_live_process_or_another_host_is_named_and_left_alone(replicas: Replicas) -> None:
    a = replicas.stubs[0]
    session = await tool_session(a)
    for holder in (f"{socket.gethostname()[:24]}:1:0a0b0c0d:00000000", "another-host:4242:0a0b0c0d:00000000"):
        await _hold_lease(replicas.running[0], session.id, holder)
        answered = await asyncio.wait_for(prepare(a, session.id), 5)
        assert answered.result.action != pb.ACTION_FOLDED
        assert answered.result.not_folded_reason == pb.NOT_FOLDED_REASON_FOLD_IN_PROGRESS
        assert holder in answered.result.not_folded_detail
    assert replicas.fake.requests == []

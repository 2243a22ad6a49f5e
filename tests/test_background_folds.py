"""Background folds end to end: real servers (one, or two replicas on one database) with an LLM
summarizer behind the fake provider. A view that reaches prefold_ratio × window starts a fold the
agent does not wait for; the Prepare at the trigger installs what it prepared without calling the
summarizer; a rewind below it cancels it or makes what it prepared stale (discarded, never installed);
across replicas it runs once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import func, select

from builders import Outcome, assistant, call, compact, create_session, prepare, result, user
from conftest import Replicas
from ctxfold.engine.background import PreparedFold
from ctxfold.engine.background import applied as applied_fold
from ctxfold.engine.projection import Projection
from ctxfold.server import RunningServer
from ctxfold.service import background as background_service
from ctxfold.service import maintenance as maintenance_service
from ctxfold.store import schema
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import FakeProvider
from test_prepare import state
from traces import tool_output

WINDOW = 12_000


def stages(outcome: Outcome) -> list[int]:
    return [p.stage for p in outcome.progress]


class Agent:
    """An agent's turns on one session: a call and its 2,000-character result per Prepare."""

    def __init__(self, stub: pb_grpc.ContextServiceStub, session_id: str) -> None:
        self.stub, self.session_id, self.turn = stub, session_id, 0

    async def step(self, stub: pb_grpc.ContextServiceStub | None = None) -> Outcome:
        self.turn += 1
        call_id = f"c{self.turn}"
        return await prepare(
            stub or self.stub, self.session_id, call(call_id), result(call_id, tool_output(self.turn, 2000))
        )

    async def until(self, done: Callable[[Outcome], bool], stub: pb_grpc.ContextServiceStub | None = None) -> Outcome:
        for _ in range(60):
            outcome = await self.step(stub)
            if done(outcome):
                return outcome
        raise AssertionError("the session never got there")


async def llm_session(stub: pb_grpc.ContextServiceStub, **config: object) -> Agent:
    session = await create_session(stub, context_window=WINDOW, summarizer="llm", **config)
    await prepare(stub, session.id, user("Find out why the nightly build is slow"))
    return Agent(stub, session.id)


def started(outcome: Outcome) -> bool:
    return pb.FOLD_STAGE_BACKGROUND_STARTED in stages(outcome)


async def receipts(stub: pb_grpc.ContextServiceStub, session_id: str, status: str) -> list[dict[str, object]]:
    found = (await state(stub, session_id)).get("receipts", [])
    assert isinstance(found, list)
    return [r for r in found if r["status"] == status]


async def eventually_receipt(stub: pb_grpc.ContextServiceStub, session_id: str, status: str) -> dict[str, object]:
    for _ in range(300):
        found = await receipts(stub, session_id, status)
        if found:
            return found[-1]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {status!r} receipt")


async def stalled(fake: FakeProvider) -> None:
    for _ in range(400):
        if fake.stalled.is_set():
            return
        await asyncio.sleep(0.025)
    raise AssertionError("the background fold never reached the summarizer")


async def test_the_prepare_at_the_trigger_installs_the_background_fold_without_waiting_for_a_summarizer(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, stub = replicas.fake, replicas.stubs[0]
    checks: list[int] = []  # views a prepared fold was applied to (a pass over the whole view each)

    def counted(projection: Projection, prepared: PreparedFold) -> Projection | None:
        checks.append(projection.message_count)
        return applied_fold(projection, prepared)

    monkeypatch.setattr(background_service, "applied", counted)
    monkeypatch.setattr(maintenance_service, "applied", counted)
    fake.script("stall")
    agent = await llm_session(stub)
    first = await agent.until(started)
    # The Prepare that started it answered while the summarizer had not: it did not wait.
    assert first.result.action == pb.ACTION_NONE
    assert first.result.estimated_tokens < first.result.trigger_tokens
    await stalled(fake)
    # While it runs, Prepares answer at once — at the trigger too (the view still fits) — and say so.
    running = await agent.until(lambda o: o.result.estimated_tokens >= o.result.trigger_tokens)
    assert pb.FOLD_STAGE_BACKGROUND_RUNNING in stages(running)
    assert running.result.action == pb.ACTION_NONE
    assert running.result.not_folded_reason == pb.NOT_FOLDED_REASON_FOLD_IN_PROGRESS
    assert len(fake.requests) == 1
    fake.release()
    made = await eventually_receipt(stub, agent.session_id, "prepared")
    assert made["action"] == "background"
    # The next Prepare at the trigger installs it: no summarizer call, no pass, one event that says so;
    # whether it still applies is worked out once.
    checks.clear()
    installed = await agent.step()
    assert len(checks) == 1
    assert installed.result.action == pb.ACTION_FOLDED
    assert stages(installed) == [pb.FOLD_STAGE_PREPARED_INSTALLED]
    assert installed.progress[0].checkpoint_id == installed.result.checkpoint_id
    assert installed.progress[0].summarizer == "llm"
    assert len(fake.requests) == 1
    assert installed.result.estimated_tokens < installed.result.trigger_tokens
    assert sum(m.summary for m in installed.result.messages) == 1
    # Every message after the fold's position is still in the view, verbatim, after the summary.
    assert installed.result.messages[-1].content == tool_output(agent.turn, 2000)
    session = (await stub.GetSession(pb.GetSessionRequest(session_id=agent.session_id))).session
    assert session.checkpoint_id == installed.result.checkpoint_id
    applied = await receipts(stub, agent.session_id, "applied")
    assert "prepared in the background" in str(applied[-1]["reason"])


async def test_a_background_fold_runs_once_across_replicas_and_either_replica_installs_it(replicas: Replicas) -> None:
    fake = replicas.fake
    a, b = replicas.stubs
    fake.script("stall")
    agent = await llm_session(a)
    await agent.until(started)
    await stalled(fake)
    # The other replica, in the band too, finds the fold lease held: it does not summarize the same input.
    await agent.step(b)
    await agent.step(b)
    await asyncio.sleep(0.3)
    assert len(fake.requests) == 1
    fake.release()
    await eventually_receipt(a, agent.session_id, "prepared")
    installed = await agent.until(lambda o: o.result.action == pb.ACTION_FOLDED, b)
    assert stages(installed) == [pb.FOLD_STAGE_PREPARED_INSTALLED]
    assert len(fake.requests) == 1


async def test_a_rewind_below_a_running_background_fold_cancels_it(replicas: Replicas) -> None:
    fake, stub = replicas.fake, replicas.stubs[0]
    running = replicas.running[0]
    fake.script("stall")
    agent = await llm_session(stub)
    await agent.until(started)
    await stalled(fake)
    assert running.maintenance.background.running(agent.session_id)
    await stub.Rewind(pb.RewindRequest(session_id=agent.session_id, to_seq=3))
    for _ in range(200):
        if not running.maintenance.background.running(agent.session_id):
            break
        await asyncio.sleep(0.025)
    assert not running.maintenance.background.running(agent.session_id)
    await asyncio.sleep(0.2)
    assert await receipts(stub, agent.session_id, "prepared") == []
    (stopped,) = await receipts(stub, agent.session_id, "discarded")
    assert stopped["action"] == "background" and "a rewind to seq 3" in str(stopped["reason"])
    # The session goes on; in the band again, a new background fold starts over the rewound history.
    fake.reset()
    again = await agent.until(started)
    assert again.result.action == pb.ACTION_NONE
    await eventually_receipt(stub, agent.session_id, "prepared")


async def prepared_rows(running: RunningServer, session_id: str) -> int:
    p = schema.prepared_folds.c
    async with running.store.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).where(p.session_id == session_id))).scalar_one())


async def finished(running: RunningServer, session_id: str) -> None:
    for _ in range(400):
        if not running.maintenance.background.running(session_id):
            return
        await asyncio.sleep(0.025)
    raise AssertionError("the background fold never ended")


async def test_deleting_a_session_stops_its_background_fold(replicas: Replicas) -> None:
    fake, stub, running = replicas.fake, replicas.stubs[0], replicas.running[0]
    fake.script("stall")
    agent = await llm_session(stub)
    await agent.until(started)
    await stalled(fake)
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=agent.session_id))
    await finished(running, agent.session_id)  # stopped, not left paying for a summary of a deleted session
    assert await prepared_rows(running, agent.session_id) == 0


async def test_a_background_fold_of_a_session_deleted_and_created_again_prepares_nothing_for_the_new_one(
    replicas: Replicas,
) -> None:
    """Deleted on another replica (which cannot stop this one's fold) and created again under its key: same id."""
    fake, (a, b), running = replicas.fake, replicas.stubs, replicas.running[0]
    fake.script("stall")
    old = await create_session(a, context_window=WINDOW, summarizer="llm", session_key="nightly")
    await prepare(a, old.id, user("Find out why the nightly build is slow"))
    await Agent(a, old.id).until(started)
    await stalled(fake)
    await b.DeleteSession(pb.DeleteSessionRequest(session_id=old.id))
    new = await create_session(b, context_window=WINDOW, summarizer="llm", session_key="nightly")
    assert new.id == old.id
    fake.release()
    await finished(running, old.id)
    assert await prepared_rows(running, new.id) == 0
    assert await receipts(b, new.id, "prepared") == []


async def test_a_prepared_fold_a_compact_folds_over_is_discarded_with_a_receipt(replicas: Replicas) -> None:
    """Its summary was paid for: the fold installed instead (here an explicit Compact, on another replica) says so."""
    stub, running = replicas.stubs[0], replicas.running[0]
    agent = await llm_session(stub)
    await agent.until(started)
    prepared = await eventually_receipt(stub, agent.session_id, "prepared")
    compacted = await compact(replicas.stubs[1], agent.session_id)
    assert compacted.result.action == pb.ACTION_FOLDED
    assert await prepared_rows(running, agent.session_id) == 0
    [discarded] = await receipts(stub, agent.session_id, "discarded")
    assert discarded["action"] == "background" and discarded["tokens_in"] == prepared["tokens_in"]
    assert "another fold was installed" in str(discarded["reason"])


async def test_a_prepared_fold_made_stale_by_a_rewind_is_discarded_never_installed(replicas: Replicas) -> None:
    fake, stub = replicas.fake, replicas.stubs[0]
    agent = await llm_session(stub)
    await agent.until(started)
    stale = await eventually_receipt(stub, agent.session_id, "prepared")
    # Below what it covers: the history it summarized is abandoned.
    await stub.Rewind(pb.RewindRequest(session_id=agent.session_id, to_seq=5))
    # The next background fold fails, so the stale one is what the trigger finds.
    fake.script("error500")
    await agent.until(started)
    await eventually_receipt(stub, agent.session_id, "failed")
    before = len(fake.requests)
    # At the trigger: the stale fold is discarded, and the view (which fits) is answered at once while
    # a new fold runs in the background.
    trigger = await agent.until(lambda o: o.result.estimated_tokens >= o.result.trigger_tokens)
    assert trigger.result.action == pb.ACTION_NONE
    assert pb.FOLD_STAGE_PREPARED_INSTALLED not in stages(trigger)
    assert trigger.result.not_folded_reason == pb.NOT_FOLDED_REASON_FOLD_IN_PROGRESS
    [discarded] = await receipts(stub, agent.session_id, "discarded")
    assert discarded["action"] == "background" and "no longer applies" in str(discarded["reason"])
    assert discarded["tokens_in"] == stale["tokens_in"]
    installed = await agent.until(lambda o: o.result.action == pb.ACTION_FOLDED)
    assert stages(installed) == [pb.FOLD_STAGE_PREPARED_INSTALLED]
    assert len(fake.requests) == before + 1  # the new background fold's, and no other


async def test_at_the_trigger_with_nothing_prepared_the_view_is_answered_and_folded_in_the_background(
    replicas: Replicas,
) -> None:
    """A turn that jumps past the prefold band: the Prepare at the trigger does not wait either."""
    fake, stub = replicas.fake, replicas.stubs[0]
    agent = await llm_session(stub, compact_ratio=0.6, prefold_ratio=0.599)  # a band no turn lands in
    fake.script("stall")
    jumped = await agent.until(lambda o: o.result.estimated_tokens >= o.result.trigger_tokens)
    assert jumped.result.action == pb.ACTION_NONE and started(jumped)
    assert jumped.result.not_folded_reason == pb.NOT_FOLDED_REASON_FOLD_IN_PROGRESS
    await stalled(fake)
    fake.release()
    await eventually_receipt(stub, agent.session_id, "prepared")
    installed = await agent.step()
    assert stages(installed) == [pb.FOLD_STAGE_PREPARED_INSTALLED]


async def huge_turn(stub: pb_grpc.ContextServiceStub, session_id: str) -> Outcome:
    """A turn that takes a view of half this window above its hard ceiling: four reads of 7,000
    characters each (too short to prune), which the next call must answer."""
    reads = [pb.ToolCall(id=f"r{i}", name="read", arguments="{}") for i in range(4)]
    return await prepare(
        stub, session_id, assistant("", *reads), *(result(f"r{i}", tool_output(i, 7_000)) for i in range(4))
    )


def folded_offline(outcome: Outcome) -> None:
    """The Prepare folded with extractive instead of the session's LLM summarizer, and said so."""
    assert outcome.result.action != pb.ACTION_NONE
    assert outcome.result.estimated_tokens <= outcome.result.hard_limit_tokens
    fallbacks = [p for p in outcome.progress if p.stage == pb.FOLD_STAGE_SUMMARIZER_FALLBACK]
    assert fallbacks and all(p.summarizer == "extractive" for p in fallbacks)
    assert "background folds are on" in fallbacks[0].message and "instead of waiting for llm" in fallbacks[0].message
    committed = [p for p in outcome.progress if p.stage == pb.FOLD_STAGE_PASS_COMMITTED]
    assert committed and all(p.summarizer == "extractive" for p in committed)


async def test_above_the_hard_ceiling_with_nothing_prepared_the_fold_is_made_offline_at_once(
    replicas: Replicas,
) -> None:
    """The summarizer never answers: with background folds on the agent does not wait for it."""
    fake, stub = replicas.fake, replicas.stubs[0]
    fake.script("stall")
    agent = await llm_session(stub)
    await agent.until(lambda o: o.result.estimated_tokens >= WINDOW // 2)
    over = await asyncio.wait_for(huge_turn(stub, agent.session_id), timeout=10)
    folded_offline(over)
    assert fake.requests == [] and not fake.stalled.is_set()
    applied = await receipts(stub, agent.session_id, "applied")
    assert any("instead of waiting for llm" in str(r["reason"]) for r in applied)
    # Off, the same turn is folded by the LLM (the fallback to extractive is only for a failed summary).
    fake.reset()
    off = await llm_session(stub, prefold_ratio=0.0)
    await off.until(lambda o: o.result.estimated_tokens >= WINDOW // 2)
    folded = await huge_turn(stub, off.session_id)
    assert len(fake.requests) >= 1
    assert all(p.summarizer == "llm" for p in folded.progress if p.stage == pb.FOLD_STAGE_PASS_COMMITTED)


async def test_an_overflow_with_nothing_prepared_is_folded_offline_too(replicas: Replicas) -> None:
    """The provider refused a view that fits by ctxfold's estimate: the retry folds one pass at once."""
    fake, stub = replicas.fake, replicas.stubs[0]
    fake.script("stall")
    agent = await llm_session(stub)
    await agent.until(lambda o: o.result.estimated_tokens >= WINDOW // 2)
    retried = await asyncio.wait_for(prepare(stub, agent.session_id, overflow=True), timeout=10)
    assert retried.result.action == pb.ACTION_FOLDED and fake.requests == []
    (fallback,) = [p for p in retried.progress if p.stage == pb.FOLD_STAGE_SUMMARIZER_FALLBACK]
    assert fallback.summarizer == "extractive" and "refused by the provider" in fallback.message


async def test_a_turn_above_the_hard_ceiling_stops_the_running_background_fold_and_does_not_wait_for_it(
    replicas: Replicas,
) -> None:
    fake, stub = replicas.fake, replicas.stubs[0]
    fake.script("stall")
    agent = await llm_session(stub)
    await agent.until(started)
    await stalled(fake)
    over = await asyncio.wait_for(huge_turn(stub, agent.session_id), timeout=10)
    folded_offline(over)
    assert len(fake.requests) == 1  # the stopped background fold's, and no other
    stopped = await receipts(stub, agent.session_id, "discarded")
    assert stopped and "stopped before it was ready: the view went above the hard ceiling" in str(stopped[-1]["reason"])
    assert stopped[-1]["action"] == "background"
    fake.release()
    # Nothing prepared from the stopped fold is installed later.
    await asyncio.sleep(0.3)
    assert await receipts(stub, agent.session_id, "prepared") == []


async def test_with_prefold_ratio_zero_nothing_runs_in_the_background(replicas: Replicas) -> None:
    fake, stub = replicas.fake, replicas.stubs[0]
    agent = await llm_session(stub, prefold_ratio=0.0)
    session = (await stub.GetSession(pb.GetSessionRequest(session_id=agent.session_id))).session
    assert session.config.HasField("prefold_ratio") and session.config.prefold_ratio == 0.0
    reached = await agent.until(lambda o: o.result.estimated_tokens >= 0.75 * WINDOW)
    assert reached.result.action == pb.ACTION_NONE and not started(reached)
    await asyncio.sleep(0.2)
    assert fake.requests == []
    folded = await agent.until(lambda o: o.result.action == pb.ACTION_FOLDED)
    assert pb.FOLD_STAGE_PASS_COMMITTED in stages(folded)


async def test_the_effective_config_says_where_background_folds_start(replicas: Replicas) -> None:
    stub = replicas.stubs[0]
    llm = await create_session(stub, context_window=WINDOW, summarizer="llm")
    assert llm.config.prefold_ratio == pytest.approx(0.75)
    extractive = await create_session(stub, context_window=WINDOW)
    assert extractive.config.HasField("prefold_ratio") and extractive.config.prefold_ratio == 0.0
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await create_session(stub, context_window=WINDOW, summarizer="llm", prefold_ratio=0.9)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.prefold_ratio" in (refused.value.details() or "")

"""Lineage operations racing on one session: eight clients fork, rewind, compact and prepare at once for a
bounded time. Every call answers OK or a status a client can act on (never INTERNAL, UNKNOWN or a bare
CANCELLED, always with an ErrorInfo), and afterwards every session is whole: its live messages are
exactly 1..head, every tool call has its result, and it prepares on."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import grpc
import pytest
from sqlalchemy import select

from builders import append, call, compact, create_session, prepare, result, user
from conftest import Replicas
from ctxfold.server import RunningServer
from ctxfold.store import lineage as store_lineage
from ctxfold.store import schema
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import error_info
from test_fold_lease import fold_in_flight
from traces import tool_output

RACE_SECONDS = 6.0
ACTIONABLE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
# The task, then groups of three (a turn, a call, its result): a rewind to 1 + 3k keeps whole groups.
GROUP = 3


def turn(tag: str) -> list[pb.Message]:
    return [user(f"step {tag}"), call(f"call_{tag}", "read_file"), result(f"call_{tag}", f"contents {tag} " * 150)]


async def live_messages(stub: pb_grpc.ContextServiceStub, sid: str) -> list[pb.Message]:
    out: list[pb.Message] = []
    token = ""
    while True:
        page = await stub.ListMessages(pb.ListMessagesRequest(session_id=sid, page_token=token, page_size=200))
        out += page.messages
        token = page.next_page_token
        if not token:
            return out


def assert_whole(messages: list[pb.Message], head_seq: int, sid: str) -> None:
    assert [m.seq for m in messages] == list(range(1, head_seq + 1)), f"{sid}: a hole in its transcript"
    waiting: set[str] = set()
    for message in messages:
        if message.role == pb.ROLE_TOOL:
            assert message.tool_call_id in waiting, f"{sid}: a result without its call at seq {message.seq}"
            waiting.discard(message.tool_call_id)
        else:
            assert not waiting, f"{sid}: calls {waiting} without results before seq {message.seq}"
            waiting = {c.id for c in message.tool_calls}


async def test_forks_rewinds_compacts_and_prepares_racing_on_one_session_leave_every_session_whole(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    sid = (await create_session(stub, context_window=6000, max_output_tokens=200, summary_max_tokens=600)).id
    await prepare(stub, sid, user("the task: keep every session whole"))
    for k in range(4):
        await prepare(stub, sid, *turn(f"warm{k}"))
    statuses: Counter[str] = Counter()
    forks: list[str] = []
    deadline = time.monotonic() + RACE_SECONDS

    async def run(operation: Callable[[random.Random], Awaitable[object]], seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            try:
                await operation(rng)
            except grpc.aio.AioRpcError as error:
                assert error.code() in ACTIONABLE, f"{error.code()}: {error.details()}"
                statuses[f"{error.code().name} {error_info(error).reason}"] += 1
            else:
                statuses["OK"] += 1

    async def head() -> int:
        return (await stub.GetSession(pb.GetSessionRequest(session_id=sid))).session.head_seq

    async def appender(rng: random.Random) -> None:
        await prepare(stub, sid, *turn(f"{rng.random():.6f}"))

    async def rewinder(rng: random.Random) -> None:
        groups = max((await head() - 1) // GROUP, 1)
        await stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=1 + GROUP * rng.randrange(1, groups + 1)))

    async def forker(rng: random.Random) -> None:
        at_seq = 0 if rng.random() < 0.5 else 1 + GROUP * rng.randrange(0, 4)
        forks.append((await stub.Fork(pb.ForkRequest(session_id=sid, at_seq=at_seq))).session.id)

    async def compacter(_rng: random.Random) -> None:
        await compact(stub, sid)

    clients = [appender, appender, appender, rewinder, rewinder, forker, forker, compacter]
    await asyncio.gather(*(run(client, seed) for seed, client in enumerate(clients)))

    assert statuses["OK"] > len(clients), statuses
    for session_id in [sid, *forks]:
        view = (await prepare(stub, session_id)).result
        session = (await stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
        assert_whole(await live_messages(stub, session_id), session.head_seq, session_id)
        state = (await stub.GetContextState(pb.GetContextStateRequest(session_id=session_id))).state_json
        assert view.checkpoint_id == session.checkpoint_id and session.checkpoint_id in state
        if session_id != sid:
            await prepare(stub, session_id, *turn(f"after {session_id}"))


async def test_a_fork_at_the_head_while_a_rewind_of_its_source_commits_is_a_snapshot_of_one_or_the_other(
    stub: pb_grpc.ContextServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rewind is held after it moved the abandoned tail out of the head segment and before it
    commits; a fork at the head made meanwhile must not see the old head over the moved messages (on
    PostgreSQL it did: `head_seq` 25 with live messages up to 13, then appends at 26)."""
    sid = (await create_session(stub, context_window=64000)).id
    await prepare(stub, sid, user("the task"))
    for k in range(8):
        await prepare(stub, sid, *turn(f"{k}"))
    moved, release = asyncio.Event(), asyncio.Event()
    split_tail = store_lineage._split_tail

    async def held_split(*args: object) -> None:
        await split_tail(*args)  # type: ignore[arg-type]
        moved.set()
        await release.wait()

    monkeypatch.setattr(store_lineage, "_split_tail", held_split)
    rewind = asyncio.ensure_future(stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=13)))
    await asyncio.wait_for(moved.wait(), 30)
    fork = asyncio.ensure_future(stub.Fork(pb.ForkRequest(session_id=sid, at_seq=0)))
    await asyncio.wait({fork}, timeout=1.0)  # a fork that does not wait for the rewind is done by now
    release.set()
    assert (await rewind).session.head_seq == 13
    forked = (await fork).session
    assert forked.head_seq in (13, 25)
    assert_whole(await live_messages(stub, forked.id), forked.head_seq, forked.id)
    appended = (await prepare(stub, forked.id, *turn("on the fork"))).result
    assert [m.seq for m in appended.messages[-3:]] == [forked.head_seq + 1, forked.head_seq + 2, forked.head_seq + 3]


async def test_a_fold_of_a_session_deleted_and_created_again_under_its_key_installs_nothing_in_the_new_one(
    replicas: Replicas,
) -> None:
    """The new session has the old one's id and counts its versions from 1 again: a fold that loaded the old one at
    version N must not install into the new one once it reaches N too (it answered INTERNAL: its folded-results
    document names a message the delete removed)."""
    (a, b), fake, running = replicas.stubs, replicas.fake, replicas.running[0]
    config = {"context_window": 12_000, "summarizer": "llm", "prefold_ratio": 0.0, "session_key": "flaky"}
    old = await create_session(a, **config)
    await prepare(a, old.id, user("Investigate the flaky test"))
    for i in range(12):
        await append(a, old.id, call(f"c{i}"), result(f"c{i}", tool_output(i, 4000)))
    folding = await fold_in_flight(fake, a, old.id)
    seen = await session_version(running, old.id)
    await b.DeleteSession(pb.DeleteSessionRequest(session_id=old.id))
    new = await create_session(b, **config)
    assert new.id == old.id
    for i in range(seen - await session_version(running, new.id)):
        await append(b, new.id, user(f"note {i}"))
    assert await session_version(running, new.id) == seen
    fake.release()
    try:
        await asyncio.wait_for(folding, 30)
    except grpc.aio.AioRpcError as error:
        assert error.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), error.details()
    assert not (await b.GetSession(pb.GetSessionRequest(session_id=new.id))).session.checkpoint_id
    view = (await prepare(b, new.id)).result
    assert [m.content for m in view.messages] == [f"note {i}" for i in range(len(view.messages))]


async def session_version(running: RunningServer, session_id: str) -> int:
    s = schema.sessions.c
    async with running.store.engine.connect() as conn:
        return int((await conn.execute(select(s.version).where(s.id == session_id))).scalar_one())

"""Fork and Rewind mixed for hundreds of cycles: every segment chain a query walks stays bounded, every
query keeps its shape, every RPC keeps answering and every transcript stays exactly right."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from sqlalchemy import event, select

from builders import call, result, user
from ctxfold.engine.lineage import MAX_LIVE_CHAIN, rewind_splits_head
from ctxfold.server import RunningServer
from ctxfold.store import schema
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_lineage import isolated, listing, live_chain

__all__ = ["isolated"]  # the fixture, imported for the tests below


def test_a_rewind_moves_the_tail_unless_a_live_branch_would_pass_the_bound() -> None:
    assert rewind_splits_head(1, 0)
    assert rewind_splits_head(2, MAX_LIVE_CHAIN - 3)
    assert not rewind_splits_head(2, MAX_LIVE_CHAIN - 2)
    # A session already at the bound moves its tail: a new head segment would be no shorter.
    assert rewind_splits_head(MAX_LIVE_CHAIN, MAX_LIVE_CHAIN)


@dataclass
class Model:
    """What each session's transcript must be: message ids, live and abandoned."""

    live: dict[str, list[str]] = field(default_factory=dict)
    abandoned: dict[str, set[str]] = field(default_factory=dict)

    def append(self, session_id: str, messages: list[pb.Message]) -> None:
        self.live[session_id] += [m.id for m in messages]

    def fork(self, source: str, fork: str) -> None:
        self.live[fork] = list(self.live[source])
        self.abandoned[fork] = set()

    def rewind(self, session_id: str, to_seq: int) -> None:
        self.abandoned[session_id] |= set(self.live[session_id][to_seq:])
        del self.live[session_id][to_seq:]


class Harness:
    def __init__(self, running: RunningServer, stub: pb_grpc.ContextServiceStub):
        self.running, self.stub, self.model = running, stub, Model()
        self.statements: list[str] = []

    async def create(self) -> str:
        response = await self.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(context_window=32000)))
        self.model.live[response.session.id], self.model.abandoned[response.session.id] = [], set()
        return response.session.id

    async def append(self, session_id: str, *messages: pb.Message) -> int:
        response = await self.stub.AppendMessages(pb.AppendMessagesRequest(session_id=session_id, messages=messages))
        self.model.append(session_id, list(response.messages))
        return len(self.model.live[session_id])

    async def fork(self, session_id: str) -> str:
        fork = (await self.stub.Fork(pb.ForkRequest(session_id=session_id))).session.id
        self.model.fork(session_id, fork)
        return fork

    async def rewind(self, session_id: str, to_seq: int) -> None:
        await self.stub.Rewind(pb.RewindRequest(session_id=session_id, to_seq=to_seq))
        self.model.rewind(session_id, to_seq)

    @contextmanager
    def recording(self) -> Iterator[list[str]]:
        """The SQL statements the server runs meanwhile."""
        seen: list[str] = []

        def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            seen.append(statement)

        engine = self.running.store.engine.sync_engine
        event.listen(engine, "before_cursor_execute", record)
        try:
            yield seen
        finally:
            event.remove(engine, "before_cursor_execute", record)

    async def probe(self, source: str, oldest_fork: str) -> int:
        """The longest statement of a round of reads over the deepest lineages (a statement names one
        range per segment it reads, so this grows with the chain)."""
        with self.recording() as seen:
            for session_id in (source, oldest_fork):
                request = pb.ReadToolResultRequest(session_id=session_id, tool_call_id="c0")
                assert (await self.stub.ReadToolResult(request)).data == "first result"
                await self.stub.ListMessages(
                    pb.ListMessagesRequest(session_id=session_id, page_size=5, include_abandoned=True)
                )
            probe_fork = (await self.stub.Fork(pb.ForkRequest(session_id=oldest_fork))).session.id
            await self.stub.DeleteSession(pb.DeleteSessionRequest(session_id=probe_fork))
        return max(len(statement) for statement in seen)

    async def check(self) -> None:
        """Every session's transcript, live and abandoned, is exactly the model's; no chain is too long."""
        for session_id, ids in self.model.live.items():
            assert len(await live_chain(self.running, session_id)) <= MAX_LIVE_CHAIN
            assert [m.id for m in await listing(self.stub, session_id, page_size=1000)] == ids
            everything = await listing(self.stub, session_id, abandoned=True, page_size=1000)
            assert {m.id for m in everything if m.abandoned} == self.model.abandoned[session_id]
            page = await self.stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session_id, tool_call_id="c0"))
            assert page.data == "first result"

    async def start(self, users: int) -> str:
        source = await self.create()
        await self.append(source, call("c0"), result("c0", "first result"), *(user(f"u{i}") for i in range(users)))
        return source


@pytest.fixture
async def harness(isolated: tuple[RunningServer, pb_grpc.ContextServiceStub]) -> AsyncIterator[Harness]:
    yield Harness(*isolated)


CYCLES = 150


async def test_fork_then_rewind_below_the_fork_going_down_the_transcript(harness: Harness) -> None:
    """Each cycle forks at the head, rewinds the source two below the fork point and appends one: every
    rewind lands below the last one, so moving the tail each time would stack the tails (and every
    older fork) one segment deeper per cycle."""
    source = await harness.start(users=CYCLES + 10)
    forks = []
    for cycle in range(CYCLES):
        forks.append(await harness.fork(source))
        head = len(harness.model.live[source])
        await harness.rewind(source, head - 2)
        await harness.append(source, user(f"again {cycle}"))
        if cycle == 10:
            early = await harness.probe(source, forks[0])
    assert await harness.probe(source, forks[0]) <= early
    await harness.check()


async def test_fork_then_rewind_below_the_fork_going_up_the_transcript(harness: Harness) -> None:
    """Each cycle appends a user message and a tool call group, forks at the head and rewinds the source
    to just after the user message: the tails start ever later, and each fork hangs off its own tail."""
    source = await harness.start(users=2)
    forks = []
    for cycle in range(CYCLES):
        head = await harness.append(source, user(f"u{cycle}"), call(f"c{cycle + 1}"), result(f"c{cycle + 1}", "out"))
        forks.append(await harness.fork(source))
        await harness.rewind(source, head - 2)
        if cycle == 10:
            early = await harness.probe(source, forks[0])
    assert await harness.probe(source, forks[0]) <= early
    await harness.check()
    assert len(await live_chain(harness.running, source)) == 1


async def test_forks_of_forks_then_rewinds_below_them(harness: Harness) -> None:
    """Each cycle forks the source, forks that fork and forks again (each appending), then rewinds the
    source below the first fork point and appends, and rewinds the deepest fork into its parent's part."""
    source = await harness.start(users=CYCLES + 10)
    for cycle in range(CYCLES // 3):
        level = source
        for depth in range(3):
            level = await harness.fork(level)
            await harness.append(level, user(f"fork {cycle} {depth}"))
        if cycle == 1:
            deepest_early = level
        head = len(harness.model.live[source])
        await harness.rewind(source, head - 2)
        await harness.append(source, user(f"again {cycle}"))
        await harness.rewind(level, head - 1)
        await harness.append(level, user(f"deepest {cycle}"))
        if cycle == 2:
            early = await harness.probe(source, deepest_early)
    assert await harness.probe(source, deepest_early) <= early
    await harness.check()


async def test_a_fork_of_a_rewound_fork_reads_the_source_history_it_saw(
    isolated: tuple[RunningServer, pb_grpc.ContextServiceStub],
) -> None:
    """Abandoned history inherited from a source: a fork that rewinds below its fork point still lists the
    source messages it abandoned and reads their results, and never sees what the source wrote later."""
    running, stub = isolated
    harness = Harness(running, stub)
    source = await harness.start(users=3)
    await harness.append(source, call("c1"), result("c1", "seen by the fork"))
    fork = await harness.fork(source)
    await harness.rewind(source, 2)
    await harness.append(source, call("c2"), result("c2", "after the fork"))
    await harness.rewind(fork, 5)
    await harness.check()
    everything = await listing(stub, fork, abandoned=True, page_size=1000)
    late = next(m for m in everything if m.tool_call_id == "c1")
    assert late.abandoned
    page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=fork, result_ref=late.result_ref))
    assert page.data == "seen by the fork"
    async with running.store.engine.connect() as conn:
        m = schema.messages.c
        later = (await conn.execute(select(m.result_ref).where(m.tool_call_id == "c2"))).scalar_one()
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=fork, result_ref=later))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND

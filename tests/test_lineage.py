"""Fork and Rewind over shared transcript segments: nothing copied, nothing lost, nothing leaked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from builders import append, call, create_session, result, user
from conftest import downgrade, fresh_database, settings_for
from ctxfold.server import RunningServer, start
from ctxfold.store import schema
from ctxfold.store.database import create_engine
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import error_info


async def listing(
    stub: pb_grpc.ContextServiceStub, session_id: str, abandoned: bool = False, page_size: int = 3
) -> list[pb.Message]:
    out: list[pb.Message] = []
    token = ""
    while True:
        page = await stub.ListMessages(
            pb.ListMessagesRequest(
                session_id=session_id, page_size=page_size, page_token=token, include_abandoned=abandoned
            )
        )
        out += page.messages
        token = page.next_page_token
        if not token:
            return out


async def test_rewind_abandons_later_messages_and_keeps_them_listable(stub: pb_grpc.ContextServiceStub) -> None:
    sid = (await create_session(stub, context_window=32000)).id
    first = (await append(stub, sid, user("one"), user("two"), user("three"), user("four"))).messages
    session = (await stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=2))).session
    assert session.head_seq == 2
    edited = (await append(stub, sid, user("three, edited"))).messages
    assert edited[0].seq == 3
    live = await listing(stub, sid)
    assert [m.content for m in live] == ["one", "two", "three, edited"]
    everything = await listing(stub, sid, abandoned=True)
    assert [(m.seq, m.content, m.abandoned) for m in everything] == [
        (1, "one", False),
        (2, "two", False),
        (3, "three, edited", False),
        (3, "three", True),
        (4, "four", True),
    ]
    assert {m.id for m in everything} >= {m.id for m in first}


async def page(stub: pb_grpc.ContextServiceStub, sid: str, abandoned: bool, token: str = "") -> pb.ListMessagesResponse:
    request = pb.ListMessagesRequest(session_id=sid, page_size=3, page_token=token, include_abandoned=abandoned)
    return await stub.ListMessages(request)


async def test_a_listing_goes_on_across_appends_and_starts_over_after_a_rewind(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    """A page token from before a rewind would splice two branches into one transcript (the next page's seqs from the
    new one) and, with abandoned messages, list a message moved off the live branch twice: it is refused."""
    sid = (await create_session(stub, context_window=32000)).id
    await append(stub, sid, user("one"), user("two"), user("three"), user("four"))
    for abandoned in (False, True):
        first = await page(stub, sid, abandoned)
        await append(stub, sid, user("appended meanwhile"))
        rest = (await page(stub, sid, abandoned, first.next_page_token)).messages
        live = [m.seq for m in [*first.messages, *rest] if not m.abandoned]
        assert len(live) > len(first.messages) and live == list(range(1, len(live) + 1))
        first = await page(stub, sid, abandoned)
        await stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=2))
        await append(stub, sid, user("three, edited"), user("four, edited"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await page(stub, sid, abandoned, first.next_page_token)
        assert refused.value.code() == grpc.StatusCode.ABORTED
        assert error_info(refused.value).reason == "INVALID_PAGE_TOKEN"
        assert "rewound" in (refused.value.details() or "")


async def test_rewind_restores_waiting_tool_calls(stub: pb_grpc.ContextServiceStub) -> None:
    sid = (await create_session(stub, context_window=32000)).id
    await append(stub, sid, user("go"), call("c1"), result("c1", "done"), user("thanks"))
    await stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=2))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await append(stub, sid, user("interrupting"))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await append(stub, sid, result("c1", "done again"))


async def test_rewind_out_of_range_is_refused(stub: pb_grpc.ContextServiceStub) -> None:
    """A negative seq is a bad argument; one past the head depends on the head, which moves."""
    sid = (await create_session(stub, context_window=32000)).id
    await append(stub, sid, user("one"))
    for bad, code in ((-1, grpc.StatusCode.INVALID_ARGUMENT), (2, grpc.StatusCode.FAILED_PRECONDITION)):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=bad))
        assert error.value.code() == code


async def test_fork_shares_history_and_then_diverges(stub: pb_grpc.ContextServiceStub) -> None:
    sid = (await create_session(stub, context_window=32000)).id
    source = (await append(stub, sid, user("a"), call("c1"), result("c1", "r" * 50_000), user("b"), user("c"))).messages
    fork = (
        await stub.Fork(pb.ForkRequest(session_id=sid, at_seq=4, config=pb.SessionConfig(max_output_tokens=1000)))
    ).session
    assert fork.id != sid and fork.head_seq == 4 and fork.forked_from_session_id == sid and fork.forked_at_seq == 4
    assert fork.config.max_output_tokens == 1000 and fork.config.context_window == 32000
    assert [m.id for m in await listing(stub, fork.id)] == [m.id for m in source[:4]]
    await append(stub, fork.id, user("fork only"))
    await append(stub, sid, user("source only"))
    assert [m.content for m in await listing(stub, fork.id)][-1] == "fork only"
    assert [m.content for m in await listing(stub, sid)][-2:] == ["c", "source only"]
    page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=fork.id, result_ref=source[2].result_ref))
    assert page.total_bytes == 50_000
    # The fork cannot read what lies after its fork point in the source, nor list it as abandoned.
    late = (await append(stub, sid, call("c9"), result("c9", "late"))).messages
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=fork.id, result_ref=late[1].result_ref))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert all(not m.abandoned for m in await listing(stub, fork.id, abandoned=True))


@pytest.fixture
async def isolated(backend: str, tmp_path: Path) -> AsyncIterator[tuple[RunningServer, pb_grpc.ContextServiceStub]]:
    running = await start(settings_for(await fresh_database(backend, tmp_path)))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield running, pb_grpc.ContextServiceStub(channel)
    await running.stop(grace=1.0)


async def test_deleting_source_keeps_fork_and_deleting_all_leaves_no_rows(
    isolated: tuple[RunningServer, pb_grpc.ContextServiceStub],
) -> None:
    running, stub = isolated
    sid = (await create_session(stub, context_window=32000)).id
    source = (await append(stub, sid, user("a"), call("c1"), result("c1", "x" * 40_000), user("b"))).messages
    await stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=3))
    await append(stub, sid, user("b2"))
    fork = (await stub.Fork(pb.ForkRequest(session_id=sid, at_seq=3))).session
    fork_of_fork = (await stub.Fork(pb.ForkRequest(session_id=fork.id))).session
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=sid))
    assert [m.id for m in await listing(stub, fork.id)] == [m.id for m in source[:3]]
    page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=fork.id, tool_call_id="c1"))
    assert page.total_bytes == 40_000
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=fork.id))
    assert len(await listing(stub, fork_of_fork.id)) == 3
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=fork_of_fork.id))
    counts = await running.store.row_counts()
    assert all(count == 0 for count in counts.values()), counts


async def live_chain(running: RunningServer, session_id: str) -> list[str]:
    """The segments the session's live transcript reads, newest first, walked in the database."""
    seg = schema.segments.c
    async with running.store.engine.connect() as conn:
        current = (
            await conn.execute(select(schema.sessions.c.segment_id).where(schema.sessions.c.id == session_id))
        ).scalar_one()
        chain: list[str] = []
        while current is not None:
            chain.append(current)
            current = (await conn.execute(select(seg.parent_id).where(seg.id == current))).scalar_one()
        return chain


async def test_long_rewind_chains_stay_bounded_and_working(
    isolated: tuple[RunningServer, pb_grpc.ContextServiceStub],
) -> None:
    """The issue's loop, 'append 2 call groups, Rewind(head-3)', 1,200 times (past SQLite's expression
    depth of 1,000 when every rewind added a range to each query): the rewinds land in the head segment,
    so the live chain stays one segment, and every operation still works."""
    running, stub = isolated
    sid = (await create_session(stub, context_window=32000)).id
    cycles = 1200
    pending: list[pb.Message] = []
    for cycle in range(cycles):
        groups = [m for g in (0, 1) for m in (call(f"c{cycle}-{g}"), result(f"c{cycle}-{g}", f"out {cycle} {g}"))]
        head = (await append(stub, sid, *pending, *groups)).messages[-1].seq
        # The rewind lands after the first group's call: the next cycle answers it first.
        head = (await stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=head - 3))).session.head_seq
        pending = [result(f"c{cycle}-0", f"again {cycle}")]
    assert len(await live_chain(running, sid)) == 1
    live = await listing(stub, sid, page_size=1000)
    assert [m.seq for m in live] == list(range(1, head + 1)) and head == 1 + 2 * (cycles - 1)
    everything = await listing(stub, sid, abandoned=True, page_size=1000)
    assert len(everything) == 4 * cycles + cycles - 1
    assert sum(m.abandoned for m in everything) == 3 * cycles
    # Live: the answer appended in the next cycle; abandoned: the first answer, still readable by ref.
    page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=sid, tool_call_id=f"c{cycles - 3}-0"))
    assert page.data == f"again {cycles - 3}"
    first_answer = next(m for m in everything if m.content == "out 0 0")
    assert first_answer.abandoned
    page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=sid, result_ref=first_answer.result_ref))
    assert page.data == "out 0 0"
    fork = (await stub.Fork(pb.ForkRequest(session_id=sid, at_seq=head - 1))).session
    assert [m.id for m in await listing(stub, fork.id, page_size=1000)] == [m.id for m in live[: head - 1]]
    assert len(await live_chain(running, fork.id)) == 2
    assert (await stub.Rewind(pb.RewindRequest(session_id=fork.id, to_seq=1))).session.head_seq == 1
    before = await running.store.get_session("default", sid)
    assert (await stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=2))).session.head_seq == 2
    after = await running.store.get_session("default", sid)
    assert len(await live_chain(running, sid)) == 1
    # Same head segment, new branch: state derived before the rewind no longer matches.
    assert after.segment_id == before.segment_id and after.branch_id != before.branch_id


async def test_sessions_from_before_migration_0004_keep_their_state_fingerprint(backend: str, tmp_path: Path) -> None:
    url = await fresh_database(backend, tmp_path)
    running = await start(settings_for(url))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = pb_grpc.ContextServiceStub(channel)
        sid = (await create_session(stub, context_window=32000)).id
        await append(stub, sid, user("one"), user("two"), user("three"))
    await running.stop(grace=0.5)
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(downgrade, "0003")
    finally:
        await engine.dispose()
    running = await start(settings_for(url))  # migrates to the newest revision
    try:
        record = await running.store.get_session("default", sid)
        # Its stored state was fingerprinted with the segment id: the branch id takes that value.
        assert record.branch_id == record.segment_id
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ContextServiceStub(channel)
            await stub.Rewind(pb.RewindRequest(session_id=sid, to_seq=1))
            everything = await listing(stub, sid, abandoned=True)
            assert [(m.content, m.abandoned) for m in everything] == [("one", False), ("two", True), ("three", True)]
        assert (await running.store.get_session("default", sid)).branch_id != record.branch_id
    finally:
        await running.stop(grace=0.5)

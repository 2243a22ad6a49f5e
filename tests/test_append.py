"""The one write of an append (`store/append.py`), on both stores: concurrent appends stay apart, so a
stale one writes nothing and the others all commit, whole, with their raw results; a repeated request
id writes nothing and answers the first append's messages; a caller that gives up does not stop the
writer. On SQLite, a small append commits on the event loop but never waits there for another
process's lock, and the write-ahead log stays bounded; on PostgreSQL, the write uses the store's
pool and a connection lost or never opened is UNAVAILABLE."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import time
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from builders import append, create_session, prepare, user
from ctxfold.engine.context import Made, SessionRecord, made
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.engine.ids import new_id, new_result_ref
from ctxfold.engine.model import NewMessage, Role, SessionConfig, ToolCall
from ctxfold.engine.transcript import AppendLimits
from ctxfold.server import RunningServer
from ctxfold.store.append import AppendWrite, Bookkeeping, Repeated, Stale, Written
from ctxfold.store.append_postgres import PostgresAppender
from ctxfold.store.append_sqlite import INLINE_MAX_BYTES
from ctxfold.store.rows import append_write
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_prepare import transcript

TENANT = "default"
CONFIG = SessionConfig(context_window=200_000)
RAW = bytes(range(256)) * 1024  # a 256 KiB tool result: stored in several chunks
LIMITS = AppendLimits(1 << 20, 16 << 20)
# A session as writes take it, for the tests that build writes without a store.
UNSTORED_RECORD = SessionRecord("s", TENANT, "{}", 0, 0, "g", 0, "b", None, (), 1, None, 0, 0.0, 0.0)


def rows(messages: list[NewMessage]) -> Made:
    """`messages` as an append makes them: stored forms, with their raw results."""
    return made(messages, [(new_id("m"), new_result_ref()) for _ in messages], CONFIG, LIMITS)


def turn(index: int) -> Made:
    """An assistant's tool call, its (large) result and a user message."""
    call_id = f"call-{index}"
    return rows(
        [
            NewMessage(Role.ASSISTANT, f"step {index}", tool_calls=(ToolCall(call_id, "bash", "{}"),)),
            NewMessage(Role.TOOL, RAW.hex() + str(index), tool_call_id=call_id),
            NewMessage(Role.USER, f"go on after {index}"),
        ]
    )


async def started_session(stub: pb_grpc.ContextServiceStub, server: RunningServer) -> tuple[SessionRecord, int]:
    session = await create_session(stub, context_window=CONFIG.context_window)
    await prepare(stub, session.id, user("start"))
    record = await server.store.get_session(TENANT, session.id)
    _, revision = await server.store.read_state(record)
    return record, revision


async def write(record: SessionRecord, new: Made | None, revision: int, request_id: str = "") -> AppendWrite:
    """An append of `new` (every turn answers its own tool call: nothing is left open) with its
    bookkeeping over `revision`."""
    now = time.time()
    new = new or Made((), ())
    messages = tuple(replace(m, seq=record.head_seq + 1 + i, create_time=now) for i, m in enumerate(new.messages))
    after = (
        replace(record, head_seq=record.head_seq + len(messages), open_tool_calls=(), version=record.version + 1)
        if messages
        else record
    )
    book = Bookkeeping("{}", revision)
    return append_write(
        record, replace(after, update_time=now), messages, new.results, request_id=request_id, bookkeeping=book
    )


async def store_append(
    server: RunningServer, record: SessionRecord, new: Made | None, revision: int, request_id: str = ""
) -> Written | Stale | Repeated:
    """The store's write of `new`, under the service (an AppendMessages call is builders.append)."""
    return await server.store.append(await write(record, new, revision, request_id))


async def test_a_write_counts_the_text_and_data_it_carries() -> None:
    """What decides whether a SQLite write is committed on the event loop: the text of its
    messages, the raw results that are not a message's content, and its bookkeeping."""
    sizes = {}
    result = NewMessage(Role.TOOL, os.urandom(256 << 10).hex(), tool_call_id="c")
    large = rows([NewMessage(Role.ASSISTANT, "", tool_calls=(ToolCall("c", "cat", "{}"),)), result])
    for name, new in (("small", rows([NewMessage(Role.USER, "go on")])), ("large", large)):
        written = await write(UNSTORED_RECORD, new, 3, "r")
        text = sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in new.messages)
        raw = sum(len(r.data) for r in new.results if not r.inline)
        assert written.size == text + raw + len("{}")
        sizes[name] = written.size
    assert sizes["small"] < INLINE_MAX_BYTES < sizes["large"]


async def test_concurrent_appends_stay_apart(server: RunningServer, stub: pb_grpc.ContextServiceStub) -> None:
    started = [await started_session(stub, server) for _ in range(8)]
    plans = []
    for i, (record, revision) in enumerate(started):
        # 2: someone appended since the session was read; 5: someone wrote its state since.
        seen = replace(record, version=record.version - 1) if i == 2 else record
        plans.append(store_append(server, seen, turn(i), revision - 1 if i == 5 else revision))
    outcomes = await asyncio.gather(*plans)

    assert [isinstance(o, Stale) for o in outcomes] == [i in (2, 5) for i in range(8)]
    for i, (record, revision) in enumerate(started):
        stored = await transcript(stub, record.id)
        after = await server.store.get_session(TENANT, record.id)
        _, now_revision = await server.store.read_state(after)
        if i in (2, 5):
            assert [m.content for m in stored] == ["start"]
            assert (after.version, after.head_seq, now_revision) == (record.version, record.head_seq, revision)
            continue
        assert outcomes[i] == Written(revision + 1) and now_revision == revision + 1
        assert [m.seq for m in stored] == [1, 2, 3, 4]
        assert (after.version, after.head_seq) == (record.version + 1, 4)
        ref = stored[2].result_ref
        whole = await server.store.read_raw_result(after, ref)
        assert whole.data == (RAW.hex() + str(i)).encode()
        assert whole.sha256 == hashlib.sha256(whole.data).hexdigest()


async def test_a_bookkeeping_write_without_messages_checks_the_session(
    server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    record, revision = await started_session(stub, server)
    assert await store_append(server, replace(record, branch_id="another-branch"), None, revision) == Stale()
    assert (await server.store.read_state(record))[1] == revision
    assert await store_append(server, record, None, revision) == Written(revision + 1)


async def test_a_repeated_request_id_writes_nothing(server: RunningServer, stub: pb_grpc.ContextServiceStub) -> None:
    record, revision = await started_session(stub, server)
    made_first = turn(0)
    assert await store_append(server, record, made_first, revision, request_id="req-1") == Written(revision + 1)
    after = await server.store.get_session(TENANT, record.id)
    repeated = await store_append(server, after, turn(1), revision + 1, request_id="req-1")
    assert repeated == Repeated(tuple(m.id for m in made_first.messages))
    again = await server.store.get_session(TENANT, record.id)
    assert (again.version, again.head_seq) == (after.version, after.head_seq)
    assert len(await transcript(stub, record.id)) == 4


async def test_a_caller_that_gives_up_does_not_stop_the_writer(
    server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    (first, first_revision), (second, second_revision) = [await started_session(stub, server) for _ in range(2)]
    abandoned = asyncio.ensure_future(store_append(server, first, turn(0), first_revision))
    kept = asyncio.ensure_future(store_append(server, second, turn(1), second_revision))
    await asyncio.sleep(0)
    abandoned.cancel()
    assert await kept == Written(second_revision + 1)
    assert len(await transcript(stub, second.id)) == 4
    # The abandoned append committed all of itself or nothing, and the session takes the next one.
    stored = len(await transcript(stub, first.id))
    assert stored in (1, 4)
    current = await server.store.get_session(TENANT, first.id)
    _, revision = await server.store.read_state(current)
    await store_append(server, current, turn(2), revision)
    assert len(await transcript(stub, first.id)) == stored + 3


def small_turn(index: int) -> Made:
    return rows([NewMessage(Role.ASSISTANT, f"ran step {index}"), NewMessage(Role.USER, f"go on after {index}")])


async def connect_to_store(server: RunningServer) -> Any:
    """A connection of the test's own to the server's PostgreSQL database."""
    import asyncpg

    url = server.store.engine.url
    return await asyncpg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password, database=url.database
    )


async def hot_write_pids(connection: Any) -> list[int]:
    """The backends whose last statement is an append."""
    rows = await connection.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND query LIKE 'WITH prior AS%'"
    )
    return [row["pid"] for row in rows]


async def blocked_pids(holder: Any) -> list[int]:
    """The backends waiting for a lock `holder` holds (whatever statement text pg_stat_activity shows for
    them: a connection's first append reports asyncpg's type lookup that prepared it)."""
    rows = await holder.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pg_backend_pid() = ANY(pg_blocking_pids(pid))"
    )
    return [row["pid"] for row in rows]


async def hot_write_backends(server: RunningServer, terminate: bool = False) -> int:
    """How many backends served appends, terminated when `terminate` is set."""
    admin = await connect_to_store(server)
    try:
        pids = await hot_write_pids(admin)
        for pid in pids if terminate else ():
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
        return len(pids)
    finally:
        await admin.close()


async def test_the_postgresql_writer_replaces_lost_connections_and_bounds_them(
    backend: str, server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    """PostgreSQL: appends use the store's one pool, so their connections are at most what it holds
    however many appends run at once, and one the server closed while it was idle is replaced without
    failing an append."""
    if backend != "postgresql":
        pytest.skip("the PostgreSQL writer's connections")
    started = [await started_session(stub, server) for _ in range(3 * server.settings.db_pool_size)]
    revisions = await asyncio.gather(*(store_append(server, r, small_turn(0), v) for r, v in started))
    assert revisions == [Written(v + 1) for _, v in started]
    pool = server.store.engine.sync_engine.pool
    assert 1 <= await hot_write_backends(server) <= pool.size() + pool._max_overflow  # type: ignore[attr-defined]

    assert await hot_write_backends(server, terminate=True) >= 1
    await asyncio.sleep(0.5)  # the writer's connections read the server's goodbye
    for record, revision in started[:2]:
        current = await server.store.get_session(TENANT, record.id)
        assert await store_append(server, current, small_turn(1), revision + 1) == Written(revision + 2)
    assert await hot_write_backends(server) >= 1


async def test_a_postgresql_write_cut_off_by_the_server_is_unavailable(
    backend: str, server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    """PostgreSQL: an administrator terminates the appender's backend while its statement waits for
    a row lock: the append fails with UNAVAILABLE (a retryable status, not an internal error) and
    wrote nothing, and the next one commits on a new connection."""
    if backend != "postgresql":
        pytest.skip("the PostgreSQL writer's connections")
    record, revision = await started_session(stub, server)
    holder = await connect_to_store(server)
    try:
        locked = holder.transaction()
        await locked.start()
        await holder.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", record.id)
        appending = asyncio.ensure_future(store_append(server, record, small_turn(0), revision))
        waiting: list[int] = []
        for _ in range(1500):  # up to 30 s on a loaded machine; found at once on a quiet one
            waiting = await blocked_pids(holder)
            if waiting:
                break
            await asyncio.sleep(0.02)
        assert len(waiting) == 1, "the append never waited for the lock"
        await holder.execute("SELECT pg_terminate_backend($1)", waiting[0])
        with pytest.raises(DomainError) as failed:
            await appending
        assert failed.value.kind is Kind.UNAVAILABLE and failed.value.reason == "STORE_UNAVAILABLE"
        await locked.rollback()
    finally:
        await holder.close()
    assert len(await transcript(stub, record.id)) == 1
    assert await store_append(server, record, small_turn(1), revision) == Written(revision + 1)


async def test_a_postgresql_writer_that_cannot_connect_is_unavailable(backend: str, server: RunningServer) -> None:
    """PostgreSQL: a hot write that cannot open a connection (here: the database is not there) fails
    with UNAVAILABLE, whatever the server's reason."""
    if backend != "postgresql":
        pytest.skip("the PostgreSQL writer's connections")
    engine = create_async_engine(server.store.engine.url.set(database=f"ctxfold_missing_{os.getpid()}"))
    writer = PostgresAppender(engine)
    try:
        with pytest.raises(DomainError) as failed:
            await writer.write(await write(UNSTORED_RECORD, None, 1))
        assert failed.value.kind is Kind.UNAVAILABLE and failed.value.reason == "STORE_UNAVAILABLE"
    finally:
        await writer.close()
        await engine.dispose()


async def test_an_append_waits_for_another_process_off_the_event_loop(
    backend: str, server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    """SQLite: while another process holds the write lock, a small append (which commits on the event
    loop when it can) waits in the writer thread; the loop keeps serving, and the append commits once
    the lock is released."""
    if backend != "sqlite":
        pytest.skip("SQLite's one write lock")
    record, revision = await started_session(stub, server)
    other = sqlite3.connect(server.store.engine.url.database or "", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        appending = asyncio.ensure_future(store_append(server, record, small_turn(0), revision))
        gaps = []
        for _ in range(20):
            tick = time.perf_counter()
            await asyncio.sleep(0.02)
            gaps.append(time.perf_counter() - tick)
        assert not appending.done()
        assert max(gaps) < 0.5  # the loop was never held by the waiting append
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert await asyncio.wait_for(appending, 15) == Written(revision + 1)
    assert len(await transcript(stub, record.id)) == 3


async def test_the_write_ahead_log_stays_bounded(
    backend: str, server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    """SQLite: the event loop's connection never checkpoints on commit (a checkpoint syncs the file);
    the writer thread checkpoints behind it, so a long run of small appends does not grow the WAL."""
    if backend != "sqlite":
        pytest.skip("SQLite's write-ahead log")
    record, revision = await started_session(stub, server)
    wal = f"{server.store.engine.url.database}-wal"
    before = await asyncio.to_thread(os.path.getsize, wal)  # earlier tests' high-water mark
    sizes = []
    for i in range(1500):
        outcome = await store_append(server, record, small_turn(i), revision)
        assert isinstance(outcome, Written)
        revision = outcome.revision
        record = (
            await server.store.get_session(TENANT, record.id)
            if i % 100 == 99
            else replace(record, version=record.version + 1, head_seq=record.head_seq + 2)
        )
        if i % 100 == 99:
            sizes.append(await asyncio.to_thread(os.path.getsize, wal))
    assert len(await transcript(stub, record.id)) == 1 + 2 * 1500
    # Every append writes about 12 pages of 4 KiB: without checkpoints the log would pass 70 MiB.
    assert max(sizes) - before < 12 << 20, (before, sizes)


async def test_large_appends_keep_the_write_ahead_log_bounded_too(
    backend: str, server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    """Appends committed in the writer thread count toward its checkpoints, and so do their bytes: before,
    only the event loop's commits did, and a run of large results grew the log without end."""
    if backend != "sqlite":
        pytest.skip("SQLite's write-ahead log")
    record, revision = await started_session(stub, server)
    wal = f"{server.store.engine.url.database}-wal"
    before = await asyncio.to_thread(os.path.getsize, wal)  # earlier tests' high-water mark
    sizes = []
    for i in range(100):
        call = ToolCall(f"call-{i}", "cat", "{}")
        result = NewMessage(Role.TOOL, os.urandom(256 << 10).hex(), tool_call_id=call.id)
        outcome = await store_append(
            server, record, rows([NewMessage(Role.ASSISTANT, "", tool_calls=(call,)), result]), revision
        )
        assert isinstance(outcome, Written)
        revision = outcome.revision
        record = await server.store.get_session(TENANT, record.id)
        sizes.append(await asyncio.to_thread(os.path.getsize, wal))
    # Every append writes about 300 KiB (its result in compressed chunks): without checkpoints the log passes 28 MiB.
    assert max(sizes) - before < 12 << 20, (before, sizes[::10])


async def test_two_appends_from_one_version_commit_once(
    server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    """Two appends decided on the same session version race for the same seqs: one commits, the
    other writes nothing and says the session went stale."""
    record, revision = await started_session(stub, server)
    outcomes = await asyncio.gather(
        store_append(server, record, small_turn(1), revision),
        store_append(server, record, small_turn(2), revision),
    )
    assert sorted(type(o).__name__ for o in outcomes) == ["Stale", "Written"]
    stored = [m.content for m in await transcript(stub, record.id)]
    assert stored in (["start", "ran step 1", "go on after 1"], ["start", "ran step 2", "go on after 2"])
    after = await server.store.get_session(TENANT, record.id)
    assert (after.version, after.head_seq) == (record.version + 1, 3)


async def test_every_user_message_is_readable_whole_by_its_result_ref(stub: pb_grpc.ContextServiceStub) -> None:
    """A user message may be shown in part or folded away (a text-acting agent's observation is
    listed in the folded-results index by its ref), so even "hi" has one, read like a tool result."""
    session = await create_session(stub)
    appended = await append(stub, session.id, user("hi"), user("Refactor the parser. " * 200))
    for message in appended.messages:
        assert message.result_ref
        page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session.id, result_ref=message.result_ref))
        assert page.data == message.content and page.complete

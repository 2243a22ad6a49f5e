"""The hot path's write: an append-only Prepare's messages and bookkeeping, run by the database
driver itself rather than through SQLAlchemy's async layer.

Every agent step makes this one transaction, and through SQLAlchemy over the async drivers its five
statements cost about 5 ms of server CPU: a thread hop per statement and per transaction step
(aiosqlite), SQLAlchemy's statement handling per execution, a pool reset per checkout. Here the same
statements are compiled once per dialect from the same tables (`schema`), and a write is a plan, a
list of (statement, rows), that the driver runs as it is:

- SQLite: a small plan commits on the event loop (about 0.1 ms), a large one in a thread of its own.
- PostgreSQL: asyncpg, the whole plan one statement of data-modifying CTEs, a transaction of its
  own (one round trip), on connections of its own; asyncpg caches the prepared statements per
  connection.

A `Write` that compare-and-swaps must change exactly one row; when it does not, its plan is undone
and the caller gets StaleSession."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg
from sqlalchemy import ClauseElement, Dialect, bindparam, exists, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.compiler import SQLCompiler

from ctxfold import cpu
from ctxfold.engine.model import StoredMessage, text_chars
from ctxfold.store import schema
from ctxfold.store.base import StaleSession
from ctxfold.store.database import configure_sqlite_connection
from ctxfold.store.errors import raise_store_error
from ctxfold.store.rows import (
    EncodedResult,
    SessionRecord,
    head_values,
    message_values,
)


@dataclass(frozen=True)
class Statement:
    """SQL in the driver's own parameter style, and the names of its parameters in order."""

    sql: str
    params: tuple[str, ...]

    @staticmethod
    def compile(statement: ClauseElement, dialect: Dialect) -> Statement:
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        return Statement(str(compiled), tuple(compiled.positiontup or ()))

    def bind(self, values: Mapping[str, object]) -> tuple[object, ...]:
        return tuple(values[name] for name in self.params)


@dataclass(frozen=True)
class Write:
    statement: Statement
    rows: tuple[tuple[object, ...], ...]
    swap: bool = False  # a compare-and-swap: exactly one row must change


@dataclass(frozen=True)
class Plan:
    """The writes of one transaction, and the bytes of text and data they carry (what running them on
    the event loop would cost), counted from the inputs rather than by walking every row."""

    writes: tuple[Write, ...]
    size: int


_CURRENT = ("at_id", "at_tenant", "at_version", "at_branch")  # the session an append was decided on


@dataclass(frozen=True)
class HotStatements:
    advance_session: Statement  # the new head, only over the version and branch the append saw
    record_request: Statement  # the request id; nothing when it is already there
    insert_message: Statement
    insert_result: Statement
    insert_chunk: Statement
    write_bookkeeping: Statement  # only over the state's revision the answer was built on
    write_bookkeeping_if_current: Statement  # ... and while the session is still the one it saw

    @staticmethod
    def compile(dialect: Dialect) -> HotStatements:
        s, cs = schema.sessions.c, schema.context_states.c
        columns = (s.id, s.tenant, s.version, s.branch_id)
        current = tuple(column == bindparam(name) for column, name in zip(columns, _CURRENT, strict=True))
        on_dialect_insert = postgresql.insert if dialect.name == "postgresql" else sqlite.insert
        bookkeeping = (
            update(schema.context_states)
            .where(cs.session_id == bindparam("at_id"), cs.revision == bindparam("at_revision"))
            .values(
                bookkeeping_json=bindparam("bookkeeping_json"),
                revision=bindparam("new_revision"),
                update_time=bindparam("now"),
            )
        )
        statements = {
            "advance_session": update(schema.sessions)
            .where(*current)
            .values({name: bindparam(name) for name in ("head_seq", "open_tool_calls", "version", "update_time")}),
            "record_request": on_dialect_insert(schema.append_requests).on_conflict_do_nothing(),
            "insert_message": insert(schema.messages),
            "insert_result": insert(schema.tool_results),
            "insert_chunk": insert(schema.tool_result_chunks),
            "write_bookkeeping": bookkeeping,
            "write_bookkeeping_if_current": bookkeeping.where(exists(select(s.id).where(*current))),
        }
        return HotStatements(**{name: Statement.compile(st, dialect) for name, st in statements.items()})


def append_answered_plan(
    statements: HotStatements,
    session: SessionRecord,
    after: SessionRecord,
    messages: Sequence[StoredMessage],
    raw_results: Sequence[EncodedResult],
    request_id: str,
    bookkeeping_json: str,
    revision: int,
    now: float,
) -> Plan:
    """The writes of `StateStore.append_answered`: `messages` after `session`'s head, which make it
    `after`, and the answer's bookkeeping over `revision`, each guarded so that nothing is written
    unless the session and the state are still those the answer was built on, and a request id seen
    before writes nothing."""
    current = dict(zip(_CURRENT, (session.id, session.tenant, session.version, session.branch_id), strict=True))
    bookkeeping = {
        "at_id": session.id,
        "at_revision": revision,
        "new_revision": revision + 1,
        "bookkeeping_json": bookkeeping_json,
        "now": now,
    }
    if not messages:
        guarded = statements.write_bookkeeping_if_current
        return Plan((Write(guarded, (guarded.bind({**current, **bookkeeping}),), swap=True),), len(bookkeeping_json))
    advance = statements.advance_session
    plan = [Write(advance, (advance.bind({**current, **head_values(after)}),), swap=True)]
    if request_id:
        request = {
            "session_id": session.id,
            "request_id": request_id,
            "message_ids_json": json.dumps([m.id for m in messages]),
            "create_time": now,
        }
        plan.append(Write(statements.record_request, (statements.record_request.bind(request),), swap=True))
    plan.append(_many(statements.insert_message, [message_values(m, session.segment_id) for m in messages]))
    if raw_results:
        plan.append(_many(statements.insert_result, [{**r.row, "segment_id": session.segment_id} for r in raw_results]))
        chunks = [chunk for r in raw_results for chunk in r.chunks]
        if chunks:
            plan.append(_many(statements.insert_chunk, chunks))
    plan.append(Write(statements.write_bookkeeping, (statements.write_bookkeeping.bind(bookkeeping),), swap=True))
    data = sum(_data_bytes(r) for r in raw_results)
    return Plan(tuple(plan), text_chars(messages) + data + len(bookkeeping_json))


def _data_bytes(result: EncodedResult) -> int:
    data = [result.row["data"], *(chunk["data"] for chunk in result.chunks)]
    return sum(len(part) for part in data if isinstance(part, bytes))


def _many(statement: Statement, values: Sequence[Mapping[str, object]]) -> Write:
    return Write(statement, tuple(statement.bind(v) for v in values))


class HotWriter(Protocol):
    statements: HotStatements

    async def commit(self, plan: Plan) -> None:
        """Runs `plan` in one transaction, all or nothing; StaleSession when a swap changed no row."""

    async def close(self) -> None: ...


def hot_writer(engine: AsyncEngine, writer_turn: asyncio.Lock | None) -> HotWriter:
    if engine.dialect.name == "sqlite":
        assert writer_turn is not None
        return SqliteHotWriter(engine, writer_turn)
    return PostgresHotWriter(engine)


# ---- SQLite -------------------------------------------------------------------------------------


# A plan with at most this many bytes of values commits on the event loop: about 0.1 ms of SQLite's
# own work, where a hop to the writer thread cost 0.7 ms of server CPU under load (the two threads
# hand the GIL back and forth around every statement). Larger plans (a big tool result) go to the
# thread, as `cpu.run` sends large work to its workers.
INLINE_MAX_BYTES = cpu.OFFLOAD_MIN_BYTES
# The loop's connection never checkpoints on commit (a checkpoint syncs the database file): after this
# many of its commits the writer thread runs a passive checkpoint, which bounds the WAL file (about
# 50 KiB per append).
CHECKPOINT_EVERY_COMMITS = 100


class _Busy(Exception):
    """Another process holds SQLite's write lock: the loop must not wait for it."""


class SqliteHotWriter:
    """Small plans commit on the event loop on a connection that never waits for the write lock;
    large ones, and any plan while another process writes, commit in a thread of their own on a
    connection that waits (`busy_timeout`). Both take their turn with the store's other writers.

    Batching the appends that wait into one transaction (a savepoint each) was measured and dropped:
    at 16 sessions in flight it made no difference beyond noise."""

    def __init__(self, engine: AsyncEngine, writer_turn: asyncio.Lock):
        self.statements = HotStatements.compile(engine.dialect)
        self._path = engine.url.database or ""
        self._writer_turn = writer_turn  # the in-process writers' queue for SQLite's one write lock
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ctxfold-hot-write")
        self._inline: sqlite3.Connection | None = None  # used on the event loop only
        self._threaded: sqlite3.Connection | None = None  # opened, used and closed in the thread
        self._inline_commits = 0
        self._closed = False

    async def commit(self, plan: Plan) -> None:
        loop = asyncio.get_running_loop()
        async with self._writer_turn:
            if plan.size <= INLINE_MAX_BYTES:
                try:
                    _commit(self._inline_connection(), plan, on_loop=True)
                except _Busy:
                    pass  # wait for the other process in the thread instead
                else:
                    self._inline_commits += 1
                    if self._inline_commits % CHECKPOINT_EVERY_COMMITS == 0:
                        # Still in this process's writer turn: with no append landing meanwhile the
                        # checkpoint catches up with the log, so the next commit starts it over.
                        await loop.run_in_executor(self._thread, self._checkpoint_wal)
                    return
            await loop.run_in_executor(self._thread, lambda: _commit(self._threaded_connection(), plan))

    async def close(self) -> None:
        """Closes the connections after the writes in flight; closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        async with self._writer_turn:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._close_threaded)
            if self._inline is not None:
                self._inline.close()
                self._inline = None
        self._thread.shutdown()

    def _checkpoint_wal(self) -> None:
        # PASSIVE: copies what it can without waiting for readers or blocking writers. A failure (the
        # disk) only delays it: the next one retries, and the other connections checkpoint too.
        with contextlib.suppress(sqlite3.Error):
            self._threaded_connection().execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _inline_connection(self) -> sqlite3.Connection:
        if self._inline is None:
            self._inline = _connect(self._path)
            self._inline.execute("PRAGMA busy_timeout=0")
            self._inline.execute("PRAGMA wal_autocheckpoint=0")
        return self._inline

    def _threaded_connection(self) -> sqlite3.Connection:
        if self._threaded is None:
            self._threaded = _connect(self._path)
        return self._threaded

    def _close_threaded(self) -> None:
        if self._threaded is not None:
            self._threaded.close()
            self._threaded = None


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level None: `_commit` issues the transaction control itself.
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    configure_sqlite_connection(connection)
    return connection


def _commit(conn: sqlite3.Connection, plan: Plan, *, on_loop: bool = False) -> None:
    """`plan` in one transaction. On the loop's connection (which does not wait for the write lock)
    a lock held elsewhere raises _Busy before anything is written."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as error:
        if on_loop and error.sqlite_errorcode == sqlite3.SQLITE_BUSY:
            raise _Busy from None
        raise_store_error(error)
    committing = False
    try:
        for write in plan.writes:
            _run_sqlite(conn, write)
        committing = True
        conn.execute("COMMIT")
    except BaseException as error:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # a disk that failed the write may fail this too
                conn.execute("ROLLBACK")
        raise_store_error(error, may_have_committed=committing)


def _run_sqlite(conn: sqlite3.Connection, write: Write) -> None:
    if len(write.rows) == 1:
        changed = conn.execute(write.statement.sql, write.rows[0]).rowcount
    else:
        changed = conn.executemany(write.statement.sql, write.rows).rowcount
    if write.swap and changed != 1:
        raise StaleSession(write.statement.sql)


# ---- PostgreSQL ---------------------------------------------------------------------------------


class PostgresHotWriter:
    """asyncpg, one statement per plan (`one_statement`), which is its own transaction: one round trip
    where a statement per write in a transaction took six. On connections of its own (`_Connections`):
    a checkout from the engine's pool costs a liveness ping and SQLAlchemy's bookkeeping (about 0.3 ms,
    as much as the transaction). A broken connection fails its plan (UNAVAILABLE) and is replaced."""

    def __init__(self, engine: AsyncEngine):
        self.statements = HotStatements.compile(engine.dialect)
        args, options = engine.dialect.create_connect_args(engine.url)
        connect_args: tuple[Any, ...] = tuple(args)
        connect_options: dict[str, Any] = dict(options)

        async def connect() -> Any:
            try:
                return await asyncpg.connect(*connect_args, **connect_options)
            except Exception as error:
                raise_store_error(error, connecting=True)

        self._connections = _Connections(connect, engine.sync_engine.pool.size())  # type: ignore[attr-defined]

    async def commit(self, plan: Plan) -> None:
        sql, args = one_statement(plan.writes)
        try:
            await self._connections.execute(sql, args)
        except asyncpg.InvalidTextRepresentationError as error:
            if STALE_MARK not in str(error):
                raise
            raise StaleSession("a compare-and-swap changed no row") from None
        except asyncpg.UniqueViolationError:
            # Another append took these seqs first: its swap of the session won, so this one's lost.
            raise StaleSession("the seqs were taken") from None
        except Exception as error:
            # The statement is its own transaction: one the server answered with an error did not commit;
            # one cut off on the way (the connection lost) may have.
            raise_store_error(error, may_have_committed=not isinstance(error, asyncpg.PostgresError))

    async def close(self) -> None:
        await self._connections.close()


# The server or the way to it is gone or refuses work for now (an administrator's or a crash's
# shutdown, no connection slots, a full disk), not the statement: the client may retry.
_POSTGRES_UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.InsufficientResourcesError,
    asyncpg.InterfaceError,
)


class _Connections:
    """The PostgreSQL hot writer's connections: at most `max_size` in use at once, idle ones reused
    newest first. A checkout from asyncpg's pool cost 0.06 ms more than using the connection directly
    in a one-off loop of `SELECT 1` here (a shielded release task, a timeout scope and a proxy per
    call: a third of a round trip on loopback); `bench/hot_path.py` shows the effect on a whole call.
    These connections run one statement at a time, its own transaction, and keep no session state, so
    giving one back is putting it on a list. One that closed while idle is dropped; one whose
    statement was interrupted (cancelled, the connection lost, the server going away) is terminated
    rather than reused."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], max_size: int):
        self._connect = connect
        self._slots = asyncio.Semaphore(max_size)
        self._idle: list[Any] = []
        self._closed = False

    async def execute(self, sql: str, args: Sequence[object]) -> None:
        async with self._slots:
            connection = await self._checkout()
            try:
                await connection.execute(sql, *args)
            except asyncpg.PostgresError as error:
                if isinstance(error, _POSTGRES_UNAVAILABLE):
                    connection.terminate()
                else:
                    self._give_back(connection)  # the statement failed, not the connection
                raise
            except BaseException:
                connection.terminate()
                raise
            self._give_back(connection)

    async def close(self) -> None:
        """Closes the idle connections; those in use close when their statement ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(connection.close() for connection in idle), return_exceptions=True)

    async def _checkout(self) -> Any:
        while self._idle:
            connection = self._idle.pop()
            if not connection.is_closed():
                return connection
        return await self._connect()

    def _give_back(self, connection: Any) -> None:
        if self._closed or connection.is_closed():
            connection.terminate()
        else:
            self._idle.append(connection)


_PARAM = re.compile(r"\$(\d+)")


# What the statement of a plan fails with when one of its swaps changed no row (see `one_statement`).
STALE_MARK = "ctxfold: a compare-and-swap changed no row"


def one_statement(plan: Sequence[Write]) -> tuple[str, list[object]]:
    """`plan` as one PostgreSQL statement and its arguments, so that it costs one round trip and is a
    transaction of its own: each write a data-modifying CTE (the rows of an insert in one multi-row
    VALUES). The statement fails, and with it every write, unless each swap changed exactly one row:
    it then casts `STALE_MARK` to an integer (an error that names itself; plain SQL has no RAISE)."""
    ctes: list[str] = []
    args: list[object] = []
    for index, write in enumerate(plan):
        sql = write.statement.sql
        if len(write.rows) == 1:
            body = _numbered(sql, len(args))
            args += write.rows[0]
        else:
            into, values = sql.split(" VALUES ", 1)
            tuples = []
            for row in write.rows:
                tuples.append(_numbered(values, len(args)))
                args += row
            body = f"{into} VALUES {', '.join(tuples)}"
        ctes.append(f"w{index} AS ({body} RETURNING 1)")
    counts = [f"(SELECT count(*) FROM w{i})" for i in range(len(plan))]
    swapped = " AND ".join(f"{counts[i]} = 1" for i, write in enumerate(plan) if write.swap) or "TRUE"
    # The failing cast names a count, so it is not a constant the planner would fold (and fail) ahead.
    stale = f"CAST('{STALE_MARK}: ' || {counts[0]} AS integer)"
    check = f"CASE WHEN {swapped} THEN 1 ELSE {stale} END"
    return f"WITH {', '.join(ctes)} SELECT {check}", args


def _numbered(sql: str, offset: int) -> str:
    """`sql` with its parameters `$n` renumbered after `offset` others."""
    return _PARAM.sub(lambda m: f"${int(m.group(1)) + offset}", sql)

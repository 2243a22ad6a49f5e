"""The one write of an agent's step (an append's messages, raw results and request id, the answer's bookkeeping;
or ObserveUsage's state and usage row): a compare-and-swap in one transaction, run by the database driver
itself. See docs/architecture.md, One path for every append."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg
from sqlalchemy import Column, Dialect, Table, and_, bindparam, insert, literal_column, null, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.ext.asyncio import AsyncEngine

from ctxfold import cpu
from ctxfold.engine.context import SessionRecord
from ctxfold.engine.model import StoredMessage, Usage, text_chars
from ctxfold.store import schema
from ctxfold.store.database import configure_sqlite_connection
from ctxfold.store.errors import raise_store_error
from ctxfold.store.rows import USAGE_FIELDS, EncodedResult, head_values, message_values, usage_values


@dataclass(frozen=True)
class Bookkeeping:
    """An answer's bookkeeping (`ContextState.bookkeeping_json`), written over `revision` only; or,
    when the stored state is not the one it was made from but for those fields (a new or rebuilt
    state), the `whole` state (`ContextState.to_json`)."""

    json: str
    revision: int
    whole: bool = False


@dataclass(frozen=True)
class AppendWrite:
    """One append, decided on the session as `seen`: it becomes `after` once `messages` (stored forms,
    with seqs) are written. No messages: the bookkeeping alone, while the session is still `seen`. A
    `usage` report is recorded with the bookkeeping, when that is written."""

    seen: SessionRecord
    after: SessionRecord
    messages: tuple[StoredMessage, ...]
    raw_results: tuple[EncodedResult, ...]
    request_id: str = ""
    bookkeeping: Bookkeeping | None = None
    usage: Usage | None = None

    @property
    def size(self) -> int:
        """The bytes of text and data it carries (what running it on the event loop would cost)."""
        stored = [d for r in self.raw_results for d in (r.row["data"], *(c["data"] for c in r.chunks))]
        data = sum(len(d) for d in stored if isinstance(d, bytes))
        return text_chars(self.messages) + data + (len(self.bookkeeping.json) if self.bookkeeping else 0)


@dataclass(frozen=True)
class Written:
    revision: int  # the state's revision after the bookkeeping, 0 when there was none or it was skipped


@dataclass(frozen=True)
class Stale:
    """The session is no longer the one the append was decided on: nothing was written."""


@dataclass(frozen=True)
class Repeated:
    """The request id was seen before: nothing was written; these are the first append's messages."""

    message_ids: tuple[str, ...]


Outcome = Written | Stale | Repeated


class Appender(Protocol):
    async def write(self, append: AppendWrite) -> Outcome: ...

    async def close(self) -> None: ...


def appender(engine: AsyncEngine, writer_turn: asyncio.Lock | None) -> Appender:
    if engine.dialect.name == "sqlite":
        assert writer_turn is not None
        return SqliteAppender(engine.url.database or "", writer_turn)
    return PostgresAppender(engine)


def _request_row(append: AppendWrite) -> dict[str, object]:
    return {
        "session_id": append.seen.id,
        "request_id": append.request_id,
        "message_ids_json": json.dumps([m.id for m in append.messages]),
        "create_time": append.after.update_time,
    }


def _result_rows(append: AppendWrite) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    segment = append.seen.segment_id
    return [{**r.row, "segment_id": segment} for r in append.raw_results], [
        c for r in append.raw_results for c in r.chunks
    ]


# ---- SQLite -------------------------------------------------------------------------------------

# A write of at most this many bytes commits on the event loop (about 0.1 ms), a larger one in the thread.
INLINE_MAX_BYTES = cpu.OFFLOAD_MIN_BYTES
# The loop never checkpoints the WAL on commit (a checkpoint syncs the database file): after this many
# commits a passive checkpoint runs in the thread, which bounds the WAL file.
CHECKPOINT_EVERY_COMMITS = 100
BUSY_TIMEOUT_MS = 10_000


class _Busy(Exception):
    """Another process holds SQLite's write lock: the loop must not wait for it."""


@dataclass(frozen=True)
class _SqliteStatements:
    """The statements of an append compiled once for SQLite, with their parameter names in order."""

    sql: dict[str, tuple[str, tuple[str, ...]]]

    @staticmethod
    def compile(dialect: Dialect) -> _SqliteStatements:
        s, cs, ar = schema.sessions.c, schema.context_states.c, schema.append_requests.c
        current = and_(
            *(getattr(s, name) == bindparam(f"at_{name}") for name in ("id", "tenant", "version", "branch_id"))
        )
        statements = {
            "prior": select(ar.message_ids_json).where(
                ar.session_id == bindparam("at_id"), ar.request_id == bindparam("request_id")
            ),
            "current": select(s.id).where(current),
            "revision": select(cs.revision).where(cs.session_id == bindparam("at_id")),
            "advance": update(schema.sessions)
            .where(current)
            .values({name: bindparam(name) for name in ("head_seq", "open_tool_calls", "version", "update_time")}),
            "request": insert(schema.append_requests),
            "message": insert(schema.messages),
            "result": insert(schema.tool_results),
            "chunk": insert(schema.tool_result_chunks),
            # Its id is the database's.
            "usage": insert(schema.usage_observations).values(
                {name: bindparam(name) for name in ("session_id", *USAGE_FIELDS, "create_time")}
            ),
            "bookkeeping": update(schema.context_states)
            .where(cs.session_id == bindparam("at_id"), cs.revision == bindparam("revision"))
            .values(
                bookkeeping_json=bindparam("document"),
                revision=cs.revision + literal_column("1"),
                update_time=bindparam("now"),
            ),
            "whole_state": update(schema.context_states)
            .where(cs.session_id == bindparam("at_id"), cs.revision == bindparam("revision"))
            .values(
                state_json=bindparam("document"),
                bookkeeping_json=null(),
                revision=cs.revision + literal_column("1"),
                update_time=bindparam("now"),
            ),
        }
        compiled = {}
        for name, statement in statements.items():
            done = statement.compile(dialect=dialect)
            compiled[name] = (str(done), tuple(done.positiontup or ()))
        return _SqliteStatements(compiled)

    def run(self, conn: sqlite3.Connection, name: str, *rows: dict[str, object]) -> sqlite3.Cursor:
        sql, params = self.sql[name]
        if len(rows) == 1:
            return conn.execute(sql, tuple(rows[0][p] for p in params))
        return conn.executemany(sql, [tuple(r[p] for p in params) for r in rows])


class SqliteAppender:
    def __init__(self, path: str, writer_turn: asyncio.Lock):
        self._statements = _SqliteStatements.compile(sqlite_dialect.dialect(paramstyle="qmark"))
        self._path = path
        self._writer_turn = writer_turn  # the in-process writers' queue for SQLite's one write lock
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ctxfold-append")
        self._conn: sqlite3.Connection | None = None
        self._commits = 0

    async def write(self, append: AppendWrite) -> Outcome:
        loop = asyncio.get_running_loop()
        async with self._writer_turn:
            conn = self._connection()
            if append.size <= INLINE_MAX_BYTES:
                try:
                    outcome = self._commit(conn, append, wait=False)
                except _Busy:
                    pass  # another process writes: wait for it in the thread
                else:
                    self._commits += 1
                    if self._commits % CHECKPOINT_EVERY_COMMITS == 0:
                        await loop.run_in_executor(self._thread, self._checkpoint_wal, conn)
                    return outcome
            return await loop.run_in_executor(self._thread, self._commit, conn, append, True)

    async def close(self) -> None:
        async with self._writer_turn:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._thread.shutdown()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # isolation_level None: `_commit` issues the transaction control itself; used by the loop and
            # the thread in turn (the writer turn), never at once.
            self._conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            configure_sqlite_connection(self._conn)
            self._conn.execute("PRAGMA wal_autocheckpoint=0")
        return self._conn

    @staticmethod
    def _checkpoint_wal(conn: sqlite3.Connection) -> None:
        # PASSIVE: copies what it can without waiting for readers or blocking writers; a failure only
        # delays it (the engine's connections checkpoint too).
        with contextlib.suppress(sqlite3.Error):
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _commit(self, conn: sqlite3.Connection, append: AppendWrite, wait: bool) -> Outcome:
        """`append` in one transaction. Without `wait` (on the loop) a write lock held by another
        process raises _Busy before anything is written."""
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS if wait else 0}")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if not wait and error.sqlite_errorcode == sqlite3.SQLITE_BUSY:
                raise _Busy from None
            raise_store_error(error)
        committing = False
        try:
            outcome = self._writes(conn, append)
            committing = True
            conn.execute("COMMIT" if isinstance(outcome, Written) else "ROLLBACK")
            return outcome
        except BaseException as error:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # a disk that failed the write may fail this too
                    conn.execute("ROLLBACK")
            raise_store_error(error, may_have_committed=committing)

    def _writes(self, conn: sqlite3.Connection, append: AppendWrite) -> Outcome:
        run = self._statements.run
        at = {f"at_{name}": getattr(append.seen, name) for name in ("id", "tenant", "version", "branch_id")}
        if append.request_id:
            prior = run(conn, "prior", {**at, "request_id": append.request_id}).fetchone()
            if prior is not None:
                return Repeated(tuple(json.loads(prior[0])))
        book = append.bookkeeping
        if book is not None and run(conn, "revision", at).fetchone() != (book.revision,):
            return Stale()  # the state was written since the answer was made from it
        if append.messages:
            if run(conn, "advance", {**at, **head_values(append.after)}).rowcount != 1:
                return Stale()
            if append.request_id:
                run(conn, "request", _request_row(append))
            run(conn, "message", *(message_values(m, append.seen.segment_id) for m in append.messages))
            results, chunks = _result_rows(append)
            if results:
                run(conn, "result", *results)
            if chunks:
                run(conn, "chunk", *chunks)
        elif run(conn, "current", at).fetchone() is None:
            return Stale()
        if book is None:
            return Written(0)
        values = {
            "at_id": append.seen.id,
            "revision": book.revision,
            "document": book.json,
            "now": append.after.update_time,
        }
        run(conn, "whole_state" if book.whole else "bookkeeping", values)
        if append.usage is not None:
            run(conn, "usage", usage_values(append.seen.id, append.usage, append.after.update_time))
        return Written(book.revision + 1)  # the revision was checked in this transaction


# ---- PostgreSQL ---------------------------------------------------------------------------------


def _type(column: Column[Any]) -> str:
    return str(column.type.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]


def _unnest(table: Table, first: int) -> tuple[str, tuple[str, ...]]:
    """`INSERT INTO table (…) SELECT u.* FROM swapped, unnest($first::type[], …) AS u`: the rows as one
    array per column, inserted only when the session's swap (the CTE `swapped`) changed its row."""
    names = tuple(c.name for c in table.columns)
    arrays = ", ".join(f"${first + i}::{_type(table.c[name])}[]" for i, name in enumerate(names))
    return f"INSERT INTO {table.name} ({', '.join(names)}) SELECT u.* FROM swapped, unnest({arrays}) AS u", names


# $1-$4 the session as seen (id, tenant, version, branch), $5-$8 the bookkeeping, its revision (-1: none), whether
# whole, the time; $9 whether a usage row is recorded, then its fields; the append's own from APPEND_FIRST on.
_USAGE_FIRST = 10
_APPEND_FIRST = _USAGE_FIRST + len(USAGE_FIELDS)


def _usage_insert() -> str:
    """The usage row, inserted only when the bookkeeping was written (the CTE `book`)."""
    u = schema.usage_observations.c
    values = ", ".join(f"${_USAGE_FIRST + i}::{_type(u[name])}" for i, name in enumerate(USAGE_FIELDS))
    return (
        f"usage AS (INSERT INTO usage_observations (session_id, create_time, {', '.join(USAGE_FIELDS)}) "
        f"SELECT $1::varchar, $8::float8, {values} FROM book WHERE $9::boolean)"
    )


@dataclass(frozen=True)
class _PostgresStatements:
    append: str  # with messages: swap, request id, messages, results, chunks, bookkeeping, usage
    bookkeeping: str  # without: the bookkeeping (and usage), while the session is current
    message_columns: tuple[str, ...]
    result_columns: tuple[str, ...]
    chunk_columns: tuple[str, ...]

    @staticmethod
    def compile() -> _PostgresStatements:
        # The append adds: request id, the new head (3), message ids, then the rows' arrays.
        request, head, ids = f"${_APPEND_FIRST}", [f"${_APPEND_FIRST + i}" for i in (1, 2, 3)], f"${_APPEND_FIRST + 4}"
        current = "id = $1 AND tenant = $2 AND version = $3 AND branch_id = $4"
        # Bookkeeping's state written since (by this statement's snapshot) makes the write stale; one written
        # between the snapshot and the update only makes the bookkeeping skipped.
        state_current = "($6 < 0 OR EXISTS (SELECT 1 FROM context_states WHERE session_id = $1 AND revision = $6))"
        book = (
            "book AS (UPDATE context_states SET state_json = CASE WHEN $7 THEN $5 ELSE state_json END, "
            "bookkeeping_json = CASE WHEN $7 THEN NULL ELSE $5 END, revision = revision + 1, update_time = $8 "
            f"WHERE session_id = $1 AND revision = $6 AND EXISTS (SELECT 1 FROM swapped) RETURNING revision), "
            f"{_usage_insert()}"
        )
        first = _APPEND_FIRST + 5
        messages, message_columns = _unnest(schema.messages, first)
        results, result_columns = _unnest(schema.tool_results, first + len(message_columns))
        chunks, chunk_columns = _unnest(schema.tool_result_chunks, first + len(message_columns) + len(result_columns))
        append = (
            "WITH prior AS (SELECT message_ids_json FROM append_requests "
            f"WHERE session_id = $1 AND request_id = {request}), "
            f"swapped AS (UPDATE sessions SET head_seq = {head[0]}, open_tool_calls = {head[1]}, version = {head[2]}, "
            f"update_time = $8 WHERE {current} AND NOT EXISTS (SELECT 1 FROM prior) AND {state_current} RETURNING 1), "
            "request AS (INSERT INTO append_requests (session_id, request_id, message_ids_json, create_time) "
            f"SELECT $1::varchar, {request}::varchar, {ids}::text, $8::float8 FROM swapped WHERE {request} <> ''), "
            f"messages AS ({messages}), results AS ({results}), chunks AS ({chunks}), {book} "
            "SELECT (SELECT message_ids_json FROM prior), (SELECT count(*) FROM swapped), (SELECT revision FROM book)"
        )
        alone = (
            f"WITH swapped AS (SELECT 1 FROM sessions WHERE {current} AND {state_current}), {book} "
            "SELECT NULL, (SELECT count(*) FROM swapped), (SELECT revision FROM book)"
        )
        return _PostgresStatements(append, alone, message_columns, result_columns, chunk_columns)


def _columns_of(rows: Sequence[dict[str, object]], names: Sequence[str]) -> list[list[object]]:
    return [[row[name] for row in rows] for name in names]


class PostgresAppender:
    """On connections of the store's pool (SQLAlchemy's), each write one statement of its own."""

    def __init__(self, engine: AsyncEngine):
        self._engine = engine
        self._statements = _PostgresStatements.compile()

    async def write(self, append: AppendWrite) -> Outcome:
        statements, seen, after = self._statements, append.seen, append.after
        book = append.bookkeeping
        args: list[object] = [
            *(seen.id, seen.tenant, seen.version, seen.branch_id),
            book.json if book else "",
            book.revision if book else -1,
            book.whole if book else False,
            after.update_time,
            append.usage is not None,
            *(getattr(append.usage, name) if append.usage else None for name in USAGE_FIELDS),
        ]
        sql = statements.bookkeeping
        if append.messages:
            sql = statements.append
            head = head_values(after)
            args += [append.request_id, head["head_seq"], head["open_tool_calls"], head["version"]]
            args.append(json.dumps([m.id for m in append.messages]))
            results, chunks = _result_rows(append)
            args += _columns_of(
                [message_values(m, seen.segment_id) for m in append.messages], statements.message_columns
            )
            args += _columns_of(results, statements.result_columns)
            args += _columns_of(chunks, statements.chunk_columns)
        conn = self._engine.connect()
        try:
            await conn.start()
        except Exception as error:
            raise_store_error(error, connecting=True)
        try:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            prior, swapped, revision = await driver.fetchrow(sql, *args)
        except BaseException as error:
            if not isinstance(error, asyncpg.PostgresError):
                # Cut off on the way (cancelled, the connection lost): the connection may be left in the
                # middle of its statement, so it is never used again.
                await asyncio.shield(conn.invalidate())
            if not isinstance(error, Exception):
                raise
            # One statement, a transaction of its own: cut off on the way (not answered with an error by
            # the server) it may have committed.
            raise_store_error(error, may_have_committed=not isinstance(error, asyncpg.PostgresError))
        finally:
            await conn.close()
        if prior is not None:
            return Repeated(tuple(json.loads(prior)))
        if swapped != 1:
            return Stale()
        return Written(int(revision) if revision is not None else 0)

    async def close(self) -> None:
        pass  # the connections are the engine's

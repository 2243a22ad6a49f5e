"""What the store's aggregates share: the engine, transactions, clock and the session row every write takes first."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from sqlalchemy import ColumnElement, Row, Table, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ctxfold.engine.context import SessionRecord
from ctxfold.engine.errors import session_not_found
from ctxfold.store import schema
from ctxfold.store.append_sqlite import SqliteFile
from ctxfold.store.database import WRITE_OPTION, row_counts
from ctxfold.store.errors import raise_store_error
from ctxfold.store.rows import session_from_row


async def ancestors(
    conn: AsyncConnection, table: Table, columns: Sequence[str], name: str, *start: ColumnElement[bool], one: bool
) -> Sequence[Row[Any]]:
    """`columns` of `table`'s rows matching `start` and of their ancestors (`parent_id`), one recursive query; `one`:
    a single start row, so no ancestor is reached twice (UNION ALL, nothing to deduplicate)."""
    chain = select(*(table.c[c] for c in columns)).where(*start).cte(name, recursive=True)
    parent = table.alias("parent")
    ancestor = select(*(parent.c[c] for c in columns)).where(parent.c.id == chain.c.parent_id)
    chain = chain.union_all(ancestor) if one else chain.union(ancestor)
    return (await conn.execute(select(chain))).all()


@asynccontextmanager
async def connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection of `engine`'s pool; one that cannot be opened makes the database unavailable (a domain error)."""
    plain = engine.connect()
    try:
        await plain.start()
    except Exception as error:
        raise_store_error(error, connecting=True)
    try:
        yield plain
    finally:
        await plain.close()


class StaleSession(Exception):
    """The session changed between read and write; the caller re-reads and retries."""


async def session_row(
    conn: AsyncConnection, tenant: str, session_id: str, lock: bool = False, shared: bool = False
) -> SessionRecord:
    """With `lock`, the row stays locked until the transaction ends (`shared`: with other shared holders, on
    PostgreSQL). Every write of a session takes its row first (docs/architecture.md, Concurrency)."""
    s = schema.sessions.c
    query = select(schema.sessions).where(s.id == session_id, s.tenant == tenant)
    if lock:
        query = query.with_for_update(read=shared)
    row = (await conn.execute(query)).first()
    if row is None:
        raise session_not_found(session_id)
    return session_from_row(row)


async def swap_session(conn: AsyncConnection, session: SessionRecord, now: float, **values: object) -> None:
    """Every session write's compare-and-swap: `values`, version + 1 if still `session.version` of `session.branch_id`,
    else StaleSession. The branch too: a session deleted and created again under its key (same id) counts from 1."""
    s = schema.sessions.c
    seen = (s.id == session.id, s.tenant == session.tenant, s.version == session.version)
    query = update(schema.sessions).where(*seen, s.branch_id == session.branch_id)
    if (await conn.execute(query.values(version=s.version + 1, update_time=now, **values))).rowcount != 1:
        raise StaleSession(session.id)


class StoreBase:
    def __init__(self, engine: AsyncEngine, clock: Callable[[], float] = time.time):
        self.engine = engine
        # Every time the store writes comes from here: a test or the server gives store and service one clock.
        self.clock = clock
        # SQLite's busy handler polls with sleeps of up to 100 ms: this process's writers queue here instead.
        sqlite = engine.dialect.name == "sqlite"
        self._writer_turn: asyncio.Lock | None = asyncio.Lock() if sqlite else None
        # Checked before every transaction, the appender's too (docs/operations.md, Errors: `file_moved`).
        self._sqlite_file = SqliteFile(engine.url.database or "") if sqlite else None
        # PostgreSQL: one snapshot for every statement of a read (READ COMMITTED showed half a rewind).
        self._read_options = {"isolation_level": "REPEATABLE READ"} if engine.dialect.name == "postgresql" else {}

    async def close(self) -> None:
        await self.engine.dispose()

    # Every statement runs in one of these (or `store/append.py`): a failure surfaces as a domain error, not a driver's.

    def _read(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return self._transaction(write=False)

    def _write(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return self._transaction(write=True)

    @asynccontextmanager
    async def _transaction(self, write: bool) -> AsyncIterator[AsyncConnection]:
        """A read (PostgreSQL: one snapshot) or a write (SQLite: in this process's writer turn, BEGIN IMMEDIATE)."""
        committing = False
        try:
            async with contextlib.AsyncExitStack() as stack:
                if write and self._writer_turn is not None:
                    await stack.enter_async_context(self._writer_turn)
                if self._sqlite_file is not None:
                    self._sqlite_file.check()
                plain = await stack.enter_async_context(connection(self.engine))
                conn = await plain.execution_options(**({WRITE_OPTION: True} if write else self._read_options))
                async with conn.begin():
                    yield conn
                    committing = write
        except Exception as error:
            raise_store_error(error, may_have_committed=committing)

    async def row_counts(self) -> dict[str, int]:
        """Rows per table of the schema (tests, benchmarks, operations)."""
        async with self._read() as conn:
            return await conn.run_sync(row_counts, schema.metadata.tables)

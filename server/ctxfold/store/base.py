"""What every aggregate of the store shares: the engine, the transactions and the clock."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ctxfold.store import schema
from ctxfold.store.database import WRITE_OPTION


class StaleSession(Exception):
    """The session changed between read and write; the caller re-reads and retries."""


class StoreBase:
    def __init__(self, engine: AsyncEngine, clock: Callable[[], float] = time.time):
        self.engine = engine
        # Every time the store writes (create, update, lease expiry) comes from here, so a test or the
        # server can give the store and the service one clock.
        self.clock = clock
        # SQLite admits one writer at a time; waiting writers poll in its busy handler with sleeps of up
        # to 100 ms, which makes tail latency under concurrent appends seconds long. Queueing them here
        # hands the lock over at once (writers in other processes still rely on busy_timeout).
        self._writer_turn: asyncio.Lock | None = asyncio.Lock() if engine.dialect.name == "sqlite" else None

    async def close(self) -> None:
        await self.engine.dispose()

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn, conn.begin():
            yield conn

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        async with contextlib.AsyncExitStack() as stack:
            if self._writer_turn is not None:
                await stack.enter_async_context(self._writer_turn)
            plain = await stack.enter_async_context(self.engine.connect())
            conn = await plain.execution_options(**{WRITE_OPTION: True})
            async with conn.begin():
                yield conn

    async def row_counts(self) -> dict[str, int]:
        """Rows per table (tests, benchmarks, operations)."""
        counts = {}
        async with self._read() as conn:
            for table in schema.metadata.sorted_tables:
                counts[table.name] = (await conn.execute(select(func.count()).select_from(table))).scalar_one()
        return counts

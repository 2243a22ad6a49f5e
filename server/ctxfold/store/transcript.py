"""The transcript: appends (the one write, `store/append.py`) and pages of messages, live and abandoned."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ctxfold.engine.context import SessionRecord
from ctxfold.engine.model import StoredMessage
from ctxfold.store import schema
from ctxfold.store.append import AppendWrite, Outcome
from ctxfold.store.append_postgres import PostgresAppender
from ctxfold.store.append_sqlite import SqliteAppender
from ctxfold.store.base import StoreBase
from ctxfold.store.lineage import in_history, in_ranges, session_live_ranges
from ctxfold.store.rows import message_from_row
from ctxfold.store.state import read_messages


class TranscriptStore(StoreBase):
    def __init__(self, engine: AsyncEngine, clock: Callable[[], float] = time.time):
        super().__init__(engine, clock)
        turn, file = self._writer_turn, self._sqlite_file  # SQLite's
        self._appender = SqliteAppender(file, turn) if file and turn else PostgresAppender(engine)
        # The one write (`store/append.py`): all of it, or nothing when Stale or Repeated.
        self.append: Callable[[AppendWrite], Awaitable[Outcome]] = self._appender.write

    async def close(self) -> None:
        await self._appender.close()
        await super().close()

    async def messages(self, ids: Sequence[str]) -> list[StoredMessage]:
        """Messages by id, in seq order (the first append's messages of a repeated request id)."""
        async with self._read() as conn:
            return await read_messages(conn, len(ids), schema.messages.c.id.in_(list(ids)))

    async def list_messages(
        self,
        session: SessionRecord,
        limit: int,
        after: tuple[int, int, str] | None,
        include_abandoned: bool,
        max_chars: int,
    ) -> tuple[list[StoredMessage], tuple[int, int, str] | None]:
        """One page in (seq, abandoned, id) order: at most `limit` messages and `max_chars` of text (at least one), and
        the cursor when more follow. Sizes are read first, so large messages are never loaded beyond the bound."""
        m = schema.messages.c
        size = (
            func.coalesce(func.length(m.content), 0)
            + func.coalesce(func.length(m.reasoning_content), 0)
            + func.coalesce(func.length(m.tool_calls_json), 0)
            + func.coalesce(func.length(m.provider_payload_json), 0)
        ).label("size")
        after_seq, after_abandoned, after_id = after or (0, 0, "")
        async with self._read() as conn:
            ranges = await session_live_ranges(conn, session)
            live_query = select(m.id, m.seq, size).where(in_ranges(ranges), m.seq > after_seq).order_by(m.seq)
            entries = [(r.seq, 0, r.id, r.size) for r in (await conn.execute(live_query.limit(limit + 1))).all()]
            if include_abandoned:
                readable = await in_history(conn, session)
                # Abandoned messages follow the live one of the same seq.
                same_seq = m.seq == after_seq if not after_abandoned else and_(m.seq == after_seq, m.id > after_id)
                ab_query = (
                    select(m.id, m.seq, size)
                    .where(readable, ~in_ranges(ranges), or_(m.seq > after_seq, same_seq))
                    .order_by(m.seq, m.id)
                    .limit(limit + 1)
                )
                entries += [(r.seq, 1, r.id, r.size) for r in (await conn.execute(ab_query)).all()]
                entries.sort()
            page: list[tuple[int, int, str, int]] = []
            chars = 0
            for entry in entries[:limit]:
                if page and chars + entry[3] > max_chars:
                    break
                page.append(entry)
                chars += entry[3]
            rows = (await conn.execute(select(schema.messages).where(m.id.in_([e[2] for e in page])))).all()
        by_id = {r.id: r for r in rows}
        messages = [message_from_row(by_id[message_id], abandoned=bool(flag)) for _, flag, message_id, _ in page]
        more = len(entries) > len(page)
        cursor = (page[-1][0], page[-1][1], page[-1][2]) if more and page else None
        return messages, cursor

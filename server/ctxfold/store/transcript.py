"""The transcript: appends (all or nothing, idempotent with a request id, serialized on the session's
row) and pages of messages, live and abandoned."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ctxfold.engine.model import StoredMessage
from ctxfold.store import schema
from ctxfold.store.base import StoreBase, session_row
from ctxfold.store.lineage import in_history, in_ranges, session_live_ranges
from ctxfold.store.rows import (
    EncodedResult,
    MessageRow,
    SessionRecord,
    appended_session,
    head_values,
    message_from_row,
    message_values,
    stored_messages,
)
from ctxfold.store.tool_results import encode_raw_results, insert_results


async def insert_messages(
    conn: AsyncConnection,
    session: SessionRecord,
    rows: Sequence[MessageRow],
    raw_results: Sequence[EncodedResult],
    request_id: str,
    now: float,
) -> list[StoredMessage]:
    """The rows of an append after `session`'s head: messages, raw results, the request id. Returns the
    messages as stored."""
    messages = stored_messages(rows, session.head_seq + 1, now)
    if messages:
        await conn.execute(insert(schema.messages), [message_values(m, session.segment_id) for m in messages])
        if raw_results:
            await insert_results(conn, session.segment_id, raw_results)
    if request_id:
        await conn.execute(
            insert(schema.append_requests).values(
                session_id=session.id,
                request_id=request_id,
                message_ids_json=json.dumps([m.id for m in messages]),
                create_time=now,
            )
        )
    return messages


async def appended_by(conn: AsyncConnection, session: SessionRecord, request_id: str) -> list[StoredMessage] | None:
    """The messages a previous append with this request id wrote, or None."""
    ar, m = schema.append_requests.c, schema.messages.c
    ids_json = (
        await conn.execute(select(ar.message_ids_json).where(ar.session_id == session.id, ar.request_id == request_id))
    ).scalar_one_or_none()
    if ids_json is None:
        return None
    ids = json.loads(ids_json)
    if not ids:
        return []
    rows = (await conn.execute(select(schema.messages).where(m.id.in_(ids)).order_by(m.seq))).all()
    return [message_from_row(r) for r in rows]


class TranscriptStore(StoreBase):
    async def append_messages(
        self,
        tenant: str,
        session_id: str,
        rows: Sequence[MessageRow],
        request_id: str,
        advance: Callable[[tuple[str, ...]], tuple[str, ...]],
    ) -> tuple[list[StoredMessage], SessionRecord]:
        """Appends `rows` after the head, all or nothing. Appends to one session serialize on its row
        lock, so they never conflict: `advance` maps the waiting tool calls before the append to those
        after it (or raises). A `request_id` seen before returns that append's messages instead."""
        now = self.clock()
        raw_results = await encode_raw_results(rows)
        async with self._write() as conn:
            session = await session_row(conn, tenant, session_id, lock=True)
            if request_id:
                previous = await appended_by(conn, session, request_id)
                if previous is not None:
                    return previous, session
            after = appended_session(session, len(rows), advance(session.open_tool_calls), now)
            s = schema.sessions.c
            await conn.execute(update(schema.sessions).where(s.id == session.id).values(**head_values(after)))
            messages = await insert_messages(conn, session, rows, raw_results, request_id, now)
        return messages, after

    async def list_messages(
        self,
        session: SessionRecord,
        limit: int,
        after: tuple[int, int, str] | None,
        include_abandoned: bool,
        max_chars: int,
    ) -> tuple[list[StoredMessage], tuple[int, int, str] | None]:
        """One page in (seq, abandoned, id) order, at most `limit` messages and `max_chars` characters
        of text (always at least one message); returns the cursor of the last message when more follow.
        Sizes are read first, so a page of large messages is never loaded beyond its bound."""
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

"""The view's stored rows (`load_context`), installs, context-state writes and usage. The state document is
opaque here (`engine/state.py` owns it); every write compare-and-swaps on its row's revision."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Row, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ctxfold import cpu
from ctxfold.engine.candidate import FoldInstall, Install
from ctxfold.engine.context import SessionRecord, StoredContext
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.engine.lineage import ranges_within
from ctxfold.engine.model import StoredMessage
from ctxfold.store import schema
from ctxfold.store.base import StoreBase, session_row, swap_session
from ctxfold.store.checkpoints import drop_prepared, insert_checkpoint, load_checkpoints
from ctxfold.store.lineage import in_ranges, session_live_ranges
from ctxfold.store.rows import message_from_row, state_document
from ctxfold.store.tool_results import insert_document


async def _read_state(conn: AsyncConnection, session_id: str) -> tuple[str | None, int]:
    """The session's stored state document and revision; (None, 0) without a row."""
    cs = schema.context_states.c
    query = select(cs.state_json, cs.bookkeeping_json, cs.revision).where(cs.session_id == session_id)
    row = (await conn.execute(query)).first()
    return (state_document(row), row.revision) if row else (None, 0)


async def _put_state(conn: AsyncConnection, session_id: str, state_json: str, revision: int | None, now: float) -> int:
    """Writes the whole state over `revision` if given (its row exists since creation); the new revision, 0 if gone."""
    cs = schema.context_states.c
    query = update(schema.context_states).where(cs.session_id == session_id)
    if revision is not None:
        query = query.where(cs.revision == revision)
    values = {"state_json": state_json, "bookkeeping_json": None, "revision": cs.revision + 1, "update_time": now}
    return int((await conn.execute(query.values(values).returning(cs.revision))).scalar_one_or_none() or 0)


# SQLAlchemy makes rows on the loop: a long view is read in partitions, the loop free between (docs/operations.md,
# Limits); a shorter read is one statement (a partitioned one is a cursor on PostgreSQL: a round trip more).
PARTITION_ROWS = 2000


async def read_messages(conn: AsyncConnection, rows: int, *where: ColumnElement[bool]) -> list[StoredMessage]:
    """The messages matching `where`, `rows` of them at most, in seq order."""
    query = select(schema.messages).where(*where).order_by(schema.messages.c.seq)
    if rows <= PARTITION_ROWS:
        read = (await conn.execute(query)).all()
        return await cpu.run(len(read) * cpu.MESSAGE_WORK_BYTES, _converted, read)
    messages: list[StoredMessage] = []
    async for partition in (await conn.stream(query)).partitions(PARTITION_ROWS):
        messages += await cpu.run(len(partition) * cpu.MESSAGE_WORK_BYTES, _converted, partition)
    return messages


def _converted(rows: Sequence[Row[Any]]) -> list[StoredMessage]:
    return [message_from_row(row) for row in rows]


class StateStore(StoreBase):
    async def load_context(self, tenant: str, session_id: str) -> StoredContext:
        """The session, its head checkpoint and kept messages, the messages after the checkpoint's
        position and the state, in one transaction. Work is bounded by the view, not the transcript."""
        m = schema.messages.c
        async with self._read() as conn:
            session = await session_row(conn, tenant, session_id)
            checkpoint = None
            kept: list[StoredMessage] = []
            if session.checkpoint_id is not None:
                checkpoint = (await load_checkpoints(conn, [session.checkpoint_id]))[session.checkpoint_id]
                if checkpoint.kept_ids:
                    kept = await read_messages(conn, len(checkpoint.kept_ids), m.id.in_(checkpoint.kept_ids))
                    if len(kept) != len(checkpoint.kept_ids):
                        broken = f"checkpoint {checkpoint.id} keeps messages that cannot be loaded"
                        raise DomainError(Kind.INTERNAL, "CHECKPOINT_BROKEN", broken, {"checkpoint_id": checkpoint.id})
            position = checkpoint.position_seq if checkpoint else 0
            ranges = ranges_within(await session_live_ranges(conn, session), position, session.head_seq)
            after = await read_messages(conn, sum(r.hi - r.lo for r in ranges), in_ranges(ranges))
            document, revision = await _read_state(conn, session.id)
        return StoredContext(session, checkpoint, kept, after, document, revision)

    async def install(
        self, session: SessionRecord, install: Install
    ) -> tuple[SessionRecord, int, tuple[int, int] | None]:
        """Installs a fold (head checkpoint, document, state) or a prune (state only), all or nothing, if the session is
        still `session.version` (else StaleSession); returns the session after it, the state's new revision and, when
        it superseded a fold prepared in the background, that fold's tokens before and after."""
        now = self.clock()
        s = schema.sessions.c
        fold = install if isinstance(install, FoldInstall) else None
        superseded = None
        async with self._write() as conn:
            # The swap first: the checkpoint builds on the session's head checkpoint, which a rewind that
            # won the race may have deleted.
            await swap_session(conn, session, now)
            if fold is not None:
                await insert_checkpoint(conn, session.tenant, fold, now)
                await conn.execute(
                    update(schema.sessions).where(s.id == session.id).values(checkpoint_id=fold.checkpoint.id)
                )
                await insert_document(conn, fold.document)
                # A new head checkpoint: a fold prepared over the old one no longer applies (or is this one).
                dropped = await drop_prepared(conn, session.id)
                if dropped is not None and dropped[0] != fold.checkpoint.id:
                    superseded = dropped[1:]
            revision = await _put_state(conn, session.id, install.state.to_json(), None, now)
            return await session_row(conn, session.tenant, session.id), revision, superseded

    async def save_state(self, session_id: str, state_json: str, revision: int) -> int:
        """Stores the state if nobody wrote it since `revision`; the new revision, or 0 when someone wrote first."""
        async with self._write() as conn:
            return await _put_state(conn, session_id, state_json, revision, self.clock())

    async def read_state(self, session: SessionRecord) -> tuple[str | None, int]:
        async with self._read() as conn:
            return await _read_state(conn, session.id)

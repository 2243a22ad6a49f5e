"""Prepared folds (`engine/background.py`): at most one per session, kept until installed or found stale."""

from __future__ import annotations

from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ctxfold.engine.background import PreparedFold
from ctxfold.engine.candidate import FoldDocument
from ctxfold.engine.context import SessionRecord
from ctxfold.store import schema
from ctxfold.store.base import StoreBase
from ctxfold.store.rows import checkpoint_entries, checkpoint_from_row

# A prepared fold's fields its row holds under their own names, in their order.
_CARRIED = ("covered", "tokens_before", "tokens_after", "summarizer", "traceparent", "create_time")


async def drop_prepared(conn: AsyncConnection, session_id: str) -> None:
    await conn.execute(delete(schema.prepared_folds).where(schema.prepared_folds.c.session_id == session_id))


class PreparedFoldStore(StoreBase):
    async def save_prepared(self, session: SessionRecord, prepared: PreparedFold) -> None:
        """Keeps `prepared` as the session's prepared fold, replacing any earlier one."""
        checkpoint, document = prepared.checkpoint, prepared.document
        async with self._write() as conn:
            await drop_prepared(conn, session.id)
            await conn.execute(
                insert(schema.prepared_folds).values(
                    session_id=session.id,
                    checkpoint_id=checkpoint.id,
                    parent_id=checkpoint.parent_id,
                    position_seq=checkpoint.position_seq,
                    entries_json=checkpoint_entries(checkpoint),
                    summary_tokens=checkpoint.summary_tokens,
                    document_ref=document.ref,
                    document_message_id=document.message_id,
                    document_text=document.text,
                    **{name: getattr(prepared, name) for name in _CARRIED},
                )
            )

    async def read_prepared(self, session: SessionRecord) -> PreparedFold | None:
        p = schema.prepared_folds.c
        async with self._read() as conn:
            row = (await conn.execute(select(schema.prepared_folds).where(p.session_id == session.id))).first()
        if row is None:
            return None
        return PreparedFold(
            checkpoint_from_row(row, id_column="checkpoint_id"),
            FoldDocument(row.document_ref, row.document_message_id, row.document_text),
            *(getattr(row, name) for name in _CARRIED),
        )

    async def discard_prepared(self, session: SessionRecord, checkpoint_id: str) -> bool:
        """Drops the session's prepared fold if it is still `checkpoint_id`; whether it did."""
        p = schema.prepared_folds.c
        async with self._write() as conn:
            dropped = await conn.execute(
                delete(schema.prepared_folds).where(p.session_id == session.id, p.checkpoint_id == checkpoint_id)
            )
            return bool(dropped.rowcount)

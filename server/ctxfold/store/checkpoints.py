"""Checkpoints (immutable, shared by forks): chains, the index a session reads, inserts, collecting unreachable ones;
and prepared folds (`engine/background.py`), at most one per session, kept until installed or found stale."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ctxfold.engine.background import PreparedFold
from ctxfold.engine.candidate import FoldDocument, FoldInstall
from ctxfold.engine.context import SessionRecord
from ctxfold.engine.errors import not_found, session_not_found
from ctxfold.engine.lineage import CheckpointLink
from ctxfold.engine.view import Checkpoint, StoredCheckpoint
from ctxfold.store import schema
from ctxfold.store.base import StoreBase, ancestors, session_row
from ctxfold.store.rows import checkpoint_from_row, checkpoint_values

# A prepared fold's fields its row holds under their own names, in their order.
_CARRIED = ("covered", "tokens_before", "tokens_after", "summarizer", "traceparent", "create_time")


async def _chain(conn: AsyncConnection, head_id: str | None, tenant: str | None = None) -> Sequence[Row[Any]]:
    """The checkpoints from `head_id` (of `tenant`, if named) to the root: id, parent_id, position_seq, create_time."""
    if head_id is None:
        return []
    cp, columns = schema.checkpoints.c, ("id", "parent_id", "position_seq", "create_time")
    start = (cp.id == head_id, *(() if tenant is None else (cp.tenant == tenant,)))
    return await ancestors(conn, schema.checkpoints, columns, "cpchain", *start, one=True)


async def checkpoint_chain(conn: AsyncConnection, head_id: str | None) -> dict[str, CheckpointLink]:
    return {r.id: CheckpointLink(r.id, r.parent_id, r.position_seq) for r in await _chain(conn, head_id)}


async def load_checkpoints(conn: AsyncConnection, ids: Sequence[str]) -> dict[str, Checkpoint]:
    """The checkpoints `ids`, by id (those a session points at exist: a foreign key)."""
    query = select(schema.checkpoints).where(schema.checkpoints.c.id.in_(list(ids)))
    return {r.id: checkpoint_from_row(r) for r in (await conn.execute(query)).all()} if ids else {}


async def insert_checkpoint(conn: AsyncConnection, tenant: str, fold: FoldInstall, now: float) -> None:
    checkpoint = fold.checkpoint
    await conn.execute(
        insert(schema.checkpoints).values(
            id=checkpoint.id,
            tenant=tenant,
            **checkpoint_values(checkpoint),
            tokens_before=fold.tokens_before,
            tokens_after=fold.tokens_after,
            create_time=now,
        )
    )


async def drop_unreachable_checkpoints(conn: AsyncConnection, start: str | None, stop_at: str | None) -> None:
    """From `start` towards the root (short of `stop_at`), deletes each checkpoint no session or checkpoint uses;
    stops at the first still needed, since everything below it is then needed too."""
    cp, s = schema.checkpoints.c, schema.sessions.c
    chain, current = await checkpoint_chain(conn, start), start
    while current is not None and current != stop_at:
        used = await conn.execute(
            select(
                select(s.id).where(s.checkpoint_id == current).exists()
                | select(cp.id).where(cp.parent_id == current).exists()
            )
        )
        if used.scalar_one():
            return
        await conn.execute(delete(schema.checkpoints).where(cp.id == current))
        current = chain[current].parent_id


async def _checkpoint_index(
    conn: AsyncConnection, session: SessionRecord, include_abandoned: bool
) -> dict[str, tuple[float, bool]]:
    """id -> (create_time, on_head_chain) of the session's readable checkpoints: its head chain and what
    its forks inherited from it (docs/architecture.md, Storage model). Bounded by its fork tree."""
    index = {r.id: (r.create_time, True) for r in await _chain(conn, session.checkpoint_id, session.tenant)}
    if not include_abandoned:
        return index
    s = schema.sessions.c
    # (session id, cutoff): a descendant fork inherited from this session what was written before
    # this session's direct fork on its path was created.
    frontier: dict[str, float | None] = {session.id: None}
    while frontier:
        rows = (
            await conn.execute(
                select(s.id, s.checkpoint_id, s.create_time, s.forked_from_session_id).where(
                    s.tenant == session.tenant, s.forked_from_session_id.in_(list(frontier))
                )
            )
        ).all()
        next_frontier: dict[str, float | None] = {}
        for row in rows:
            cutoff = frontier[row.forked_from_session_id] or row.create_time
            next_frontier[row.id] = cutoff
            for link in await _chain(conn, row.checkpoint_id, session.tenant):
                if link.create_time <= cutoff and link.id not in index:
                    index[link.id] = (link.create_time, False)
        frontier = next_frontier
    return index


async def drop_prepared(conn: AsyncConnection, session_id: str) -> tuple[str, int, int] | None:
    """Drops the session's prepared fold; its checkpoint id and tokens before and after, if there was one."""
    p = schema.prepared_folds.c
    query = delete(schema.prepared_folds).where(p.session_id == session_id)
    row = (await conn.execute(query.returning(p.checkpoint_id, p.tokens_before, p.tokens_after))).first()
    return None if row is None else (str(row.checkpoint_id), int(row.tokens_before), int(row.tokens_after))


class CheckpointStore(StoreBase):
    async def list_checkpoints(
        self, session: SessionRecord, include_abandoned: bool, limit: int, after: tuple[float, str] | None
    ) -> tuple[list[StoredCheckpoint], tuple[float, str] | None]:
        """One page, newest first, after the (create_time, id) cursor `after`; and the next cursor if more follow."""
        async with self._read() as conn:
            index = await _checkpoint_index(conn, session, include_abandoned)
            order = sorted(index.items(), key=lambda item: (item[1][0], item[0]), reverse=True)
            if after is not None:
                order = [(cid, meta) for cid, meta in order if (meta[0], cid) < after]
            page = order[: limit + 1]
            loaded = await load_checkpoints(conn, [cid for cid, _ in page[:limit]])
        listed = [StoredCheckpoint(loaded[cid], meta[0], meta[1]) for cid, meta in page[:limit]]
        return listed, (listed[-1].create_time, listed[-1].checkpoint.id) if len(page) > limit else None

    async def get_checkpoint(self, session: SessionRecord, checkpoint_id: str) -> StoredCheckpoint:
        """A checkpoint of the session's head chain or abandoned branches; any other id: CHECKPOINT_NOT_FOUND alike."""
        async with self._read() as conn:
            found = (await _checkpoint_index(conn, session, include_abandoned=True)).get(checkpoint_id)
            if found is None:
                missing = f"checkpoint {checkpoint_id!r} not found in session {session.id!r}"
                raise not_found("CHECKPOINT_NOT_FOUND", missing, checkpoint_id=checkpoint_id, session_id=session.id)
            checkpoint = (await load_checkpoints(conn, [checkpoint_id]))[checkpoint_id]
        return StoredCheckpoint(checkpoint, found[0], found[1])

    async def save_prepared(self, session: SessionRecord, prepared: PreparedFold) -> None:
        """Keeps `prepared` as the session's prepared fold, replacing any earlier one; SESSION_NOT_FOUND when the
        session it was made for is gone: deleted, or deleted and created again under its key (the same id)."""
        checkpoint, document = prepared.checkpoint, prepared.document
        async with self._write() as conn:
            if (await session_row(conn, session.tenant, session.id, lock=True)).create_time != session.create_time:
                raise session_not_found(session.id)
            await drop_prepared(conn, session.id)
            await conn.execute(
                insert(schema.prepared_folds).values(
                    session_id=session.id,
                    checkpoint_id=checkpoint.id,
                    **checkpoint_values(checkpoint),
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

"""Lineage: segments (shared with forks, split by rewinds), live seq ranges, the readable history, branch points,
Rewind and collecting unreachable segments; the decisions are `engine/lineage.py`'s."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, and_, delete, false, func, insert, literal, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ctxfold.engine.context import SessionRecord
from ctxfold.engine.ids import new_id
from ctxfold.engine.lineage import (
    Segment,
    SeqRange,
    check_branch_seq,
    checkpoint_at_or_before,
    live_ranges,
    rewind_splits_head,
    segment_holding,
)
from ctxfold.engine.transcript import MAX_TOOL_CALLS_PER_MESSAGE, open_calls_at_end
from ctxfold.store import schema
from ctxfold.store.base import StaleSession, StoreBase, ancestors, session_row, swap_session
from ctxfold.store.checkpoints import checkpoint_chain, drop_unreachable_checkpoints
from ctxfold.store.rows import BranchPoint, branch_values, message_from_row


def in_ranges(ranges: Sequence[SeqRange]) -> ColumnElement[bool]:
    """Matches the messages in `ranges`."""
    m = schema.messages.c
    if not ranges:
        return false()
    return or_(*(and_(m.segment_id == r.segment_id, m.seq > r.lo, m.seq <= r.hi) for r in ranges))


async def segments(conn: AsyncConnection, start_ids: Sequence[str]) -> dict[str, Segment]:
    """The given segments and all their ancestors, in one recursive query."""
    segment, columns = schema.segments, ("id", "parent_id", "base_seq")
    rows = await ancestors(conn, segment, columns, "chain", segment.c.id.in_(list(start_ids)), one=False)
    return {r.id: Segment(r.id, r.parent_id, r.base_seq) for r in rows}


async def session_live_ranges(conn: AsyncConnection, session: SessionRecord) -> list[SeqRange]:
    return live_ranges(await segments(conn, [session.segment_id]), session.segment_id, session.head_seq)


async def in_history(conn: AsyncConnection, session: SessionRecord) -> ColumnElement[bool]:
    """Matches what was ever in the session's transcript (abandoned branches too, not a fork source's later writes):
    owned segments by owner, plus the inherited lineage (why that suffices: docs/architecture.md, Storage model)."""
    seg, m = schema.segments.c, schema.messages.c
    parent = schema.segments.alias("parent")
    branch = (
        await conn.execute(
            select(seg.parent_id, seg.base_seq)
            .join(parent, parent.c.id == seg.parent_id)
            .where(
                seg.owner_session_id == session.id,
                or_(parent.c.owner_session_id.is_(None), parent.c.owner_session_id != session.id),
            )
            .order_by(seg.base_seq.desc())
            .limit(1)
        )
    ).first()
    inherited = (
        []
        if branch is None
        else live_ranges(await segments(conn, [branch.parent_id]), branch.parent_id, branch.base_seq)
    )
    owned = select(seg.id).where(seg.owner_session_id == session.id)
    return or_(m.segment_id.in_(owned), in_ranges(inherited))


async def branch_point(conn: AsyncConnection, session: SessionRecord, seq: int) -> BranchPoint:
    """Everything a new branch at `seq` of `session` starts from (used by Rewind and Fork)."""
    check_branch_seq(seq, session.head_seq)
    ranges = await session_live_ranges(conn, session)
    checkpoint_id = checkpoint_at_or_before(
        await checkpoint_chain(conn, session.checkpoint_id), session.checkpoint_id, seq
    )
    # Calls waiting at `seq` are the last assistant message's, a group of at most 1 + MAX_TOOL_CALLS_PER_MESSAGE.
    m = schema.messages.c
    window = MAX_TOOL_CALLS_PER_MESSAGE + 1
    rows = (
        await conn.execute(
            select(schema.messages).where(in_ranges(ranges), m.seq <= seq, m.seq > seq - window).order_by(m.seq)
        )
    ).all()
    return BranchPoint(
        parent_segment_id=segment_holding(ranges, seq),
        seq=seq,
        checkpoint_id=checkpoint_id,
        open_tool_calls=open_calls_at_end([message_from_row(r) for r in rows]),
    )


async def drop_unreachable_segments(conn: AsyncConnection, candidates: dict[str, Segment]) -> None:
    """Deletes the candidate segments (with messages and raw results) no session has as head, no live session owns
    (its abandoned branches stay listable) and no segment builds on; repeats, as deleting children frees parents."""
    seg, s = schema.segments.c, schema.sessions.c
    remaining = set(candidates)
    while remaining:
        child = schema.segments.alias("child")
        unreachable = select(seg.id).where(
            seg.id.in_(remaining),
            ~select(s.id).where(s.segment_id == seg.id).exists(),
            ~select(s.id).where(s.id == seg.owner_session_id).exists(),
            ~select(child.c.id).where(child.c.parent_id == seg.id).exists(),
        )
        ids = (await conn.execute(unreachable)).scalars().all()
        if not ids:
            return
        # Messages, raw results and their chunks go with their segment (ON DELETE CASCADE in the schema).
        await conn.execute(delete(schema.segments).where(seg.id.in_(ids)))
        remaining -= set(ids)


async def _live_branch_depth_after(conn: AsyncConnection, segment_id: str, seq: int) -> int:
    """How many segments below `segment_id` the deepest session head on a branch after `seq` lies (0: none)."""
    seg, s = schema.segments.c, schema.sessions.c
    below = (
        select(seg.id, literal(1).label("depth"))
        .where(seg.parent_id == segment_id, seg.base_seq > seq)
        .cte("below", recursive=True)
    )
    child = schema.segments.alias("child")
    below = below.union_all(
        select(child.c.id, (below.c.depth + 1).label("depth")).where(child.c.parent_id == below.c.id)
    )
    query = select(func.max(below.c.depth)).select_from(below.join(schema.sessions, s.segment_id == below.c.id))
    return int((await conn.execute(query)).scalar_one() or 0)


async def _split_tail(conn: AsyncConnection, segment_id: str, seq: int, tail_id: str) -> None:
    """Moves `segment_id`'s messages after `seq` (and raw results) to the new segment `tail_id`, parented there, and
    re-parents the branches after `seq` onto it; ids, seqs and contents stay, so every lineage reads the same."""
    m, tr, seg = schema.messages.c, schema.tool_results.c, schema.segments.c
    tail = select(m.id).where(m.segment_id == segment_id, m.seq > seq)
    await conn.execute(
        update(schema.tool_results)
        .where(tr.segment_id == segment_id, tr.message_id.in_(tail))
        .values(segment_id=tail_id)
    )
    await conn.execute(
        update(schema.messages).where(m.segment_id == segment_id, m.seq > seq).values(segment_id=tail_id)
    )
    await conn.execute(
        update(schema.segments)
        .where(seg.parent_id == segment_id, seg.base_seq > seq, seg.id != tail_id)
        .values(parent_id=tail_id)
    )


async def insert_segment(conn: AsyncConnection, tenant: str, point: BranchPoint, owner: str, now: float) -> str:
    """A new segment of `owner`'s, branching at `point`: its id."""
    segment_id = new_id("g")
    await conn.execute(
        insert(schema.segments).values(
            id=segment_id,
            tenant=tenant,
            parent_id=point.parent_segment_id,
            base_seq=point.seq,
            owner_session_id=owner,
            create_time=now,
        )
    )
    return segment_id


class LineageStore(StoreBase):
    async def rewind(self, session: SessionRecord, to_seq: int) -> None:
        """Moves the head back to `to_seq` (later messages stay, abandoned); StaleSession if the session changed."""
        now = self.clock()
        async with self._write() as conn:
            if (await session_row(conn, session.tenant, session.id, lock=True)).version != session.version:
                raise StaleSession(session.id)
            point = await branch_point(conn, session, to_seq)
            new_segment_id = await insert_segment(conn, session.tenant, point, session.id, now)
            if point.parent_segment_id == session.segment_id and rewind_splits_head(
                len(await segments(conn, [session.segment_id])),
                await _live_branch_depth_after(conn, session.segment_id, to_seq),
            ):
                # The head segment's tail moves to the new (abandoned) segment and the head stays, so
                # rewinds do not lengthen the live chain (docs/architecture.md, Storage model).
                await _split_tail(conn, session.segment_id, to_seq, new_segment_id)
                segment_id = session.segment_id
            else:
                segment_id = new_segment_id
            await swap_session(conn, session, now, **branch_values(point, segment_id))
            # Checkpoints past the new head are unreachable now unless a fork still uses them.
            await drop_unreachable_checkpoints(conn, session.checkpoint_id, stop_at=point.checkpoint_id)

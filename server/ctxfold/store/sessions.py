"""Session rows: create, fork, get, list, delete (with whatever only the session reached), and the fold lease."""

from __future__ import annotations

from sqlalchemy import and_, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from ctxfold.engine.context import SessionRecord
from ctxfold.engine.ids import new_id
from ctxfold.store import schema
from ctxfold.store.base import StoreBase, session_row
from ctxfold.store.checkpoints import drop_unreachable_checkpoints
from ctxfold.store.lineage import branch_point, drop_unreachable_segments, insert_segment, segments
from ctxfold.store.rows import BranchPoint, ConfigTokens, branch_values, session_from_row


class SessionStore(StoreBase):
    async def create_session(
        self,
        tenant: str,
        config_json: str,
        tokens: ConfigTokens,
        *,
        session_id: str | None = None,
        source: SessionRecord | None = None,
        at_seq: int = 0,
    ) -> SessionRecord:
        """A new session, or a fork of `source` sharing its history and checkpoints up to `at_seq` (0: its head): a
        snapshot, whatever runs beside it (appends, rewinds and deletes wait for the source's row, which the fork holds
        shared). An explicit `session_id` that exists already (two callers creating the session one key names, at
        once) answers the existing session of the tenant."""
        session_id = session_id or new_id("s")
        try:
            async with self._write() as conn:
                point = BranchPoint(None, 0, None, ())
                if source is not None:
                    current = await session_row(conn, tenant, source.id, lock=True, shared=True)
                    point = await branch_point(conn, current, at_seq or current.head_seq)
                now = self.clock()
                segment_id = await insert_segment(conn, tenant, point, session_id, now)
                await conn.execute(
                    insert(schema.sessions).values(
                        id=session_id,
                        tenant=tenant,
                        config_json=config_json,
                        system_tokens=tokens.system,
                        tools_tokens=tokens.tools,
                        **branch_values(point, segment_id),
                        version=1,
                        forked_from_session_id=source.id if source else None,
                        forked_at_seq=point.seq,
                        create_time=now,
                        update_time=now,
                    )
                )
                # An empty state ("new"); every later write is then an update with a compare-and-swap.
                await conn.execute(
                    insert(schema.context_states).values(
                        session_id=session_id, state_json="", revision=1, update_time=now
                    )
                )
        except IntegrityError:
            if source is not None:
                raise
        return await self.get_session(tenant, session_id)

    async def find_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        s = schema.sessions.c
        async with self._read() as conn:
            row = (await conn.execute(select(schema.sessions).where(s.id == session_id, s.tenant == tenant))).first()
        return session_from_row(row) if row is not None else None

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        async with self._read() as conn:
            return await session_row(conn, tenant, session_id)

    async def list_sessions(
        self, tenant: str, limit: int, after: tuple[float, str] | None
    ) -> tuple[list[SessionRecord], tuple[float, str] | None]:
        """One page, newest first, after the (create_time, id) cursor `after`; and the next cursor if more follow."""
        s = schema.sessions.c
        query = select(schema.sessions).where(s.tenant == tenant)
        if after is not None:
            query = query.where(or_(s.create_time < after[0], and_(s.create_time == after[0], s.id < after[1])))
        query = query.order_by(s.create_time.desc(), s.id.desc()).limit(limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(query)).all()
        records = [session_from_row(r) for r in rows[:limit]]
        return records, (records[-1].create_time, records[-1].id) if len(rows) > limit else None

    async def delete_session(self, tenant: str, session_id: str) -> None:
        """Deletes the session and whatever only it reached: bounded by its own segments and chain, not the tenant."""
        s, seg = schema.sessions.c, schema.segments.c
        async with self._write() as conn:
            session = await session_row(conn, tenant, session_id, lock=True)
            owned = (await conn.execute(select(seg.id).where(seg.owner_session_id == session.id))).scalars().all()
            candidates = await segments(conn, [session.segment_id, *owned])
            await conn.execute(delete(schema.sessions).where(s.id == session.id))
            await drop_unreachable_checkpoints(conn, session.checkpoint_id, stop_at=None)
            await drop_unreachable_segments(conn, candidates)

    async def take_fold_lease(
        self, session: SessionRecord, owner: str, seconds: float, replacing: str = ""
    ) -> tuple[float, str]:
        """Takes the fold lease, extends it for `owner`, or takes it from `replacing` (a holder known dead). Returns
        (0, owner) when ours, else (when the holder's lease runs out, that holder)."""
        now = self.clock()
        s = schema.sessions.c
        free = or_(s.fold_lease_until.is_(None), s.fold_lease_until < now, s.fold_lease_owner == owner)
        async with self._write() as conn:
            taken = await conn.execute(
                update(schema.sessions)
                .where(s.id == session.id, s.tenant == session.tenant, or_(free, s.fold_lease_owner == replacing))
                .values(fold_lease_owner=owner, fold_lease_until=now + seconds)
            )
            if taken.rowcount == 1:
                return 0.0, owner
            held = (
                await conn.execute(select(s.fold_lease_until, s.fold_lease_owner).where(s.id == session.id))
            ).first()
        return (float(held.fold_lease_until or now), str(held.fold_lease_owner or "")) if held else (now, "")

    async def fold_lease_until(self, session: SessionRecord) -> float:
        """When the current fold lease runs out (0 when nobody holds one)."""
        s = schema.sessions.c
        async with self._read() as conn:
            until = (await conn.execute(select(s.fold_lease_until).where(s.id == session.id))).scalar_one_or_none()
        return float(until or 0.0)

    async def release_fold_lease(self, session: SessionRecord, owner: str) -> None:
        s = schema.sessions.c
        async with self._write() as conn:
            await conn.execute(
                update(schema.sessions)
                .where(s.id == session.id, s.fold_lease_owner == owner)
                .values(fold_lease_owner=None, fold_lease_until=None)
            )

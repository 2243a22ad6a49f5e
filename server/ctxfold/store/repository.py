"""The repository: every query ctxfold makes, scoped by tenant. Writers compare-and-swap on
`sessions.version`, so concurrent appends and replicas sharing one database never lose a write."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import zstandard
from sqlalchemy import ColumnElement, and_, delete, false, func, insert, literal, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ctxfold import cpu
from ctxfold.engine.briefing import FoldNotes
from ctxfold.engine.errors import DomainError, Kind, invalid, not_found, session_not_found
from ctxfold.engine.lineage import (
    CheckpointLink,
    Segment,
    SeqRange,
    checkpoint_at_or_before,
    live_ranges,
    ranges_within,
    rewind_splits_head,
    segment_holding,
)
from ctxfold.engine.maintenance import FoldDocument, FoldInstall, Install
from ctxfold.engine.model import Role, StoredMessage, ToolCall, Usage
from ctxfold.engine.tool_results import RawSpan, page_span, sha256_hex
from ctxfold.engine.transcript import MAX_TOOL_CALLS_PER_MESSAGE, open_calls_at_end
from ctxfold.engine.view import Checkpoint, StoredCheckpoint
from ctxfold.store import schema
from ctxfold.store.database import WRITE_OPTION

# zstd (de)compressor objects are not thread-safe, and (de)compression runs in worker threads: one
# object per call (they are cheap to make).
ZSTD_LEVEL = 3
# Raw results below this size are stored uncompressed; compression costs more than it saves.
_COMPRESS_MIN_BYTES = 1024
# Results longer than this many raw bytes are stored in chunks of it, each compressed on its own; shorter
# ones are kept whole (in `data`, or as the message content). So a page read (at most 24 KiB) fetches
# and decompresses at most two chunks or one whole result of at most one chunk, whatever the result's
# size (migration 0006 chunks the longer rows stored whole before).
CHUNK_BYTES = 64 << 10


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def new_result_ref() -> str:
    """80 random bits in base32: refs are written into summaries, where each costs tokens (about
    11 here against 20 for a hex UUID)."""
    return "tr_" + base64.b32encode(secrets.token_bytes(10)).decode().lower()


@dataclass(frozen=True)
class SessionRecord:
    id: str
    tenant: str
    config_json: str
    system_tokens: int
    tools_tokens: int
    segment_id: str
    head_seq: int
    branch_id: str
    checkpoint_id: str | None
    open_tool_calls: tuple[str, ...]
    version: int
    forked_from_session_id: str | None
    forked_at_seq: int
    create_time: float
    update_time: float


@dataclass(frozen=True)
class MessageRow:
    """A message ready to insert: ids, bounded content and token count already computed."""

    id: str
    role: Role
    content: str
    tokens: int
    tool_calls: tuple[ToolCall, ...]
    tool_call_id: str
    reasoning_content: str
    name: str
    pinned: bool
    result_ref: str
    raw: bytes | None  # the raw tool result when `content` is a bounded cut of it
    raw_bytes: int
    truncated: bool


@dataclass(frozen=True)
class RawResult:
    ref: str
    data: bytes
    sha256: str


@dataclass(frozen=True)
class EncodedResult:
    """A raw result as stored: its tool_results row (segment aside) and its tool_result_chunks rows."""

    row: dict[str, object]
    chunks: list[dict[str, object]]


@dataclass(frozen=True)
class ConfigTokens:
    system: int
    tools: int


@dataclass(frozen=True)
class BranchPoint:
    parent_segment_id: str | None
    seq: int
    checkpoint_id: str | None
    open_tool_calls: tuple[str, ...]


@dataclass(frozen=True)
class ContextSnapshot:
    """What a view is built from, read in one transaction."""

    session: SessionRecord
    checkpoint: Checkpoint | None
    kept: list[StoredMessage]
    after: list[StoredMessage]
    state_json: str | None
    state_revision: int  # 0 when the session has no stored state yet


class StaleSession(Exception):
    """The session changed between read and write; the caller re-reads and retries."""


def _session_record(row: object) -> SessionRecord:
    m = row._mapping  # type: ignore[attr-defined]
    return SessionRecord(
        id=m["id"],
        tenant=m["tenant"],
        config_json=m["config_json"],
        system_tokens=m["system_tokens"],
        tools_tokens=m["tools_tokens"],
        segment_id=m["segment_id"],
        head_seq=m["head_seq"],
        branch_id=m["branch_id"],
        checkpoint_id=m["checkpoint_id"],
        open_tool_calls=tuple(json.loads(m["open_tool_calls"])),
        version=m["version"],
        forked_from_session_id=m["forked_from_session_id"],
        forked_at_seq=m["forked_at_seq"],
        create_time=m["create_time"],
        update_time=m["update_time"],
    )


def _stored_message(row: object, abandoned: bool = False) -> StoredMessage:
    m = row._mapping  # type: ignore[attr-defined]
    calls = tuple(ToolCall(**c) for c in json.loads(m["tool_calls_json"])) if m["tool_calls_json"] else ()
    return StoredMessage(
        id=m["id"],
        seq=m["seq"],
        role=Role(m["role"]),
        content=m["content"],
        tokens=m["tokens"],
        tool_calls=calls,
        tool_call_id=m["tool_call_id"] or "",
        reasoning_content=m["reasoning_content"],
        pinned=m["pinned"],
        name=m["name"],
        result_ref=m["result_ref"] or "",
        raw_bytes=m["raw_bytes"],
        truncated=m["truncated"],
        create_time=m["create_time"],
        abandoned=abandoned,
    )


_STATE_QUERY = select(
    schema.context_states.c.state_json, schema.context_states.c.bookkeeping_json, schema.context_states.c.revision
)


def _whole_state(state_json: str) -> dict[str, str | None]:
    """The columns of a write of the whole state: its bookkeeping is in it."""
    return {"state_json": state_json, "bookkeeping_json": None}


def state_document(row: object) -> str:
    """The stored state of a context_states row: `state_json` with the fields of `bookkeeping_json`
    laid over it (the store knows nothing else of either). A document that is not a JSON object is
    answered as it is, for the reader to reject."""
    m = row._mapping  # type: ignore[attr-defined]
    text, bookkeeping = str(m["state_json"]), m["bookkeeping_json"]
    if not bookkeeping:
        return text
    try:
        base, fields = json.loads(text), json.loads(bookkeeping)
    except ValueError:
        return text
    if not isinstance(base, dict) or not isinstance(fields, dict):
        return text
    return json.dumps({**base, **fields}, sort_keys=True, separators=(",", ":"))


def _in_ranges(ranges: Sequence[SeqRange]) -> ColumnElement[bool]:
    m = schema.messages.c
    if not ranges:
        return false()
    return or_(*(and_(m.segment_id == r.segment_id, m.seq > r.lo, m.seq <= r.hi) for r in ranges))


def _encode_result(ref: str, message_id: str, raw: bytes, *, inline: bool = False) -> EncodedResult:
    """How `raw` is stored: only its identity when it is the message content (`inline`) of at most one
    chunk, whole when small, else in independently compressed chunks. The sha256 is of the whole result."""
    row: dict[str, object] = {
        "ref": ref,
        "message_id": message_id,
        "codec": "inline",
        "data": b"",
        "total_bytes": len(raw),
        "sha256": sha256_hex(raw),
        "chunk_bytes": None,
    }
    if inline and len(raw) <= CHUNK_BYTES:
        return EncodedResult(row, [])
    if len(raw) < _COMPRESS_MIN_BYTES:
        return EncodedResult({**row, "codec": "identity", "data": raw}, [])
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    view = memoryview(raw)
    chunks: list[dict[str, object]] = [
        {"ref": ref, "chunk_index": index, "data": compressor.compress(view[start : start + CHUNK_BYTES])}
        for index, start in enumerate(range(0, len(raw), CHUNK_BYTES))
    ]
    return EncodedResult({**row, "codec": "zstd_chunks", "chunk_bytes": CHUNK_BYTES}, chunks)


def _raw_result(row: MessageRow) -> EncodedResult:
    """The stored raw result of a tool message; not truncated, its content is the raw result."""
    if row.raw is None:
        return _encode_result(row.result_ref, row.id, row.content.encode(), inline=True)
    return _encode_result(row.result_ref, row.id, row.raw)


def _decompress_span(chunks: Sequence[bytes], first_start: int, start: int, stop: int) -> bytes:
    """Bytes [start, stop) of a result from its consecutive chunks, the first starting at `first_start`."""
    decompressor = zstandard.ZstdDecompressor()
    joined = b"".join(decompressor.decompress(chunk) for chunk in chunks)
    return joined[start - first_start : stop - first_start]


async def _encode_raw_results(rows: Sequence[MessageRow]) -> list[EncodedResult]:
    """Compressing and hashing raw results is done before the write transaction, off the event loop.
    A user message's result is its content (raw_bytes 0): it is encoded and hashed all the same."""
    raw_size = sum(len(r.content) if r.raw is None else len(r.raw) for r in rows if r.result_ref)
    return await cpu.run(raw_size, lambda: [_raw_result(r) for r in rows if r.result_ref])


def appended_session(session: SessionRecord, count: int, open_tool_calls: tuple[str, ...], now: float) -> SessionRecord:
    """`session` after an append of `count` messages."""
    return replace(
        session,
        head_seq=session.head_seq + count,
        open_tool_calls=open_tool_calls,
        version=session.version + 1,
        update_time=now,
    )


def _head_values(after: SessionRecord) -> dict[str, object]:
    """The columns an append changes, to become `after`."""
    return {
        "head_seq": after.head_seq,
        "open_tool_calls": json.dumps(list(after.open_tool_calls)),
        "version": after.version,
        "update_time": after.update_time,
    }


def stored_messages(rows: Sequence[MessageRow], first_seq: int, now: float) -> list[StoredMessage]:
    """`rows` as they are stored by an append at `first_seq` at time `now`."""
    return [
        StoredMessage(
            id=r.id,
            seq=first_seq + i,
            role=r.role,
            content=r.content,
            tokens=r.tokens,
            tool_calls=r.tool_calls,
            tool_call_id=r.tool_call_id,
            reasoning_content=r.reasoning_content,
            pinned=r.pinned,
            name=r.name,
            result_ref=r.result_ref,
            raw_bytes=r.raw_bytes,
            truncated=r.truncated,
            create_time=now,
        )
        for i, r in enumerate(rows)
    ]


class Store:
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        # SQLite admits one writer at a time; waiting writers poll in its busy handler with sleeps of up
        # to 100 ms, which makes tail latency under concurrent appends seconds long. Queueing them here
        # hands the lock over at once (writers in other processes still rely on busy_timeout).
        self._writer_turn: asyncio.Lock | None = asyncio.Lock() if engine.dialect.name == "sqlite" else None

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

    # ---- sessions -------------------------------------------------------------------------------

    async def create_session(
        self, tenant: str, config_json: str, tokens: ConfigTokens, *, session_id: str | None = None
    ) -> SessionRecord:
        session_id = session_id or new_id("s")
        async with self._write() as conn:
            await self._insert_session(conn, tenant, session_id, config_json, tokens, BranchPoint(None, 0, None, ()))
        return await self.get_session(tenant, session_id)

    async def fork(
        self, source: SessionRecord, at_seq: int, session_id: str, config_json: str, tokens: ConfigTokens
    ) -> SessionRecord:
        """A new session sharing `source`'s history up to `at_seq` and its checkpoint chain up to there."""
        async with self._write() as conn:
            # Re-read inside the write transaction: a concurrent delete must not leave a dangling parent.
            current = await self._get_session(conn, source.tenant, source.id)
            point = await self._branch_point(conn, current, at_seq)
            await self._insert_session(
                conn, source.tenant, session_id, config_json, tokens, point, forked_from=source.id
            )
        return await self.get_session(source.tenant, session_id)

    async def _insert_session(
        self,
        conn: AsyncConnection,
        tenant: str,
        session_id: str,
        config_json: str,
        tokens: ConfigTokens,
        point: BranchPoint,
        forked_from: str | None = None,
    ) -> None:
        now = time.time()
        segment_id = new_id("g")
        await conn.execute(
            insert(schema.segments).values(
                id=segment_id,
                tenant=tenant,
                parent_id=point.parent_segment_id,
                base_seq=point.seq,
                owner_session_id=session_id,
                create_time=now,
            )
        )
        await conn.execute(
            insert(schema.sessions).values(
                id=session_id,
                tenant=tenant,
                config_json=config_json,
                system_tokens=tokens.system,
                tools_tokens=tokens.tools,
                segment_id=segment_id,
                head_seq=point.seq,
                branch_id=new_id("b"),
                checkpoint_id=point.checkpoint_id,
                open_tool_calls=json.dumps(list(point.open_tool_calls)),
                version=1,
                forked_from_session_id=forked_from,
                forked_at_seq=point.seq if forked_from else 0,
                create_time=now,
                update_time=now,
            )
        )
        # An empty state ("new"); every later write is then an update with a compare-and-swap.
        await conn.execute(
            insert(schema.context_states).values(session_id=session_id, state_json="", revision=1, update_time=now)
        )

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        async with self._read() as conn:
            return await self._get_session(conn, tenant, session_id)

    async def _get_session(
        self, conn: AsyncConnection, tenant: str, session_id: str, lock: bool = False
    ) -> SessionRecord:
        """With `lock`, the row stays locked until the transaction ends (PostgreSQL; SQLite write
        transactions already hold the database lock)."""
        s = schema.sessions.c
        query = select(schema.sessions).where(s.id == session_id, s.tenant == tenant)
        row = (await conn.execute(query.with_for_update() if lock else query)).first()
        if row is None:
            raise session_not_found(session_id)
        return _session_record(row)

    async def list_sessions(
        self, tenant: str, limit: int, after: tuple[float, str] | None
    ) -> tuple[list[SessionRecord], bool]:
        """Newest first; `after` is the (create_time, id) of the last session of the previous page."""
        s = schema.sessions.c
        query = select(schema.sessions).where(s.tenant == tenant)
        if after is not None:
            query = query.where(or_(s.create_time < after[0], and_(s.create_time == after[0], s.id < after[1])))
        query = query.order_by(s.create_time.desc(), s.id.desc()).limit(limit + 1)
        async with self._read() as conn:
            rows = (await conn.execute(query)).all()
        records = [_session_record(r) for r in rows[:limit]]
        return records, len(rows) > limit

    async def delete_session(self, tenant: str, session_id: str) -> None:
        """Deletes the session and whatever only it could reach: work is bounded by the session's own
        segments and checkpoint chain, not by the tenant's size."""
        s, seg = schema.sessions.c, schema.segments.c
        async with self._write() as conn:
            session = await self._get_session(conn, tenant, session_id, lock=True)
            owned = (await conn.execute(select(seg.id).where(seg.owner_session_id == session.id))).scalars().all()
            segments = await self._segments(conn, [session.segment_id, *owned])
            chain = await self._checkpoint_chain(conn, session.checkpoint_id)
            await conn.execute(delete(schema.sessions).where(s.id == session.id))
            await self._drop_unreachable_checkpoints(conn, chain, session.checkpoint_id, stop_at=None)
            await self._drop_unreachable_segments(conn, segments)

    async def _drop_unreachable_checkpoints(
        self, conn: AsyncConnection, chain: dict[str, CheckpointLink], start: str | None, stop_at: str | None
    ) -> None:
        """Walks the chain from `start` towards the root (not reaching `stop_at`) and deletes each
        checkpoint no session points at and no other checkpoint builds on; stops at the first that is
        still needed, since everything below it is then needed too."""
        cp, s = schema.checkpoints.c, schema.sessions.c
        current = start
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

    async def _drop_unreachable_segments(self, conn: AsyncConnection, candidates: dict[str, Segment]) -> None:
        """Deletes the candidate segments (with their messages and raw results) that no session has as
        its head, no live session owns (its abandoned branches stay listable) and no segment builds on.
        Children go first, which frees their parents, so a pass repeats until nothing changes."""
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
            # Messages and raw results go with their segment (ON DELETE CASCADE, stated for clarity).
            tr = schema.tool_results.c
            refs = select(tr.ref).where(tr.segment_id.in_(ids))
            await conn.execute(delete(schema.tool_result_chunks).where(schema.tool_result_chunks.c.ref.in_(refs)))
            await conn.execute(delete(schema.tool_results).where(tr.segment_id.in_(ids)))
            await conn.execute(delete(schema.messages).where(schema.messages.c.segment_id.in_(ids)))
            await conn.execute(delete(schema.segments).where(seg.id.in_(ids)))
            remaining -= set(ids)

    # ---- lineage --------------------------------------------------------------------------------

    async def _segments(self, conn: AsyncConnection, start_ids: Sequence[str]) -> dict[str, Segment]:
        """The given segments and all their ancestors, in one recursive query."""
        seg = schema.segments.c
        chain = (
            select(seg.id, seg.parent_id, seg.base_seq).where(seg.id.in_(list(start_ids))).cte("chain", recursive=True)
        )
        parent = schema.segments.alias("parent")
        chain = chain.union(
            select(parent.c.id, parent.c.parent_id, parent.c.base_seq).where(parent.c.id == chain.c.parent_id)
        )
        rows = (await conn.execute(select(chain))).all()
        return {r.id: Segment(r.id, r.parent_id, r.base_seq) for r in rows}

    async def _in_history(self, conn: AsyncConnection, session: SessionRecord) -> ColumnElement[bool]:
        """Matches everything that was ever in the session's transcript, abandoned branches included (but
        not what a fork's source wrote after the fork point). Every message of a segment the session owns
        is in its history, so those are matched by owner, however many rewinds made them. The rest is the
        source history the session was forked from: each owned segment whose parent another session wrote
        branched off that one lineage (at the fork, or lower after a rewind below the fork point), so the
        one branching highest covers all of them, and its chain is as long as the fork's, not the session's
        number of segments."""
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
            else live_ranges(await self._segments(conn, [branch.parent_id]), branch.parent_id, branch.base_seq)
        )
        owned = select(seg.id).where(seg.owner_session_id == session.id)
        return or_(m.segment_id.in_(owned), _in_ranges(inherited))

    async def _live_ranges(self, conn: AsyncConnection, session: SessionRecord) -> list[SeqRange]:
        return live_ranges(await self._segments(conn, [session.segment_id]), session.segment_id, session.head_seq)

    async def _checkpoint_chain(self, conn: AsyncConnection, head_id: str | None) -> dict[str, CheckpointLink]:
        if head_id is None:
            return {}
        cp = schema.checkpoints.c
        chain = select(cp.id, cp.parent_id, cp.position_seq).where(cp.id == head_id).cte("cpchain", recursive=True)
        parent = schema.checkpoints.alias("parent")
        chain = chain.union_all(
            select(parent.c.id, parent.c.parent_id, parent.c.position_seq).where(parent.c.id == chain.c.parent_id)
        )
        rows = (await conn.execute(select(chain))).all()
        return {r.id: CheckpointLink(r.id, r.parent_id, r.position_seq) for r in rows}

    async def _branch_point(self, conn: AsyncConnection, session: SessionRecord, seq: int) -> BranchPoint:
        """Everything a new branch at `seq` of `session` starts from (used by Rewind and Fork)."""
        if not 0 <= seq <= session.head_seq:
            raise invalid(
                "SEQ_OUT_OF_RANGE",
                f"seq {seq} is outside the session's transcript (0..{session.head_seq})",
                seq=seq,
                head_seq=session.head_seq,
            )
        ranges = await self._live_ranges(conn, session)
        checkpoint_id = checkpoint_at_or_before(
            await self._checkpoint_chain(conn, session.checkpoint_id), session.checkpoint_id, seq
        )
        # Calls still waiting at `seq` can only belong to the last assistant message, whose group is at
        # most 1 + MAX_TOOL_CALLS_PER_MESSAGE messages long.
        m = schema.messages.c
        window = MAX_TOOL_CALLS_PER_MESSAGE + 1
        rows = (
            await conn.execute(
                select(schema.messages).where(_in_ranges(ranges), m.seq <= seq, m.seq > seq - window).order_by(m.seq)
            )
        ).all()
        return BranchPoint(
            parent_segment_id=segment_holding(ranges, seq),
            seq=seq,
            checkpoint_id=checkpoint_id,
            open_tool_calls=open_calls_at_end([_stored_message(r) for r in rows]),
        )

    async def rewind(self, session: SessionRecord, to_seq: int) -> None:
        """Moves the head back to `to_seq`; the later messages stay, abandoned.
        Raises StaleSession when the session changed since it was read."""
        now = time.time()
        async with self._write() as conn:
            point = await self._branch_point(conn, session, to_seq)
            new_segment_id = new_id("g")
            await conn.execute(
                insert(schema.segments).values(
                    id=new_segment_id,
                    tenant=session.tenant,
                    parent_id=point.parent_segment_id,
                    base_seq=to_seq,
                    owner_session_id=session.id,
                    create_time=now,
                )
            )
            if point.parent_segment_id == session.segment_id and rewind_splits_head(
                len(await self._segments(conn, [session.segment_id])),
                await self._live_branch_depth_after(conn, session.segment_id, to_seq),
            ):
                # The point is in the head segment: its tail moves to the new segment, which becomes an
                # abandoned branch, and the head keeps appending in place. Otherwise every rewind would
                # add a segment to the live chain and a range to every query.
                await self._split_tail(conn, session.segment_id, to_seq, new_segment_id)
                segment_id = session.segment_id
            else:
                segment_id = new_segment_id
            s = schema.sessions.c
            swapped = await conn.execute(
                update(schema.sessions)
                .where(s.id == session.id, s.tenant == session.tenant, s.version == session.version)
                .values(
                    segment_id=segment_id,
                    head_seq=to_seq,
                    branch_id=new_id("b"),
                    checkpoint_id=point.checkpoint_id,
                    open_tool_calls=json.dumps(list(point.open_tool_calls)),
                    version=s.version + 1,
                    update_time=now,
                )
            )
            if swapped.rowcount != 1:
                raise StaleSession(session.id)
            # Checkpoints past the new head are unreachable now unless a fork still uses them.
            chain = await self._checkpoint_chain(conn, session.checkpoint_id)
            await self._drop_unreachable_checkpoints(conn, chain, session.checkpoint_id, stop_at=point.checkpoint_id)

    @staticmethod
    async def _live_branch_depth_after(conn: AsyncConnection, segment_id: str, seq: int) -> int:
        """How many segments below `segment_id` the deepest session head lies, among the branches that
        start after `seq` (what moving that tail re-parents); 0 when no session's head is there."""
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

    @staticmethod
    async def _split_tail(conn: AsyncConnection, segment_id: str, seq: int, tail_id: str) -> None:
        """Moves the messages of `segment_id` after `seq` (with their raw results) to the new segment
        `tail_id`, whose parent is `segment_id` at `seq`, and re-parents the branches that start after
        `seq` onto it. Message ids, seqs and contents stay; every lineage reads the same messages."""
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

    # ---- transcript -----------------------------------------------------------------------------

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
        now = time.time()
        raw_results = await _encode_raw_results(rows)
        async with self._write() as conn:
            session = await self._get_session(conn, tenant, session_id, lock=True)
            if request_id:
                previous = await self._append_request(conn, session, request_id)
                if previous is not None:
                    return previous, session
            after = appended_session(session, len(rows), advance(session.open_tool_calls), now)
            s = schema.sessions.c
            await conn.execute(update(schema.sessions).where(s.id == session.id).values(**_head_values(after)))
            await self._insert_messages(conn, session, rows, raw_results, request_id, now)
        return stored_messages(rows, session.head_seq + 1, now), after

    async def append_answered(
        self,
        session: SessionRecord,
        rows: Sequence[MessageRow],
        request_id: str,
        open_tool_calls: tuple[str, ...],
        bookkeeping_json: str,
        revision: int,
        now: float,
    ) -> int:
        """The hot path of an append-only Prepare, in one transaction: appends `rows` (maybe none) and
        writes the answer's bookkeeping (not the rest of the state), only if the session is still
        `session` (same version and branch) and the state still at `revision`; raises StaleSession
        otherwise and writes nothing. A `request_id` seen before also raises StaleSession: the caller's
        full path answers it. Returns the state's new revision."""
        raw_results = await _encode_raw_results(rows)
        s = schema.sessions.c
        current = and_(s.id == session.id, s.tenant == session.tenant, s.version == session.version)
        current = and_(current, s.branch_id == session.branch_id)
        async with self._write() as conn:
            if rows:
                if request_id and await self._append_request(conn, session, request_id) is not None:
                    raise StaleSession(session.id)
                after = appended_session(session, len(rows), open_tool_calls, now)
                swapped = await conn.execute(update(schema.sessions).where(current).values(**_head_values(after)))
                if swapped.rowcount != 1:
                    raise StaleSession(session.id)
                await self._insert_messages(conn, session, rows, raw_results, request_id, now)
            elif (await conn.execute(select(s.id).where(current))).first() is None:
                raise StaleSession(session.id)
            written = await self._put_state(conn, session.id, {"bookkeeping_json": bookkeeping_json}, revision, now)
            if not written:
                raise StaleSession(session.id)
            return written

    async def _insert_messages(
        self,
        conn: AsyncConnection,
        session: SessionRecord,
        rows: Sequence[MessageRow],
        raw_results: Sequence[EncodedResult],
        request_id: str,
        now: float,
    ) -> None:
        """The rows of an append after `session`'s head: messages, raw results, the request id."""
        first_seq = session.head_seq + 1
        if rows:
            await conn.execute(
                insert(schema.messages),
                [
                    {
                        "id": r.id,
                        "segment_id": session.segment_id,
                        "seq": first_seq + i,
                        "role": r.role.value,
                        "content": r.content,
                        "tool_calls_json": json.dumps([c.__dict__ for c in r.tool_calls]) if r.tool_calls else None,
                        "tool_call_id": r.tool_call_id or None,
                        "reasoning_content": r.reasoning_content,
                        "name": r.name,
                        "pinned": r.pinned,
                        "tokens": r.tokens,
                        "result_ref": r.result_ref or None,
                        "raw_bytes": r.raw_bytes,
                        "truncated": r.truncated,
                        "create_time": now,
                    }
                    for i, r in enumerate(rows)
                ],
            )
            if raw_results:
                await self._insert_results(conn, session.segment_id, raw_results)
        if request_id:
            await conn.execute(
                insert(schema.append_requests).values(
                    session_id=session.id,
                    request_id=request_id,
                    message_ids_json=json.dumps([r.id for r in rows]),
                    create_time=now,
                )
            )

    async def _append_request(
        self, conn: AsyncConnection, session: SessionRecord, request_id: str
    ) -> list[StoredMessage] | None:
        """The messages a previous append with this request id wrote, or None."""
        ar, m = schema.append_requests.c, schema.messages.c
        ids_json = (
            await conn.execute(
                select(ar.message_ids_json).where(ar.session_id == session.id, ar.request_id == request_id)
            )
        ).scalar_one_or_none()
        if ids_json is None:
            return None
        ids = json.loads(ids_json)
        if not ids:
            return []
        rows = (await conn.execute(select(schema.messages).where(m.id.in_(ids)).order_by(m.seq))).all()
        return [_stored_message(r) for r in rows]

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
        ).label("size")
        after_seq, after_abandoned, after_id = after or (0, 0, "")
        async with self._read() as conn:
            ranges = await self._live_ranges(conn, session)
            live_query = select(m.id, m.seq, size).where(_in_ranges(ranges), m.seq > after_seq).order_by(m.seq)
            entries = [(r.seq, 0, r.id, r.size) for r in (await conn.execute(live_query.limit(limit + 1))).all()]
            if include_abandoned:
                in_history = await self._in_history(conn, session)
                # Abandoned messages follow the live one of the same seq.
                same_seq = m.seq == after_seq if not after_abandoned else and_(m.seq == after_seq, m.id > after_id)
                ab_query = (
                    select(m.id, m.seq, size)
                    .where(in_history, ~_in_ranges(ranges), or_(m.seq > after_seq, same_seq))
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
        messages = [_stored_message(by_id[message_id], abandoned=bool(flag)) for _, flag, message_id, _ in page]
        more = len(entries) > len(page)
        cursor = (page[-1][0], page[-1][1], page[-1][2]) if more and page else None
        return messages, cursor

    # ---- checkpoints and context state ----------------------------------------------------------

    @staticmethod
    def _checkpoint(row: object) -> Checkpoint:
        m = row._mapping  # type: ignore[attr-defined]
        entries = json.loads(m["entries_json"])
        summary = next(e["text"] for e in entries if e["type"] == "summary")
        kept = tuple(e["id"] for e in entries if e["type"] == "message")
        notes = next((FoldNotes.from_json(e["notes"]) for e in entries if e["type"] == "notes"), None)
        return Checkpoint(m["id"], m["parent_id"], m["position_seq"], summary, m["summary_tokens"], kept, notes)

    async def list_checkpoints(
        self, session: SessionRecord, include_abandoned: bool, limit: int, after: tuple[float, str] | None
    ) -> tuple[list[StoredCheckpoint], bool]:
        """One page, newest first; `after` is the (create_time, id) of the last checkpoint of the
        previous page. Returns the page and whether more follow."""
        async with self._read() as conn:
            index = await self._checkpoint_index(conn, session, include_abandoned)
            order = sorted(index.items(), key=lambda item: (item[1][0], item[0]), reverse=True)
            if after is not None:
                order = [(cid, meta) for cid, meta in order if (meta[0], cid) < after]
            page = order[: limit + 1]
            rows = await self._checkpoint_rows(conn, [cid for cid, _ in page[:limit]])
        listed = [StoredCheckpoint(self._checkpoint(rows[cid]), meta[0], meta[1]) for cid, meta in page[:limit]]
        return listed, len(page) > limit

    async def get_checkpoint(self, session: SessionRecord, checkpoint_id: str) -> StoredCheckpoint:
        """A checkpoint of the session's head chain or of one of its abandoned branches; any other id
        (unknown, another session's, another tenant's) is CHECKPOINT_NOT_FOUND alike."""
        async with self._read() as conn:
            found = (await self._checkpoint_index(conn, session, include_abandoned=True)).get(checkpoint_id)
            if found is None:
                raise not_found(
                    "CHECKPOINT_NOT_FOUND",
                    f"checkpoint {checkpoint_id!r} not found in session {session.id!r}",
                    checkpoint_id=checkpoint_id,
                    session_id=session.id,
                )
            row = (await self._checkpoint_rows(conn, [checkpoint_id]))[checkpoint_id]
        return StoredCheckpoint(self._checkpoint(row), found[0], found[1])

    async def _checkpoint_rows(self, conn: AsyncConnection, ids: Sequence[str]) -> dict[str, object]:
        if not ids:
            return {}
        cp = schema.checkpoints.c
        return {r.id: r for r in (await conn.execute(select(schema.checkpoints).where(cp.id.in_(list(ids))))).all()}

    async def _chain_times(self, conn: AsyncConnection, tenant: str, head_id: str) -> dict[str, float]:
        """The create_time of every checkpoint on the chain from `head_id` to its root."""
        cp = schema.checkpoints.c
        chain = (
            select(cp.id, cp.parent_id, cp.create_time)
            .where(cp.id == head_id, cp.tenant == tenant)
            .cte("timechain", recursive=True)
        )
        parent = schema.checkpoints.alias("parent")
        chain = chain.union_all(
            select(parent.c.id, parent.c.parent_id, parent.c.create_time).where(parent.c.id == chain.c.parent_id)
        )
        return {r.id: r.create_time for r in (await conn.execute(select(chain.c.id, chain.c.create_time))).all()}

    async def _checkpoint_index(
        self, conn: AsyncConnection, session: SessionRecord, include_abandoned: bool
    ) -> dict[str, tuple[float, bool]]:
        """id -> (create_time, on_head_chain) of the session's readable checkpoints.

        Rewind deletes the checkpoints it leaves behind unless a fork still builds on them, so the
        abandoned checkpoints that still exist are exactly those on the chain of a fork (or a fork of
        a fork) of this session that were written before that fork was made: the fork inherited them
        from this session. Work is bounded by the session's fork tree and chains."""
        index: dict[str, tuple[float, bool]] = {}
        if session.checkpoint_id is not None:
            times = await self._chain_times(conn, session.tenant, session.checkpoint_id)
            index = {cid: (created, True) for cid, created in times.items()}
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
                if row.checkpoint_id is None:
                    continue
                for cid, created in (await self._chain_times(conn, session.tenant, row.checkpoint_id)).items():
                    if created <= cutoff and cid not in index:
                        index[cid] = (created, False)
            frontier = next_frontier
        return index

    async def load_context(self, tenant: str, session_id: str) -> ContextSnapshot:
        """The session, its head checkpoint and kept messages, the messages after the checkpoint's
        position and the state, in one transaction. Work is bounded by the view, not the transcript."""
        m, cs = schema.messages.c, schema.context_states.c
        async with self._read() as conn:
            session = await self._get_session(conn, tenant, session_id)
            checkpoint = None
            kept: list[StoredMessage] = []
            if session.checkpoint_id is not None:
                row = (
                    await conn.execute(
                        select(schema.checkpoints).where(schema.checkpoints.c.id == session.checkpoint_id)
                    )
                ).one()
                checkpoint = self._checkpoint(row)
                if checkpoint.kept_ids:
                    rows = (
                        await conn.execute(select(schema.messages).where(m.id.in_(checkpoint.kept_ids)).order_by(m.seq))
                    ).all()
                    kept = [_stored_message(r) for r in rows]
                    if len(kept) != len(checkpoint.kept_ids):
                        raise DomainError(
                            Kind.INTERNAL,
                            "CHECKPOINT_BROKEN",
                            f"checkpoint {checkpoint.id} keeps messages that cannot be loaded",
                            {"checkpoint_id": checkpoint.id},
                        )
            position = checkpoint.position_seq if checkpoint else 0
            ranges = ranges_within(await self._live_ranges(conn, session), position, session.head_seq)
            after = [
                _stored_message(r)
                for r in (await conn.execute(select(schema.messages).where(_in_ranges(ranges)).order_by(m.seq))).all()
            ]
            state = (await conn.execute(_STATE_QUERY.where(cs.session_id == session.id))).first()
        return ContextSnapshot(
            session, checkpoint, kept, after, state_document(state) if state else None, state.revision if state else 0
        )

    async def install(self, session: SessionRecord, install: Install) -> tuple[SessionRecord, int]:
        """Installs a fold (a new head checkpoint, its document and projection state) or a prune (only
        a new projection state) if the session is still at `session.version`; raises StaleSession
        otherwise. All or nothing. Returns the session after the install and the state's new revision."""
        now = time.time()
        s = schema.sessions.c
        fold = install if isinstance(install, FoldInstall) else None
        async with self._write() as conn:
            if fold is not None:
                checkpoint = fold.checkpoint
                entries: list[dict[str, object]] = [{"type": "summary", "text": checkpoint.summary}]
                entries += [{"type": "message", "id": kept_id} for kept_id in checkpoint.kept_ids]
                if checkpoint.notes is not None:
                    entries.append({"type": "notes", "notes": checkpoint.notes.to_json()})
                await conn.execute(
                    insert(schema.checkpoints).values(
                        id=checkpoint.id,
                        tenant=session.tenant,
                        parent_id=checkpoint.parent_id,
                        position_seq=checkpoint.position_seq,
                        entries_json=json.dumps(entries),
                        summary_tokens=checkpoint.summary_tokens,
                        tokens_before=fold.tokens_before,
                        tokens_after=fold.tokens_after,
                        create_time=now,
                    )
                )
            swapped = await conn.execute(
                update(schema.sessions)
                .where(s.id == session.id, s.tenant == session.tenant, s.version == session.version)
                .values(
                    checkpoint_id=fold.checkpoint.id if fold else session.checkpoint_id,
                    version=s.version + 1,
                    update_time=now,
                )
            )
            if swapped.rowcount != 1:
                raise StaleSession(session.id)
            if fold is not None:
                await self._insert_document(conn, fold.document)
            revision = await self._put_state(conn, session.id, _whole_state(install.state.to_json()), None, now)
            return await self._get_session(conn, session.tenant, session.id), revision

    async def _insert_document(self, conn: AsyncConnection, document: FoldDocument) -> None:
        m = schema.messages.c
        segment_id = (await conn.execute(select(m.segment_id).where(m.id == document.message_id))).scalar_one()
        raw = document.text.encode()
        encoded = await cpu.run(len(raw), _encode_result, document.ref, document.message_id, raw)
        await self._insert_results(conn, segment_id, [encoded])

    @staticmethod
    async def _insert_results(conn: AsyncConnection, segment_id: str, results: Sequence[EncodedResult]) -> None:
        await conn.execute(insert(schema.tool_results), [{**r.row, "segment_id": segment_id} for r in results])
        chunks = [chunk for r in results for chunk in r.chunks]
        if chunks:
            await conn.execute(insert(schema.tool_result_chunks), chunks)

    async def take_fold_lease(self, session: SessionRecord, owner: str, seconds: float) -> float:
        """Takes the session's fold lease, or extends it for its `owner`. Returns 0 when it is ours,
        else the time at which the other holder's lease runs out."""
        now = time.time()
        s = schema.sessions.c
        async with self._write() as conn:
            taken = await conn.execute(
                update(schema.sessions)
                .where(
                    s.id == session.id,
                    s.tenant == session.tenant,
                    or_(s.fold_lease_until.is_(None), s.fold_lease_until < now, s.fold_lease_owner == owner),
                )
                .values(fold_lease_owner=owner, fold_lease_until=now + seconds)
            )
            if taken.rowcount == 1:
                return 0.0
            until = (await conn.execute(select(s.fold_lease_until).where(s.id == session.id))).scalar_one_or_none()
        return float(until or now)

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

    async def save_state(self, session_id: str, state_json: str, revision: int) -> int:
        """Bookkeeping write: stores the state only if nobody wrote it since `revision` was read.
        Returns the new revision, or 0 when someone else wrote first."""
        async with self._write() as conn:
            return await self._put_state(conn, session_id, _whole_state(state_json), revision, time.time())

    async def read_state(self, session: SessionRecord) -> tuple[str | None, int]:
        cs = schema.context_states.c
        async with self._read() as conn:
            row = (await conn.execute(_STATE_QUERY.where(cs.session_id == session.id))).first()
        return (state_document(row), row.revision) if row else (None, 0)

    async def _put_state(
        self, conn: AsyncConnection, session_id: str, values: dict[str, str | None], revision: int | None, now: float
    ) -> int:
        """Writes the state's columns `values` (its row exists from the session's creation): with a
        `revision`, only over that revision. Returns the new revision, or 0 when the expected revision
        was not there."""
        cs = schema.context_states.c
        query = update(schema.context_states).where(cs.session_id == session_id)
        if revision is not None:
            query = query.where(cs.revision == revision)
        written = await conn.execute(
            query.values(**values, revision=cs.revision + 1, update_time=now).returning(cs.revision)
        )
        new_revision = written.scalar_one_or_none()
        return int(new_revision) if new_revision is not None else 0

    async def record_usage(self, session: SessionRecord, usage: Usage) -> None:
        async with self._write() as conn:
            await conn.execute(
                insert(schema.usage_observations).values(
                    session_id=session.id,
                    view_version=usage.view_version,
                    estimated_tokens=usage.estimated_tokens,
                    input_tokens=usage.input_tokens,
                    cached_input_tokens=usage.cached_input_tokens,
                    output_tokens=usage.output_tokens,
                    finish_reason=usage.finish_reason,
                    create_time=time.time(),
                )
            )

    # ---- tool results ---------------------------------------------------------------------------

    async def tool_result_refs(self, session: SessionRecord, tool_call_id: str) -> list[str]:
        """Refs of the live tool results answering `tool_call_id`, oldest first."""
        m = schema.messages.c
        async with self._read() as conn:
            ranges = await self._live_ranges(conn, session)
            rows = await conn.execute(
                select(m.result_ref)
                .where(_in_ranges(ranges), m.tool_call_id == tool_call_id, m.result_ref.is_not(None))
                .order_by(m.seq)
            )
            return [r for r in rows.scalars().all() if r]

    async def read_raw_result(self, session: SessionRecord, ref: str) -> RawResult:
        """The whole raw result `ref`, if the session can see it (see `read_raw_span`)."""
        span, sha256 = await self._read_raw(session, ref, lambda total: (0, total))
        return RawResult(ref=ref, data=span.data, sha256=sha256)

    async def read_raw_span(self, session: SessionRecord, ref: str, offset: int, limit: int) -> tuple[RawSpan, str]:
        """The bytes of raw result `ref` that the page at `offset` of at most `limit` bytes is cut from
        (`page_span`), and the sha256 of the whole result. The session can read a result on its lineage
        or on a branch it abandoned; any other ref answers NOT_FOUND, whoever owns it."""
        return await self._read_raw(session, ref, lambda total: page_span(offset, limit, total))

    async def _read_raw(
        self, session: SessionRecord, ref: str, span_of: Callable[[int], tuple[int, int]]
    ) -> tuple[RawSpan, str]:
        tr, m = schema.tool_results.c, schema.messages.c
        async with self._read() as conn:
            in_history = await self._in_history(conn, session)
            row = (
                await conn.execute(
                    select(tr.codec, tr.total_bytes, tr.chunk_bytes, tr.sha256, tr.message_id)
                    .join(schema.messages, m.id == tr.message_id)
                    .where(tr.ref == ref, in_history)
                )
            ).first()
            if row is None:
                raise not_found("RESULT_REF_NOT_FOUND", f"no tool result {ref!r} in this session", result_ref=ref)
            start, stop = span_of(row.total_bytes)
            if row.codec == "zstd_chunks":
                data = await self._chunked_span(conn, ref, row.chunk_bytes, start, stop)
            elif row.codec in ("inline", "identity"):
                # Kept whole: at most CHUNK_BYTES (see CHUNK_BYTES), no more than a chunked read costs.
                data = (await self._whole_raw(conn, ref, row.codec, row.message_id))[start:stop]
            else:
                raise DomainError(Kind.INTERNAL, "STORAGE_CORRUPT", f"unknown codec {row.codec!r} for {ref}")
        return RawSpan(start, data, row.total_bytes), row.sha256

    async def _chunked_span(self, conn: AsyncConnection, ref: str, chunk_bytes: int, start: int, stop: int) -> bytes:
        if stop <= start:
            return b""
        first, last = start // chunk_bytes, (stop - 1) // chunk_bytes
        chunks = await self._fetch_chunks(conn, ref, first, last)
        if len(chunks) != last - first + 1:
            raise DomainError(Kind.INTERNAL, "STORAGE_CORRUPT", f"chunks {first}..{last} of {ref} are incomplete")
        return await cpu.run(stop - start, _decompress_span, chunks, first * chunk_bytes, start, stop)

    @staticmethod
    async def _fetch_chunks(conn: AsyncConnection, ref: str, first: int, last: int) -> list[bytes]:
        """Compressed chunks `first`..`last` of a chunked result, in order (the one place chunks are read)."""
        c = schema.tool_result_chunks.c
        rows = await conn.execute(
            select(c.data).where(c.ref == ref, c.chunk_index.between(first, last)).order_by(c.chunk_index)
        )
        return [bytes(data) for data in rows.scalars().all()]

    @staticmethod
    async def _whole_raw(conn: AsyncConnection, ref: str, codec: str, message_id: str) -> bytes:
        """A result kept whole (the one place those are read)."""
        if codec == "inline":
            m = schema.messages.c
            content = (await conn.execute(select(m.content).where(m.id == message_id))).scalar_one()
            return str(content).encode()
        tr = schema.tool_results.c
        return bytes((await conn.execute(select(tr.data).where(tr.ref == ref))).scalar_one())

    # ---- introspection (tests, benchmarks, operations) ------------------------------------------

    async def row_counts(self) -> dict[str, int]:
        counts = {}
        async with self._read() as conn:
            for table in schema.metadata.sorted_tables:
                counts[table.name] = (await conn.execute(select(func.count()).select_from(table))).scalar_one()
        return counts

"""Raw tool results (and user messages, fold documents): inserted as `rows.encode_result` makes them, read by page."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import zstandard
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ctxfold import cpu
from ctxfold.engine.candidate import FoldDocument
from ctxfold.engine.context import SessionRecord
from ctxfold.engine.errors import DomainError, Kind, not_found
from ctxfold.engine.tool_results import RawSpan, page_span
from ctxfold.store import schema
from ctxfold.store.base import StoreBase
from ctxfold.store.lineage import in_history, in_ranges, session_live_ranges
from ctxfold.store.rows import RawResult, encode_result


def _decompress_span(chunks: Sequence[bytes], first_start: int, start: int, stop: int) -> bytes:
    """Bytes [start, stop) of a result from its consecutive chunks, the first starting at `first_start`."""
    decompressor = zstandard.ZstdDecompressor()
    joined = b"".join(decompressor.decompress(chunk) for chunk in chunks)
    return joined[start - first_start : stop - first_start]


async def insert_document(conn: AsyncConnection, document: FoldDocument) -> None:
    """A fold's document, stored as a raw result of the message it is attached to."""
    m = schema.messages.c
    segment_id = (await conn.execute(select(m.segment_id).where(m.id == document.message_id))).scalar_one()
    raw = document.text.encode()
    encoded = await cpu.run(len(raw), encode_result, document.ref, document.message_id, raw)
    await conn.execute(insert(schema.tool_results), {**encoded.row, "segment_id": segment_id})
    if encoded.chunks:
        await conn.execute(insert(schema.tool_result_chunks), encoded.chunks)


class ToolResultStore(StoreBase):
    async def tool_result_refs(self, session: SessionRecord, tool_call_id: str) -> list[str]:
        """Refs of the live tool results answering `tool_call_id`, oldest first."""
        m = schema.messages.c
        async with self._read() as conn:
            ranges = await session_live_ranges(conn, session)
            rows = await conn.execute(
                select(m.result_ref)
                .where(in_ranges(ranges), m.tool_call_id == tool_call_id, m.result_ref.is_not(None))
                .order_by(m.seq)
            )
            return [r for r in rows.scalars().all() if r]

    async def read_raw_result(self, session: SessionRecord, ref: str) -> RawResult:
        """The whole raw result `ref`, if the session can see it (see `read_raw_span`)."""
        span, sha256 = await self._read_raw(session, ref, lambda total: (0, total))
        return RawResult(ref=ref, data=span.data, sha256=sha256)

    async def read_raw_span(self, session: SessionRecord, ref: str, offset: int, limit: int) -> tuple[RawSpan, str]:
        """The bytes of `ref` the page at `offset` of at most `limit` bytes is cut from (`page_span`), and the whole
        result's sha256. A ref off the session's lineage and abandoned branches is NOT_FOUND, whoever owns it."""
        return await self._read_raw(session, ref, lambda total: page_span(offset, limit, total))

    async def _read_raw(
        self, session: SessionRecord, ref: str, span_of: Callable[[int], tuple[int, int]]
    ) -> tuple[RawSpan, str]:
        tr, m = schema.tool_results.c, schema.messages.c
        async with self._read() as conn:
            readable = await in_history(conn, session)
            row = (
                await conn.execute(
                    select(tr.codec, tr.total_bytes, tr.chunk_bytes, tr.sha256, tr.message_id)
                    .join(schema.messages, m.id == tr.message_id)
                    .where(tr.ref == ref, readable)
                )
            ).first()
            if row is None:
                raise not_found("RESULT_REF_NOT_FOUND", f"no tool result {ref!r} in this session", result_ref=ref)
            start, stop = span_of(row.total_bytes)
            if row.codec == "zstd_chunks":
                data = await self._chunked_span(conn, ref, row.chunk_bytes, start, stop)
            elif row.codec in ("inline", "identity"):
                # Kept whole: at most CHUNK_BYTES (see rows.CHUNK_BYTES), no more than a chunked read costs.
                data = (await self._whole_raw(conn, ref, row.codec, row.message_id))[start:stop]
            else:
                raise DomainError(Kind.INTERNAL, "STORAGE_CORRUPT", f"unknown codec {row.codec!r} for {ref}")
        return RawSpan(start, data, row.total_bytes), row.sha256

    # The two places stored result bytes are read from (tests count what a page read fetches here).

    @staticmethod
    async def _fetch_chunks(conn: AsyncConnection, ref: str, first: int, last: int) -> list[bytes]:
        """Compressed chunks `first`..`last` of a chunked result, in order."""
        c = schema.tool_result_chunks.c
        rows = await conn.execute(
            select(c.data).where(c.ref == ref, c.chunk_index.between(first, last)).order_by(c.chunk_index)
        )
        return [bytes(data) for data in rows.scalars().all()]

    @staticmethod
    async def _whole_raw(conn: AsyncConnection, ref: str, codec: str, message_id: str) -> bytes:
        if codec == "inline":
            m = schema.messages.c
            content = (await conn.execute(select(m.content).where(m.id == message_id))).scalar_one()
            return str(content).encode()
        tr = schema.tool_results.c
        return bytes((await conn.execute(select(tr.data).where(tr.ref == ref))).scalar_one())

    async def _chunked_span(self, conn: AsyncConnection, ref: str, chunk_bytes: int, start: int, stop: int) -> bytes:
        if stop <= start:
            return b""
        first, last = start // chunk_bytes, (stop - 1) // chunk_bytes
        chunks = await self._fetch_chunks(conn, ref, first, last)
        if len(chunks) != last - first + 1:
            raise DomainError(Kind.INTERNAL, "STORAGE_CORRUPT", f"chunks {first}..{last} of {ref} are incomplete")
        return await cpu.run(stop - start, _decompress_span, chunks, first * chunk_bytes, start, stop)

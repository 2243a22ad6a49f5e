"""Every ReadToolResult page costs O(page): whatever a result's size and however it was stored (kept as
the message content, whole, in chunks, or whole before migration 0006), a page fetches at most two
chunks' worth of stored bytes, and the pages give back the result byte for byte."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import zstandard
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from builders import create_session
from conftest import downgrade, fresh_database, settings_for
from ctxfold.engine.tool_results import MAX_PAGE_BYTES
from ctxfold.server import RunningServer, start
from ctxfold.store import Store, schema
from ctxfold.store.database import create_engine
from ctxfold.store.rows import CHUNK_BYTES
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_tool_results import append_result, chunk_text, read

# What one page may fetch: two compressed chunks (zstd adds a few bytes to incompressible input) or one
# result kept whole, which is at most one chunk.
PAGE_FETCH_BOUND = 2 * (CHUNK_BYTES + 1024)
MAX_CONTENT = 1 << 20  # the largest tool_content_max_bytes: results up to it are the message content


@contextmanager
def fetched_bytes(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Stored bytes fetched per read, through the two places result bytes are read from."""
    counts: list[int] = []
    fetch_chunks, whole_raw = store._fetch_chunks, store._whole_raw

    async def chunks(conn: AsyncConnection, ref: str, first: int, last: int) -> list[bytes]:
        out = await fetch_chunks(conn, ref, first, last)
        counts.append(sum(len(c) for c in out))
        return out

    async def whole(conn: AsyncConnection, ref: str, codec: str, message_id: str) -> bytes:
        out = await whole_raw(conn, ref, codec, message_id)
        counts.append(len(out))
        return out

    with monkeypatch.context() as patch:
        patch.setattr(store, "_fetch_chunks", chunks)
        patch.setattr(store, "_whole_raw", whole)
        yield counts


async def page_through(stub: pb_grpc.ContextServiceStub, session_id: str, ref: str, raw: bytes) -> int:
    """Reads the whole result page by page, checking bytes and sha256; returns the number of pages."""
    digest, offset, parts = hashlib.sha256(raw).hexdigest(), 0, []
    while True:
        page = await read(stub, session_id, ref, offset, MAX_PAGE_BYTES)
        assert page.sha256 == digest and page.total_bytes == len(raw)
        parts.append(page.data.encode())
        if page.complete:
            break
        offset = page.next_offset
    assert b"".join(parts) == raw
    return len(parts)


SIZES = [1, 1023, 1024, 40_000, CHUNK_BYTES, CHUNK_BYTES + 1, 300_001, MAX_CONTENT, 3 * MAX_CONTENT + 7]


@pytest.mark.parametrize("size", SIZES)
async def test_every_page_of_every_size_fetches_at_most_two_chunks(
    server: RunningServer, stub: pb_grpc.ContextServiceStub, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """With tool_content_max_bytes at its maximum, results up to 1 MiB are the message content itself
    (not truncated); the larger ones are truncated. Either way no page reads the whole result."""
    session_id = (await create_session(stub, tool_content_max_bytes=MAX_CONTENT)).id
    raw = chunk_text(size).encode()
    stored = await append_result(stub, session_id, "call", raw.decode())
    assert stored.truncated == (size > MAX_CONTENT)
    with fetched_bytes(server.store, monkeypatch) as counts:
        pages = await page_through(stub, session_id, stored.result_ref, raw)
    assert len(counts) == pages
    assert max(counts) <= min(PAGE_FETCH_BOUND, size + 1024), counts


async def test_results_stored_whole_before_migration_0006_are_chunked_and_page_back(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result as one zstd frame (before 0003) and a 1 MiB result kept as the message content become
    chunks on upgrade; a short inline result stays as it is; all page back exactly."""
    url = await fresh_database(backend, tmp_path)
    frame_raw, inline_raw, small_raw = chunk_text(700_001).encode(), chunk_text(MAX_CONTENT).encode(), b"small"
    running = await start(settings_for(url))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ContextServiceStub(channel)
            session_id = (await create_session(stub, tool_content_max_bytes=MAX_CONTENT)).id
            frame = (await append_result(stub, session_id, "c1", frame_raw.decode())).result_ref
            inline = (await append_result(stub, session_id, "c2", inline_raw.decode())).result_ref
            small = (await append_result(stub, session_id, "c3", small_raw.decode())).result_ref
    finally:
        await running.stop(grace=0.5)
    tr, trc = schema.tool_results.c, schema.tool_result_chunks.c
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(delete(schema.tool_result_chunks).where(trc.ref.in_([frame, inline])))
            one_frame = {"codec": "zstd", "data": zstandard.ZstdCompressor().compress(frame_raw)}
            await conn.execute(update(schema.tool_results).where(tr.ref == frame).values(**one_frame))
            await conn.execute(update(schema.tool_results).where(tr.ref == inline).values(codec="inline", data=b""))
            await conn.execute(update(schema.tool_results).values(chunk_bytes=None).where(tr.ref != small))
            await conn.run_sync(downgrade, "0005")
            before = {r.ref: r for r in (await conn.execute(select(tr.ref, tr.total_bytes, tr.sha256))).all()}
    finally:
        await engine.dispose()

    running = await start(settings_for(url))  # migrates to the newest revision
    try:
        async with running.store.engine.connect() as conn:
            rows = {r.ref: r for r in (await conn.execute(select(tr.ref, tr.codec, tr.chunk_bytes))).all()}
            after = {r.ref: r for r in (await conn.execute(select(tr.ref, tr.total_bytes, tr.sha256))).all()}
        assert after == before
        assert (rows[frame].codec, rows[frame].chunk_bytes) == ("zstd_chunks", CHUNK_BYTES)
        assert (rows[inline].codec, rows[inline].chunk_bytes) == ("zstd_chunks", CHUNK_BYTES)
        assert rows[small].codec == "inline"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ContextServiceStub(channel)
            with fetched_bytes(running.store, monkeypatch) as counts:
                for ref, raw in ((frame, frame_raw), (inline, inline_raw), (small, small_raw)):
                    await page_through(stub, session_id, ref, raw)
        assert max(counts) <= PAGE_FETCH_BOUND
    finally:
        await running.stop(grace=0.5)

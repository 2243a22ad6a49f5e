"""Upgrades lose nothing: a database of every released schema, holding every kind of row, is upgraded to
the newest one and compared row by row, then served. A database newer than this version, or an
upgrade that would lose rows, stops the server with a reason and changes nothing."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import zstandard
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, MetaData, insert, select, text

from builders import call, create_session, prepare, result, user
from conftest import fresh_database, settings_for
from ctxfold.server import RunningServer, StartupError, start
from ctxfold.store import database, schema
from ctxfold.store.database import MIGRATIONS_DIR, SchemaError, create_engine, migrate
from ctxfold.store.rows import state_document
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

Rows = dict[str, list[dict[str, Any]]]
SCRIPTS = ScriptDirectory(str(MIGRATIONS_DIR))
HEAD = SCRIPTS.get_current_head()
# Every revision a released ctxfold may have left a database at, oldest first, the newest excepted.
RELEASED = [script.revision for script in reversed(list(SCRIPTS.walk_revisions())) if script.revision != HEAD]
WINDOW = 6000
RETRIED_REQUEST_ID = "retried-after-the-upgrade"


def _alembic(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@asynccontextmanager
async def _serving(url: str) -> AsyncIterator[tuple[RunningServer, pb_grpc.ContextServiceStub]]:
    running = await start(settings_for(url))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield running, pb_grpc.ContextServiceStub(channel)
    finally:
        await running.stop(grace=0.5)


def _big(seed: str, size: int) -> str:
    """Text that zstd cannot shrink to nothing, so chunks stay distinct."""
    out, counter = [], 0
    while sum(map(len, out)) < size:
        out.append(hashlib.sha256(f"{seed}{counter}".encode()).hexdigest() + " ")
        counter += 1
    return "".join(out)[:size]


async def _populate(stub: pb_grpc.ContextServiceStub) -> dict[str, Any]:
    """A session with folds (checkpoints, fold documents, pruned results, receipts), a fork, a rewind
    (an abandoned branch), results of every storage form, request ids and usage observations."""
    sid = (
        await create_session(
            stub, context_window=WINDOW, max_output_tokens=200, summary_max_tokens=600, tool_content_max_bytes=4096
        )
    ).id
    view = (await prepare(stub, sid, user("Fix the failing test in parser.py"))).result
    large = _big("large", 150_000)  # bounded, three chunks
    for turn in range(8):
        call_id = f"call_{turn}"
        content = large if turn == 1 else _big(f"t{turn}", 2_000 if turn % 2 else 300)
        view = (await prepare(stub, sid, call(call_id, "read_file", '{"path": "src/parser.py"}'))).result
        view = (await prepare(stub, sid, result(call_id, content))).result
        await stub.ObserveUsage(
            pb.ObserveUsageRequest(session_id=sid, view_version=view.view_version, input_tokens=900, output_tokens=40)
        )
    appended = await stub.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=sid,
            messages=[pb.Message(role=pb.ROLE_ASSISTANT, content="done"), user("now the docs")],
            request_id=RETRIED_REQUEST_ID,
        )
    )
    fork = (await stub.Fork(pb.ForkRequest(session_id=sid, at_seq=0))).session
    await prepare(stub, fork.id, pb.Message(role=pb.ROLE_ASSISTANT, content="on the fork"), user("go on"))
    head = (await stub.GetSession(pb.GetSessionRequest(session_id=sid))).session.head_seq
    await stub.Rewind(pb.RewindRequest(session_id=fork.id, to_seq=head - 1))
    await prepare(stub, fork.id, user("edited"))
    await _prepared_fold(stub)
    session = (await stub.GetSession(pb.GetSessionRequest(session_id=sid))).session
    assert session.checkpoint_id, "the scenario must fold"
    [large_ref] = [m.result_ref async for m in _messages(stub, sid) if m.tool_call_id == "call_1"]
    return {
        "session_id": sid,
        "appended": [m.id for m in appended.messages],
        "large_ref": large_ref,
        "large": large,
        "head_seq": session.head_seq,
    }


async def _prepared_fold(stub: pb_grpc.ContextServiceStub) -> None:
    """A session whose fold was made in the background and is kept, not installed (between its
    prefold ratio and its trigger)."""
    sid = (await create_session(stub, context_window=WINDOW, prefold_ratio=0.5)).id
    await prepare(stub, sid, user("Profile the import"))
    for turn in range(40):
        view = (
            await prepare(stub, sid, call(f"bg_{turn}", "read_file", "{}"), result(f"bg_{turn}", _big(f"b{turn}", 600)))
        ).result
        if view.estimated_tokens >= 0.5 * WINDOW:
            break
    for _ in range(200):
        state = (await stub.GetContextState(pb.GetContextStateRequest(session_id=sid))).state_json
        if '"prepared"' in state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the scenario must prepare a fold in the background")


async def _messages(stub: pb_grpc.ContextServiceStub, sid: str) -> AsyncIterator[pb.Message]:
    token = ""
    while True:
        page = await stub.ListMessages(pb.ListMessagesRequest(session_id=sid, page_token=token))
        for message in page.messages:
            yield message
        token = page.next_page_token
        if not token:
            return


def _dump(connection: Connection) -> Rows:
    """Every row of every table (alembic's own excepted), as dicts, in primary-key order."""
    meta = MetaData()
    meta.reflect(connection)
    rows: Rows = {}
    for table in meta.sorted_tables:
        if table.name == "alembic_version":
            continue
        order = list(table.primary_key.columns) or list(table.columns)
        rows[table.name] = [dict(r._mapping) for r in connection.execute(select(table).order_by(*order))]
    return rows


def _raw(tables: Rows, row: dict[str, Any]) -> bytes:
    """The raw bytes of a tool_results row, whatever its codec."""
    codec = row["codec"]
    if codec == "inline":
        return str(next(m["content"] for m in tables["messages"] if m["id"] == row["message_id"])).encode()
    if codec == "identity":
        return bytes(row["data"])
    if codec == "zstd":
        return zstandard.ZstdDecompressor().decompress(bytes(row["data"]))
    chunks = sorted((c for c in tables["tool_result_chunks"] if c["ref"] == row["ref"]), key=lambda c: c["chunk_index"])
    return b"".join(zstandard.ZstdDecompressor().decompress(bytes(c["data"])) for c in chunks)


def _as_of(revision: str, head: Rows) -> Rows:
    """The rows of `head` as a ctxfold at `revision` would have stored them: only the columns its
    schema has, whole states (no bookkeeping column before 0005), and results longer than one chunk
    as one zstd frame, as before 0006 (no chunk table before 0003)."""
    chunked = revision >= "0003"
    out: Rows = {name: [dict(r) for r in rows] for name, rows in head.items()}
    if revision < "0005":
        whole = [state_document(SimpleNamespace(_mapping=row)) for row in out["context_states"]]
        out["context_states"] = [
            {**row, "state_json": state, "bookkeeping_json": None}
            for row, state in zip(out["context_states"], whole, strict=True)
        ]
    if revision < "0006":
        frames = []
        for row in out["tool_results"]:
            raw = _raw(head, row)
            if row["codec"] == "zstd_chunks" and (len(raw) > 64 << 10 or not chunked):
                frames.append(row["ref"])
                row.update(codec="zstd", data=zstandard.ZstdCompressor().compress(raw), chunk_bytes=None)
        out["tool_result_chunks"] = [c for c in out["tool_result_chunks"] if c["ref"] not in frames]
        assert frames, "the scenario must have a result longer than one chunk"
    return out


def _insert(connection: Connection, rows: Rows) -> None:
    """`rows` into the schema the database has now (columns it lacks are left out), parents first."""
    meta = MetaData()
    meta.reflect(connection)
    for table in meta.sorted_tables:
        if table.name not in rows:
            continue
        values = [{k: v for k, v in row.items() if k in table.c} for row in rows[table.name]]
        if table.name in ("segments", "checkpoints"):  # parent_id points into the same table
            values = _parents_first(values)
        for row in values:
            connection.execute(insert(table).values(**row))


def _parents_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    placed: set[str | None] = {None}
    ordered: list[dict[str, Any]] = []
    pending = list(rows)
    while pending:
        ready = [r for r in pending if r["parent_id"] in placed]
        assert ready, "a parent cycle"
        ordered += ready
        placed |= {r["id"] for r in ready}
        pending = [r for r in pending if r["id"] not in placed]
    return ordered


def _keys(table: str, row: dict[str, Any]) -> tuple[Any, ...]:
    pk = [c.name for c in schema.metadata.tables[table].primary_key.columns]
    return tuple(row[name] for name in pk)


def _lost_or_changed(before: Rows, after: Rows) -> list[str]:
    """Every row of `before` must be in `after` with the values it had; a result 0006 rewrote as
    chunks must have the same raw bytes. New rows and new columns are allowed."""
    problems: list[str] = []
    for table, rows in before.items():
        found = {_keys(table, r): r for r in after.get(table, [])}
        for row in rows:
            now = found.get(_keys(table, row))
            if now is None:
                problems.append(f"{table} {_keys(table, row)}: lost")
                continue
            columns = set(row)
            if table == "tool_results" and row["codec"] != now["codec"]:
                if _raw(before, row) != _raw(after, now):
                    problems.append(f"tool_results {row['ref']}: raw bytes changed")
                columns -= {"codec", "data", "chunk_bytes"}
            if table == "tool_result_chunks" and now["ref"] in _rechunked(before, after):
                columns -= {"data"}
            changed = sorted(c for c in columns if now[c] != row[c])
            if changed:
                problems.append(f"{table} {_keys(table, row)}: {changed} changed")
    return problems


def _rechunked(before: Rows, after: Rows) -> set[str]:
    was = {r["ref"]: r["codec"] for r in before.get("tool_results", [])}
    return {r["ref"] for r in after["tool_results"] if was.get(r["ref"], r["codec"]) != r["codec"]}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
async def released(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Rows, Any]:
    """(backend, every row of a populated database at head, what the scenario left)."""
    backend = str(request.param)
    url = await fresh_database(backend, tmp_path_factory.mktemp("released"))
    async with _serving(url) as (_, stub):
        scenario = await _populate(stub)
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.run_sync(_dump)
    finally:
        await engine.dispose()
    assert all(rows[table.name] for table in schema.metadata.sorted_tables), "every table must hold rows"
    return backend, rows, scenario


async def _database_at(backend: str, tmp_path: Path, revision: str, rows: Rows) -> str:
    url = await fresh_database(backend, tmp_path)
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(lambda c: command.upgrade(_alembic(c), revision))
            await conn.run_sync(_insert, rows)
    finally:
        await engine.dispose()
    return url


async def _rows(url: str, read: Callable[[Connection], Any] = _dump) -> Any:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(read)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("revision", RELEASED)
async def test_an_upgrade_from_every_released_schema_keeps_every_row_and_serves_them(
    released: tuple[str, Rows, Any], revision: str, tmp_path: Path
) -> None:
    backend, head_rows, scenario = released
    url = await _database_at(backend, tmp_path, revision, _as_of(revision, head_rows))
    before = await _rows(url)
    assert all(before[name] for name in before if name != "tool_result_chunks" or revision >= "0003")

    async with _serving(url) as (running, stub):  # migrates to the newest revision
        after = await _rows(url)
        assert _lost_or_changed(before, after) == []
        sid = scenario["session_id"]
        # A retried append is still recognised by its request id: the first append's messages, no new ones.
        retried = await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=sid,
                messages=[pb.Message(role=pb.ROLE_ASSISTANT, content="done"), user("now the docs")],
                request_id=RETRIED_REQUEST_ID,
            )
        )
        assert [m.id for m in retried.messages] == scenario["appended"]
        assert (await running.store.row_counts())["messages"] == len(after["messages"])
        # The whole large result pages back unchanged.
        raw, offset = b"", 0
        while True:
            page = await stub.ReadToolResult(
                pb.ReadToolResultRequest(session_id=sid, result_ref=scenario["large_ref"], offset=offset)
            )
            raw += page.data.encode()
            offset = page.next_offset
            if page.complete:
                break
        assert raw == scenario["large"].encode()
        assert page.sha256 == hashlib.sha256(raw).hexdigest()
        # The session folds on: its checkpoint and its state agree.
        view = (await prepare(stub, sid, user("and the changelog"))).result
        session = (await stub.GetSession(pb.GetSessionRequest(session_id=sid))).session
        state = (await stub.GetContextState(pb.GetContextStateRequest(session_id=sid))).state_json
        assert view.checkpoint_id == session.checkpoint_id and session.checkpoint_id in state
        assert view.messages[-1].content == "and the changelog"


async def test_a_database_newer_than_this_version_is_refused_and_left_as_it_is(backend: str, tmp_path: Path) -> None:
    url = await fresh_database(backend, tmp_path)
    engine = create_engine(url)
    try:
        await migrate(engine)
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        with pytest.raises(SchemaError, match=r"revision 9999, newer than this ctxfold knows \(its newest is "):
            await migrate(engine)
        with pytest.raises(StartupError, match="9999"):
            await start(settings_for(url))
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one() == "9999"
    finally:
        await engine.dispose()


async def test_an_upgrade_that_would_lose_rows_fails_and_changes_nothing(
    released: tuple[str, Rows, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite rebuilds `sessions` in 0004; with foreign keys on (as before this fix) dropping the old
    table cascades into every child table. The upgrade must refuse rather than empty them."""
    backend, head_rows, _ = released
    if backend != "sqlite":
        pytest.skip("PostgreSQL alters tables in place; nothing cascades")
    url = await _database_at(backend, tmp_path, "0003", _as_of("0003", head_rows))
    before = await _rows(url)
    monkeypatch.setattr(database, "_sqlite_foreign_keys", lambda _connection, _on: None)
    engine = create_engine(url)
    try:
        with pytest.raises(SchemaError, match=r"would lose rows, so nothing was changed: .*context_states"):
            await migrate(engine)
    finally:
        await engine.dispose()
    assert await _rows(url) == before
    version = await _rows(url, lambda c: c.execute(text("SELECT version_num FROM alembic_version")).scalar_one())
    assert version == "0003"

"""The store failing under the service: PostgreSQL stopped and restarted under load, a full disk (a
read-only database maps alike: the unit cases at the end), the SQLite file moved away and back. Every
call answers OK or UNAVAILABLE or ABORTED with a reason and a retry delay (never a bare INTERNAL: a
corrupt database answers INTERNAL STORAGE_CORRUPT, the one refusal no retry gets past), reads and
health stay up, the service recovers without a restart, and retries with the same request id never
append twice."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import asyncpg
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from sqlalchemy.engine import make_url

from builders import create_session, prepare, user
from conftest import fresh_database, settings_for
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.server import RunningServer, start
from ctxfold.store.append_sqlite import MovedDatabaseFile
from ctxfold.store.errors import store_error
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from faults import fill, private_postgres, small_filesystem
from rpc_errors import error_info

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED}


def retry_delay(error: grpc.aio.AioRpcError) -> float:
    status = rpc_status.from_call(error)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.ToTimedelta().total_seconds()
    raise AssertionError(f"{error.code()} {error.details()!r} carries no RetryInfo")


async def contents(stub: pb_grpc.ContextServiceStub, sid: str) -> list[str]:
    out: list[str] = []
    token = ""
    while True:
        page = await stub.ListMessages(pb.ListMessagesRequest(session_id=sid, page_token=token, page_size=500))
        out += [m.content for m in page.messages]
        token = page.next_page_token
        if not token:
            return out


async def test_postgresql_stopped_and_restarted_under_load_answers_unavailable_and_loses_nothing() -> None:
    steps, clients = 10, 4
    with private_postgres() as postgres:
        running = await start(settings_for(postgres.url))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                stub = pb_grpc.ContextServiceStub(channel)
                config = {"context_window": 6000, "max_output_tokens": 200, "summary_max_tokens": 600}
                sessions = [(await create_session(stub, **config)).id for _ in range(clients)]
                statuses: Counter[str] = Counter()
                progress = [0] * clients
                warmed = asyncio.Event()  # every client made three steps: time for the outage
                stopped = asyncio.Event()  # the database is down: the later steps run into the outage

                async def client(index: int) -> None:
                    sid = sessions[index]
                    for step in range(steps):
                        if step == steps // 2:
                            await stopped.wait()
                        while True:  # a retry of one step keeps its request id
                            try:
                                await prepare(
                                    stub, sid, user(f"client {index} step {step} " * 60), request_id=f"{index}-{step}"
                                )
                                await stub.GetSession(pb.GetSessionRequest(session_id=sid))
                            except grpc.aio.AioRpcError as error:
                                assert error.code() in RETRYABLE, f"{error.code()}: {error.details()}"
                                statuses[f"{error.code().name} {error_info(error).reason}"] += 1
                                await asyncio.sleep(min(retry_delay(error), 0.3))
                                continue
                            statuses["OK"] += 1
                            progress[index] = step + 1
                            if min(progress) >= 3:
                                warmed.set()
                            break

                async def outage() -> None:
                    await warmed.wait()
                    await asyncio.to_thread(postgres.stop)
                    stopped.set()
                    await asyncio.sleep(2.0)
                    await asyncio.to_thread(postgres.start)

                await asyncio.wait_for(asyncio.gather(outage(), *(client(i) for i in range(clients))), 180)
                assert statuses["UNAVAILABLE STORE_UNAVAILABLE"] > 0, statuses  # the outage was seen
                for index, sid in enumerate(sessions):
                    assert await contents(stub, sid) == [f"client {index} step {s} " * 60 for s in range(steps)]
        finally:
            await running.stop(grace=0.5)


async def _appends_until_refused(stub: pb_grpc.ContextServiceStub, sid: str) -> tuple[int, grpc.aio.AioRpcError]:
    for attempt in range(2000):
        try:
            await stub.AppendMessages(
                pb.AppendMessagesRequest(session_id=sid, messages=[user(f"{attempt} " + "x" * 60_000)])
            )
        except grpc.aio.AioRpcError as error:
            return attempt, error
    raise AssertionError("the disk never filled")


async def _reads_and_health_answer(stub: pb_grpc.ContextServiceStub, channel: grpc.aio.Channel, sid: str) -> None:
    await stub.GetSession(pb.GetSessionRequest(session_id=sid))
    assert await contents(stub, sid)
    health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING


async def _check_refusal(error: grpc.aio.AioRpcError, causes: set[str]) -> None:
    assert error.code() == grpc.StatusCode.UNAVAILABLE, f"{error.code()}: {error.details()}"
    info = error_info(error)
    assert info.reason == "STORE_UNAVAILABLE" and info.metadata["cause"] in causes, (info, error.details())
    assert retry_delay(error) > 0


async def test_a_full_sqlite_disk_answers_unavailable_and_recovers(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", 24 << 20) as disk:
        running = await start(settings_for(f"sqlite:///{disk / 'ctxfold.db'}"))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                stub = pb_grpc.ContextServiceStub(channel)
                sid = (await create_session(stub, context_window=8000)).id
                await prepare(stub, sid, user("the task"), request_id="first")
                filler = fill(disk, 1 << 20)
                kept, error = await _appends_until_refused(stub, sid)
                await _check_refusal(error, {"disk_full", "io_error"})
                await _reads_and_health_answer(stub, channel, sid)
                filler.unlink()
                await stub.AppendMessages(pb.AppendMessagesRequest(session_id=sid, messages=[user("after")]))
                assert len(await contents(stub, sid)) == kept + 2
        finally:
            await running.stop(grace=0.5)
        with sqlite3.connect(disk / "ctxfold.db") as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def test_a_full_postgresql_disk_answers_unavailable_and_recovers(tmp_path: Path) -> None:
    admin = await fresh_database("postgresql", tmp_path)  # skips without PostgreSQL
    url = make_url(admin)
    name = f"ctxfold_full_{url.database}"
    with small_filesystem(Path("/tmp") / f"{name}-space", 24 << 20, owner="postgres") as disk:
        space = disk / "pg"
        space.mkdir()
        shutil.chown(space, "postgres", "postgres")
        conn = await asyncpg.connect(host=url.host, port=url.port, user=url.username, database=url.database)
        running: RunningServer | None = None
        try:
            await conn.execute(f"CREATE TABLESPACE {name} LOCATION '{space}'")
            await conn.execute(f'CREATE DATABASE "{name}" TABLESPACE {name}')
            running = await start(settings_for(url.set(database=name).render_as_string(hide_password=False)))
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                stub = pb_grpc.ContextServiceStub(channel)
                sid = (await create_session(stub, context_window=8000)).id
                await prepare(stub, sid, user("the task"), request_id="first")
                filler = fill(disk, 1 << 20)
                kept, error = await _appends_until_refused(stub, sid)
                await _check_refusal(error, {"disk_full", "io_error", "out_of_resources"})
                await _reads_and_health_answer(stub, channel, sid)
                filler.unlink()
                await stub.AppendMessages(pb.AppendMessagesRequest(session_id=sid, messages=[user("after")]))
                assert len(await contents(stub, sid)) == kept + 2
        finally:
            if running is not None:
                await running.stop(grace=0.5)
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f"DROP TABLESPACE IF EXISTS {name}")
            await conn.close()


async def _refused_as_moved(stub: pb_grpc.ContextServiceStub, sid: str) -> None:
    for call in (
        stub.AppendMessages(pb.AppendMessagesRequest(session_id=sid, messages=[user("lost?")], request_id="moved")),
        stub.GetSession(pb.GetSessionRequest(session_id=sid)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        await _check_refusal(refused.value, {"file_moved"})


async def test_a_sqlite_file_moved_or_replaced_while_serving_is_refused_until_it_is_back(tmp_path: Path) -> None:
    # Before, the pool's open connections kept writing to the moved file (acknowledged, then lost at restart) and a
    # new one created an empty database at the path (INTERNAL: no such table).
    path = tmp_path / "ctxfold.db"
    running = await start(settings_for(f"sqlite:///{path}"))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ContextServiceStub(channel)
            sid = (await create_session(stub, context_window=8000)).id
            await prepare(stub, sid, user("the task"), request_id="first")
            path.rename(tmp_path / "aside.db")
            await _refused_as_moved(stub, sid)
            assert not path.exists()
            path.write_bytes(b"not the database")
            await _refused_as_moved(stub, sid)
            (tmp_path / "aside.db").replace(path)
            await stub.AppendMessages(pb.AppendMessagesRequest(session_id=sid, messages=[user("after")]))
            assert await contents(stub, sid) == ["the task", "after"]
    finally:
        await running.stop(grace=0.5)


async def test_a_corrupt_sqlite_database_answers_storage_corrupt(tmp_path: Path) -> None:
    # Before, the call answered a bare INTERNAL ("internal error").
    url = f"sqlite:///{tmp_path / 'ctxfold.db'}"
    running = await start(settings_for(url))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = pb_grpc.ContextServiceStub(channel)
        sid = (await create_session(stub, context_window=100_000)).id
        for step in range(50):
            await stub.AppendMessages(pb.AppendMessagesRequest(session_id=sid, messages=[user(f"{step} " * 200)]))
    await running.stop(grace=0.5)
    with sqlite3.connect(tmp_path / "ctxfold.db") as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    with (tmp_path / "ctxfold.db").open("r+b") as file:  # the messages table's root page, overwritten
        file.seek((root - 1) * page_size)
        file.write(b"\xff" * page_size)
    running = await start(settings_for(url))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await contents(pb_grpc.ContextServiceStub(channel), sid)
    finally:
        await running.stop(grace=0.5)
    assert refused.value.code() == grpc.StatusCode.INTERNAL
    info = error_info(refused.value)
    assert (info.reason, info.metadata["cause"]) == ("STORAGE_CORRUPT", "corrupt"), refused.value.details()


class _Driver(Exception):
    """A driver error as the drivers raise them: a SQLSTATE or a SQLite result code."""

    def __init__(self, sqlstate: str = "", sqlite_errorcode: int | None = None):
        super().__init__(sqlstate or str(sqlite_errorcode))
        self.sqlstate = sqlstate
        if sqlite_errorcode is not None:
            self.sqlite_errorcode = sqlite_errorcode


@pytest.mark.parametrize(
    ("error", "kind", "cause"),
    [
        (_Driver("40P01"), Kind.ABORTED, "deadlock"),
        (_Driver("40001"), Kind.ABORTED, "serialization_failure"),
        (_Driver("55P03"), Kind.ABORTED, "lock_timeout"),
        (_Driver("57P01"), Kind.UNAVAILABLE, "shutting_down"),
        (_Driver("57P03"), Kind.UNAVAILABLE, "starting_up"),
        (_Driver("53100"), Kind.UNAVAILABLE, "disk_full"),
        (_Driver("25006"), Kind.UNAVAILABLE, "read_only"),
        (_Driver("08006"), Kind.UNAVAILABLE, "connection_lost"),
        (MovedDatabaseFile("the database file was moved"), Kind.UNAVAILABLE, "file_moved"),
        (ConnectionRefusedError(111, "refused"), Kind.UNAVAILABLE, "connection_lost"),
        (sqlite3.OperationalError("database is locked"), None, None),  # no result code: not recognised
    ],
)
def test_database_conditions_map_to_a_retryable_status_with_a_cause(
    error: BaseException, kind: Kind | None, cause: str | None
) -> None:
    translated = store_error(error)
    if kind is None:
        assert translated is error
        return
    assert isinstance(translated, DomainError)
    assert (translated.kind, translated.metadata["cause"]) == (kind, cause)
    assert translated.retry_after_seconds > 0
    assert "may_have_committed" not in translated.metadata
    assert store_error(error, may_have_committed=True).metadata["may_have_committed"] == "true"  # type: ignore[attr-defined]


def test_sqlite_result_codes_map_by_their_primary_code() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
    translated = store_error(full)
    assert isinstance(translated, DomainError) and translated.metadata["cause"] == "disk_full"
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = sqlite3.SQLITE_BUSY | (2 << 8)  # type: ignore[attr-defined]  # an extended code
    translated = store_error(busy)
    assert isinstance(translated, DomainError) and translated.kind is Kind.ABORTED
    assert store_error(KeyError("a bug")).__class__ is KeyError  # anything else stays what it is


def test_a_corrupt_database_maps_to_storage_corrupt_without_a_retry() -> None:
    not_a_database = sqlite3.DatabaseError("file is not a database")
    not_a_database.sqlite_errorcode = sqlite3.SQLITE_NOTADB  # type: ignore[attr-defined]
    for error, cause in (
        (_Driver("XX001"), "corrupt"),
        (_Driver("XX002"), "corrupt_index"),
        (not_a_database, "not_a_database"),
    ):
        translated = store_error(error, connecting=True)
        assert isinstance(translated, DomainError)
        assert (translated.kind, translated.reason, translated.metadata["cause"]) == (
            Kind.INTERNAL,
            "STORAGE_CORRUPT",
            cause,
        )
        assert translated.retry_after_seconds == 0

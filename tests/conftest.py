"""Shared fixtures: every storage test runs against SQLite and a real PostgreSQL.

PostgreSQL comes from CTXFOLD_TEST_POSTGRES_URL (set by `.ci/postgres.sh`, which `make test` runs).
Without it the PostgreSQL cases skip locally and fail in CI (CI=true)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection
from sqlalchemy.engine import make_url

from ctxfold.config import Settings
from ctxfold.server import RunningServer, start
from ctxfold.store.database import MIGRATIONS_DIR
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import FakeProvider

BACKENDS = ["sqlite", "postgresql"]
_created_databases: list[str] = []


async def fresh_database(backend: str, tmp: Path) -> str:
    """A new, empty database of `backend`, returned as a URL."""
    if backend == "sqlite":
        return f"sqlite:///{tmp / f'ctxfold-{uuid.uuid4().hex[:8]}.db'}"
    admin_url = os.environ.get("CTXFOLD_TEST_POSTGRES_URL")
    if not admin_url:
        if os.environ.get("CI"):
            pytest.fail("CTXFOLD_TEST_POSTGRES_URL is not set in CI: PostgreSQL tests must run")
        pytest.skip('PostgreSQL not available (run `eval "$(bash .ci/postgres.sh)"` first)')
    import asyncpg

    name = f"ctxfold_test_{uuid.uuid4().hex[:12]}"
    url = make_url(admin_url)
    conn = await asyncpg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password, database=url.database
    )
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    _created_databases.append(name)
    return url.set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session", autouse=True)
async def drop_test_databases() -> AsyncIterator[None]:
    """Drops every PostgreSQL database the session created, so repeated runs do not pile them up."""
    yield
    admin_url = os.environ.get("CTXFOLD_TEST_POSTGRES_URL")
    if not admin_url or not _created_databases:
        return
    import asyncpg

    url = make_url(admin_url)
    conn = await asyncpg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password, database=url.database
    )
    try:
        for name in _created_databases:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def free_port() -> int:
    """A loopback port that was free a moment ago (for servers started as separate processes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settings_for(database: str, **overrides: object) -> Settings:
    return Settings(listen="127.0.0.1:0", database=database, grace_seconds=2.0, **overrides)  # type: ignore[arg-type]


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
async def database_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return await fresh_database(backend, tmp_path_factory.mktemp(backend))


@pytest.fixture(scope="session")
async def server(database_url: str) -> AsyncIterator[RunningServer]:
    running = await start(settings_for(database_url))
    yield running
    await running.stop(grace=1.0)


@pytest.fixture(scope="session")
async def channel(server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{server.port}",
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    ) as ch:
        yield ch


@pytest.fixture(scope="session")
def stub(channel: grpc.aio.Channel) -> pb_grpc.ContextServiceStub:
    return pb_grpc.ContextServiceStub(channel)


def downgrade(connection: Connection, revision: str) -> None:
    """Migrates the database down to `revision` (to test upgrades from it)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


@dataclass
class Replicas:
    fake: FakeProvider
    running: list[RunningServer]
    stubs: list[pb_grpc.ContextServiceStub]


@asynccontextmanager
async def stubs_for(ports: list[int], ready_within: float = 30.0) -> AsyncIterator[list[pb_grpc.ContextServiceStub]]:
    """A stub for each server on these loopback ports, once its channel is ready; the channels close
    on exit."""
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for port in ports]
    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), ready_within)
        yield [pb_grpc.ContextServiceStub(channel) for channel in channels]
    finally:
        for channel in channels:
            await channel.close()


@asynccontextmanager
async def started_replicas(url: str, count: int = 2, **overrides: object) -> AsyncIterator[list[RunningServer]]:
    """`count` servers (replicas) in this process on the database `url`, with these settings."""
    running: list[RunningServer] = []
    try:
        for _ in range(count):
            running.append(await start(settings_for(url, **overrides)))
        yield running
    finally:
        for replica in running:
            await replica.stop(grace=1.0)


@pytest.fixture
async def replicas(backend: str, tmp_path: Path) -> AsyncIterator[Replicas]:
    """Two servers (replicas) on one fresh database, both summarizing with the fake provider as "llm"."""
    with FakeProvider() as fake:
        url = await fresh_database(backend, tmp_path)
        specs = json.dumps({"llm": {"type": "openai", "base_url": fake.base_url, "model": "m", "max_retries": 0}})
        async with (
            started_replicas(url, summarizers=specs) as running,
            stubs_for([replica.port for replica in running]) as stubs,
        ):
            try:
                yield Replicas(fake, running, stubs)
            finally:
                fake.release()  # answers a test left stalled

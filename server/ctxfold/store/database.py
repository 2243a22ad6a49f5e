"""Engine creation for the two supported stores and schema migration at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Any constant works; it only has to be the same for every replica that migrates the same database.
_MIGRATION_LOCK_KEY = 0x63747866  # "ctxf"
WRITE_OPTION = "ctxfold_write"


def async_url(url: str) -> str:
    """Accepts plain `sqlite:///…` / `postgresql://…` URLs and picks the async drivers."""
    parsed = make_url(url)
    if parsed.drivername in ("sqlite", "sqlite+pysqlite"):
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    if parsed.drivername not in ("sqlite+aiosqlite", "postgresql+asyncpg"):
        raise ValueError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://…")
    return parsed.render_as_string(hide_password=False)


def create_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    full = async_url(url)
    if full.startswith("sqlite"):
        path = make_url(full).database
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(full, pool_size=pool_size, max_overflow=0, pool_pre_ping=False)
        _configure_sqlite(engine)
        return engine
    return create_async_engine(full, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def _configure_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN itself, so writers can take the lock up front.
        dbapi_connection.isolation_level = None
        configure_sqlite_connection(dbapi_connection)

    @event.listens_for(engine.sync_engine, "begin")
    def on_begin(conn: Connection) -> None:
        # A write transaction that starts as a reader and upgrades later fails at once with SQLITE_BUSY
        # under WAL when another writer got in between; BEGIN IMMEDIATE waits for the lock instead.
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def configure_sqlite_connection(connection: Any) -> None:
    """What every SQLite connection of ctxfold runs first (the engine's and the hot path's own)."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    # A checkpointed log is reused from its start; after a burst, cut the file back to this size.
    cursor.execute("PRAGMA journal_size_limit=33554432")
    cursor.close()


async def migrate(engine: AsyncEngine) -> None:
    """Upgrades the schema to the newest revision (a no-op when it is current)."""

    def upgrade(connection: Connection) -> None:
        if connection.dialect.name == "postgresql":
            # Replicas starting together migrate one at a time.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = connection
        command.upgrade(config, "head")

    async with engine.connect() as plain:
        conn = await plain.execution_options(**{WRITE_OPTION: True})
        async with conn.begin():
            await conn.run_sync(upgrade)

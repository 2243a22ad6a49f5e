"""Engine creation for the two supported stores and schema migration at start-up."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event, func, inspect, select, table, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Any constant works; it only has to be the same for every replica that migrates the same database.
_MIGRATION_LOCK_KEY = 0x63747866  # "ctxf"
WRITE_OPTION = "ctxfold_write"
BUSY_TIMEOUT_MS = 10_000


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
    engine = create_async_engine(full, pool_size=pool_size, max_overflow=pool_size)

    @event.listens_for(engine.sync_engine, "checkout")
    def on_checkout(_dbapi_connection: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        # No ping per checkout (docs/operations.md, Databases): a connection the server closed while idle is replaced.
        if record.driver_connection is not None and record.driver_connection.is_closed():
            raise DisconnectionError("the server closed this connection while it was idle")

    return engine


def _configure_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN itself, so writers can take the lock up front.
        dbapi_connection.isolation_level = None
        configure_sqlite_connection(dbapi_connection)

    @event.listens_for(engine.sync_engine, "begin")
    def on_begin(conn: Connection) -> None:
        # Under WAL a reader upgrading to a writer fails with SQLITE_BUSY if one got in between; IMMEDIATE waits.
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def configure_sqlite_connection(connection: Any) -> None:
    """What every SQLite connection of ctxfold runs first (the engine's and the hot path's own)."""
    cursor = connection.cursor()
    # journal_size_limit: a checkpointed log is reused from its start; after a burst, cut the file back to this size.
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=NORMAL", f"busy_timeout={BUSY_TIMEOUT_MS}"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.execute("PRAGMA journal_size_limit=33554432")
    cursor.close()


class SchemaError(Exception):
    """The schema cannot be brought to this version's: it is newer, or the upgrade would lose rows (nothing changed)."""


def row_counts(connection: Connection, names: Iterable[str] | None = None) -> dict[str, int]:
    names = inspect(connection).get_table_names() if names is None else names
    return {name: connection.execute(select(func.count()).select_from(table(name))).scalar_one() for name in names}


def _upgrade(connection: Connection) -> None:
    """Upgrades to the newest revision in the caller's transaction; SchemaError (the caller rolls back) when the
    database is newer than this version or the upgrade would lose rows or break foreign keys."""
    if connection.dialect.name == "postgresql":
        # Replicas starting together migrate one at a time.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    scripts = ScriptDirectory.from_config(config)
    current = set(MigrationContext.configure(connection).get_current_heads())
    known = {script.revision for script in scripts.walk_revisions()}
    if current - known:
        raise SchemaError(
            f"the database's schema is at revision {', '.join(sorted(current - known))}, newer than this "
            f"ctxfold knows (its newest is {scripts.get_current_head()}); run the ctxfold that wrote it or a newer one"
        )
    if current == set(scripts.get_heads()):
        return
    before = row_counts(connection)
    command.upgrade(config, "head")
    after = row_counts(connection)
    lost = {name: (count, after.get(name, 0)) for name, count in before.items() if after.get(name, 0) < count}
    if lost:
        raise SchemaError(
            "the upgrade would lose rows, so nothing was changed: "
            + ", ".join(f"{name} {was} -> {now}" for name, (was, now) in sorted(lost.items()))
        )
    if connection.dialect.name == "sqlite":
        broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
        if broken:
            raise SchemaError(f"the upgrade would break {len(broken)} foreign keys, so nothing was changed")


def _sqlite_foreign_keys(connection: Connection, on: bool) -> None:
    # Outside any transaction (SQLite ignores the pragma inside one), on the driver's connection.
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    cursor.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    cursor.close()


async def migrate(engine: AsyncEngine) -> None:
    """Upgrades the schema all or nothing (SchemaError), SQLite's foreign keys off (docs/operations.md, Databases)."""
    async with engine.connect() as plain:
        sqlite = engine.dialect.name == "sqlite"
        if sqlite:
            await plain.run_sync(_sqlite_foreign_keys, False)
        try:
            conn = await plain.execution_options(**{WRITE_OPTION: True})
            async with conn.begin():
                await conn.run_sync(_upgrade)
        finally:
            if sqlite:
                await plain.run_sync(_sqlite_foreign_keys, True)

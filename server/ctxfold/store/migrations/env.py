"""Alembic environment. Runs on the connection handed over by `ctxfold.store.migrate` (the server's
own async engine), or, from the alembic CLI, on `sqlalchemy.url`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, engine_from_config, pool

from ctxfold.store.schema import metadata

config = context.config


def run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_with(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section) or {}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as conn:
        run_with(conn)


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run against a database")
run()

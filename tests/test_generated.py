"""Committed artefacts that are derived from a source of truth stay in step with it:

* the generated Python API code in server/ctxfold/v1/ is exactly what proto/generate.py makes now;
* every error reason the server raises is a value of the proto's ErrorReason (what the SDKs compare with);
* the Alembic migrations build exactly the schema declared in ctxfold.store.schema (both backends).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event, inspect, text

from conftest import fresh_database
from ctxfold.store import schema
from ctxfold.store.database import MIGRATIONS_DIR, create_engine, migrate
from ctxfold.v1 import context_service_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "server" / "ctxfold" / "v1"
WRITE_VERBS = {"CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE", "REPLACE"}
STALE_HINT = "the generated code in server/ctxfold/v1 is stale: run `make generate` and commit the result"


def _files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_is_current(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"proto/generate.py failed:\n{result.stdout}\n{result.stderr}"
    fresh = _files(tmp_path / "ctxfold" / "v1")
    committed = _files(GENERATED)
    assert fresh, "proto/generate.py produced no files"
    assert {"context_service_pb2.py", "context_service_pb2_grpc.py"} <= fresh.keys()
    missing = sorted(fresh.keys() - committed.keys())
    extra = sorted(committed.keys() - fresh.keys())
    assert not missing, f"{STALE_HINT} (not committed: {missing})"
    assert not extra, f"{STALE_HINT} (committed but no longer generated: {extra})"
    differing = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not differing, f"{STALE_HINT} (differs: {differing})"


# The error constructors of ctxfold.engine.errors that take a reason, and the position of that argument.
REASON_ARGUMENT = {"DomainError": 1, "invalid": 0, "not_found": 0, "failed_precondition": 0, "too_large": 0}


def _reasons_raised(path: Path) -> set[str]:
    reasons = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        position = REASON_ARGUMENT.get(node.func.id)
        if position is not None and len(node.args) > position:
            argument = node.args[position]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                reasons.add(argument.value)
    return reasons


def test_every_reason_the_server_raises_is_an_error_reason_of_the_proto() -> None:
    """The SDKs compare `reason` with their generated ErrorReason constants: a reason missing from the enum cannot be
    named by any of them (Go reads it as unspecified)."""
    raised = set().union(*(_reasons_raised(p) for p in (ROOT / "server" / "ctxfold").rglob("*.py")))
    assert {"SESSION_NOT_FOUND", "SERVER_SHUTTING_DOWN"} <= raised
    assert not sorted(raised - set(pb.ErrorReason.keys())), "add them to ErrorReason in the proto and regenerate"


def _schema_differences(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(
        connection,
        opts={"compare_type": True, "compare_server_default": True},
    )
    return list(compare_metadata(context, schema.metadata))


def _describe(connection: Connection) -> dict[str, Any]:
    """Everything about the live schema that a migration could change."""
    inspector = inspect(connection)
    described: dict[str, Any] = {}
    for table in sorted(inspector.get_table_names()):
        described[table] = {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], str(c.get("default"))) for c in inspector.get_columns(table)
            ],
            "pk": inspector.get_pk_constraint(table),
            "fks": sorted(str(fk) for fk in inspector.get_foreign_keys(table)),
            "indexes": sorted(str(ix) for ix in inspector.get_indexes(table)),
            "uniques": sorted(str(uq) for uq in inspector.get_unique_constraints(table)),
        }
    return described


def _versions(connection: Connection) -> list[str]:
    return [row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))]


async def test_migrations_build_exactly_the_declared_schema(backend: str, tmp_path: Path) -> None:
    engine = create_engine(await fresh_database(backend, tmp_path))
    try:
        await migrate(engine)
        async with engine.connect() as conn:
            differences = await conn.run_sync(_schema_differences)
            tables = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert differences == [], (
            "the Alembic migrations and ctxfold/store/schema.py disagree; add a migration under "
            f"store/migrations/versions/ for: {differences}"
        )
        assert set(schema.metadata.tables) <= tables
        assert tables - set(schema.metadata.tables) == {"alembic_version"}
    finally:
        await engine.dispose()


async def test_migrating_twice_is_a_no_op(backend: str, tmp_path: Path) -> None:
    engine = create_engine(await fresh_database(backend, tmp_path))
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None
    try:
        await migrate(engine)
        async with engine.connect() as conn:
            before = await conn.run_sync(_describe)
            assert await conn.run_sync(_versions) == [head]

        statements: list[str] = []

        def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
            statements.append(statement)

        event.listen(engine.sync_engine, "before_cursor_execute", record)
        try:
            await migrate(engine)
        finally:
            event.remove(engine.sync_engine, "before_cursor_execute", record)

        assert any("alembic_version" in s for s in statements), "the second migrate did not even read the version"
        writes = [s for s in statements if s.lstrip().split(None, 1)[0].upper() in WRITE_VERBS]
        assert writes == [], f"the second migrate changed the database: {writes}"
        async with engine.connect() as conn:
            assert await conn.run_sync(_describe) == before
            assert await conn.run_sync(_versions) == [head]
            assert await conn.run_sync(_schema_differences) == []
    finally:
        await engine.dispose()

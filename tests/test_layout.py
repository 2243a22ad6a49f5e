"""The code's shape, as the first section of docs/architecture.md states it: the engine is a functional core that
imports nothing of the shell, and no hand-written module or function grows past what a reader takes in at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parent.parent / "server" / "ctxfold"
# Generated code (protobuf) and database migrations are not read as modules of their own.
HAND_WRITTEN = sorted(p for p in SERVER.rglob("*.py") if not {"v1", "migrations"} & set(p.relative_to(SERVER).parts))
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def test_the_engine_imports_nothing_of_the_shell() -> None:
    outside = {
        f"{path.name}: {node.module}"
        for path in (SERVER / "engine").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("ctxfold.")
        and not node.module.startswith("ctxfold.engine")
    }
    assert not outside


@pytest.mark.parametrize("path", HAND_WRITTEN, ids=lambda p: str(p.relative_to(SERVER)))
def test_modules_and_functions_stay_short(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long

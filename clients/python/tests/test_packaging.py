"""One version, one license, one client implementation: the checks that keep them so."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata

import ctxfold_client
from conftest import CLIENT_DIR, REPO_ROOT


def test_the_version_is_the_repository_version() -> None:
    version = (REPO_ROOT / "VERSION").read_text(encoding="utf-8").strip()
    assert tomllib.loads((CLIENT_DIR / "pyproject.toml").read_text())["project"]["version"] == version
    assert metadata.version("ctxfold-client") == version
    assert ctxfold_client.__version__ == version


def test_the_package_license_is_the_repository_license() -> None:
    assert (CLIENT_DIR / "LICENSE").read_bytes() == (REPO_ROOT / "LICENSE").read_bytes()
    assert metadata.metadata("ctxfold-client")["License-Expression"] == "MIT"


def test_the_blocking_client_is_generated_from_the_asyncio_client() -> None:
    script = CLIENT_DIR / "scripts" / "unasync.py"
    check = subprocess.run([sys.executable, str(script), "--check"], check=False, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr

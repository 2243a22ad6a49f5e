"""`.ci/postgres.sh -- CMD` passes CMD's exit status through in each of its three starts: a new
cluster (created, then removed), a cluster folder left by an earlier run (started, then stopped and
kept) and a cluster already running (used as it is). A CI run once failed after every test passed
because the second case returned the stop trap's status instead of the command's."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "postgres.sh"


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not found or not os.access(Path(found[-1]) / "initdb", os.X_OK):
        pytest.skip("PostgreSQL is not installed here")
    return Path(found[-1])


def _script(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *command], check=False, env=env, capture_output=True, text=True, timeout=120
    )


def _as_owner(*command: str) -> list[str]:
    """pg_ctl refuses to run as root; the script runs it as the postgres user, and so does this test."""
    return ["runuser", "-u", "postgres", "--", *command] if os.getuid() == 0 else list(command)


@pytest.fixture
def cluster_env() -> Iterator[dict[str, str]]:
    # Outside the checkout's TMPDIR: the postgres user must be able to reach the folder.
    parent = Path("/tmp") / f"ctxfold-pg-test-{os.getpid()}-{free_port()}"
    env = dict(os.environ, CTXFOLD_PG_PORT=str(free_port()), CTXFOLD_PG_DIR=str(parent / "data"))
    parent.mkdir(mode=0o777)
    parent.chmod(0o777)
    yield env
    data = parent / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run(_as_owner(str(_bindir() / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"), check=False)
    shutil.rmtree(parent, ignore_errors=True)


def test_the_command_status_passes_through_every_kind_of_start(cluster_env: dict[str, str]) -> None:
    bindir = _bindir()
    data = Path(cluster_env["CTXFOLD_PG_DIR"])

    # A new cluster: the command's status comes back and the folder is removed afterwards.
    assert _script(cluster_env, "--", "true").returncode == 0
    assert _script(cluster_env, "--", "sh", "-c", "exit 3").returncode == 3
    assert not data.exists()

    # A folder an earlier run left behind, server stopped: started, stopped again, folder kept.
    started = _script(cluster_env)
    assert started.returncode == 0, started.stderr
    assert "CTXFOLD_TEST_POSTGRES_URL=" in started.stdout
    subprocess.run(_as_owner(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"), check=True)
    kept = _script(cluster_env, "--", "true")
    assert kept.returncode == 0, kept.stderr
    assert (data / "PG_VERSION").exists() and not (data / "postmaster.pid").exists()
    assert _script(cluster_env, "--", "false").returncode == 1

    # A running cluster is used as it is and left running.
    assert _script(cluster_env).returncode == 0
    assert _script(cluster_env, "--", "true").returncode == 0
    assert (data / "postmaster.pid").exists()

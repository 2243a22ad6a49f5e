"""Faults a test can cause for real: a PostgreSQL cluster of its own (to stop and restart under load)
and a filesystem that fills up (tmpfs where the test may mount one)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import free_port


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def _as_postgres(command: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: .ci/postgres.sh runs it as the postgres user too.
    return ["runuser", "-u", "postgres", "--", *command] if os.getuid() == 0 else command


def _run(command: list[str]) -> None:
    subprocess.run(_as_postgres(command), check=True, capture_output=True)


@dataclass
class PrivatePostgres:
    """A cluster of the test's own on a free loopback port, which the test may stop and start."""

    bin: Path
    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://ctxfold@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        _run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.data / "log"), "-w", "-o", options, "start"]
        )

    def stop(self) -> None:
        _run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    bin_dir = _postgres_bin()
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed in CI (make test installs it)")
        pytest.skip("PostgreSQL is not installed")
    # Outside the checkout, like .ci/postgres.sh's cluster: the postgres user may not reach it.
    data = Path("/tmp") / f"ctxfold-pg-{uuid.uuid4().hex[:8]}"
    data.mkdir()
    if os.getuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    cluster = PrivatePostgres(bin_dir, data, free_port())
    try:
        _run([str(bin_dir / "initdb"), "-D", str(data), "-U", "ctxfold", "--auth=trust", "-E", "UTF8"])
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            cluster.stop()
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def small_filesystem(path: Path, size_bytes: int, owner: str = "") -> Iterator[Path]:
    """A tmpfs of `size_bytes` at `path` (skips where the test may not mount one)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a size-limited filesystem here: {mounted.stderr.decode().strip()}")
    try:
        if owner:
            shutil.chown(path, owner, owner)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(path: Path, leave_bytes: int) -> Path:
    """Fills the filesystem of `path` with one file until about `leave_bytes` are free; returns it."""
    filler = path / "filler"
    free = shutil.disk_usage(path).free
    with filler.open("wb") as out:
        out.write(b"\0" * max(free - leave_bytes, 0))
    return filler

"""Fixtures: real ctxfold servers run as subprocesses (free loopback port, temporary data dir).

The server is `.venv/bin/ctxfold` of the repository root (clients/python/../../), which the root
Makefile creates; CTXFOLD_BIN overrides it. The server package is never imported here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ctxfold_client import Client

CLIENT_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = CLIENT_DIR.parent.parent
CTXFOLD = Path(os.environ.get("CTXFOLD_BIN", REPO_ROOT / ".venv" / "bin" / "ctxfold"))
STARTUP_SECONDS = 60.0

TOKEN_A = "sdk-token-alpha-0123456789"
TOKEN_B = "sdk-token-bravo-0123456789"


@dataclass
class Server:
    address: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


_SERVING = re.compile(r"serving on \S*:(\d+) \(")  # the ready line: "serving on HOST:PORT (…)"


def start_server(workdir: Path, *extra: str) -> Server:
    """Starts `ctxfold serve` on port 0 (the kernel picks a free one: no race with other processes
    picking ports) and returns once the server has logged the port it listens on."""
    if not CTXFOLD.exists():
        pytest.fail(f"{CTXFOLD} is missing: create the server venv first (make setup in the repo root)")
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "server.log"
    command = [str(CTXFOLD), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(workdir / "data")]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--log-level", "INFO", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        found = _SERVING.search(log.read_text(errors="replace"))
        if found:
            port = int(found.group(1))
            return Server(f"127.0.0.1:{port}", port, process, log)
        time.sleep(0.05)
    if process.poll() is None:
        process.kill()
        process.wait()
    pytest.fail(f"ctxfold did not start:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("server"))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("auth-server")
    tokens = workdir / "tokens"
    tokens.write_text(f"# ctxfold tokens\n{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")
    running = start_server(workdir, "--auth-tokens-file", str(tokens))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(server: Server) -> Iterator[Client]:
    with Client(server.address) as connected:
        yield connected

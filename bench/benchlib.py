"""The plumbing every benchmark in bench/ shares (not a benchmark itself).

Common arguments; real traces as an endless message source; fresh databases on both backends;
`ctxfold serve` in its own process (or in this one, for the benchmarks that read the server's SQL);
the raw grpc.aio echo server in its own process, the ceiling every ratio is taken against; a health
prober in its own process; closed-loop rounds timed from the client; RSS and CPU of a process;
percentiles, tables and JSON output.

`python bench/benchlib.py --echo-server PORT` is the echo process itself, `--health-probe ADDRESS` the
prober."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import glob
import json
import math
import os
import platform
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url

from ctxfold.config import Settings
from ctxfold.engine import estimator
from ctxfold.engine.model import ToolCall
from ctxfold.server import RunningServer, start
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = REPO / "tests" / "data" / "traces"
BACKENDS = ("sqlite", "postgresql")
ROLES = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT, "tool": pb.ROLE_TOOL}
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


# ---- traces as an endless, well-formed message stream ---------------------------------------------


def _message(raw: dict[str, Any]) -> pb.Message:
    return pb.Message(
        role=ROLES[raw["role"]],
        content=raw.get("content") or "",
        tool_calls=[
            pb.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"].get("arguments") or "")
            for c in raw.get("tool_calls") or []
        ],
        tool_call_id=raw.get("tool_call_id") or "",
        reasoning_content=raw.get("reasoning_content") or "",
        name=raw.get("name") or "",
    )


# The load benchmarks' message source in tests/data/traces: the six runs their numbers were measured
# with (the long Claude Code sessions added since hold results far above the 32 KiB bound, whose
# estimates would overshoot the views these benchmarks build). Another --traces directory is read whole.
LOAD_TRACES = (
    "mini-swe-agent-django-11910.json",
    "openhands-django-11149.json",
    "openhands-multi-swe-bench-0.json",
    "openhands-multi-swe-bench-1.json",
    "openhands-multi-swe-bench-2.json",
    "swe-agent-pydicom-1458.json",
)


def trace_paths(directory: Path) -> list[str]:
    """The trace files a load benchmark reads from `directory` (LOAD_TRACES from the default one)."""
    if directory == DEFAULT_TRACES:
        return [str(directory / name) for name in LOAD_TRACES]
    return sorted(glob.glob(str(directory / "*.json")))


@functools.cache
def trace_messages(directory: Path = DEFAULT_TRACES) -> tuple[tuple[pb.Message, ...], ...]:
    """Every trace's messages without its system prompt, cut after its last complete call group (a
    final assistant call without results is dropped), so traces can follow each other in one session."""
    traces = []
    for path in trace_paths(directory):
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)["messages"]
        messages = [_message(m) for m in raw if m["role"] != "system"]
        waiting: set[str] = set()
        complete = 0
        for index, m in enumerate(messages):
            if m.role == pb.ROLE_TOOL:
                waiting.discard(m.tool_call_id)
            elif m.role == pb.ROLE_ASSISTANT:
                waiting = {c.id for c in m.tool_calls}
            if not waiting:
                complete = index + 1
        traces.append(tuple(messages[:complete]))
    if not traces:
        raise SystemExit(f"no traces (*.json) in {directory}")
    return tuple(traces)


def message_tokens(m: pb.Message) -> int:
    """The estimator's count for a message as appended (tool results over 32 KiB are bounded by the
    server, so this slightly overestimates them; benchmarks read exact counts back)."""
    calls = [ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls]
    return estimator.message_tokens(m.content, calls, m.reasoning_content) + estimator.PER_MESSAGE_TOKENS


class MessageSource:
    """The recorded traces laid end to end, over and over: real user requests, assistant tool calls and
    tool results. Tool call ids get a per-lap suffix so they never repeat within a session."""

    def __init__(self, directory: Path = DEFAULT_TRACES, start: int = 0):
        self.traces = trace_messages(directory)
        self.lap = 0
        self._iter = self._messages(start)

    def _messages(self, start: int) -> Iterator[pb.Message]:
        index = start
        while True:
            trace = self.traces[index % len(self.traces)]
            suffix = f"-{uuid.uuid4().hex[:6]}"
            for original in trace:
                m = pb.Message()
                m.CopyFrom(original)
                for c in m.tool_calls:
                    c.id += suffix
                if m.tool_call_id:
                    m.tool_call_id += suffix
                yield m
            index += 1

    def take(self, tokens: int, max_messages: int = 1000) -> list[pb.Message]:
        """At least `tokens` (estimated) worth of messages, ending after a complete call group; stops
        early at `max_messages` (also at a group boundary when possible)."""
        out: list[pb.Message] = []
        total = 0
        waiting: set[str] = set()
        while True:
            if (total >= tokens or len(out) >= max_messages) and not waiting:
                return out
            m = next(self._iter)
            if m.role == pb.ROLE_TOOL:
                waiting.discard(m.tool_call_id)
            elif m.role == pb.ROLE_ASSISTANT:
                waiting = {c.id for c in m.tool_calls}
            out.append(m)
            total += message_tokens(m)


def user_message(index: int) -> pb.Message:
    """A short user turn (about 15 tokens), far below any trigger."""
    return pb.Message(role=pb.ROLE_USER, content=f"Step {index}: run the tests again and report what changed.")


# ---- databases and servers ------------------------------------------------------------------------


async def admin_execute(admin_url: str, statement: str) -> str:
    """Runs one statement on the cluster's admin database; returns the first value (or "")."""
    import asyncpg  # type: ignore[import-untyped]

    url = make_url(admin_url)
    conn = await asyncpg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password, database=url.database
    )
    try:
        value = await conn.fetchval(statement)
    finally:
        await conn.close()
    return "" if value is None else str(value)


async def pg_connect(url: str) -> Any:
    import asyncpg

    u = make_url(url)
    return await asyncpg.connect(host=u.host, port=u.port, user=u.username, password=u.password, database=u.database)


@dataclass
class Database:
    backend: str
    url: str
    version: str
    admin_url: str = ""
    name: str = ""  # PostgreSQL: the database to drop afterwards
    path: Path | None = None  # SQLite: the file

    async def drop(self) -> None:
        if self.backend == "postgresql" and self.name:
            await admin_execute(self.admin_url, f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def _sqlite_database(tmp: Path, label: str) -> Database:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{label}-{uuid.uuid4().hex[:8]}.db"
    return Database("sqlite", f"sqlite:///{path}", sqlite3.sqlite_version, path=path)


async def fresh_database(backend: str, tmp: Path, admin_url: str, label: str = "bench") -> Database:
    if backend == "sqlite":
        return _sqlite_database(tmp, label)
    name = f"ctxfold_{label}_{uuid.uuid4().hex[:10]}"
    await admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    version = await admin_execute(admin_url, "SHOW server_version")
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    return Database("postgresql", url, version, admin_url, name)


def server_settings(database: Database, tmp: Path, **overrides: Any) -> Settings:
    return Settings(listen="127.0.0.1:0", database=database.url, data_dir=str(tmp), grace_seconds=2.0, **overrides)


@dataclass
class Served:
    """An in-process server on a fresh database, and a client channel to it over loopback."""

    database: Database
    server: RunningServer
    channel: grpc.aio.Channel
    stub: pb_grpc.ContextServiceAsyncStub

    @property
    def backend(self) -> str:
        return self.database.backend


async def serve_in_process(database: Database, tmp: Path, **overrides: Any) -> Served:
    server = await start(server_settings(database, tmp, **overrides))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=CHANNEL_OPTIONS)
    return Served(database, server, channel, pb_grpc.ContextServiceStub(channel))


async def close_served(served: Served) -> None:
    await served.channel.close()
    await served.server.stop(grace=1.0)
    await served.database.drop()


# ---- what a database holds, read directly (the server may be another process) ----------------------


async def row_counts(database: Database) -> dict[str, int]:
    """Rows of every table of the schema (not the migration bookkeeping)."""
    if database.backend == "postgresql":
        conn = await pg_connect(database.url)
        try:
            tables = [r["relname"] for r in await conn.fetch("SELECT relname FROM pg_stat_user_tables")]
            return {
                t: int(await conn.fetchval(f'SELECT count(*) FROM "{t}"')) for t in tables if t != "alembic_version"
            }
        finally:
            await conn.close()
    assert database.path is not None
    return await asyncio.to_thread(_sqlite_row_counts, database.path)


def _sqlite_row_counts(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            t: int(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0])
            for t in tables
            if not t.startswith("sqlite_") and t != "alembic_version"
        }
    finally:
        conn.close()


async def table_bytes(database: Database) -> dict[str, int]:
    """Bytes of each table with its indexes (PostgreSQL: pg_total_relation_size, with TOAST; SQLite: the
    pages of each table and index, from dbstat)."""
    if database.backend == "postgresql":
        conn = await pg_connect(database.url)
        try:
            rows = await conn.fetch("SELECT relname, pg_total_relation_size(relid) AS size FROM pg_stat_user_tables")
        finally:
            await conn.close()
        return {r["relname"]: int(r["size"]) for r in rows if r["relname"] != "alembic_version"}
    assert database.path is not None
    return await asyncio.to_thread(_sqlite_table_bytes, database.path)


def _sqlite_table_bytes(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        index_owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table','index')"))
        sizes: dict[str, int] = {}
        for name, size in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            table = index_owner.get(name, name)
            if table.startswith("sqlite_") or table == "alembic_version":
                continue
            sizes[table] = sizes.get(table, 0) + int(size)
        return sizes
    finally:
        conn.close()


# ---- processes: `ctxfold serve` and the echo server ----------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    """Resident memory of a process (VmRSS in /proc/PID/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class Process:
    """A server process on a loopback port, and one client channel to it."""

    name: str
    popen: subprocess.Popen[bytes]
    address: str
    log_path: Path
    channel: grpc.aio.Channel

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stub(self) -> pb_grpc.ContextServiceAsyncStub:
        return pb_grpc.ContextServiceStub(self.channel)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]


def ctxfold_command() -> list[str]:
    script = Path(sys.executable).parent / "ctxfold"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ctxfold.cli"]


async def _wait_serving(process: Process, seconds: float = 60.0) -> None:
    health = health_pb2_grpc.HealthStub(process.channel)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise RuntimeError(f"{process.name} exited with {process.popen.returncode}: {process.log_tail()}")
        with contextlib.suppress(grpc.aio.AioRpcError):
            answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            if answer.status == health_pb2.HealthCheckResponse.SERVING:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{process.name} on {process.address} not serving after {seconds:g} s")


@contextlib.asynccontextmanager
async def running(
    name: str, command: Callable[[str], list[str]], log_path: Path, env: dict[str, str] | None = None
) -> AsyncIterator[Process]:
    """Starts `command(address)` (which must serve gRPC health on that loopback address), yields once it
    reports SERVING, and stops it (SIGTERM, then SIGKILL) afterwards."""
    address = f"127.0.0.1:{free_port()}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        # Popen returns once the process is started; nothing here waits on it.
        popen = subprocess.Popen(  # noqa: ASYNC220
            command(address),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    process = Process(name, popen, address, log_path, grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS))
    try:
        await _wait_serving(process)
        yield process
    finally:
        await process.channel.close()
        await stop_process(popen)


async def stop_process(popen: subprocess.Popen[bytes], seconds: float = 15.0) -> None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(popen.wait, seconds)
        except subprocess.TimeoutExpired:
            popen.kill()
    await asyncio.to_thread(popen.wait)


def ctxfold_env() -> dict[str, str]:
    """This environment without CTXFOLD_ settings, so only the command line configures the server."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CTXFOLD_")}


QUIET = ("--log-level", "WARNING", "--grace-seconds", "2")  # serve flags: warnings only, a short shutdown


def serve_process(
    database_url: str, log_path: Path, *args: str, name: str = "ctxfold"
) -> contextlib.AbstractAsyncContextManager[Process]:
    """`ctxfold serve` on `database_url` in its own process; `args` are further `serve` flags."""
    return running(
        name,
        lambda address: [*ctxfold_command(), "serve", "--listen", address, "--database", database_url, *args],
        log_path,
        ctxfold_env(),
    )


ECHO_METHOD = "/ctxfold.bench.Echo/Echo"
ECHO_PAYLOAD_BYTES = 256


def echo_process(log_path: Path) -> contextlib.AbstractAsyncContextManager[Process]:
    """The raw grpc.aio unary echo server (this file with --echo-server) in its own process."""
    return running(
        "echo", lambda address: [sys.executable, str(Path(__file__).resolve()), "--echo-server", address], log_path
    )


def echo_call(process: Process) -> Callable[[], Awaitable[bytes]]:
    """One echo of a 256-byte payload through the same client library the ctxfold calls use."""
    method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = process.channel.unary_unary(ECHO_METHOD)
    payload = os.urandom(ECHO_PAYLOAD_BYTES)

    async def call() -> bytes:
        answer: bytes = await method(payload)
        return answer

    return call


async def echo_server(address: str) -> None:
    """Answers every request with its own bytes: no (de)serialization, no work beyond gRPC itself."""
    from grpc_health.v1 import health

    async def echo(request: bytes, _context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    server = grpc.aio.server(maximum_concurrent_rpcs=1024)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "ctxfold.bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
            ),
        )
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_insecure_port(address)
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await server.stop(1.0)


HEALTH_PROBE_INTERVAL_S = 0.02
HEALTH_PROBE_TIMEOUT_S = 30.0
_THIS_FILE = str(Path(__file__).resolve())


@contextlib.asynccontextmanager
async def health_probe(address: str, interval: float = HEALTH_PROBE_INTERVAL_S) -> AsyncIterator[list[float]]:
    """Calls grpc.health.v1 Check on `address` every `interval` seconds from a process of its own (so
    this process's own work, e.g. serializing a 32 MiB request, does not delay the probes); yields the
    latencies in seconds, every one, complete when the block ends. A failed check counts as its
    timeout (`HEALTH_PROBE_TIMEOUT_S`)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        _THIS_FILE,
        "--health-probe",
        address,
        "--interval",
        str(interval),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    if await process.stdout.readline() != b"ready\n":  # its channel is connected and one check answered
        await process.wait()
        raise RuntimeError(f"the health prober of {address} did not start (exit {process.returncode})")
    latencies: list[float] = []

    async def read(stdout: asyncio.StreamReader) -> None:
        async for line in stdout:
            latencies.append(float(line))

    reader = asyncio.create_task(read(process.stdout))
    try:
        yield latencies
    finally:
        process.stdin.close()  # the prober stops when its stdin closes
        await reader
        await process.wait()


def probe_health(address: str, interval: float) -> None:
    """The prober of `health_probe`: prints "ready", then one latency (seconds) per line until stdin
    closes."""
    stop = threading.Event()

    def wait_for_stdin_to_close() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_stdin_to_close, daemon=True).start()
    with grpc.insecure_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        check(health_pb2.HealthCheckRequest(), timeout=HEALTH_PROBE_TIMEOUT_S, wait_for_ready=True)
        print("ready", flush=True)
        while not stop.is_set():
            started = time.perf_counter()
            try:
                check(health_pb2.HealthCheckRequest(), timeout=HEALTH_PROBE_TIMEOUT_S)
                took = time.perf_counter() - started
            except grpc.RpcError:
                took = HEALTH_PROBE_TIMEOUT_S
            print(f"{took:.6f}", flush=True)
            stop.wait(interval)


# ---- arguments ------------------------------------------------------------------------------------


def add_common_arguments(
    parser: argparse.ArgumentParser,
    *,
    rounds: int,
    seconds: float | None = None,
    sessions: int | None = None,
    backends: bool = True,
) -> None:
    """--backends (unless the benchmark runs on PostgreSQL only), --postgres-url, --traces, --json and
    --rounds, and --seconds / --sessions where the benchmark has them, with its own defaults."""
    if backends:
        parser.add_argument("--backends", default=",".join(BACKENDS), help="sqlite,postgresql (default both)")
    parser.add_argument(
        "--postgres-url",
        default="",
        help="admin URL of a PostgreSQL cluster (default $CTXFOLD_TEST_POSTGRES_URL); a fresh database is "
        "created in it and dropped afterwards",
    )
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="directory of trace *.json files")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the full result as JSON to PATH (the table still prints), or alone: JSON instead of the table",
    )
    parser.add_argument("--rounds", type=positive_int, default=rounds, help=f"interleaved rounds (default {rounds})")
    if seconds is not None:
        parser.add_argument(
            "--seconds", type=positive_float, default=seconds, help=f"seconds per timed window (default {seconds:g})"
        )
    if sessions is not None:
        parser.add_argument("--sessions", type=positive_int, default=sessions, help=f"sessions (default {sessions})")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 1")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be > 0")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers, e.g. "1,16,64"."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text}: positive integers")
    return values


def postgres_url_arg(value: str) -> str:
    return value or os.environ.get("CTXFOLD_TEST_POSTGRES_URL", "")


def backends_arg(text: str, postgres_url: str, error: Callable[[str], Any]) -> tuple[str, ...]:
    """Parses --backends; drops PostgreSQL (with a note) when no cluster URL is known."""
    backends = tuple(b.strip() for b in text.split(",") if b.strip())
    if not backends or set(backends) - set(BACKENDS):
        error(f"--backends: choose from {', '.join(BACKENDS)}")
    if "postgresql" in backends and not postgres_url:
        print("PostgreSQL skipped: set CTXFOLD_TEST_POSTGRES_URL or --postgres-url", flush=True, file=sys.stderr)
        backends = tuple(b for b in backends if b != "postgresql")
        if not backends:
            error("no backend left to measure")
    return backends


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- RPC helpers ----------------------------------------------------------------------------------


@dataclass
class PrepareOutcome:
    result: pb.PreparedContext
    result_bytes: int  # serialized size of the PrepareResponse that carried the result
    progress: int
    seconds: float


async def prepare(stub: pb_grpc.ContextServiceAsyncStub, request: pb.PrepareRequest) -> PrepareOutcome:
    started = time.perf_counter()
    result: pb.PreparedContext | None = None
    size = 0
    progress = 0
    async for event in stub.Prepare(request):
        if event.HasField("result"):
            result, size = event.result, event.ByteSize()
        else:
            progress += 1
    elapsed = time.perf_counter() - started
    assert result is not None, "Prepare ended without a result"
    return PrepareOutcome(result, size, progress, elapsed)


async def compact(stub: pb_grpc.ContextServiceAsyncStub, session_id: str) -> PrepareOutcome:
    started = time.perf_counter()
    result: pb.PreparedContext | None = None
    size = 0
    progress = 0
    async for event in stub.Compact(pb.CompactRequest(session_id=session_id)):
        if event.HasField("result"):
            result, size = event.result, event.ByteSize()
        else:
            progress += 1
    assert result is not None, "Compact ended without a result"
    return PrepareOutcome(result, size, progress, time.perf_counter() - started)


async def append(stub: pb_grpc.ContextServiceAsyncStub, session_id: str, messages: Sequence[pb.Message]) -> int:
    """Appends; returns the tokens the server counted for the stored messages (with overhead)."""
    total = 0
    for offset in range(0, len(messages), 500):
        response = await stub.AppendMessages(
            pb.AppendMessagesRequest(session_id=session_id, messages=messages[offset : offset + 500])
        )
        total += sum(m.tokens + estimator.PER_MESSAGE_TOKENS for m in response.messages)
    return total


@dataclass
class Built:
    session_id: str
    canonical_tokens: int  # stored tokens of every live message (with per-message overhead)
    messages: int
    view_tokens: int
    view_messages: int
    view_version: int
    folds: int
    prunes: int
    checkpoint_id: str
    seconds: float


async def build_session(
    stub: pb_grpc.ContextServiceAsyncStub,
    config: pb.SessionConfig,
    canonical_tokens: int,
    view_tokens: int,
    source: MessageSource,
    chunk_tokens: int = 20_000,
) -> Built:
    """A session whose canonical transcript holds about `canonical_tokens` and whose view ends at about
    `view_tokens` (or all of it, when the transcript is smaller). Messages go in with AppendMessages in
    big batches; after each batch a Prepare (no append) lets the server prune and fold as an agent's
    next model call would. When the view would end far above `view_tokens`, a Compact folds it first."""
    started = time.perf_counter()
    session = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session
    sid = session.id
    total = count = folds = prunes = 0
    view = 0
    trigger = int((config.compact_ratio or 0.8) * config.context_window)

    async def step(messages: list[pb.Message]) -> PrepareOutcome:
        nonlocal total, count, folds, prunes, view
        total += await append(stub, sid, messages)
        count += len(messages)
        outcome = await prepare(stub, pb.PrepareRequest(session_id=sid))
        folds += outcome.result.action == pb.ACTION_FOLDED
        prunes += outcome.result.action == pb.ACTION_PRUNED
        view = outcome.result.estimated_tokens
        return outcome

    outcome = None
    # Phase 1: history. Stop early enough that the last stretch can end with the view at its target.
    while total + max(0, view_tokens - view) < canonical_tokens:
        budget = min(chunk_tokens, canonical_tokens - total, max(1000, trigger - view - 2000))
        outcome = await step(source.take(budget))
    # Phase 2: bring the view to its target: fold first if it is well above, then fill it up.
    if view > view_tokens * 1.1 and canonical_tokens > view_tokens:
        outcome = await compact(stub, sid)
        folds += outcome.result.action == pb.ACTION_FOLDED
        view = outcome.result.estimated_tokens
    target = min(view_tokens, canonical_tokens)
    while view < target - min(2000, target // 10):
        budget = min(chunk_tokens, target - view)
        outcome = await step(source.take(budget))
    if outcome is None:
        outcome = await step(source.take(1))
    result = outcome.result
    return Built(
        sid,
        total,
        count,
        result.estimated_tokens,
        result.view_message_count,
        result.view_version,
        folds,
        prunes,
        result.checkpoint_id,
        time.perf_counter() - started,
    )


# ---- rounds, timed from the client ----------------------------------------------------------------


def round_order(names: Sequence[T], round_index: int) -> list[T]:
    """The targets of one round: as given in even rounds, reversed in odd ones, so drift hits all."""
    return list(names) if round_index % 2 == 0 else list(names)[::-1]


@dataclass
class Window:
    """A closed-loop window: `concurrency` callers, each calling again as soon as its call returns."""

    concurrency: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def calls_per_s(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


async def closed_loop(callers: Sequence[Callable[[], Awaitable[object]]], seconds: float) -> Window:
    """Runs every caller in a loop for `seconds`; each latency is one call as the client saw it."""
    window = Window(len(callers))
    started = time.perf_counter()
    deadline = started + seconds

    async def loop(call: Callable[[], Awaitable[object]]) -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await call()
            window.latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(loop(c) for c in callers))
    window.seconds = time.perf_counter() - started
    return window


async def sequential(call: Callable[[], Awaitable[object]], count: int) -> list[float]:
    """`count` calls one after another; their latencies as the client saw them."""
    latencies = []
    for _ in range(count):
        t0 = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - t0)
    return latencies


# ---- statistics and output ------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p99 in milliseconds and the number of calls."""
    return {"p50_ms": percentile(seconds, 50) * 1e3, "p99_ms": percentile(seconds, 99) * 1e3, "calls": len(seconds)}


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def render_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align_left: int = 1) -> str:
    """A plain text table; the first `align_left` columns are left-aligned, numbers formatted."""

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            if value == 0:
                return "0"
            if abs(value) >= 100:
                return f"{value:,.0f}"
            if abs(value) >= 10:
                return f"{value:.1f}"
            return f"{value:.2f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(header)]
    out = []

    def line(values: Sequence[str]) -> str:
        pairs = enumerate(zip(values, widths, strict=True))
        parts = [v.ljust(w) if i < align_left else v.rjust(w) for i, (v, w) in pairs]
        return "  ".join(parts).rstrip()

    out.append(line([str(h) for h in header]))
    out.append("-" * len(out[0]))
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def write_json(result: dict[str, Any], json_path: str | None, table: str) -> None:
    """`--json` alone: JSON on stdout instead of the table; `--json PATH`: table on stdout, JSON to PATH."""
    if json_path == "-":
        print(json.dumps(result, indent=2), flush=True)
        return
    print(table, flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")


async def gather_limited(coroutines: Sequence[Any], limit: int) -> list[Any]:
    semaphore = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with semaphore:
            return await c

    return await asyncio.gather(*(one(c) for c in coroutines))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the echo server and health prober processes of the benchmarks")
    role = parser.add_mutually_exclusive_group(required=True)
    role.add_argument("--echo-server", metavar="ADDRESS", help="serve the echo service on host:port")
    role.add_argument("--health-probe", metavar="ADDRESS", help="probe the health of host:port until stdin closes")
    parser.add_argument(
        "--interval", type=positive_float, default=HEALTH_PROBE_INTERVAL_S, help="seconds between probes"
    )
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        if args.health_probe:
            probe_health(args.health_probe, args.interval)
        else:
            asyncio.run(echo_server(args.echo_server))


if __name__ == "__main__":
    main()

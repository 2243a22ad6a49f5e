#!/usr/bin/env python3
"""AppendMessages throughput of a real ctxfold server, SQLite against PostgreSQL.

Starts the server in this process (`ctxfold.server.start`) once on a temporary SQLite file and once
on a fresh PostgreSQL database (when CTXFOLD_TEST_POSTGRES_URL or --postgres-url names a cluster),
and drives it with the real gRPC client over loopback with messages replayed from the recorded agent
traces in tests/data/traces (OpenAI chat format). Three scenarios:

  a) sequential   one client appends single messages, one call after another
  b) concurrent   N sessions (default 16) append batches of 10 messages at the same time
  c) tool-200k    one client appends [assistant tool call, 200 KiB tool result] pairs

Rounds interleave the backends (and alternate which goes first) so that machine noise hits both;
the table shows per-metric medians over the rounds and the SQLite/PostgreSQL ratio.

    .venv/bin/python bench/append_throughput.py [--rounds 5] [--seconds 2.5] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import logging
import math
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy.engine import make_url

from ctxfold.config import Settings
from ctxfold.server import RunningServer, start
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = REPO / "tests" / "data" / "traces"
BACKENDS = ("sqlite", "postgresql")
SCENARIOS = ("sequential", "concurrent", "tool_results")
ROLES = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT, "tool": pb.ROLE_TOOL}
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
SESSION_CONFIG = pb.SessionConfig(context_window=200_000)
MIB = float(1 << 20)


# ---- traces ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    name: str
    messages: tuple[pb.Message, ...]


def to_message(raw: dict[str, Any]) -> pb.Message:
    """One OpenAI chat-format message as a ctxfold Message."""
    calls = [
        pb.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"].get("arguments") or "")
        for c in raw.get("tool_calls") or []
    ]
    return pb.Message(
        role=ROLES[raw["role"]],
        content=raw.get("content") or "",
        tool_calls=calls,
        tool_call_id=raw.get("tool_call_id") or "",
        reasoning_content=raw.get("reasoning_content") or "",
        name=raw.get("name") or "",
    )


def load_traces(directory: Path) -> list[Trace]:
    traces = []
    for path in sorted(glob.glob(str(directory / "*.json"))):
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
        traces.append(Trace(Path(path).stem, tuple(to_message(m) for m in document["messages"])))
    if not traces:
        raise SystemExit(f"no traces (*.json) in {directory}")
    return traces


@dataclass(frozen=True)
class ToolPair:
    """An assistant message with one real tool call, and a large result built from real tool output."""

    call: pb.Message
    result_content: str
    result_bytes: int


def tool_pairs(traces: Sequence[Trace], result_bytes: int, count: int = 8) -> list[ToolPair]:
    """`count` distinct results of about `result_bytes` UTF-8 bytes, cut from the traces' tool outputs
    laid end to end (at different offsets), each behind a real assistant tool-call message."""
    outputs = "\n".join(m.content for t in traces for m in t.messages if m.role == pb.ROLE_TOOL and m.content)
    callers = [m for t in traces for m in t.messages if m.role == pb.ROLE_ASSISTANT and len(m.tool_calls) == 1]
    if not outputs or not callers:
        raise SystemExit("the traces hold no tool calls with results")
    stream = outputs.encode()
    stream = stream * (result_bytes // len(stream) + 2)
    pairs = []
    for k in range(count):
        start = (k * len(stream) // (2 * count)) % (len(stream) - result_bytes)
        content = stream[start : start + result_bytes].decode("utf-8", errors="ignore")
        call = pb.Message()
        call.CopyFrom(callers[(k * 7) % len(callers)])
        pairs.append(ToolPair(call, content, len(content.encode())))
    return pairs


def cycle_traces(traces: Sequence[Trace], first: int) -> Iterator[Trace]:
    index = first
    while True:
        yield traces[index % len(traces)]
        index += 1


# ---- measurement ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


@dataclass
class Window:
    """What one scenario did in one timed window."""

    messages: int = 0
    calls: int = 0
    payload_bytes: int = 0
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    sessions_used: int = 0
    sessions_created_in_window: int = 0

    def metrics(self) -> dict[str, float]:
        elapsed = max(self.elapsed, 1e-9)
        out = {
            "messages_per_s": self.messages / elapsed,
            "calls_per_s": self.calls / elapsed,
            "p50_ms": percentile(self.latencies, 50) * 1e3,
            "p99_ms": percentile(self.latencies, 99) * 1e3,
        }
        if self.payload_bytes:
            out["mib_per_s"] = self.payload_bytes / MIB / elapsed
        return out


class SessionPool:
    """Sessions created before a timed window, so the window measures appends, not CreateSession.
    A window that runs dry creates more on demand and reports how many."""

    def __init__(self, stub: pb_grpc.ContextServiceAsyncStub):
        self.stub = stub
        self.ready: list[str] = []
        self.created_on_demand = 0
        self.taken = 0

    async def _create(self) -> str:
        response = await self.stub.CreateSession(pb.CreateSessionRequest(config=SESSION_CONFIG))
        return str(response.session.id)

    async def fill(self, count: int) -> None:
        missing = max(0, count - len(self.ready))
        for done in range(0, missing, 16):
            created = await asyncio.gather(*(self._create() for _ in range(min(16, missing - done))))
            self.ready.extend(created)
        self.created_on_demand = 0
        self.taken = 0

    async def take(self) -> str:
        self.taken += 1
        if self.ready:
            return self.ready.pop()
        self.created_on_demand += 1
        return await self._create()


async def append(stub: pb_grpc.ContextServiceAsyncStub, session_id: str, messages: Sequence[pb.Message]) -> float:
    started = time.perf_counter()
    response = await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session_id, messages=messages))
    latency = time.perf_counter() - started
    if len(response.messages) != len(messages):
        raise RuntimeError(f"appended {len(response.messages)} of {len(messages)} messages")
    return latency


async def run_sequential(
    stub: pb_grpc.ContextServiceAsyncStub, pool: SessionPool, traces: Sequence[Trace], seconds: float
) -> Window:
    """a) One client, single messages, each call waiting for the previous one."""
    window = Window()
    paused = 0.0
    started = time.perf_counter()
    deadline = started + seconds
    for trace in cycle_traces(traces, 0):
        before = time.perf_counter()
        session_id = await pool.take()
        paused += time.perf_counter() - before  # creating a session on demand is not an append
        for message in trace.messages:
            if time.perf_counter() >= deadline:
                break
            window.latencies.append(await append(stub, session_id, [message]))
            window.messages += 1
            window.calls += 1
        if time.perf_counter() >= deadline:
            break
    window.elapsed = time.perf_counter() - started - paused
    window.sessions_used, window.sessions_created_in_window = pool.taken, pool.created_on_demand
    return window


async def run_concurrent(
    stub: pb_grpc.ContextServiceAsyncStub,
    pool: SessionPool,
    traces: Sequence[Trace],
    seconds: float,
    sessions: int,
    batch: int,
) -> Window:
    """b) `sessions` clients at once, each appending its own trace in batches of `batch` messages."""
    window = Window()
    started = time.perf_counter()
    deadline = started + seconds

    async def worker(first_trace: int) -> None:
        for trace in cycle_traces(traces, first_trace):
            session_id = await pool.take()
            for offset in range(0, len(trace.messages), batch):
                if time.perf_counter() >= deadline:
                    return
                chunk = trace.messages[offset : offset + batch]
                window.latencies.append(await append(stub, session_id, chunk))
                window.messages += len(chunk)
                window.calls += 1

    await asyncio.gather(*(worker(i) for i in range(sessions)))
    window.elapsed = time.perf_counter() - started
    window.sessions_used, window.sessions_created_in_window = pool.taken, pool.created_on_demand
    return window


async def run_tool_results(
    stub: pb_grpc.ContextServiceAsyncStub, pool: SessionPool, pairs: Sequence[ToolPair], seconds: float
) -> Window:
    """c) One client appending [assistant tool call, large tool result] per call into one session."""
    window = Window()
    session_id = await pool.take()
    started = time.perf_counter()
    deadline = started + seconds
    n = 0
    while time.perf_counter() < deadline:
        pair = pairs[n % len(pairs)]
        call_id = f"{pair.call.tool_calls[0].id}-{uuid.uuid4().hex[:8]}"
        call = pb.Message()
        call.CopyFrom(pair.call)
        call.tool_calls[0].id = call_id
        result = pb.Message(role=pb.ROLE_TOOL, tool_call_id=call_id, content=pair.result_content)
        window.latencies.append(await append(stub, session_id, [call, result]))
        window.messages += 1  # tool results
        window.calls += 1
        window.payload_bytes += pair.result_bytes
        n += 1
    window.elapsed = time.perf_counter() - started
    window.sessions_used, window.sessions_created_in_window = pool.taken, pool.created_on_demand
    return window


# ---- backends -------------------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    url: str
    server: RunningServer
    channel: grpc.aio.Channel
    stub: pb_grpc.ContextServiceAsyncStub
    pool: SessionPool
    version: str
    drop: str = ""  # PostgreSQL: the database to drop afterwards
    admin_url: str = ""
    sessions_per_second: dict[str, float] = field(default_factory=dict)


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


async def postgres_database(admin_url: str) -> tuple[str, str, str]:
    """Creates a fresh database; returns (its URL, its name, the server version)."""
    name = f"ctxfold_bench_{uuid.uuid4().hex[:12]}"
    await admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    version = await admin_execute(admin_url, "SHOW server_version")
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    return url, name, version


async def drop_postgres_database(admin_url: str, name: str) -> None:
    await admin_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def open_backend(name: str, tmp: Path, postgres_url: str) -> Backend:
    drop, version = "", ""
    if name == "sqlite":
        url = f"sqlite:///{tmp / 'bench.db'}"
        version = sqlite3.sqlite_version
    else:
        url, drop, version = await postgres_database(postgres_url)
    try:
        server = await start(Settings(listen="127.0.0.1:0", database=url, data_dir=str(tmp), grace_seconds=2.0))
    except BaseException:
        if drop:
            await drop_postgres_database(postgres_url, drop)
        raise
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=CHANNEL_OPTIONS)
    stub = pb_grpc.ContextServiceStub(channel)
    return Backend(name, url, server, channel, stub, SessionPool(stub), version, drop, postgres_url)


async def close_backend(backend: Backend) -> None:
    await backend.channel.close()
    await backend.server.stop(grace=1.0)
    if backend.drop:
        await drop_postgres_database(backend.admin_url, backend.drop)


# ---- the run --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    rounds: int
    seconds: float
    warmup_seconds: float
    sessions: int
    batch: int
    tool_result_kib: int
    backends: tuple[str, ...]
    postgres_url: str
    traces: Path


async def run_window(
    backend: Backend, scenario: str, seconds: float, traces: Sequence[Trace], pairs: Sequence[ToolPair], opts: Options
) -> Window:
    # Enough fresh sessions for the window: the rate seen so far, with room to spare.
    expected = backend.sessions_per_second.get(scenario, 0.0) * seconds
    await backend.pool.fill(math.ceil(expected * 1.5) + opts.sessions + 1)
    if scenario == "sequential":
        window = await run_sequential(backend.stub, backend.pool, traces, seconds)
    elif scenario == "concurrent":
        window = await run_concurrent(backend.stub, backend.pool, traces, seconds, opts.sessions, opts.batch)
    else:
        window = await run_tool_results(backend.stub, backend.pool, pairs, seconds)
    rate = window.sessions_used / max(window.elapsed, 1e-9)
    backend.sessions_per_second[scenario] = max(rate, backend.sessions_per_second.get(scenario, 0.0))
    return window


async def run(opts: Options) -> dict[str, Any]:
    traces = load_traces(opts.traces)
    pairs = tool_pairs(traces, opts.tool_result_kib * 1024)
    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    with tempfile.TemporaryDirectory(prefix="ctxfold-bench-") as tmp:
        backends: list[Backend] = []
        try:
            for name in opts.backends:
                backends.append(await open_backend(name, Path(tmp) / name, opts.postgres_url))
            for backend in backends:  # warm-up: connections, caches, first session-rate estimate
                for scenario in SCENARIOS:
                    await run_window(backend, scenario, opts.warmup_seconds, traces, pairs, opts)
            for index in range(opts.rounds):
                order = backends if index % 2 == 0 else backends[::-1]
                result: dict[str, dict[str, dict[str, float]]] = {b.name: {} for b in backends}
                for scenario in SCENARIOS:
                    for backend in order:
                        window = await run_window(backend, scenario, opts.seconds, traces, pairs, opts)
                        metrics = window.metrics()
                        metrics["sessions_created_in_window"] = window.sessions_created_in_window
                        result[backend.name][scenario] = metrics
                rounds.append(result)
                print(f"round {index + 1}/{opts.rounds} done", file=sys.stderr, flush=True)
            versions = {b.name: b.version for b in backends}
        finally:
            for backend in backends:
                await close_backend(backend)
    return report(opts, traces, pairs, rounds, versions)


def report(
    opts: Options,
    traces: Sequence[Trace],
    pairs: Sequence[ToolPair],
    rounds: list[dict[str, dict[str, dict[str, float]]]],
    versions: dict[str, str],
) -> dict[str, Any]:
    medians: dict[str, dict[str, dict[str, float]]] = {}
    for backend in versions:
        medians[backend] = {}
        for scenario in SCENARIOS:
            keys = rounds[0][backend][scenario].keys()
            medians[backend][scenario] = {k: statistics.median(r[backend][scenario][k] for r in rounds) for k in keys}
    ratio: dict[str, dict[str, float]] = {}
    if "sqlite" in medians and "postgresql" in medians:
        for scenario in SCENARIOS:
            pg = medians["postgresql"][scenario]
            ratio[scenario] = {
                k: v / pg[k] for k, v in medians["sqlite"][scenario].items() if pg.get(k) and k.endswith(("_s", "_ms"))
            }
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "grpc": grpc.__version__,
        },
        "backend_versions": versions,
        "settings": {
            "rounds": opts.rounds,
            "seconds": opts.seconds,
            "warmup_seconds": opts.warmup_seconds,
            "concurrent_sessions": opts.sessions,
            "batch": opts.batch,
            "tool_result_bytes": pairs[0].result_bytes,
            "traces": [t.name for t in traces],
            "trace_messages": sum(len(t.messages) for t in traces),
        },
        "median": medians,
        "sqlite_over_postgresql": ratio,
        "rounds": rounds,
    }


ROWS: tuple[tuple[str, str, str], ...] = (
    ("sequential", "messages_per_s", "msgs/s"),
    ("sequential", "p50_ms", "p50 ms/call"),
    ("sequential", "p99_ms", "p99 ms/call"),
    ("concurrent", "messages_per_s", "msgs/s"),
    ("concurrent", "calls_per_s", "calls/s"),
    ("concurrent", "p50_ms", "p50 ms/call"),
    ("concurrent", "p99_ms", "p99 ms/call"),
    ("tool_results", "messages_per_s", "results/s"),
    ("tool_results", "mib_per_s", "MiB/s"),
    ("tool_results", "p50_ms", "p50 ms/call"),
    ("tool_results", "p99_ms", "p99 ms/call"),
)


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    titles = {
        "sequential": "a) 1 client, single messages",
        "concurrent": f"b) {s['concurrent_sessions']} sessions, batches of {s['batch']}",
        "tool_results": f"c) {s['tool_result_bytes'] / 1024:.0f} KiB tool results",
    }
    backends = list(result["median"])
    has_ratio = bool(result["sqlite_over_postgresql"])
    m = result["machine"]
    lines = [
        f"ctxfold AppendMessages throughput: medians of {s['rounds']} rounds x {s['seconds']:g} s per scenario "
        f"and backend (interleaved); {m['cpus']} CPUs, Python {m['python']}, grpcio {m['grpc']}",
        "backends: " + ", ".join(f"{b} {v}" for b, v in result["backend_versions"].items()),
        "",
    ]
    header = f"{'scenario':<34} {'metric':<12}" + "".join(f" {b:>11}" for b in backends)
    if has_ratio:
        header += f" {'sqlite/pg':>10}"
    lines += [header, "-" * len(header)]
    previous = ""
    for scenario, key, label in ROWS:
        title = titles[scenario] if scenario != previous else ""
        previous = scenario
        line = f"{title:<34} {label:<12}"
        line += "".join(f" {result['median'][b][scenario][key]:>11.1f}" for b in backends)
        if has_ratio:
            value = result["sqlite_over_postgresql"][scenario].get(key)
            line += f" {value:>10.2f}" if value is not None else f" {'-':>10}"
        lines.append(line)
    late = sum(r[b][sc]["sessions_created_in_window"] for r in result["rounds"] for b in backends for sc in SCENARIOS)
    if late:
        lines.append(f"(note: {late:.0f} sessions had to be created inside timed windows)")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, str | None]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=2.5, help="seconds per scenario, backend and round")
    parser.add_argument("--warmup", type=float, default=None, help="warm-up seconds per scenario (default min(0.5, S))")
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="comma-separated: sqlite,postgresql (default both)"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("CTXFOLD_TEST_POSTGRES_URL", ""),
        help="admin URL of a PostgreSQL cluster (default $CTXFOLD_TEST_POSTGRES_URL); a fresh database "
        "is created in it and dropped afterwards",
    )
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions in scenario b")
    parser.add_argument("--batch", type=int, default=10, help="messages per call in scenario b")
    parser.add_argument("--tool-result-kib", type=int, default=200, help="tool result size in scenario c")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="directory of trace *.json files")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the full result as JSON to PATH (the table still prints), or alone: JSON instead of the table",
    )
    args = parser.parse_args(argv)
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    unknown = set(backends) - set(BACKENDS)
    if unknown or not backends:
        parser.error(f"--backends: choose from {', '.join(BACKENDS)}")
    if "postgresql" in backends and not args.postgres_url:
        print("PostgreSQL skipped: set CTXFOLD_TEST_POSTGRES_URL or --postgres-url", file=sys.stderr)
        backends = tuple(b for b in backends if b != "postgresql")
        if not backends:
            parser.error("no backend left to measure")
    if args.rounds < 1 or args.seconds <= 0 or args.sessions < 1 or args.batch < 1 or args.tool_result_kib < 1:
        parser.error("--rounds, --seconds, --sessions, --batch and --tool-result-kib must be positive")
    warmup = min(0.5, args.seconds) if args.warmup is None else args.warmup
    opts = Options(
        rounds=args.rounds,
        seconds=args.seconds,
        warmup_seconds=warmup,
        sessions=args.sessions,
        batch=args.batch,
        tool_result_kib=args.tool_result_kib,
        backends=backends,
        postgres_url=args.postgres_url,
        traces=args.traces,
    )
    return opts, args.json


def main(argv: Sequence[str] | None = None) -> None:
    opts, json_path = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    result = asyncio.run(run(opts))
    if json_path == "-":
        print(json.dumps(result, indent=2), flush=True)
        return
    print(table(result), flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

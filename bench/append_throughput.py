#!/usr/bin/env python3
"""AppendMessages throughput of a real ctxfold server, SQLite against PostgreSQL.

Starts `ctxfold serve` in its own process once on a temporary SQLite file and once on a fresh
PostgreSQL database (when CTXFOLD_TEST_POSTGRES_URL or --postgres-url names a cluster), and drives it
with the real gRPC client over loopback with messages replayed from the recorded agent traces in
tests/data/traces (OpenAI chat format; one trace per session, without its system prompt). Three
scenarios:

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
import contextlib
import logging
import math
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import benchlib as bl

from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

SCENARIOS = ("sequential", "concurrent", "tool_results")
SESSION_CONFIG = pb.SessionConfig(context_window=200_000)
MIB = float(1 << 20)
Trace = tuple[pb.Message, ...]


@dataclass(frozen=True)
class ToolPair:
    """An assistant message with one real tool call, and a large result built from real tool output."""

    call: pb.Message
    result_content: str
    result_bytes: int


def tool_pairs(traces: Sequence[Trace], result_bytes: int, count: int = 8) -> list[ToolPair]:
    """`count` distinct results of about `result_bytes` UTF-8 bytes, cut from the traces' tool outputs
    laid end to end (at different offsets), each behind a real assistant tool-call message."""
    outputs = "\n".join(m.content for t in traces for m in t if m.role == pb.ROLE_TOOL and m.content)
    callers = [m for t in traces for m in t if m.role == pb.ROLE_ASSISTANT and len(m.tool_calls) == 1]
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
            "p50_ms": bl.percentile(self.latencies, 50) * 1e3,
            "p99_ms": bl.percentile(self.latencies, 99) * 1e3,
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
        for message in trace:
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
            for offset in range(0, len(trace), batch):
                if time.perf_counter() >= deadline:
                    return
                chunk = trace[offset : offset + batch]
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
    version: str
    stub: pb_grpc.ContextServiceAsyncStub
    pool: SessionPool
    sessions_per_second: dict[str, float] = field(default_factory=dict)


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
    traces = bl.trace_messages(opts.traces)
    pairs = tool_pairs(traces, opts.tool_result_kib * 1024)
    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    with tempfile.TemporaryDirectory(prefix="ctxfold-append-") as tmp_name:
        tmp = Path(tmp_name)
        async with contextlib.AsyncExitStack() as stack:
            backends: list[Backend] = []
            for name in opts.backends:
                database = await bl.fresh_database(name, tmp / name, opts.postgres_url, "append")
                stack.push_async_callback(database.drop)
                serve = bl.serve_process(database.url, tmp / f"{name}.log", "--data-dir", str(tmp / name), *bl.QUIET)
                stub = (await stack.enter_async_context(serve)).stub
                backends.append(Backend(name, database.version, stub, SessionPool(stub)))
            for backend in backends:  # warm-up: connections, caches, first session-rate estimate
                for scenario in SCENARIOS:
                    await run_window(backend, scenario, opts.warmup_seconds, traces, pairs, opts)
            for index in range(opts.rounds):
                result: dict[str, dict[str, dict[str, float]]] = {b.name: {} for b in backends}
                for scenario in SCENARIOS:
                    for backend in bl.round_order(backends, index):
                        window = await run_window(backend, scenario, opts.seconds, traces, pairs, opts)
                        metrics = window.metrics()
                        metrics["sessions_created_in_window"] = window.sessions_created_in_window
                        result[backend.name][scenario] = metrics
                rounds.append(result)
                bl.log(f"round {index + 1}/{opts.rounds} done")
    versions = {b.name: b.version for b in backends}
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
        "machine": bl.machine(),
        "backend_versions": versions,
        "settings": {
            "rounds": opts.rounds,
            "seconds": opts.seconds,
            "warmup_seconds": opts.warmup_seconds,
            "concurrent_sessions": opts.sessions,
            "batch": opts.batch,
            "tool_result_bytes": pairs[0].result_bytes,
            "traces": [Path(p).stem for p in bl.trace_paths(opts.traces)],
            "trace_messages": sum(len(t) for t in traces),
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
    bl.add_common_arguments(parser, rounds=5, seconds=2.5)
    parser.add_argument("--warmup", type=float, default=None, help="warm-up seconds per scenario (default min(0.5, S))")
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions in scenario b")
    parser.add_argument("--batch", type=int, default=10, help="messages per call in scenario b")
    parser.add_argument("--tool-result-kib", type=int, default=200, help="tool result size in scenario c")
    args = parser.parse_args(argv)
    postgres_url = bl.postgres_url_arg(args.postgres_url)
    backends = bl.backends_arg(args.backends, postgres_url, parser.error)
    if args.sessions < 1 or args.batch < 1 or args.tool_result_kib < 1:
        parser.error("--sessions, --batch and --tool-result-kib must be positive")
    warmup = min(0.5, args.seconds) if args.warmup is None else args.warmup
    opts = Options(
        rounds=args.rounds,
        seconds=args.seconds,
        warmup_seconds=warmup,
        sessions=args.sessions,
        batch=args.batch,
        tool_result_kib=args.tool_result_kib,
        backends=backends,
        postgres_url=postgres_url,
        traces=args.traces,
    )
    return opts, args.json


def main(argv: Sequence[str] | None = None) -> None:
    opts, json_path = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    result = asyncio.run(run(opts))
    bl.write_json(result, json_path, table(result))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Load generator: append-only Prepare throughput and latency at 1, 16 and 64 concurrent sessions.

The server runs as a separate process (`ctxfold serve`, default settings, a fresh SQLite file or a
fresh PostgreSQL database), so the client does not share its interpreter. The client is one asyncio
process with one gRPC channel: each of C sessions runs a closed loop of Prepare calls, each call
appending one short user message and asking for a delta view (`known_view_version` of its previous
answer), which is how an agent calls Prepare before each model request. Sessions are created and
filled with a few thousand tokens of recorded agent trace before the timed windows.

For comparison, the same client drives a trivial grpc.aio echo server (also its own process, started
by this script) with the same request and response sizes: a server-streaming method that answers
every request with one recorded Prepare response. That is the ceiling of gRPC in Python on this
machine; the gap to it is what ctxfold's own work costs.

Rounds interleave the targets and alternate their order. The table shows medians over rounds of
requests/second and of each window's p50/p99 latency.

Memory: a fresh server process per backend gets `--idle-sessions` sessions at a time (each with a
few messages and one Prepare), `--idle-batches` times; its VmRSS (/proc/PID/status) is read after
each batch. The growth per 1,000 idle sessions is reported.

    .venv/bin/python bench/load.py [--rounds 3] [--seconds 3] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import benchlib as bl
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

ECHO_METHOD = "/ctxfold.bench.Echo/Prepare"
DEFAULT_CONCURRENCY = (1, 16, 64)


@dataclass(frozen=True)
class Options:
    concurrency: tuple[int, ...]
    rounds: int
    seconds: float
    warmup_seconds: float
    prefill_tokens: int
    idle_sessions: int
    idle_batches: int
    backends: tuple[str, ...]
    postgres_url: str
    traces: Path


# ---- processes ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
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
    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid


async def wait_serving(port: int, process: subprocess.Popen[bytes], log_path: Path, service: str = "") -> None:
    deadline = time.monotonic() + 60
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"server exited with {process.returncode}: {_tail(log_path)}")
            try:
                answer = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"server on port {port} not serving after 60 s")


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2000:]


def _spawn(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


SCRIPT = str(Path(__file__).resolve())


async def _ready(port: int, popen: subprocess.Popen[bytes], log_path: Path) -> None:
    """Waits until the process serves; stops it (only it) when it does not."""
    try:
        await wait_serving(port, popen, log_path)
    except BaseException:
        if popen.poll() is None:
            popen.kill()
            await asyncio.to_thread(popen.wait)
        raise


async def start_ctxfold(database: bl.Database, tmp: Path) -> Process:
    port = free_port()
    log_path = tmp / f"serve-{database.backend}-{port}.log"
    command = [sys.executable, "-m", "ctxfold.cli", "serve", "--listen", f"127.0.0.1:{port}"]
    command += ["--database", database.url, "--data-dir", str(tmp), "--log-level", "WARNING"]
    command += ["--max-concurrent-rpcs", "1024", "--grace-seconds", "2"]
    popen = _spawn(command, log_path)
    await _ready(port, popen, log_path)
    return Process(database.backend, popen, port, log_path)


async def start_echo(response: bytes, tmp: Path) -> Process:
    port = free_port()
    payload = tmp / "echo-response.bin"
    await asyncio.to_thread(payload.write_bytes, response)
    log_path = tmp / "echo.log"
    command = [sys.executable, SCRIPT, "--echo-server", str(port), "--echo-response", str(payload)]
    popen = _spawn(command, log_path)
    await _ready(port, popen, log_path)
    return Process("echo", popen, port, log_path)


async def stop(process: Process) -> None:
    if process.popen.poll() is None:
        process.popen.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.popen.wait, 15)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            await asyncio.to_thread(process.popen.wait)


async def echo_server(port: int, response_path: Path) -> None:
    """The comparison server: answers every request with one recorded Prepare response."""
    from grpc_health.v1 import health

    response = await asyncio.to_thread(response_path.read_bytes)

    async def prepare(_request: bytes, _context: Any) -> AsyncIterator[bytes]:
        yield response

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)], maximum_concurrent_rpcs=1024)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "ctxfold.bench.Echo", {"Prepare": grpc.unary_stream_rpc_method_handler(prepare)}
            ),
        )
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await server.stop(1.0)


# ---- clients --------------------------------------------------------------------------------------


@dataclass
class Target:
    """Something the load generator can send Prepare requests to."""

    name: str
    process: Process
    channel: grpc.aio.Channel
    method: Any  # a unary-stream callable taking a PrepareRequest
    sessions: list[str] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    step: int = 0


def open_target(name: str, process: Process, echo: bool) -> Target:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{process.port}", options=bl.CHANNEL_OPTIONS)
    if echo:
        method = channel.unary_stream(
            ECHO_METHOD,
            request_serializer=pb.PrepareRequest.SerializeToString,
            response_deserializer=pb.PrepareResponse.FromString,
        )
    else:
        method = pb_grpc.ContextServiceStub(channel).Prepare
    return Target(name, process, channel, method)


async def call(target: Target, session_id: str) -> tuple[float, int]:
    """One Prepare (append one user message, delta view); returns (latency, response bytes)."""
    target.step += 1
    request = pb.PrepareRequest(
        session_id=session_id,
        append=[bl.user_message(target.step)],
        known_view_version=target.versions.get(session_id, 0),
    )
    started = time.perf_counter()
    size = 0
    async for event in target.method(request):
        if event.HasField("result"):
            target.versions[session_id] = event.result.view_version
            size = event.ByteSize()
    return time.perf_counter() - started, size


@dataclass
class Window:
    concurrency: int
    calls: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    response_bytes: list[int] = field(default_factory=list)
    server_cpu: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "requests_per_s": self.calls / max(self.elapsed, 1e-9),
            "server_cpu_ms_per_request": self.server_cpu / max(self.calls, 1) * 1e3,
            "server_cpu_cores": self.server_cpu / max(self.elapsed, 1e-9),
            "p50_ms": bl.percentile(self.latencies, 50) * 1e3,
            "p99_ms": bl.percentile(self.latencies, 99) * 1e3,
            "response_bytes": statistics.median(self.response_bytes) if self.response_bytes else 0,
        }


async def run_window(target: Target, concurrency: int, seconds: float) -> Window:
    window = Window(concurrency)
    cpu_before = cpu_seconds(target.process.pid)
    started = time.perf_counter()
    deadline = started + seconds

    async def worker(session_id: str) -> None:
        while time.perf_counter() < deadline:
            latency, size = await call(target, session_id)
            window.latencies.append(latency)
            window.response_bytes.append(size)
            window.calls += 1

    await asyncio.gather(*(worker(s) for s in target.sessions[:concurrency]))
    window.elapsed = time.perf_counter() - started
    window.server_cpu = cpu_seconds(target.process.pid) - cpu_before
    return window


async def create_sessions(
    stub: pb_grpc.ContextServiceStub, count: int, prefill_tokens: int, traces: Path, prepare: bool = False
) -> list[str]:
    source = bl.MessageSource(traces)
    batches = [source.take(prefill_tokens, max_messages=200) for _ in range(count)]

    async def one(messages: list[pb.Message]) -> str:
        config = pb.SessionConfig(context_window=200_000)
        sid = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
        await stub.AppendMessages(pb.AppendMessagesRequest(session_id=sid, messages=messages))
        if prepare:
            await bl.prepare(stub, pb.PrepareRequest(session_id=sid))
        return str(sid)

    return list(await bl.gather_limited([one(b) for b in batches], 16))


# ---- memory ---------------------------------------------------------------------------------------


async def idle_memory(database: bl.Database, tmp: Path, opts: Options) -> dict[str, Any]:
    """RSS of a fresh server process as idle sessions accumulate."""
    process = await start_ctxfold(database, tmp)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{process.port}", options=bl.CHANNEL_OPTIONS) as channel:
            stub = pb_grpc.ContextServiceStub(channel)
            # warm the code paths and connections first
            await create_sessions(stub, 32, 2000, opts.traces, prepare=True)
            await asyncio.sleep(0.5)
            samples = [rss_kib(process.pid)]
            for _ in range(opts.idle_batches):
                await create_sessions(stub, opts.idle_sessions, 2000, opts.traces, prepare=True)
                await asyncio.sleep(0.5)
                samples.append(rss_kib(process.pid))
    finally:
        await stop(process)
    steps = [b - a for a, b in itertools.pairwise(samples)]
    per_1000 = [s * 1000 / opts.idle_sessions for s in steps]
    return {
        "rss_kib": samples,
        "growth_kib_per_1000_sessions": per_1000,
        "median_growth_kib_per_1000_sessions": statistics.median(per_1000),
    }


# ---- the run --------------------------------------------------------------------------------------


async def run(opts: Options) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ctxfold-load-") as tmp_name:
        tmp = Path(tmp_name)
        databases: list[bl.Database] = []
        targets: dict[str, Target] = {}
        try:
            try:
                for name in opts.backends:
                    database = await bl.fresh_database(name, tmp / name, opts.postgres_url, "load")
                    databases.append(database)
                    process = await start_ctxfold(database, tmp / name)
                    target = open_target(name, process, echo=False)
                    targets[name] = target
                    stub = pb_grpc.ContextServiceStub(target.channel)
                    count = max(opts.concurrency)
                    target.sessions = await create_sessions(stub, count, opts.prefill_tokens, opts.traces)
                    bl.log(f"{name}: server pid {process.pid}, {len(target.sessions)} sessions ready")
                # a recorded Prepare answer of the size the load sees, for the echo server to send back
                first = next(iter(targets.values()))
                await call(first, first.sessions[0])
                response = await recorded_response(first)
                echo = await start_echo(response, tmp)
                targets["echo"] = open_target("echo", echo, echo=True)
                targets["echo"].sessions = [f"echo-{i}" for i in range(max(opts.concurrency))]
                for target in targets.values():  # warm-up, not counted
                    for concurrency in opts.concurrency:
                        await run_window(target, concurrency, opts.warmup_seconds)
                rounds: list[dict[str, dict[str, dict[str, float]]]] = []
                for index in range(opts.rounds):
                    order = list(targets) if index % 2 == 0 else list(targets)[::-1]
                    result: dict[str, dict[str, dict[str, float]]] = {name: {} for name in order}
                    for concurrency in opts.concurrency:
                        for name in order:
                            window = await run_window(targets[name], concurrency, opts.seconds)
                            result[name][str(concurrency)] = window.metrics()
                    rounds.append(result)
                    bl.log(f"round {index + 1}/{opts.rounds} done")
                rss_after_load = {name: rss_kib(t.process.pid) for name, t in targets.items()}
            finally:
                for target in targets.values():
                    await target.channel.close()
                    await stop(target.process)
            memory = {}
            if opts.idle_batches:
                for database in databases:
                    memory[database.backend] = await idle_memory(database, tmp / database.backend, opts)
                    bl.log(f"{database.backend}: idle-session memory measured")
        finally:
            for database in databases:
                await database.drop()
    versions = {d.backend: d.version for d in databases}
    return report(opts, rounds, versions, memory, rss_after_load)


async def recorded_response(target: Target) -> bytes:
    """One real PrepareResponse (a delta answer) of the target, serialized."""
    session_id = target.sessions[0]
    target.step += 1
    request = pb.PrepareRequest(
        session_id=session_id, append=[bl.user_message(target.step)], known_view_version=target.versions[session_id]
    )
    async for event in target.method(request):
        if event.HasField("result"):
            target.versions[session_id] = event.result.view_version
            return bytes(event.SerializeToString())
    raise RuntimeError("Prepare ended without a result")


def report(
    opts: Options,
    rounds: list[dict[str, dict[str, dict[str, float]]]],
    versions: dict[str, str],
    memory: dict[str, Any],
    rss_after_load: dict[str, int],
) -> dict[str, Any]:
    medians: dict[str, dict[str, dict[str, float]]] = {}
    for name in rounds[0]:
        medians[name] = {}
        for c in opts.concurrency:
            keys = rounds[0][name][str(c)].keys()
            medians[name][str(c)] = {k: statistics.median(r[name][str(c)][k] for r in rounds) for k in keys}
    of_echo = {
        name: {
            str(c): medians[name][str(c)]["requests_per_s"] / medians["echo"][str(c)]["requests_per_s"]
            for c in opts.concurrency
        }
        for name in medians
        if name != "echo"
    }
    return {
        "machine": bl.machine(),
        "backend_versions": versions,
        "settings": {
            "concurrency": list(opts.concurrency),
            "rounds": opts.rounds,
            "seconds": opts.seconds,
            "warmup_seconds": opts.warmup_seconds,
            "prefill_tokens": opts.prefill_tokens,
            "idle_sessions": opts.idle_sessions,
            "idle_batches": opts.idle_batches,
        },
        "median": medians,
        "throughput_fraction_of_echo": of_echo,
        "rss_kib_after_load": rss_after_load,
        "idle_memory": memory,
        "rounds": rounds,
    }


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    m = result["machine"]
    lines = [
        f"ctxfold Prepare load (append one message, delta view; server in its own process): medians of "
        f"{s['rounds']} interleaved rounds x {s['seconds']:g} s; {m['cpus']} CPUs, load average "
        f"{m['load_average'][0]}, Python {m['python']}, grpcio {m['grpc']}",
        "backends: "
        + ", ".join(f"{b} {v}" for b, v in result["backend_versions"].items())
        + "; echo = trivial grpc.aio server, same client, same message sizes",
        "",
    ]
    header = ["target", "sessions", "req/s", "p50 ms", "p99 ms", "server CPU ms/req", "cores", "response B", "of echo"]
    rows = []
    for name, cells in result["median"].items():
        for c in s["concurrency"]:
            cell = cells[str(c)]
            fraction = result["throughput_fraction_of_echo"].get(name, {}).get(str(c))
            rows.append(
                [
                    name,
                    c,
                    cell["requests_per_s"],
                    cell["p50_ms"],
                    cell["p99_ms"],
                    cell["server_cpu_ms_per_request"],
                    cell["server_cpu_cores"],
                    int(cell["response_bytes"]),
                    f"{fraction:.0%}" if fraction is not None else "-",
                ]
            )
    lines.append(bl.render_table(header, rows, align_left=1))
    if result["idle_memory"]:
        lines += ["", f"server RSS with idle sessions ({s['idle_sessions']} per batch, each 2k tokens + 1 Prepare):"]
        for name, mem in result["idle_memory"].items():
            samples = " -> ".join(f"{v / 1024:.1f}" for v in mem["rss_kib"])
            growth = ", ".join(f"{g:,.0f}" for g in mem["growth_kib_per_1000_sessions"])
            lines.append(
                f"  {name}: RSS MiB {samples}; KiB per 1,000 sessions: {growth} "
                f"(median {mem['median_growth_kib_per_1000_sessions']:,.0f})"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options | None, str | None, tuple[int, Path] | None]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,16,64", help="concurrent sessions per window (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per window (default 3)")
    parser.add_argument("--warmup", type=float, default=None, help="warm-up seconds per window (default min(1, S))")
    parser.add_argument("--prefill-tokens", type=int, default=5000, help="trace tokens in each session before load")
    parser.add_argument("--idle-sessions", type=int, default=1000, help="sessions per memory batch (0 = skip)")
    parser.add_argument("--idle-batches", type=int, default=2, help="memory batches (default 2)")
    parser.add_argument("--backends", default=",".join(bl.BACKENDS), help="sqlite,postgresql (default both)")
    parser.add_argument(
        "--postgres-url",
        default="",
        help="admin URL of a PostgreSQL cluster (default $CTXFOLD_TEST_POSTGRES_URL); a fresh database is "
        "created in it and dropped afterwards",
    )
    parser.add_argument("--traces", type=Path, default=bl.DEFAULT_TRACES, help="directory of trace *.json files")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the full result as JSON to PATH (the table still prints), or alone: JSON instead of the table",
    )
    parser.add_argument("--echo-server", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--echo-response", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.echo_server:
        return None, None, (args.echo_server, args.echo_response)
    postgres_url = bl.postgres_url_arg(args.postgres_url)
    try:
        concurrency = tuple(int(x) for x in args.concurrency.split(",") if x.strip())
    except ValueError:
        parser.error("--concurrency: comma-separated integers")
    if not concurrency or min(concurrency) < 1:
        parser.error("--concurrency: positive integers")
    if args.rounds < 1 or args.seconds <= 0 or args.idle_sessions < 0 or args.idle_batches < 0:
        parser.error("--rounds >= 1, --seconds > 0, --idle-sessions and --idle-batches >= 0")
    opts = Options(
        concurrency=concurrency,
        rounds=args.rounds,
        seconds=args.seconds,
        warmup_seconds=min(1.0, args.seconds) if args.warmup is None else args.warmup,
        prefill_tokens=args.prefill_tokens,
        idle_sessions=args.idle_sessions,
        idle_batches=args.idle_batches if args.idle_sessions else 0,
        backends=bl.backends_arg(args.backends, postgres_url, parser.error),
        postgres_url=postgres_url,
        traces=args.traces,
    )
    return opts, args.json, None


def main(argv: Sequence[str] | None = None) -> None:
    opts, json_path, echo = parse_args(argv)
    if echo is not None:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(echo_server(*echo))
        return
    assert opts is not None
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result = asyncio.run(run(opts))
    bl.write_json(result, json_path, table(result))


if __name__ == "__main__":
    main()

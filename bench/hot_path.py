#!/usr/bin/env python3
"""The append-only Prepare hot path against the raw gRPC echo of this machine, in one run (issue 10).

Every server runs in its own process: `ctxfold serve` on a fresh SQLite file and on a fresh PostgreSQL
database, and the raw grpc.aio unary echo server (256-byte payload, answered with its own bytes). One
client process with one channel per server drives them all; every time is a call as the client sees
it. The sessions' window puts the fold trigger above every view, so no call ever folds or prunes.

Each call is the agent's delta Prepare: append one assistant and one user message, with
`known_view_version` of the previous answer, so the server answers with what changed.

  latency     per round, `--calls` sequential calls on a session with a ~8k-token and one with a
              ~100k-token view; the echo the same number of sequential calls. p50/p99 over all rounds.
  throughput  per round and concurrency (1, 16, 64), a closed loop of that many calls in flight for
              `--seconds` (each caller calls its share of the `--sessions` in turn, so every session
              stays far below the trigger), and the echo at the same concurrency. calls/s and the server process's
              CPU time per call (/proc/PID/stat): medians over rounds.
  memory      RSS of the server after `--sessions` sessions were appended to, and again after one
              Prepare each (which is when a server caches a session's hot state); the difference / N.

Rounds interleave the servers and alternate their order. The ratios printed next to the numbers are
the goals of issue 10, each marked PASS or MISS:
  p50 at 100k <= 6x echo p50 (further out 4x); p50 at 100k <= 1.25x p50 at 8k; calls/s with 16
  sessions >= 25 % of echo calls/s (further out 50 %); PostgreSQL p50 <= 1.5x SQLite p50.

    .venv/bin/python bench/hot_path.py [--rounds 3] [--calls 50] [--seconds 3] [--json PATH]
    .venv/bin/python bench/hot_path.py --quick --backends sqlite    # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import logging
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import benchlib as bl

from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

GOAL_CONCURRENCY = 16
# Admission limits above the benchmark's own concurrency: what is measured is serving, not refusing.
ADMISSION_FLAGS = ("--max-concurrent-rpcs", "1024", "--max-concurrent-rpcs-per-tenant", "1024")


@dataclass(frozen=True)
class Options:
    small_view_tokens: int
    large_view_tokens: int
    window: int
    calls: int
    concurrency: tuple[int, ...]
    rounds: int
    seconds: float
    warmup_seconds: float
    sessions: int
    backends: tuple[str, ...]
    postgres_url: str
    traces: Path

    @property
    def views(self) -> dict[str, int]:
        return {"small": self.small_view_tokens, "large": self.large_view_tokens}


# ---- the agent's delta Prepare --------------------------------------------------------------------


@dataclass
class Session:
    """One session's side of the conversation: the last view version it was answered with."""

    stub: pb_grpc.ContextServiceAsyncStub
    session_id: str
    view_version: int = 0
    step: int = 0
    view_tokens: int = 0
    first_view_tokens: int = 0  # of the first, full Prepare: every call adds ~30 tokens after it
    answers: int = 0
    deltas: int = 0

    async def delta_prepare(self) -> None:
        self.step += 1
        turn = [
            pb.Message(role=pb.ROLE_ASSISTANT, content=f"Ran step {self.step - 1}; two tests still fail."),
            bl.user_message(self.step),
        ]
        request = pb.PrepareRequest(session_id=self.session_id, append=turn, known_view_version=self.view_version)
        result: pb.PreparedContext | None = None
        async for event in self.stub.Prepare(request):
            if event.HasField("result"):
                result = event.result
        if result is None:
            raise RuntimeError("Prepare ended without a result")
        if result.action != pb.ACTION_NONE:
            raise RuntimeError(f"Prepare did maintenance (action {result.action}): not the append-only path")
        self.view_version = result.view_version
        self.view_tokens = result.estimated_tokens
        self.answers += 1
        self.deltas += result.delta

    async def observe_usage(self) -> None:
        """The agent's report of the provider's usage for the last view (as many tokens as estimated)."""
        request = pb.ObserveUsageRequest(
            session_id=self.session_id, view_version=self.view_version, input_tokens=self.view_tokens, output_tokens=50
        )
        await self.stub.ObserveUsage(request)


async def new_session(stub: pb_grpc.ContextServiceAsyncStub, opts: Options, view_tokens: int, start: int) -> Session:
    """A session whose view holds about `view_tokens` of recorded agent trace, appended in batches and
    never prepared (so nothing about it is cached yet)."""
    config = pb.SessionConfig(context_window=opts.window)
    sid = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
    source = bl.MessageSource(opts.traces, start=start)
    await bl.append(stub, sid, source.take(view_tokens, max_messages=100_000))
    return Session(stub, sid)


async def full_prepare(session: Session) -> None:
    """A Prepare without `known_view_version`: the whole view, as an agent's first call gets it."""
    outcome = await bl.prepare(session.stub, pb.PrepareRequest(session_id=session.session_id))
    if outcome.result.action != pb.ACTION_NONE:
        raise RuntimeError(f"the first Prepare did maintenance (action {outcome.result.action}); lower the views")
    session.view_version = outcome.result.view_version
    session.view_tokens = session.first_view_tokens = outcome.result.estimated_tokens


# ---- one backend's server -------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    version: str
    process: bl.Process
    latency_sessions: dict[str, Session] = field(default_factory=dict)
    load_sessions: list[Session] = field(default_factory=list)
    rss_kib: tuple[int, int] = (0, 0)  # before and after warming the load sessions


async def prepare_backend(backend: Backend, opts: Options) -> None:
    stub = backend.process.stub
    for label, tokens in opts.views.items():
        session = await new_session(stub, opts, tokens, start=0)
        await full_prepare(session)
        backend.latency_sessions[label] = session
        bl.log(f"{backend.name}: {label} view of {session.view_tokens:,} tokens")
    for session in backend.latency_sessions.values():  # the code paths warm before memory is read
        await bl.sequential(session.delta_prepare, 3)
    load = await bl.gather_limited(
        [new_session(stub, opts, opts.small_view_tokens, start=i) for i in range(opts.sessions)], 8
    )
    await asyncio.sleep(0.5)
    before = bl.rss_kib(backend.process.pid)
    await bl.gather_limited([full_prepare(s) for s in load], 8)
    await asyncio.sleep(0.5)
    backend.rss_kib = (before, bl.rss_kib(backend.process.pid))
    backend.load_sessions = list(load)
    bl.log(f"{backend.name}: {len(load)} load sessions warmed, RSS {before:,} -> {backend.rss_kib[1]:,} KiB")


# ---- the run --------------------------------------------------------------------------------------


Caller = Callable[[], Awaitable[object]]


def rotating(sessions: Sequence[Session]) -> Caller:
    """Calls `sessions` in turn: the load spreads over all of them, so no view grows toward the
    trigger however many calls a window makes."""
    turn = itertools.cycle(sessions)

    async def call() -> None:
        await next(turn).delta_prepare()

    return call


def callers(backends: dict[str, Backend], echo: Caller, concurrency: int) -> dict[str, list[Caller]]:
    out: dict[str, list[Caller]] = {"echo": [echo] * concurrency}
    for name, backend in backends.items():
        out[name] = [rotating(backend.load_sessions[k::concurrency]) for k in range(concurrency)]
    return out


async def measure_round(
    backends: dict[str, Backend], echo: Caller, pids: dict[str, int], opts: Options, index: int
) -> dict[str, Any]:
    order = bl.round_order(["echo", *backends], index)
    latency: dict[str, dict[str, list[float]]] = {name: {} for name in order}
    observe_cpu_ms: dict[str, float] = {}
    for name in order:
        if name == "echo":
            latency["echo"]["echo"] = await bl.sequential(echo, opts.calls)
            continue
        for label in opts.views:
            latency[name][label] = await bl.sequential(backends[name].latency_sessions[label].delta_prepare, opts.calls)
        cpu_before = bl.cpu_seconds(pids[name])
        latency[name]["observe"] = await bl.sequential(
            backends[name].latency_sessions["small"].observe_usage, opts.calls
        )
        observe_cpu_ms[name] = (bl.cpu_seconds(pids[name]) - cpu_before) * 1e3 / opts.calls
    calls_per_s: dict[str, dict[str, float]] = {name: {} for name in order}
    cpu_ms_per_call: dict[str, dict[str, float]] = {name: {} for name in order}
    for concurrency in opts.concurrency:
        loops = callers(backends, echo, concurrency)
        for name in order:
            cpu_before = bl.cpu_seconds(pids[name])
            window = await bl.closed_loop(loops[name], opts.seconds)
            cpu = bl.cpu_seconds(pids[name]) - cpu_before
            calls_per_s[name][str(concurrency)] = window.calls_per_s
            cpu_ms_per_call[name][str(concurrency)] = cpu * 1e3 / max(1, len(window.latencies))
    return {
        "latency_s": latency,
        "calls_per_s": calls_per_s,
        "server_cpu_ms_per_call": cpu_ms_per_call,
        "observe_cpu_ms_per_call": observe_cpu_ms,
    }


async def run(opts: Options) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ctxfold-hot-path-") as tmp_name:
        tmp = Path(tmp_name)
        async with contextlib.AsyncExitStack() as stack:
            backends: dict[str, Backend] = {}
            for name in opts.backends:
                database = await bl.fresh_database(name, tmp / name, opts.postgres_url, "hot_path")
                stack.push_async_callback(database.drop)
                serve = bl.serve_process(
                    database.url, tmp / f"{name}.log", "--data-dir", str(tmp / name), *bl.QUIET, *ADMISSION_FLAGS
                )
                process = await stack.enter_async_context(serve)
                backends[name] = Backend(name, database.version, process)
                await prepare_backend(backends[name], opts)
            echo_process = await stack.enter_async_context(bl.echo_process(tmp / "echo.log"))
            echo = bl.echo_call(echo_process)
            pids = {"echo": echo_process.pid, **{name: b.process.pid for name, b in backends.items()}}
            # Warm-up, not counted: every target at every concurrency once.
            await measure_round(backends, echo, pids, warmup_options(opts), 0)
            rounds = []
            for index in range(opts.rounds):
                rounds.append(await measure_round(backends, echo, pids, opts, index))
                bl.log(f"round {index + 1}/{opts.rounds} done")
            return report(opts, backends, rounds)


def warmup_options(opts: Options) -> Options:
    return dataclasses.replace(opts, calls=min(opts.calls, 5), seconds=opts.warmup_seconds)


# ---- the report -----------------------------------------------------------------------------------


def report(opts: Options, backends: dict[str, Backend], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def pooled(name: str, label: str) -> dict[str, float]:
        return bl.latency_summary([x for r in rounds for x in r["latency_s"][name][label]])

    def throughput(name: str, key: str = "calls_per_s") -> dict[str, float]:
        return {str(c): statistics.median(r[key][name][str(c)] for r in rounds) for c in opts.concurrency}

    echo = {
        "latency": pooled("echo", "echo"),
        "calls_per_s": throughput("echo"),
        "server_cpu_ms_per_call": throughput("echo", "server_cpu_ms_per_call"),
    }
    measured: dict[str, Any] = {}
    for name, backend in backends.items():
        before, after = backend.rss_kib
        load_deltas = sum(s.deltas for s in backend.load_sessions)
        load_answers = sum(s.answers for s in backend.load_sessions)
        measured[name] = {
            "latency": {
                label: {
                    **pooled(name, label),
                    "view_tokens_first": backend.latency_sessions[label].first_view_tokens,
                    "view_tokens_last": backend.latency_sessions[label].view_tokens,
                    "delta_fraction": _fraction(
                        backend.latency_sessions[label].deltas, backend.latency_sessions[label].answers
                    ),
                }
                for label in opts.views
            },
            "observe_usage": {
                **pooled(name, "observe"),
                "server_cpu_ms_per_call": statistics.median(r["observe_cpu_ms_per_call"][name] for r in rounds),
            },
            "calls_per_s": throughput(name),
            "server_cpu_ms_per_call": throughput(name, "server_cpu_ms_per_call"),
            "load_delta_fraction": _fraction(load_deltas, load_answers),
            "rss_kib_before_warming": before,
            "rss_kib_after_warming": after,
            "rss_kib_per_cached_session": (after - before) / len(backend.load_sessions),
        }
    ratios = {name: backend_ratios(m, echo, opts) for name, m in measured.items()}
    if "sqlite" in measured and "postgresql" in measured:
        ratios["postgresql_over_sqlite"] = {
            **{
                f"p50_{label}": _ratio(
                    measured["postgresql"]["latency"][label]["p50_ms"], measured["sqlite"]["latency"][label]["p50_ms"]
                )
                for label in opts.views
            },
            **{
                f"calls_per_s_{c}": _ratio(
                    measured["postgresql"]["calls_per_s"][str(c)], measured["sqlite"]["calls_per_s"][str(c)]
                )
                for c in opts.concurrency
            },
        }
    return {
        "machine": bl.machine(),
        "backend_versions": {name: b.version for name, b in backends.items()},
        "settings": {**opts.__dict__, "traces": str(opts.traces), "echo_payload_bytes": bl.ECHO_PAYLOAD_BYTES},
        "echo": echo,
        "backends": measured,
        "ratios": ratios,
        "goals": goals(ratios, opts),
        "rounds": rounds,
    }


def backend_ratios(m: dict[str, Any], echo: dict[str, Any], opts: Options) -> dict[str, Any]:
    return {
        **{
            f"p50_{label}_over_echo": _ratio(m["latency"][label]["p50_ms"], echo["latency"]["p50_ms"])
            for label in opts.views
        },
        "p50_large_over_small": _ratio(m["latency"]["large"]["p50_ms"], m["latency"]["small"]["p50_ms"]),
        "calls_per_s_of_echo": {
            str(c): _ratio(m["calls_per_s"][str(c)], echo["calls_per_s"][str(c)]) for c in opts.concurrency
        },
    }


def goals(ratios: dict[str, Any], opts: Options) -> list[dict[str, Any]]:
    """The goal lines of issue 10 against this run's ratios."""
    out: list[dict[str, Any]] = []

    def goal(text: str, value: float, limit: float, at_most: bool) -> None:
        ok = value <= limit if at_most else value >= limit
        out.append({"goal": text, "value": value, "limit": limit, "at_most": at_most, "pass": ok})

    for name in opts.backends:
        r = ratios[name]
        goal(f"{name}: p50 at the large view <= 6x echo p50", r["p50_large_over_echo"], 6.0, True)
        goal(f"{name}: p50 at the large view <= 4x echo p50 (further out)", r["p50_large_over_echo"], 4.0, True)
        goal(f"{name}: p50 large view <= 1.25x p50 small view", r["p50_large_over_small"], 1.25, True)
        if str(GOAL_CONCURRENCY) in r["calls_per_s_of_echo"]:
            of_echo = r["calls_per_s_of_echo"][str(GOAL_CONCURRENCY)]
            goal(f"{name}: calls/s with {GOAL_CONCURRENCY} in flight >= 25 % of echo", of_echo, 0.25, False)
            goal(
                f"{name}: calls/s with {GOAL_CONCURRENCY} in flight >= 50 % of echo (further out)", of_echo, 0.5, False
            )
    if "postgresql_over_sqlite" in ratios:
        r = ratios["postgresql_over_sqlite"]
        goal("postgresql p50 at the large view <= 1.5x sqlite", r["p50_large"], 1.5, True)
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def _fraction(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    m = result["machine"]
    echo = result["echo"]
    lines = [
        f"ctxfold delta Prepare (append assistant + user, known_view_version) against the raw grpc.aio unary echo "
        f"({s['echo_payload_bytes']} B), every server in its own process; {s['rounds']} interleaved rounds, "
        f"{s['calls']} sequential calls per cell per round, {s['seconds']:g} s per throughput window",
        f"{m['cpus']} CPUs, load average {m['load_average'][0]}, Python {m['python']}, grpcio {m['grpc']}; "
        + ", ".join(f"{b} {v}" for b, v in result["backend_versions"].items()),
        "",
        "latency (ms, p50/p99 over all rounds' calls):",
    ]
    rows: list[list[Any]] = [["echo", "-", echo["latency"]["p50_ms"], echo["latency"]["p99_ms"], "1.00", "-", "-"]]
    for name, b in result["backends"].items():
        r = result["ratios"][name]
        for label in ("small", "large"):
            cell = b["latency"][label]
            rows.append(
                [
                    name,
                    f"{cell['view_tokens_first']:,}-{cell['view_tokens_last']:,}",
                    cell["p50_ms"],
                    cell["p99_ms"],
                    f"{r[f'p50_{label}_over_echo']:.2f}",
                    f"{r['p50_large_over_small']:.2f}" if label == "large" else "",
                    f"{cell['delta_fraction']:.0%}",
                ]
            )
    lines.append(
        bl.render_table(
            ["target", "view tokens (first-last)", "p50", "p99", "x echo p50", "large/small", "delta"], rows
        )
    )
    lines += [
        "",
        "ObserveUsage after the small view's Prepares (ms; server CPU per call: median over rounds, 10 ms ticks):",
    ]
    rows = [
        [name, b["observe_usage"]["p50_ms"], b["observe_usage"]["p99_ms"], b["observe_usage"]["server_cpu_ms_per_call"]]
        for name, b in result["backends"].items()
    ]
    lines.append(bl.render_table(["target", "p50", "p99", "server CPU"], rows))
    lines += ["", "throughput (calls/s, median over rounds; share of echo at the same concurrency):"]
    header = ["target", *(f"{c} in flight" for c in s["concurrency"])]
    rows = [["echo", *(echo["calls_per_s"][str(c)] for c in s["concurrency"])]]
    for name, b in result["backends"].items():
        share = result["ratios"][name]["calls_per_s_of_echo"]
        rows.append([name, *(f"{b['calls_per_s'][str(c)]:,.0f} ({share[str(c)]:.0%})" for c in s["concurrency"])])
    lines.append(bl.render_table(header, rows))
    lines += [
        "",
        "server CPU per call (ms, user + system of the server process; PostgreSQL's own processes not counted):",
    ]
    rows = [
        [name, *(cells["server_cpu_ms_per_call"][str(c)] for c in s["concurrency"])]
        for name, cells in [("echo", echo), *result["backends"].items()]
    ]
    lines.append(bl.render_table(header, rows))
    if "postgresql_over_sqlite" in result["ratios"]:
        r = result["ratios"]["postgresql_over_sqlite"]
        lines += ["", "postgresql / sqlite: " + ", ".join(f"{k} x{v:.2f}" for k, v in r.items())]
    lines += [
        "",
        f"server RSS per cached session ({s['sessions']} sessions of ~{s['small_view_tokens']:,} tokens, "
        "RSS after one Prepare each minus before, / N):",
    ]
    for name, b in result["backends"].items():
        lines.append(
            f"  {name}: {b['rss_kib_before_warming'] / 1024:.1f} -> {b['rss_kib_after_warming'] / 1024:.1f} MiB, "
            f"{b['rss_kib_per_cached_session']:,.1f} KiB per session"
        )
    lines += ["", "issue 10 goals:"]
    for g in result["goals"]:
        lines.append(f"  {'PASS' if g['pass'] else 'MISS'}  {g['goal']}: {g['value']:.2f} (limit {g['limit']:g})")
    return "\n".join(lines)


# ---- arguments ------------------------------------------------------------------------------------

QUICK = {
    "small": 2000,
    "large": 20_000,
    "window": 40_000,
    "calls": 5,
    "concurrency": (1, 4, 16),
    "rounds": 1,
    "seconds": 0.3,
    "sessions": 16,
}


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, str | None]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.add_common_arguments(parser, rounds=3, seconds=3.0, sessions=64)
    parser.add_argument("--calls", type=bl.positive_int, default=50, help="sequential calls per latency cell per round")
    parser.add_argument(
        "--concurrency", type=bl.int_list, default=(1, 16, 64), help="sessions in flight (default 1,16,64)"
    )
    parser.add_argument("--small-view", type=bl.positive_int, default=8000, help="tokens of the small view")
    parser.add_argument("--large-view", type=bl.positive_int, default=100_000, help="tokens of the large view")
    parser.add_argument("--window", type=bl.positive_int, default=200_000, help="the sessions' context_window")
    parser.add_argument("--warmup", type=bl.positive_float, default=None, help="warm-up seconds per window")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: views {QUICK['small']:,}/{QUICK['large']:,} tokens in a {QUICK['window']:,} window, "
        f"1 round, {QUICK['sessions']} sessions (overrides the sizes, rounds, calls, seconds and concurrency)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.small_view, args.large_view, args.window = QUICK["small"], QUICK["large"], QUICK["window"]
        args.calls, args.concurrency, args.rounds = QUICK["calls"], QUICK["concurrency"], QUICK["rounds"]
        args.seconds, args.sessions = QUICK["seconds"], QUICK["sessions"]
    if args.small_view >= args.large_view:
        parser.error("--small-view must be below --large-view")
    # Every call appends ~30 tokens; the large view must stay well below the trigger (0.8 x window).
    if args.large_view * 1.1 + 10_000 > 0.8 * args.window:
        parser.error("--large-view must stay well below the fold trigger (0.8 x --window)")
    if max(args.concurrency) > args.sessions:
        parser.error("--sessions must be at least the largest --concurrency")
    postgres_url = bl.postgres_url_arg(args.postgres_url)
    opts = Options(
        small_view_tokens=args.small_view,
        large_view_tokens=args.large_view,
        window=args.window,
        calls=args.calls,
        concurrency=args.concurrency,
        rounds=args.rounds,
        seconds=args.seconds,
        warmup_seconds=min(1.0, args.seconds) if args.warmup is None else args.warmup,
        sessions=args.sessions,
        backends=bl.backends_arg(args.backends, postgres_url, parser.error),
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

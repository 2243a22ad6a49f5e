#!/usr/bin/env python3
"""Append-only Prepare latency against the size of the canonical transcript, and fold engine time.

Part 1 (Prepare): on each backend, sessions whose canonical transcript holds about 10k, 100k and 1M
tokens of the recorded agent traces (tests/data/traces), built with big AppendMessages batches and a
Prepare after each batch, so the server prunes and folds as it would for an agent: the view ends at
about 100k tokens (all of it for the 10k session) in a 200k window. Then each round sends, per
session, N Prepare calls that append one short user message (below the trigger: the append-only
path), once asking for the whole view and once with `known_view_version` (delta view). Reported:
p50/p99 of the time inside the server's Prepare use case (`Maintenance.prepare`, from the call to
its result), of the whole gRPC handler (plus proto conversion and serialization), of the RPC as the
client on loopback sees it, the SQL statements per call, and the response size in bytes.

Part 2 (fold): the pure engine (prune, plan_pass, apply_pass, views and estimates) on a ~200k-token
projection built from real trace text, and the service-level fold (`Compact` on a fork of a ~200k
token session, extractive summarizer) with the summarizer's own time measured and subtracted.

The server runs in this process (so its code can be timed); the client talks to it over loopback.
Rounds interleave backends, sizes and modes, alternating which backend goes first.

    .venv/bin/python bench/prepare_latency.py [--rounds 5] [--calls 30] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import benchlib as bl
from sqlalchemy import event

from ctxfold.api.servicer import ContextServicer
from ctxfold.engine import estimator
from ctxfold.engine.maintenance import Projection, after_position, apply_pass, plan_pass, prune
from ctxfold.engine.model import Role, SessionConfig, StoredMessage, ToolCall
from ctxfold.engine.view import Checkpoint
from ctxfold.service.maintenance import Maintenance
from ctxfold.summarizers.base import SummaryRequest
from ctxfold.summarizers.extractive import ExtractiveSummarizer, briefing
from ctxfold.v1 import context_service_pb2 as pb

MODES = ("full", "delta")
SUMMARIZER_WINDOW = 1_000_000  # the extractive summarizer's input window: a 200k fold is one pass


@dataclass(frozen=True)
class Options:
    sizes: tuple[int, ...]
    view_tokens: int
    window: int
    rounds: int
    calls: int
    fold_tokens: int
    fold_rounds: int
    engine_repeats: int
    backends: tuple[str, ...]
    postgres_url: str
    traces: Path


# ---- part 1: append-only Prepare ------------------------------------------------------------------


@dataclass
class Hooks:
    service: bl.Samples
    handler: bl.Samples
    compact: bl.Samples
    summarizer: bl.Samples


class StatementCounter:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_args: Any) -> None:
        self.count += 1


@dataclass
class Cell:
    """One (backend, size, mode) cell of one round."""

    rpc: list[float]
    service: list[float]
    handler: list[float]
    statements: list[int]
    response_bytes: list[int]
    view_tokens: list[int]
    delta: list[bool]

    def metrics(self) -> dict[str, float]:
        ms = 1e3
        return {
            "service_p50_ms": bl.percentile(self.service, 50) * ms,
            "service_p99_ms": bl.percentile(self.service, 99) * ms,
            "handler_p50_ms": bl.percentile(self.handler, 50) * ms,
            "handler_p99_ms": bl.percentile(self.handler, 99) * ms,
            "rpc_p50_ms": bl.percentile(self.rpc, 50) * ms,
            "rpc_p99_ms": bl.percentile(self.rpc, 99) * ms,
            "statements": statistics.median(self.statements),
            "response_bytes": statistics.median(self.response_bytes),
            "view_tokens": statistics.median(self.view_tokens),
            "delta_fraction": sum(self.delta) / max(1, len(self.delta)),
        }


@dataclass
class Backend:
    served: bl.Served
    sessions: dict[int, bl.Built]
    last_version: dict[str, int]
    counter: StatementCounter


async def measure_cell(backend: Backend, hooks: Hooks, size: int, mode: str, calls: int, step: int) -> Cell:
    built = backend.sessions[size]
    sid = built.session_id
    cell = Cell([], [], [], [], [], [], [])
    for i in range(calls):
        known = backend.last_version.get(sid, 0) if mode == "delta" else 0
        request = pb.PrepareRequest(session_id=sid, append=[bl.user_message(step + i)], known_view_version=known)
        before = backend.counter.count
        outcome = await bl.prepare(backend.served.stub, request)
        statements = backend.counter.count - before
        result = outcome.result
        if result.action != pb.ACTION_NONE:
            raise SystemExit(f"Prepare on the {size}-token session did maintenance ({result.action}); not append-only")
        backend.last_version[sid] = result.view_version
        (service,) = hooks.service.take(sid)
        (handler,) = hooks.handler.take(sid)
        cell.rpc.append(outcome.seconds)
        cell.service.append(service)
        cell.handler.append(handler)
        cell.statements.append(statements)
        cell.response_bytes.append(outcome.result_bytes)
        cell.view_tokens.append(result.estimated_tokens)
        cell.delta.append(result.delta)
    return cell


async def canonical_tokens(served: bl.Served, session_id: str) -> tuple[int, int]:
    """(stored tokens incl. per-message overhead, messages) of the session's live transcript, read
    back from the database through the server's own lineage query."""
    from sqlalchemy import func, select

    from ctxfold.store import schema
    from ctxfold.store.repository import _in_ranges

    store = served.server.store
    session = await store.get_session("default", session_id)  # the single tenant without auth
    m = schema.messages.c
    async with store._read() as conn:
        ranges = await store._live_ranges(conn, session)
        row = (await conn.execute(select(func.sum(m.tokens), func.count()).where(_in_ranges(ranges)))).one()
    count = int(row[1])
    return int(row[0] or 0) + count * estimator.PER_MESSAGE_TOKENS, count


# ---- part 2: fold engine time ---------------------------------------------------------------------


def stored_messages(tokens: int, source: bl.MessageSource) -> list[StoredMessage]:
    """Real trace messages as canonical messages with their stored token counts, ~`tokens` in all."""
    out = []
    for seq, m in enumerate(source.take(tokens, max_messages=1_000_000), start=1):
        calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls)
        role = {pb.ROLE_USER: Role.USER, pb.ROLE_ASSISTANT: Role.ASSISTANT, pb.ROLE_TOOL: Role.TOOL}[m.role]
        out.append(
            StoredMessage(
                id=f"m_{seq:08d}",
                seq=seq,
                role=role,
                content=m.content,
                tokens=estimator.message_tokens(m.content, calls, m.reasoning_content),
                tool_calls=calls,
                tool_call_id=m.tool_call_id,
                reasoning_content=m.reasoning_content,
                result_ref=f"tr_{seq:08d}" if role is Role.TOOL else "",
            )
        )
    return out


def fresh_projection(config: SessionConfig, messages: Sequence[StoredMessage]) -> Projection:
    # A new object every time: a projection caches its view and estimate.
    return Projection(config, 0, 0, 1.0, None, (), tuple(messages), {})


def engine_fold(config: SessionConfig, messages: Sequence[StoredMessage], summary: str) -> dict[str, float]:
    """What the service does around one summarizer call on the Prepare path, pure engine only:
    build the view and its estimate, prune, plan the pass, make the checkpoint and the candidate."""
    t0 = time.perf_counter()
    projection = fresh_projection(config, messages)
    tokens_before = projection.tokens()
    t1 = time.perf_counter()
    pruned = prune(projection)
    candidate = replace(projection, pruned=pruned)
    candidate.tokens()
    t2 = time.perf_counter()
    plan = plan_pass(candidate, SUMMARIZER_WINDOW)
    fold = plan.first
    assert fold is not None and fold.final
    t3 = time.perf_counter()
    checkpoint = Checkpoint("cp_bench", None, fold.position_seq, summary, estimator.count_text(summary), ())
    checkpoint = replace(checkpoint, kept_ids=tuple(m.id for m in fold.kept))
    after = apply_pass(candidate, fold, checkpoint, after_position(candidate, fold.position_seq))
    after.view()
    tokens_after = after.tokens()
    t4 = time.perf_counter()
    return {
        "view_and_estimate_ms": (t1 - t0) * 1e3,
        "prune_ms": (t2 - t1) * 1e3,
        "plan_pass_ms": (t3 - t2) * 1e3,
        "apply_pass_ms": (t4 - t3) * 1e3,
        "total_ms": (t4 - t0) * 1e3,
        "tokens_before": tokens_before,
        "tokens_after_prune": candidate.tokens(),
        "tokens_after": tokens_after,
        "folded_messages": len(fold.folded),
        "kept_messages": len(fold.kept),
    }


def engine_benchmark(opts: Options) -> dict[str, Any]:
    config = SessionConfig(context_window=int(opts.fold_tokens * 1.25))
    messages = stored_messages(opts.fold_tokens, bl.MessageSource(opts.traces, start=1))
    # The summary the extractive summarizer writes for this fold (its own time reported apart).
    projection = fresh_projection(config, messages)
    pruned = replace(projection, pruned=prune(projection))
    fold = plan_pass(pruned, SUMMARIZER_WINDOW).first
    assert fold is not None
    request = SummaryRequest("", "", "", "", fold.prefix, fold.folded, config.summary_max_tokens)
    summarizer_ms = []
    summary = ""
    for _ in range(max(1, opts.engine_repeats // 3)):
        started = time.perf_counter()
        summary = briefing(request)
        summarizer_ms.append((time.perf_counter() - started) * 1e3)
    runs = [engine_fold(config, messages, summary) for _ in range(opts.engine_repeats)]
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["messages"] = len(messages)
    out["summarizer_ms"] = statistics.median(summarizer_ms)
    out["context_window"] = config.context_window
    out["repeats"] = opts.engine_repeats
    return out


async def build_unfolded(served: bl.Served, tokens: int, window: int, traces: Path) -> tuple[str, int]:
    """A session with ~`tokens` of history that was never prepared (AppendMessages never folds)."""
    config = pb.SessionConfig(context_window=window)
    sid = (await served.stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
    source = bl.MessageSource(traces, start=1)
    total = await bl.append(served.stub, sid, source.take(tokens, max_messages=100_000))
    return sid, total


async def service_fold(served: bl.Served, hooks: Hooks, source_id: str) -> dict[str, float]:
    """Compact on a fresh fork of the unfolded session: the fold as the service runs it."""
    fork = (await served.stub.Fork(pb.ForkRequest(session_id=source_id))).session.id
    hooks.summarizer.take("all")
    outcome = await bl.compact(served.stub, fork)
    if outcome.result.action != pb.ACTION_FOLDED:
        raise SystemExit(f"Compact did not fold (action {outcome.result.action})")
    (service,) = hooks.compact.take(fork)
    summarizer = sum(hooks.summarizer.take("all"))
    await served.stub.DeleteSession(pb.DeleteSessionRequest(session_id=fork))
    return {
        "rpc_ms": outcome.seconds * 1e3,
        "service_ms": service * 1e3,
        "summarizer_ms": summarizer * 1e3,
        "service_minus_summarizer_ms": (service - summarizer) * 1e3,
        "tokens_after": outcome.result.estimated_tokens,
    }


# ---- the run --------------------------------------------------------------------------------------


async def run(opts: Options) -> dict[str, Any]:
    hooks = Hooks(bl.Samples(), bl.Samples(), bl.Samples(), bl.Samples())
    with (
        bl.timed_async_generator(Maintenance, "prepare", hooks.service, session_arg=2),
        bl.timed_async_generator(ContextServicer, "Prepare", hooks.handler, session_arg=1),
        bl.timed_async_generator(Maintenance, "compact", hooks.compact, session_arg=2),
        bl.timed_coroutine(ExtractiveSummarizer, "summarize", hooks.summarizer, key=lambda *_a, **_k: "all"),
        tempfile.TemporaryDirectory(prefix="ctxfold-bench-") as tmp,
    ):
        return await run_backends(opts, hooks, Path(tmp))


async def run_backends(opts: Options, hooks: Hooks, tmp: Path) -> dict[str, Any]:
    backends: dict[str, Backend] = {}
    fold_sources: dict[str, tuple[str, int]] = {}
    builds: dict[str, dict[str, Any]] = {}
    rounds: list[dict[str, Any]] = []
    versions: dict[str, str] = {}
    try:
        for name in opts.backends:
            database = await bl.fresh_database(name, tmp / name, opts.postgres_url, "prepare")
            served = await bl.serve_in_process(database, tmp / name)
            counter = StatementCounter()
            event.listen(served.server.store.engine.sync_engine, "before_cursor_execute", counter)
            backends[name] = Backend(served, {}, {}, counter)
            versions[name] = database.version
            source = bl.MessageSource(opts.traces)
            config = pb.SessionConfig(context_window=opts.window)
            builds[name] = {}
            for size in opts.sizes:
                built = await bl.build_session(served.stub, config, size, opts.view_tokens, source)
                exact, count = await canonical_tokens(served, built.session_id)
                built = replace(built, canonical_tokens=exact, messages=count)
                backends[name].sessions[size] = built
                builds[name][str(size)] = built.__dict__
                bl.log(
                    f"{name}: session of {exact:,} canonical tokens ({count} messages), view {built.view_tokens:,} "
                    f"tokens, {built.folds} folds, {built.prunes} prunes, built in {built.seconds:.1f}s"
                )
            fold_sources[name] = await build_unfolded(
                served, opts.fold_tokens, int(opts.fold_tokens * 1.25), opts.traces
            )
            builds[name]["fold_source_tokens"] = fold_sources[name][1]
        for samples in (hooks.service, hooks.handler, hooks.compact, hooks.summarizer):
            samples.by_session.clear()  # what building the sessions recorded
        # warm-up: a few calls per cell, not counted
        for backend in backends.values():
            for size in opts.sizes:
                for mode in MODES:
                    await measure_cell(backend, hooks, size, mode, 3, 0)
        step = 1000
        for index in range(opts.rounds):
            order = list(backends) if index % 2 == 0 else list(backends)[::-1]
            result: dict[str, Any] = {name: {} for name in order}
            for size in opts.sizes:
                for mode in MODES:
                    for name in order:
                        cell = await measure_cell(backends[name], hooks, size, mode, opts.calls, step)
                        step += opts.calls
                        result[name][f"{size}/{mode}"] = {"metrics": cell.metrics(), "raw": cell.__dict__}
            for name in order:
                if index < opts.fold_rounds:
                    result[name]["fold"] = await service_fold(backends[name].served, hooks, fold_sources[name][0])
            rounds.append(result)
            bl.log(f"round {index + 1}/{opts.rounds} done")
    finally:
        for backend in backends.values():
            await bl.close_served(backend.served)
    engine = engine_benchmark(opts)
    return report(opts, builds, rounds, versions, engine)


def report(
    opts: Options,
    builds: dict[str, dict[str, Any]],
    rounds: list[dict[str, Any]],
    versions: dict[str, str],
    engine: dict[str, Any],
) -> dict[str, Any]:
    """Per cell: percentiles over all calls of all rounds; per fold: medians over the rounds."""
    cells: dict[str, dict[str, Any]] = {}
    for name in versions:
        cells[name] = {}
        for size in opts.sizes:
            for mode in MODES:
                key = f"{size}/{mode}"
                merged = bl_merge([r[name][key]["raw"] for r in rounds])
                metrics = merged.metrics()
                # p50 per round, to show the spread between rounds
                metrics["service_p50_ms_per_round"] = [r[name][key]["metrics"]["service_p50_ms"] for r in rounds]
                cells[name][key] = metrics
        folds = [r[name]["fold"] for r in rounds if "fold" in r[name]]
        cells[name]["fold"] = {k: statistics.median(f[k] for f in folds) for k in folds[0]} if folds else {}
    # the largest transcript against each smaller one: the same view size (or smaller), more history
    growth: dict[str, dict[str, dict[str, float]]] = {}
    large = max(opts.sizes)
    for name in versions:
        growth[name] = {}
        for small in sorted(opts.sizes)[:-1]:
            growth[name][f"{large}/{small}"] = {
                f"{mode}_{metric}": cells[name][f"{large}/{mode}"][metric] / cells[name][f"{small}/{mode}"][metric]
                for mode in MODES
                for metric in ("service_p50_ms", "handler_p50_ms", "rpc_p50_ms", "response_bytes")
                if cells[name][f"{small}/{mode}"][metric]
            }
    return {
        "machine": bl.machine(),
        "backend_versions": versions,
        "settings": {
            "sizes": list(opts.sizes),
            "view_tokens": opts.view_tokens,
            "context_window": opts.window,
            "rounds": opts.rounds,
            "calls_per_cell": opts.calls,
            "fold_tokens": opts.fold_tokens,
            "fold_rounds": min(opts.fold_rounds, opts.rounds),
        },
        "sessions": builds,
        "prepare": cells,
        "largest_over_smaller": growth,
        "engine_fold": engine,
        "rounds": rounds,
    }


def bl_merge(raws: Sequence[dict[str, Any]]) -> Cell:
    cell = Cell([], [], [], [], [], [], [])
    for raw in raws:
        for key, values in raw.items():
            getattr(cell, key).extend(values)
    return cell


def tokens_label(n: float) -> str:
    return f"{n / 1e6:.2g}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    m = result["machine"]
    lines = [
        f"ctxfold append-only Prepare: {s['rounds']} interleaved rounds x {s['calls_per_cell']} calls per cell; "
        f"window {s['context_window']:,}; {m['cpus']} CPUs, load average {m['load_average'][0]}, Python {m['python']}",
        "backends: " + ", ".join(f"{b} {v}" for b, v in result["backend_versions"].items()),
        "service = Maintenance.prepare (use case: append, load, view, bookkeeping); handler = + proto conversion "
        "and serialization; rpc = client round trip on loopback. ms, p50/p99 over all calls.",
        "",
    ]
    header = [
        "backend",
        "canonical",
        "view",
        "mode",
        "service p50",
        "p99",
        "handler p50",
        "p99",
        "rpc p50",
        "p99",
        "SQL/call",
        "response B",
    ]
    rows = []
    for name, cells in result["prepare"].items():
        for size in s["sizes"]:
            built = result["sessions"][name][str(size)]
            for mode in MODES:
                c = cells[f"{size}/{mode}"]
                rows.append(
                    [
                        name,
                        tokens_label(built["canonical_tokens"]),
                        tokens_label(c["view_tokens"]),
                        mode,
                        c["service_p50_ms"],
                        c["service_p99_ms"],
                        c["handler_p50_ms"],
                        c["handler_p99_ms"],
                        c["rpc_p50_ms"],
                        c["rpc_p99_ms"],
                        c["statements"],
                        int(c["response_bytes"]),
                    ]
                )
    lines.append(bl.render_table(header, rows, align_left=4))
    if any(result["largest_over_smaller"].values()):
        lines += ["", "largest transcript / smaller transcript, ratios of p50s (service, rpc) and of response sizes:"]
        for name, pairs in result["largest_over_smaller"].items():
            for pair, g in pairs.items():
                sizes = " / ".join(tokens_label(int(x)) for x in pair.split("/"))
                parts = [
                    f"{mode} service x{g[f'{mode}_service_p50_ms']:.2f} rpc x{g[f'{mode}_rpc_p50_ms']:.2f} "
                    f"bytes x{g[f'{mode}_response_bytes']:.2f}"
                    for mode in MODES
                ]
                lines.append(f"  {name} {sizes}: " + "; ".join(parts))
    e = result["engine_fold"]
    lines += [
        "",
        f"fold of {e['tokens_before']:,} tokens ({e['messages']} real trace messages, window {e['context_window']:,}): "
        "pure engine, median of "
        f"{e['repeats']} runs, ms",
        bl.render_table(
            ["view+estimate", "prune", "plan_pass", "apply_pass", "engine total", "summarizer (extractive)", "after"],
            [
                [
                    e["view_and_estimate_ms"],
                    e["prune_ms"],
                    e["plan_pass_ms"],
                    e["apply_pass_ms"],
                    e["total_ms"],
                    e["summarizer_ms"],
                    f"{e['tokens_after']:,} tokens",
                ]
            ],
            align_left=0,
        ),
    ]
    fold_rows = [
        [
            name,
            c["fold"]["service_ms"],
            c["fold"]["summarizer_ms"],
            c["fold"]["service_minus_summarizer_ms"],
            c["fold"]["rpc_ms"],
            int(c["fold"]["tokens_after"]),
        ]
        for name, c in result["prepare"].items()
        if c["fold"]
    ]
    if fold_rows:
        sources = {name: b.get("fold_source_tokens", 0) for name, b in result["sessions"].items()}
        lines += [
            "",
            f"service-level fold: Compact on a fork of a ~{tokens_label(max(sources.values()))}-token session, "
            f"median of {s['fold_rounds']} rounds, ms",
            bl.render_table(
                ["backend", "Compact (service)", "summarizer", "service - summarizer", "rpc", "tokens after"], fold_rows
            ),
        ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, str | None]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes",
        default="10000,100000,300000,1000000",
        help="canonical transcript sizes in tokens (comma-separated; default 10k, 100k, 300k, 1M)",
    )
    parser.add_argument("--view-tokens", type=int, default=100_000, help="target view size (default 100000)")
    parser.add_argument("--window", type=int, default=200_000, help="context_window of the sessions")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--calls", type=int, default=30, help="Prepare calls per session, mode and round")
    parser.add_argument("--fold-tokens", type=int, default=200_000, help="size of the measured fold")
    parser.add_argument("--fold-rounds", type=int, default=3, help="rounds that also time a service-level fold")
    parser.add_argument("--engine-repeats", type=int, default=9, help="runs of the pure engine fold")
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
    args = parser.parse_args(argv)
    postgres_url = bl.postgres_url_arg(args.postgres_url)
    try:
        sizes = tuple(sorted(int(x) for x in args.sizes.split(",") if x.strip()))
    except ValueError:
        parser.error("--sizes: comma-separated integers")
    if not sizes or min(sizes) < 1000:
        parser.error("--sizes: at least one size, each >= 1000")
    if args.rounds < 1 or args.calls < 1 or args.engine_repeats < 1 or args.fold_tokens < 5000:
        parser.error("--rounds, --calls and --engine-repeats must be positive, --fold-tokens >= 5000")
    if args.view_tokens + 20_000 > 0.8 * args.window:
        parser.error("--view-tokens must stay well below the trigger (0.8 x --window)")
    opts = Options(
        sizes=sizes,
        view_tokens=args.view_tokens,
        window=args.window,
        rounds=args.rounds,
        calls=args.calls,
        fold_tokens=args.fold_tokens,
        fold_rounds=args.fold_rounds,
        engine_repeats=args.engine_repeats,
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

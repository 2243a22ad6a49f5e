#!/usr/bin/env python3
"""Fork and Rewind cost against the size of the history: structural sharing, measured.

On each backend, two sessions are built from the recorded agent traces (tests/data/traces): one of
about 10k canonical tokens and one of about 1M (which has folded several times, so it also has a
checkpoint chain). Each round then, per session and backend (interleaved):

  fork       N Forks at the head: RPC time, and the growth of every table in rows and bytes
             (PostgreSQL: pg_total_relation_size; SQLite: the pages of each table and index, from
             dbstat; read from the database directly) divided by N
  prepare    the first Prepare of each fork (no append): it must not fold again; its time and view
  rewind     a Rewind of each fork by 2 messages, and of another fork to half its history
  delete     DeleteSession of each fork (and its garbage collection); rows must return to what they
             were before the forks (nothing leaks, nothing of the source is lost)

A last section measures edit churn: Prepare latency on one session after 0, E and 4E edits
(Rewind one message back + append a new version), since every edit starts a new transcript segment.

The server is `ctxfold serve` in its own process; every time is an RPC as the client on loopback sees
it. Rounds interleave the backends, alternating which goes first.

    .venv/bin/python bench/fork_scale.py [--rounds 3] [--forks 20] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import benchlib as bl

from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    sizes: tuple[int, ...]
    view_tokens: int
    window: int
    rounds: int
    forks: int
    edits: int
    backends: tuple[str, ...]
    postgres_url: str
    traces: Path


@dataclass
class Backend:
    database: bl.Database
    process: bl.Process
    sessions: dict[int, bl.Built]
    chain: dict[int, int]  # checkpoints on each source's chain


async def chain_length(stub: pb_grpc.ContextServiceAsyncStub, session_id: str) -> int:
    """Checkpoints on the session's chain (ListCheckpoints, all pages)."""
    count, token = 0, ""
    while True:
        page = await stub.ListCheckpoints(
            pb.ListCheckpointsRequest(session_id=session_id, page_size=100, page_token=token)
        )
        count += len(page.checkpoints)
        token = page.next_page_token
        if not token:
            return count


async def timed(call: Awaitable[T]) -> tuple[T, float]:
    started = time.perf_counter()
    answer = await call
    return answer, time.perf_counter() - started


# ---- one round for one source session -------------------------------------------------------------


async def measure(backend: Backend, size: int, forks: int) -> dict[str, Any]:
    stub = backend.process.stub
    source = backend.sessions[size]
    rows_before = await bl.row_counts(backend.database)
    bytes_before = await bl.table_bytes(backend.database)
    fork_rpc, fork_ids = [], []
    for _ in range(forks):
        response, seconds = await timed(stub.Fork(pb.ForkRequest(session_id=source.session_id)))
        fork_rpc.append(seconds)
        fork_ids.append(response.session.id)
    rows_after = await bl.row_counts(backend.database)
    bytes_after = await bl.table_bytes(backend.database)
    # first Prepare of each fork: no fold again, same view size as the source
    first_prepare, first_actions, first_views = [], [], []
    for fork_id in fork_ids:
        outcome = await bl.prepare(stub, pb.PrepareRequest(session_id=fork_id))
        first_prepare.append(outcome.seconds)
        first_actions.append(int(outcome.result.action))
        first_views.append(int(outcome.result.estimated_tokens))
    # rewinds: by 2 messages on every other fork, to half the history on the rest
    head = (await stub.GetSession(pb.GetSessionRequest(session_id=fork_ids[0]))).session.head_seq
    rewind_short: list[float] = []
    rewind_half: list[float] = []
    for index, fork_id in enumerate(fork_ids):
        to_seq = head - 2 if index % 2 == 0 else head // 2
        _, seconds = await timed(stub.Rewind(pb.RewindRequest(session_id=fork_id, to_seq=to_seq)))
        (rewind_short if index % 2 == 0 else rewind_half).append(seconds)
    deletes = []
    for fork_id in fork_ids:
        _, seconds = await timed(stub.DeleteSession(pb.DeleteSessionRequest(session_id=fork_id)))
        deletes.append(seconds)
    rows_final = await bl.row_counts(backend.database)
    ms = 1e3
    return {
        "fork_p50_ms": bl.percentile(fork_rpc, 50) * ms,
        "fork_p99_ms": bl.percentile(fork_rpc, 99) * ms,
        "rows_per_fork": {t: (rows_after[t] - rows_before[t]) / forks for t in rows_after},
        "bytes_per_fork": {t: (bytes_after.get(t, 0) - bytes_before.get(t, 0)) / forks for t in bytes_after},
        "table_bytes_before": bytes_before,
        "first_prepare_p50_ms": bl.percentile(first_prepare, 50) * ms,
        "first_prepare_folded": sum(a != pb.ACTION_NONE for a in first_actions),
        "first_prepare_view_tokens": statistics.median(first_views),
        "rewind_2_p50_ms": bl.percentile(rewind_short, 50) * ms,
        "rewind_half_p50_ms": bl.percentile(rewind_half, 50) * ms,
        "delete_p50_ms": bl.percentile(deletes, 50) * ms,
        "rows_leaked_after_delete": {t: n - rows_before[t] for t, n in rows_final.items() if n != rows_before[t]},
    }


async def edit_churn(backend: Backend, size: int, edits: int, calls: int) -> dict[str, float]:
    """Delta Prepare p50 on a fork of the source after 0, `edits` and 4 x `edits` edits (Rewind by one
    message, append the new version), each edit being one more transcript segment."""
    stub = backend.process.stub
    source = backend.sessions[size]
    fork_id = (await stub.Fork(pb.ForkRequest(session_id=source.session_id))).session.id
    out: dict[str, float] = {}
    done = 0
    step = 0
    version = 0
    for target in (0, edits, 4 * edits):
        while done < target:
            head = (await stub.GetSession(pb.GetSessionRequest(session_id=fork_id))).session.head_seq
            await stub.Rewind(pb.RewindRequest(session_id=fork_id, to_seq=head - 1))
            await stub.AppendMessages(pb.AppendMessagesRequest(session_id=fork_id, messages=[bl.user_message(done)]))
            done += 1
        times = []
        for _ in range(calls):
            step += 1
            request = pb.PrepareRequest(session_id=fork_id, append=[bl.user_message(step)], known_view_version=version)
            outcome = await bl.prepare(stub, request)
            version = outcome.result.view_version
            times.append(outcome.seconds)
        out[str(target)] = bl.percentile(times, 50) * 1e3
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=fork_id))
    return out


# ---- the run --------------------------------------------------------------------------------------


async def run(opts: Options) -> dict[str, Any]:
    backends: dict[str, Backend] = {}
    versions: dict[str, str] = {}
    sessions: dict[str, dict[str, Any]] = {}
    rounds: list[dict[str, Any]] = []
    churn: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="ctxfold-fork-") as tmp_name:
        tmp = Path(tmp_name)
        async with contextlib.AsyncExitStack() as stack:
            for name in opts.backends:
                database = await bl.fresh_database(name, tmp / name, opts.postgres_url, "fork")
                stack.push_async_callback(database.drop)
                serve = bl.serve_process(database.url, tmp / f"{name}.log", "--data-dir", str(tmp / name), *bl.QUIET)
                process = await stack.enter_async_context(serve)
                backend = Backend(database, process, {}, {})
                backends[name] = backend
                versions[name] = database.version
                source = bl.MessageSource(opts.traces)
                sessions[name] = {}
                for size in opts.sizes:
                    built = await bl.build_session(
                        process.stub, pb.SessionConfig(context_window=opts.window), size, opts.view_tokens, source
                    )
                    backend.sessions[size] = built
                    backend.chain[size] = await chain_length(process.stub, built.session_id)
                    sessions[name][str(size)] = {**built.__dict__, "checkpoint_chain": backend.chain[size]}
                    bl.log(
                        f"{name}: source of ~{built.canonical_tokens:,} tokens ({built.messages} messages, "
                        f"{backend.chain[size]} checkpoints) built in {built.seconds:.1f}s"
                    )
                sessions[name]["table_bytes"] = await bl.table_bytes(database)
                sessions[name]["rows"] = await bl.row_counts(database)
            for index in range(opts.rounds):
                order = bl.round_order(list(backends), index)
                result: dict[str, Any] = {name: {} for name in order}
                for size in opts.sizes:
                    for name in order:
                        result[name][str(size)] = await measure(backends[name], size, opts.forks)
                rounds.append(result)
                bl.log(f"round {index + 1}/{opts.rounds} done")
            if opts.edits:
                for name, backend in backends.items():
                    churn[name] = await edit_churn(backend, min(opts.sizes), opts.edits, 10)
                    bl.log(f"{name}: edit churn done")
    return report(opts, versions, sessions, rounds, churn)


def _median_of(rounds: Sequence[dict[str, Any]], name: str, size: int) -> dict[str, Any]:
    cells = [r[name][str(size)] for r in rounds]
    out: dict[str, Any] = {}
    for key, value in cells[0].items():
        if isinstance(value, dict):
            if key == "table_bytes_before":
                out[key] = cells[0][key]
            elif key == "rows_leaked_after_delete":
                merged: dict[str, int] = {}
                for c in cells:
                    for t, v in c[key].items():
                        merged[t] = merged.get(t, 0) + v
                out[key] = merged
            else:
                out[key] = {t: statistics.median(c[key].get(t, 0) for c in cells) for t in value}
        else:
            out[key] = statistics.median(c[key] for c in cells)
    return out


def report(
    opts: Options,
    versions: dict[str, str],
    sessions: dict[str, dict[str, Any]],
    rounds: list[dict[str, Any]],
    churn: dict[str, dict[str, float]],
) -> dict[str, Any]:
    medians = {name: {str(size): _median_of(rounds, name, size) for size in opts.sizes} for name in versions}
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    large = str(max(opts.sizes))
    for name in versions:
        ratios[name] = {}
        for smaller in sorted(opts.sizes)[:-1]:
            a, b = medians[name][str(smaller)], medians[name][large]
            ratio = {
                k: b[k] / a[k]
                for k in ("fork_p50_ms", "first_prepare_p50_ms", "rewind_2_p50_ms", "delete_p50_ms")
                if a[k]
            }
            if sum(a["bytes_per_fork"].values()) > 0:
                ratio["bytes_per_fork"] = sum(b["bytes_per_fork"].values()) / sum(a["bytes_per_fork"].values())
            ratios[name][f"{large}/{smaller}"] = ratio
    return {
        "machine": bl.machine(),
        "backend_versions": versions,
        "settings": {
            "sizes": list(opts.sizes),
            "view_tokens": opts.view_tokens,
            "context_window": opts.window,
            "rounds": opts.rounds,
            "forks_per_round": opts.forks,
            "edits": opts.edits,
        },
        "sources": sessions,
        "median": medians,
        "largest_over_smaller": ratios,
        "edit_churn_prepare_p50_ms": churn,
        "rounds": rounds,
    }


def tokens_label(n: float) -> str:
    return f"{n / 1e6:.2g}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    m = result["machine"]
    lines = [
        f"ctxfold Fork/Rewind vs history size: medians of {s['rounds']} interleaved rounds x {s['forks_per_round']} "
        f"forks; {m['cpus']} CPUs, load average {m['load_average'][0]}, Python {m['python']}",
        "backends: " + ", ".join(f"{b} {v}" for b, v in result["backend_versions"].items()),
        "times = RPC p50 as the client sees it (ms); rows/bytes per fork = growth of all tables / forks",
        "",
    ]
    header = [
        "backend",
        "source",
        "msgs",
        "cps",
        "fork p50",
        "p99",
        "rows/fork",
        "bytes/fork",
        "1st Prepare",
        "refolds",
        "rewind -2",
        "rewind 1/2",
        "delete",
    ]
    rows = []
    for name, cells in result["median"].items():
        for size in s["sizes"]:
            c = cells[str(size)]
            source = result["sources"][name][str(size)]
            rows_per = {t: v for t, v in c["rows_per_fork"].items() if v}
            rows.append(
                [
                    name,
                    tokens_label(source["canonical_tokens"]),
                    source["messages"],
                    source["checkpoint_chain"],
                    c["fork_p50_ms"],
                    c["fork_p99_ms"],
                    " ".join(f"{t[:3]}+{v:g}" for t, v in sorted(rows_per.items())),
                    int(sum(c["bytes_per_fork"].values())),
                    c["first_prepare_p50_ms"],
                    int(c["first_prepare_folded"]),
                    c["rewind_2_p50_ms"],
                    c["rewind_half_p50_ms"],
                    c["delete_p50_ms"],
                ]
            )
    lines.append(bl.render_table(header, rows, align_left=2))
    lines += ["", "what a copy would cost: the whole database after building the sources (bytes, rows):"]
    for name, source in result["sources"].items():
        total = sum(source["table_bytes"].values())
        lines.append(
            f"  {name}: {total:,} bytes; messages {source['rows']['messages']:,} rows, "
            f"tool_results {source['rows']['tool_results']:,}, checkpoints {source['rows']['checkpoints']:,}"
        )
    if any(result["largest_over_smaller"].values()):
        lines += ["", "largest source / smaller source (ratios of medians):"]
        for name, by_pair in result["largest_over_smaller"].items():
            for pair, g in by_pair.items():
                sizes = " / ".join(tokens_label(int(x)) for x in pair.split("/"))
                lines.append(f"  {name} {sizes}: " + ", ".join(f"{k} x{v:.2f}" for k, v in g.items()))
    leaks = {
        name: {size: c["rows_leaked_after_delete"] for size, c in cells.items() if c["rows_leaked_after_delete"]}
        for name, cells in result["median"].items()
    }
    leaks = {k: v for k, v in leaks.items() if v}
    lines.append("")
    lines.append(f"rows left after deleting the forks: {leaks or 'none'}")
    if result["edit_churn_prepare_p50_ms"]:
        e = s["edits"]
        lines += ["", f"edit churn: delta Prepare p50 (ms) after 0 / {e} / {4 * e} edits:"]
        for name, c in result["edit_churn_prepare_p50_ms"].items():
            lines.append(f"  {name}: " + " / ".join(f"{v:.1f}" for v in c.values()))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, str | None]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes", default="10000,100000,1000000", help="source sizes in canonical tokens (comma-separated)"
    )
    parser.add_argument("--view-tokens", type=int, default=100_000, help="target view of the sources")
    parser.add_argument("--window", type=int, default=200_000, help="context_window of the sources")
    parser.add_argument("--forks", type=int, default=20, help="forks per source, backend and round (default 20)")
    parser.add_argument("--edits", type=int, default=100, help="edit churn step E (0 = skip; default 100)")
    bl.add_common_arguments(parser, rounds=3)
    args = parser.parse_args(argv)
    postgres_url = bl.postgres_url_arg(args.postgres_url)
    try:
        sizes = tuple(sorted(int(x) for x in args.sizes.split(",") if x.strip()))
    except ValueError:
        parser.error("--sizes: comma-separated integers")
    if not sizes or min(sizes) < 1000:
        parser.error("--sizes: at least one size, each >= 1000")
    if args.forks < 2 or args.edits < 0:
        parser.error("--forks >= 2, --edits >= 0")
    opts = Options(
        sizes=sizes,
        view_tokens=args.view_tokens,
        window=args.window,
        rounds=args.rounds,
        forks=args.forks,
        edits=args.edits,
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

#!/usr/bin/env python3
"""Fork and Rewind cost against the size of the history: structural sharing, measured.

On each backend, two sessions are built from the recorded agent traces (tests/data/traces): one of
about 10k canonical tokens and one of about 1M (which has folded several times, so it also has a
checkpoint chain). Each round then, per session and backend (interleaved):

  fork       N Forks at the head: RPC time, time inside the server's Fork use case, SQL statements,
             and the growth of every table in rows and bytes (PostgreSQL: pg_total_relation_size;
             SQLite: the pages of each table and index, from dbstat) divided by N
  prepare    the first Prepare of each fork (no append): it must not fold again; its time and view
  rewind     a Rewind of each fork by 2 messages, and of another fork to half its history
  delete     DeleteSession of each fork (and its garbage collection); rows must return to what they
             were before the forks (nothing leaks, nothing of the source is lost)

A last section measures edit churn: Prepare latency on one session after 0, E and 4E edits
(Rewind one message back + append a new version), since every edit starts a new transcript segment.

    .venv/bin/python bench/fork_scale.py [--rounds 3] [--forks 20] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sqlite3
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import benchlib as bl
from sqlalchemy import event

from ctxfold.service.lineage import Lineage
from ctxfold.service.maintenance import Maintenance
from ctxfold.service.sessions import Sessions
from ctxfold.v1 import context_service_pb2 as pb


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


class StatementCounter:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_args: Any) -> None:
        self.count += 1


@dataclass
class Backend:
    served: bl.Served
    counter: StatementCounter
    sessions: dict[int, bl.Built]
    chain: dict[int, int]  # checkpoints on each source's chain


@dataclass
class Hooks:
    fork: bl.Samples
    rewind: bl.Samples
    delete: bl.Samples
    prepare: bl.Samples


def _key(*args: Any, **_kwargs: Any) -> str:
    return str(args[2])  # (self, tenant, session_id, ...)


# ---- storage --------------------------------------------------------------------------------------


async def table_bytes(served: bl.Served) -> dict[str, int]:
    """Bytes of each table with its indexes (and TOAST on PostgreSQL)."""
    database = served.database
    if database.backend == "postgresql":
        conn = await bl.pg_connect(database.url)
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


async def chain_length(served: bl.Served, session_id: str) -> int:
    session = await served.stub.GetSession(pb.GetSessionRequest(session_id=session_id))
    store = served.server.store
    async with store._read() as conn:
        return len(await store._checkpoint_chain(conn, session.session.checkpoint_id or None))


# ---- one round for one source session -------------------------------------------------------------


async def measure(backend: Backend, hooks: Hooks, size: int, forks: int) -> dict[str, Any]:
    served = backend.served
    stub = served.stub
    source = backend.sessions[size]
    rows_before = await served.server.store.row_counts()
    bytes_before = await table_bytes(served)
    fork_rpc, fork_server, statements = [], [], []
    fork_ids = []
    for _ in range(forks):
        before = backend.counter.count
        outcome_start = asyncio.get_running_loop().time()
        response = await stub.Fork(pb.ForkRequest(session_id=source.session_id))
        fork_rpc.append(asyncio.get_running_loop().time() - outcome_start)
        statements.append(backend.counter.count - before)
        (server_time,) = hooks.fork.take(source.session_id)
        fork_server.append(server_time)
        fork_ids.append(response.session.id)
    rows_after = await served.server.store.row_counts()
    bytes_after = await table_bytes(served)
    # first Prepare of each fork: no fold again, same view size as the source
    first_prepare, first_actions, first_views = [], [], []
    for fork_id in fork_ids:
        outcome = await bl.prepare(stub, pb.PrepareRequest(session_id=fork_id))
        (server_time,) = hooks.prepare.take(fork_id)
        first_prepare.append(server_time)
        first_actions.append(int(outcome.result.action))
        first_views.append(int(outcome.result.estimated_tokens))
    # rewinds: by 2 messages on every other fork, to half the history on the rest
    head = (await stub.GetSession(pb.GetSessionRequest(session_id=fork_ids[0]))).session.head_seq
    rewind_short, rewind_half = [], []
    for index, fork_id in enumerate(fork_ids):
        to_seq = head - 2 if index % 2 == 0 else head // 2
        await stub.Rewind(pb.RewindRequest(session_id=fork_id, to_seq=to_seq))
        (server_time,) = hooks.rewind.take(fork_id)
        (rewind_short if index % 2 == 0 else rewind_half).append(server_time)
    deletes = []
    for fork_id in fork_ids:
        await stub.DeleteSession(pb.DeleteSessionRequest(session_id=fork_id))
        (server_time,) = hooks.delete.take(fork_id)
        deletes.append(server_time)
    rows_final = await served.server.store.row_counts()
    ms = 1e3
    return {
        "fork_rpc_p50_ms": bl.percentile(fork_rpc, 50) * ms,
        "fork_rpc_p99_ms": bl.percentile(fork_rpc, 99) * ms,
        "fork_server_p50_ms": bl.percentile(fork_server, 50) * ms,
        "fork_statements": statistics.median(statements),
        "rows_per_fork": {t: (rows_after[t] - rows_before[t]) / forks for t in rows_after},
        "bytes_per_fork": {t: (bytes_after.get(t, 0) - bytes_before.get(t, 0)) / forks for t in bytes_after},
        "table_bytes_before": bytes_before,
        "first_prepare_server_p50_ms": bl.percentile(first_prepare, 50) * ms,
        "first_prepare_folded": sum(a != pb.ACTION_NONE for a in first_actions),
        "first_prepare_view_tokens": statistics.median(first_views),
        "rewind_2_server_p50_ms": bl.percentile(rewind_short, 50) * ms,
        "rewind_half_server_p50_ms": bl.percentile(rewind_half, 50) * ms,
        "delete_server_p50_ms": bl.percentile(deletes, 50) * ms,
        "rows_leaked_after_delete": {t: n - rows_before[t] for t, n in rows_final.items() if n != rows_before[t]},
    }


async def edit_churn(backend: Backend, hooks: Hooks, size: int, edits: int, calls: int) -> dict[str, float]:
    """Prepare p50 on a fork of the source after 0, `edits` and 4 x `edits` edits (Rewind by one
    message, append the new version), each edit being one more transcript segment."""
    stub = backend.served.stub
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
        hooks.prepare.take(fork_id)
        times = []
        for _ in range(calls):
            step += 1
            request = pb.PrepareRequest(session_id=fork_id, append=[bl.user_message(step)], known_view_version=version)
            outcome = await bl.prepare(stub, request)
            version = outcome.result.view_version
            (server_time,) = hooks.prepare.take(fork_id)
            times.append(server_time)
        out[str(target)] = bl.percentile(times, 50) * 1e3
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=fork_id))
    hooks.rewind.by_session.clear()
    return out


# ---- the run --------------------------------------------------------------------------------------


async def run(opts: Options) -> dict[str, Any]:
    hooks = Hooks(bl.Samples(), bl.Samples(), bl.Samples(), bl.Samples())
    with (
        bl.timed_coroutine(Lineage, "fork", hooks.fork, key=_key),
        bl.timed_coroutine(Lineage, "rewind", hooks.rewind, key=_key),
        bl.timed_coroutine(Sessions, "delete", hooks.delete, key=_key),
        bl.timed_async_generator(Maintenance, "prepare", hooks.prepare, session_arg=2),
        tempfile.TemporaryDirectory(prefix="ctxfold-bench-") as tmp,
    ):
        return await run_backends(opts, hooks, Path(tmp))


async def run_backends(opts: Options, hooks: Hooks, tmp: Path) -> dict[str, Any]:
    backends: dict[str, Backend] = {}
    versions: dict[str, str] = {}
    sessions: dict[str, dict[str, Any]] = {}
    rounds: list[dict[str, Any]] = []
    churn: dict[str, dict[str, float]] = {}
    try:
        for name in opts.backends:
            database = await bl.fresh_database(name, tmp / name, opts.postgres_url, "fork")
            served = await bl.serve_in_process(database, tmp / name)
            counter = StatementCounter()
            event.listen(served.server.store.engine.sync_engine, "before_cursor_execute", counter)
            backend = Backend(served, counter, {}, {})
            backends[name] = backend
            versions[name] = database.version
            source = bl.MessageSource(opts.traces)
            sessions[name] = {}
            for size in opts.sizes:
                built = await bl.build_session(
                    served.stub, pb.SessionConfig(context_window=opts.window), size, opts.view_tokens, source
                )
                backend.sessions[size] = built
                backend.chain[size] = await chain_length(served, built.session_id)
                sessions[name][str(size)] = {**built.__dict__, "checkpoint_chain": backend.chain[size]}
                bl.log(
                    f"{name}: source of ~{built.canonical_tokens:,} tokens ({built.messages} messages, "
                    f"{backend.chain[size]} checkpoints) built in {built.seconds:.1f}s"
                )
            sessions[name]["table_bytes"] = await table_bytes(served)
            sessions[name]["rows"] = await served.server.store.row_counts()
            for samples in (hooks.fork, hooks.rewind, hooks.delete, hooks.prepare):
                samples.by_session.clear()
        for index in range(opts.rounds):
            order = list(backends) if index % 2 == 0 else list(backends)[::-1]
            result: dict[str, Any] = {name: {} for name in order}
            for size in opts.sizes:
                for name in order:
                    result[name][str(size)] = await measure(backends[name], hooks, size, opts.forks)
            rounds.append(result)
            bl.log(f"round {index + 1}/{opts.rounds} done")
        if opts.edits:
            for name, backend in backends.items():
                churn[name] = await edit_churn(backend, hooks, min(opts.sizes), opts.edits, 10)
                bl.log(f"{name}: edit churn done")
    finally:
        for backend in backends.values():
            await bl.close_served(backend.served)
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
                for k in ("fork_rpc_p50_ms", "fork_server_p50_ms", "rewind_2_server_p50_ms", "delete_server_p50_ms")
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
        "server = time inside the use case (ms); rows/bytes per fork = growth of all tables / forks",
        "",
    ]
    header = [
        "backend",
        "source",
        "msgs",
        "cps",
        "fork rpc p50",
        "p99",
        "fork server",
        "SQL",
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
                    c["fork_rpc_p50_ms"],
                    c["fork_rpc_p99_ms"],
                    c["fork_server_p50_ms"],
                    c["fork_statements"],
                    " ".join(f"{t[:3]}+{v:g}" for t, v in sorted(rows_per.items())),
                    int(sum(c["bytes_per_fork"].values())),
                    c["first_prepare_server_p50_ms"],
                    int(c["first_prepare_folded"]),
                    c["rewind_2_server_p50_ms"],
                    c["rewind_half_server_p50_ms"],
                    c["delete_server_p50_ms"],
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
        lines += ["", f"edit churn: append-only Prepare p50 (server, ms) after 0 / {e} / {4 * e} edits:"]
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
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--forks", type=int, default=20, help="forks per source, backend and round (default 20)")
    parser.add_argument("--edits", type=int, default=100, help="edit churn step E (0 = skip; default 100)")
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
    if args.rounds < 1 or args.forks < 2 or args.edits < 0:
        parser.error("--rounds >= 1, --forks >= 2, --edits >= 0")
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

#!/usr/bin/env python3
"""Scale: append-only Prepare latency on a PostgreSQL database holding 10,000 sessions and 1,000,000
stored messages, against the same sessions on an almost empty database, with the query plans.

Two fresh PostgreSQL databases, each served by a ctxfold server in this process:

  small  only the measured sessions
  big    the same measured sessions plus bulk-loaded sessions up to --sessions sessions and about
         --messages stored messages in all

The bulk load clones two template sessions that the server itself wrote (CreateSession +
AppendMessages of 100 recorded trace messages, then one Prepare; one never folded, one folded by that
Prepare): their segment, session, messages, raw tool results, checkpoint and context state rows are
copied inside PostgreSQL (INSERT ... SELECT) with fresh ids in the server's own formats (`s_`, `g_`,
`m_`, `cp_` + uuid4 hex as new_id() makes them; result refs from the server's new_result_ref()). What
the server would have written differently for a clone is rewritten: the cache key in the config and
the state, the ref in truncated tool content, the checkpoint's kept ids and the refs in its summary
(token count and hash recounted), the state's fingerprint and pruned ids. Then ANALYZE (what
autovacuum would do). A few clones are checked through the API before anything is measured.

Measured sessions, created through the API in both databases:
  folded  sessions of the template's messages in a window whose trigger is below them: their first
          Prepare folded, so every later Prepare also reads a checkpoint and its kept messages
  plain   template-shaped sessions (200k window, never folded); in the big database these are
          picked at random among the bulk-loaded sessions

Rounds interleave the databases (alternating which goes first); each Prepare appends one short user
message and asks for a delta view. Reported: p50/p99 RPC time as the client sees it, big/small
ratios, DeleteSession time, and EXPLAIN (ANALYZE, BUFFERS) of every SQL statement one Prepare and one
DeleteSession issue on each database, captured as the server sent them. That capture is why the
server runs in this process: a SQLAlchemy statement listener observes its engine (nothing is timed
inside the server).

    .venv/bin/python bench/scale.py [--sessions 10000] [--messages 1000000] [--json [PATH]]
    .venv/bin/python bench/scale.py --quick       # 300 sessions, 30k messages: a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import random
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import benchlib as bl
from sqlalchemy import event

from ctxfold.engine import estimator
from ctxfold.engine.ids import new_id, new_result_ref
from ctxfold.engine.state import fingerprint
from ctxfold.v1 import context_service_pb2 as pb

TEMPLATE_WINDOW = 200_000
# Session, segment, message and checkpoint ids are made in SQL in the format of new_id() (uuid4().hex,
# checked at start); result refs are made by the server's own new_result_ref() and uploaded.
NEW_ID = "replace(gen_random_uuid()::text, '-', '')"
ID_FORMAT = re.compile(r"x_[0-9a-f]{32}")


@dataclass(frozen=True)
class Options:
    sessions: int
    messages: int
    per_session: int
    folded: int
    plain: int
    calls: int
    rounds: int
    deletes: int
    chunk: int
    postgres_url: str
    traces: Path


# ---- statement capture and plans ------------------------------------------------------------------


@dataclass
class Capture:
    on: bool = False
    statements: list[tuple[str, Any]] = field(default_factory=list)

    def __call__(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if self.on:
            self.statements.append((statement, parameters))


LABELS = (
    (r"^SELECT sessions\..*FOR UPDATE", "session row lock (append)"),
    (r"^SELECT sessions\.", "session by id"),
    (r"^UPDATE sessions", "session head update (append)"),
    (r"^INSERT INTO messages", "insert message (append)"),
    (r"^SELECT checkpoints\.id, checkpoints\.tenant", "head checkpoint by id"),
    (r"^SELECT messages\..*messages\.id IN", "kept messages by id"),
    (r"^WITH RECURSIVE chain", "segment chain (recursive)"),
    (r"^SELECT messages\.", "messages after the checkpoint (segment, seq range)"),
    (r"^SELECT context_states\.state_json", "context state"),
    (r"^SELECT context_states\.revision", "state revision (bookkeeping)"),
    (r"^UPDATE context_states", "state write (bookkeeping)"),
    (r"^INSERT INTO context_states", "state insert"),
    (r"^DELETE FROM sessions", "delete session"),
    (r"^SELECT checkpoints\.id\s+FROM checkpoints", "GC: orphaned checkpoints of the tenant"),
    (r"^SELECT segments\.id\s+FROM segments", "GC: orphaned segments of the tenant"),
    (r"^DELETE FROM", "GC: delete rows"),
)
SCAN = re.compile(
    r"((?:Parallel )?(?:Index Only Scan|Index Scan|Bitmap Index Scan|Seq Scan))(?: using (\S+))? on (\S+)"
)


def label(statement: str) -> str:
    flat = " ".join(statement.split())
    for pattern, name in LABELS:
        if re.search(pattern, flat):
            return name
    return flat[:60]


async def explain(url: str, statements: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """EXPLAIN (ANALYZE, BUFFERS) of each statement with its captured parameters, in a transaction that
    is rolled back (so writes change nothing). INSERTs are only planned (their ids already exist)."""
    conn = await bl.pg_connect(url)
    out = []
    try:
        for statement, parameters in statements:
            flat = " ".join(statement.split())
            args = list(parameters or ())
            analyze = not flat.startswith("INSERT")
            options = "ANALYZE, BUFFERS" if analyze else "COSTS"
            transaction = conn.transaction()
            await transaction.start()
            try:
                rows = await conn.fetch(f"EXPLAIN ({options}) {statement}", *args)
                plan = [r[0] for r in rows]
            except Exception as exc:  # report, do not fail the run
                plan = [f"EXPLAIN failed: {exc}"]
            finally:
                await transaction.rollback()
            text = "\n".join(plan)
            scans = [
                f"{m.group(1)}{' using ' + m.group(2) if m.group(2) else ''} on {m.group(3)}"
                for m in SCAN.finditer(text)
            ]
            timing = re.search(r"Execution Time: ([\d.]+) ms", text)
            out.append(
                {
                    "label": label(statement),
                    "statement": flat[:400],
                    "scans": scans,
                    "execution_ms": float(timing.group(1)) if timing else None,
                    "analyzed": analyze,
                    "plan": plan,
                }
            )
    finally:
        await conn.close()
    return out


# ---- databases ------------------------------------------------------------------------------------


@dataclass
class Side:
    name: str  # small | big
    served: bl.Served
    capture: Capture
    folded: list[str] = field(default_factory=list)
    plain: list[str] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    step: int = 0


def exactly(source: bl.MessageSource, count: int) -> list[pb.Message]:
    """`count` trace messages ending after a complete call group (short user turns fill the rest)."""
    messages = source.take(10**9, max_messages=count)
    waiting: set[str] = set()
    boundary = 0
    for index, m in enumerate(messages[:count]):
        if m.role == pb.ROLE_TOOL:
            waiting.discard(m.tool_call_id)
        elif m.role == pb.ROLE_ASSISTANT:
            waiting = {c.id for c in m.tool_calls}
        if not waiting:
            boundary = index + 1
    return messages[:boundary] + [bl.user_message(i) for i in range(count - boundary)]


async def create_session(
    stub: Any, messages: Sequence[pb.Message], window: int, prepare: bool = True
) -> tuple[str, pb.PreparedContext | None]:
    sid = (await stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(context_window=window)))).session.id
    await bl.append(stub, sid, messages)
    result = None
    if prepare:
        result = (await bl.prepare(stub, pb.PrepareRequest(session_id=sid))).result
    return str(sid), result


@dataclass
class Template:
    """A session the server wrote, to be cloned: its rows, and what a clone must rewrite."""

    session: Any  # the sessions row
    state: dict[str, Any]
    checkpoint: Any | None  # the checkpoints row (the folded template has exactly one)
    kept_seqs: dict[str, int]  # kept message id -> seq
    pruned_seqs: dict[str, int]  # pruned message id -> seq
    refs: dict[str, int]  # result_ref -> seq


async def load_template(conn: Any, session_id: str) -> Template:
    session = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", session_id)
    state = json.loads(await conn.fetchval("SELECT state_json FROM context_states WHERE session_id = $1", session_id))
    seqs = {
        r["id"]: r["seq"]
        for r in await conn.fetch("SELECT id, seq FROM messages WHERE segment_id = $1", session["segment_id"])
    }
    refs = {
        r["result_ref"]: r["seq"]
        for r in await conn.fetch(
            "SELECT result_ref, seq FROM messages WHERE segment_id = $1 AND result_ref IS NOT NULL",
            session["segment_id"],
        )
    }
    checkpoint = None
    kept: dict[str, int] = {}
    if session["checkpoint_id"]:
        checkpoint = await conn.fetchrow("SELECT * FROM checkpoints WHERE id = $1", session["checkpoint_id"])
        if checkpoint["parent_id"] is not None:
            raise SystemExit("the folded template has more than one checkpoint; use a smaller --per-session")
        kept = {e["id"]: seqs[e["id"]] for e in json.loads(checkpoint["entries_json"]) if e["type"] == "message"}
    pruned = {k: seqs[k] for k in state.get("pruned", {})}
    return Template(session, state, checkpoint, kept, pruned, refs)


def clone_rows(
    template: Template, sid: str, gid: str, cpid: str, ids: dict[int, str], refs: dict[int, str]
) -> tuple[tuple[Any, ...] | None, tuple[Any, ...]]:
    """The checkpoint row (or None) and the context state row of one clone; `ids` and `refs` map the
    template's seqs to the clone's message ids and result refs."""
    ref_map = {ref: refs[seq] for ref, seq in template.refs.items()}
    template_refs = re.compile("|".join(re.escape(r) for r in sorted(ref_map, key=len, reverse=True)) or "(?!)")
    state = dict(template.state)
    state["prompt_cache_key"] = state["prompt_cache_key"].replace(template.session["id"], sid)
    state["pruned"] = {ids[template.pruned_seqs[k]]: v for k, v in state.get("pruned", {}).items()}
    checkpoint_row = None
    if template.checkpoint is not None:
        cp = template.checkpoint
        entries = []
        for entry in json.loads(cp["entries_json"]):
            if entry["type"] == "summary":
                summary = template_refs.sub(lambda m: ref_map[m.group(0)], entry["text"])
                entries.append({"type": "summary", "text": summary})
            elif entry["type"] == "message":
                entries.append({"type": "message", "id": ids[template.kept_seqs[entry["id"]]]})
            else:  # the fold's notes (artifact index, folded-results index ref): copied as they are
                entries.append(entry)
        summary_tokens = estimator.count_text(summary)
        checkpoint_row = (
            cpid,
            cp["tenant"],
            None,
            cp["position_seq"],
            json.dumps(entries),
            summary_tokens,
            cp["tokens_before"],
            cp["tokens_after"],
            cp["create_time"],
        )
        state["checkpoint_id"] = cpid
        state["summary_hash"] = hashlib.sha256(summary.encode()).hexdigest()[:16]
    state["fingerprint"] = fingerprint(gid, cpid if template.checkpoint is not None else None)
    state_row = (sid, json.dumps(state, sort_keys=True, separators=(",", ":")), 1, time.time())
    return checkpoint_row, state_row


CHECKPOINT_COLUMNS = [
    "id",
    "tenant",
    "parent_id",
    "position_seq",
    "entries_json",
    "summary_tokens",
    "tokens_before",
    "tokens_after",
    "create_time",
]


async def clone_chunk(conn: Any, template: Template, first: int, n: int) -> None:
    """`n` clones of `template` in one transaction, all inside PostgreSQL except the checkpoint and
    state rows, whose JSON needs the clone's ids."""
    tid = template.session["id"]
    await conn.execute("DROP TABLE IF EXISTS tmpl_msg, tmpl_tr, fill, fm, newrefs")
    await conn.execute(
        "CREATE TEMP TABLE tmpl_msg AS SELECT * FROM messages WHERE segment_id = $1", template.session["segment_id"]
    )
    await conn.execute(
        # Each message's own result (not the fold's folded-results index stored beside one of them:
        # clones keep the template's fold notes as they are, so their index ref reads nothing).
        "CREATE TEMP TABLE tmpl_tr AS SELECT tr.*, m.seq FROM tool_results tr "
        "JOIN messages m ON m.id = tr.message_id AND m.result_ref = tr.ref WHERE tr.segment_id = $1",
        template.session["segment_id"],
    )
    await conn.execute(
        f"CREATE TEMP TABLE fill AS SELECT 's_' || {NEW_ID} AS sid, 'g_' || {NEW_ID} AS gid, "
        f"'cp_' || {NEW_ID} AS cpid, n FROM generate_series({first}, {first + n - 1}) AS n"
    )
    await conn.execute("CREATE TEMP TABLE newrefs (n bigint, seq bigint, ref text)")
    await conn.copy_records_to_table(
        "newrefs",
        records=[(k, seq, new_result_ref()) for k in range(first, first + n) for seq in template.refs.values()],
    )
    await conn.execute(
        f"CREATE TEMP TABLE fm AS SELECT f.gid, m.seq, 'm_' || {NEW_ID} AS mid, r.ref "
        "FROM fill f CROSS JOIN tmpl_msg m LEFT JOIN newrefs r ON r.n = f.n AND r.seq = m.seq"
    )
    await conn.execute(
        "INSERT INTO segments (id, tenant, parent_id, base_seq, owner_session_id, create_time) "
        "SELECT f.gid, t.tenant, NULL, 0, f.sid, t.create_time + f.n * 0.001 FROM fill f, sessions t WHERE t.id = $1",
        tid,
    )
    fill = await conn.fetch("SELECT sid, gid, cpid FROM fill ORDER BY n")
    needed = sorted({*template.kept_seqs.values(), *template.pruned_seqs.values(), *template.refs.values()})
    ids: dict[str, dict[int, str]] = {}
    refs: dict[str, dict[int, str]] = {}
    for r in await conn.fetch("SELECT gid, seq, mid, ref FROM fm WHERE seq = ANY($1::bigint[])", needed):
        ids.setdefault(r["gid"], {})[r["seq"]] = r["mid"]
        if r["ref"]:
            refs.setdefault(r["gid"], {})[r["seq"]] = r["ref"]
    checkpoints, states = [], []
    for row in fill:
        checkpoint, state = clone_rows(
            template, row["sid"], row["gid"], row["cpid"], ids.get(row["gid"], {}), refs.get(row["gid"], {})
        )
        if checkpoint is not None:
            checkpoints.append(checkpoint)
        states.append(state)
    if checkpoints:
        await conn.copy_records_to_table("checkpoints", records=checkpoints, columns=CHECKPOINT_COLUMNS)
    checkpoint_id = "f.cpid" if template.checkpoint is not None else "NULL"
    await conn.execute(
        "INSERT INTO sessions (id, tenant, config_json, system_tokens, tools_tokens, segment_id, head_seq, "
        "branch_id, checkpoint_id, open_tool_calls, version, forked_from_session_id, forked_at_seq, create_time, "
        f"update_time) SELECT f.sid, t.tenant, replace(t.config_json, t.id, f.sid), t.system_tokens, "
        f"t.tools_tokens, f.gid, t.head_seq, f.gid, {checkpoint_id}, t.open_tool_calls, t.version, NULL, 0, "
        "t.create_time + f.n * 0.001, t.update_time + f.n * 0.001 FROM fill f, sessions t WHERE t.id = $1",
        tid,
    )
    await conn.execute(
        "INSERT INTO messages (id, segment_id, seq, role, content, tool_calls_json, tool_call_id, "
        "reasoning_content, name, pinned, author, tokens, result_ref, raw_bytes, truncated, create_time) "
        "SELECT fm.mid, fm.gid, m.seq, m.role, "
        "CASE WHEN m.truncated THEN replace(m.content, m.result_ref, fm.ref) ELSE m.content END, "
        "m.tool_calls_json, m.tool_call_id, m.reasoning_content, m.name, m.pinned, m.author, m.tokens, fm.ref, "
        "m.raw_bytes, m.truncated, m.create_time FROM fm JOIN tmpl_msg m ON m.seq = fm.seq"
    )
    await conn.execute(
        "INSERT INTO tool_results (ref, segment_id, message_id, codec, data, total_bytes, sha256, chunk_bytes) "
        "SELECT fm.ref, fm.gid, fm.mid, t.codec, t.data, t.total_bytes, t.sha256, t.chunk_bytes "
        "FROM fm JOIN tmpl_tr t ON t.seq = fm.seq"
    )
    await conn.execute(
        "INSERT INTO tool_result_chunks (ref, chunk_index, data) "
        "SELECT fm.ref, c.chunk_index, c.data FROM fm JOIN tmpl_tr t ON t.seq = fm.seq "
        "JOIN tool_result_chunks c ON c.ref = t.ref"
    )
    await conn.copy_records_to_table(
        "context_states", records=states, columns=["session_id", "state_json", "revision", "update_time"]
    )


async def bulk_load(side: Side, template_ids: Sequence[str], count: int, chunk: int) -> dict[str, Any]:
    """`count` clones of the templates (taking turns), `chunk` sessions per transaction."""
    conn = await bl.pg_connect(side.served.database.url)
    started = time.perf_counter()
    try:
        templates = [await load_template(conn, t) for t in template_ids]
        done = 0
        while done < count:
            n = min(chunk, count - done)
            for index, template in enumerate(templates):
                share = n // len(templates) + (1 if index < n % len(templates) else 0)
                if share:
                    async with conn.transaction():
                        await clone_chunk(conn, template, done + 1, share)
                    done += share
            bl.log(f"bulk load: {done:,}/{count:,} sessions ({time.perf_counter() - started:.0f}s)")
        load_seconds = time.perf_counter() - started
        await conn.execute("ANALYZE")
        analyze_seconds = time.perf_counter() - started - load_seconds
        database_bytes = await conn.fetchval("SELECT pg_database_size(current_database())")
    finally:
        await conn.close()
    return {
        "cloned_sessions": count,
        "load_seconds": load_seconds,
        "analyze_seconds": analyze_seconds,
        "database_bytes": int(database_bytes),
    }


async def pick_clones(side: Side, exclude: set[str], count: int, folded: bool) -> list[str]:
    """Random bulk-loaded sessions of one template."""
    conn = await bl.pg_connect(side.served.database.url)
    try:
        condition = "IS NOT NULL" if folded else "IS NULL"
        rows = await conn.fetch(f"SELECT id FROM sessions WHERE checkpoint_id {condition}")
    finally:
        await conn.close()
    ids = sorted(r["id"] for r in rows if r["id"] not in exclude)
    return random.Random(7).sample(ids, min(count, len(ids)))


async def verify_clones(side: Side, session_ids: Sequence[str]) -> int:
    """The server reads bulk-loaded sessions as its own: the stored state is valid (no maintenance),
    the view carries the cloned checkpoint's summary, and a result_ref it names reads back."""
    stub = side.served.stub
    for sid in session_ids:
        session = (await stub.GetSession(pb.GetSessionRequest(session_id=sid))).session
        outcome = await bl.prepare(stub, pb.PrepareRequest(session_id=sid))
        result = outcome.result
        if result.action != pb.ACTION_NONE or result.checkpoint_id != session.checkpoint_id:
            raise SystemExit(f"bulk-loaded session {sid} is not what the server would have written: {result.action}")
        if session.checkpoint_id and not any(m.summary for m in result.messages):
            raise SystemExit(f"bulk-loaded session {sid}: no summary in its view")
        # A result the view names (the summary names the fold's index, which clones do not copy).
        refs = [m.result_ref for m in result.messages if m.result_ref]
        for ref in refs[:1]:
            page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=sid, result_ref=ref))
            if page.total_bytes <= 0:
                raise SystemExit(f"bulk-loaded session {sid}: {ref} does not read back")
    return len(session_ids)


# ---- measurement ----------------------------------------------------------------------------------


async def measure(side: Side, session_ids: Sequence[str], calls: int) -> list[float]:
    latencies: list[float] = []
    for sid in session_ids:
        for _ in range(calls):
            side.step += 1
            request = pb.PrepareRequest(
                session_id=sid, append=[bl.user_message(side.step)], known_view_version=side.versions.get(sid, 0)
            )
            outcome = await bl.prepare(side.served.stub, request)
            if outcome.result.action != pb.ACTION_NONE:
                raise SystemExit(f"a measured Prepare did maintenance ({outcome.result.action}); not append-only")
            side.versions[sid] = outcome.result.view_version
            latencies.append(outcome.seconds)
    return latencies


async def captured(side: Side, action: Any) -> list[tuple[str, Any]]:
    side.capture.statements = []
    side.capture.on = True
    try:
        await action()
    finally:
        side.capture.on = False
    return list(side.capture.statements)


async def run(opts: Options) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ctxfold-scale-") as tmp:
        return await run_sides(opts, Path(tmp))


async def delete_session(side: Side, session_id: str) -> float:
    started = time.perf_counter()
    await side.served.stub.DeleteSession(pb.DeleteSessionRequest(session_id=session_id))
    return time.perf_counter() - started


async def run_sides(opts: Options, tmp: Path) -> dict[str, Any]:
    sides: dict[str, Side] = {}
    try:
        for name in ("small", "big"):
            database = await bl.fresh_database("postgresql", tmp / name, opts.postgres_url, f"scale_{name}")
            # No hot-state cache: every Prepare takes the cold load (what a cache miss, a restart or
            # another replica's write costs), which is the path whose plans depend on the database size.
            served = await bl.serve_in_process(database, tmp / name, hot_state_max_bytes=0)
            capture = Capture()
            event.listen(served.server.store.engine.sync_engine, "before_cursor_execute", capture)
            sides[name] = Side(name, served, capture)
        source = bl.MessageSource(opts.traces)
        template_messages = exactly(source, opts.per_session)
        # a window whose trigger lies below the template, so that the first Prepare folds
        folded_window = max(8000, int(sum(bl.message_tokens(m) for m in template_messages) * 0.9))
        # the template, written by the server itself, in the big database
        big, small = sides["big"], sides["small"]
        template_id, _ = await create_session(big.served.stub, template_messages, TEMPLATE_WINDOW)
        folded_template_id, _ = await create_session(big.served.stub, template_messages, folded_window)
        # measured sessions, the same in both databases
        for side in (small, big):
            for _ in range(opts.folded):
                sid, result = await create_session(side.served.stub, template_messages, folded_window)
                assert result is not None and result.checkpoint_id, "a folded probe did not fold"
                side.folded.append(sid)
        for _ in range(opts.plain):
            sid, _ = await create_session(small.served.stub, template_messages, TEMPLATE_WINDOW)
            small.plain.append(sid)
        per = len(template_messages)
        clones = max(0, min(opts.sessions - 2 - opts.folded, opts.messages // per - 2 - opts.folded))
        bl.log(f"template: {per} messages; cloning {clones:,} sessions into the big database")
        load = await bulk_load(big, [template_id, folded_template_id], clones, opts.chunk)
        templates = set(big.folded) | {template_id, folded_template_id}
        big.plain = await pick_clones(big, templates, opts.plain, folded=False)
        verified = await verify_clones(big, await pick_clones(big, templates | set(big.plain), 5, folded=True))
        verified += await verify_clones(big, await pick_clones(big, templates | set(big.plain), 2, folded=False))
        rows = {name: await bl.row_counts(side.served.database) for name, side in sides.items()}
        bl.log(f"big database: {rows['big']['sessions']:,} sessions, {rows['big']['messages']:,} messages")
        for side in sides.values():  # warm-up
            await measure(side, side.folded[:2] + side.plain[:2], 2)
        rounds: list[dict[str, Any]] = []
        for index in range(opts.rounds):
            order = bl.round_order([small, big], index)
            result: dict[str, Any] = {side.name: {} for side in order}
            for kind in ("folded", "plain"):
                for side in order:
                    result[side.name][kind] = await measure(side, getattr(side, kind), opts.calls)
            rounds.append(result)
            bl.log(f"round {index + 1}/{opts.rounds} done")
        plans: dict[str, dict[str, Any]] = {}
        delete_times: dict[str, list[float]] = {}
        for side in order_sides(sides):
            sid = side.folded[0]
            request = pb.PrepareRequest(
                session_id=sid, append=[bl.user_message(0)], known_view_version=side.versions.get(sid, 0)
            )
            prepare_statements = await captured(side, lambda s=side, r=request: bl.prepare(s.served.stub, r))
            plans[side.name] = {"prepare": await explain(side.served.database.url, prepare_statements)}
            # DeleteSession of measured-shape sessions made for it (the folded probes stay)
            victims = [
                (await create_session(side.served.stub, template_messages, folded_window))[0]
                for _ in range(opts.deletes)
            ]
            delete_times[side.name] = []
            delete_statements = await captured(
                side, lambda s=side, v=victims[0]: record(delete_times[s.name], delete_session(s, v))
            )
            for victim in victims[1:]:
                delete_times[side.name].append(await delete_session(side, victim))
            # re-create the deleted session's rows for EXPLAIN would change the DB; plan the GC as issued
            plans[side.name]["delete"] = await explain(side.served.database.url, delete_statements)
    finally:
        for side in sides.values():
            await bl.close_served(side.served)
    load["verified_clones"] = verified
    return report(opts, rows, load, rounds, plans, delete_times, per)


async def record(times: list[float], call: Awaitable[float]) -> None:
    times.append(await call)


def order_sides(sides: dict[str, Side]) -> list[Side]:
    return [sides["small"], sides["big"]]


def report(
    opts: Options,
    rows: dict[str, dict[str, int]],
    load: dict[str, Any],
    rounds: list[dict[str, Any]],
    plans: dict[str, dict[str, Any]],
    delete_times: dict[str, list[float]],
    per_session: int,
) -> dict[str, Any]:
    cells: dict[str, dict[str, dict[str, float]]] = {}
    for name in ("small", "big"):
        cells[name] = {}
        for kind in ("folded", "plain"):
            rpc = [x for r in rounds for x in r[name][kind]]
            cells[name][kind] = {
                **bl.latency_summary(rpc),
                "p50_ms_per_round": [bl.percentile(r[name][kind], 50) * 1e3 for r in rounds],
            }
        cells[name]["delete"] = {
            "p50_ms": bl.percentile(delete_times[name], 50) * 1e3,
            "max_ms": max(delete_times[name]) * 1e3 if delete_times[name] else 0.0,
            "calls": len(delete_times[name]),
        }
    ratio = {
        kind: {
            k: cells["big"][kind][k] / cells["small"][kind][k]
            for k in ("p50_ms", "p99_ms" if kind != "delete" else "max_ms")
        }
        for kind in ("folded", "plain", "delete")
    }
    return {
        "machine": bl.machine(),
        "settings": {
            "sessions": opts.sessions,
            "messages": opts.messages,
            "messages_per_session": per_session,
            "folded_sessions": opts.folded,
            "plain_sessions": opts.plain,
            "calls_per_session_and_round": opts.calls,
            "rounds": opts.rounds,
        },
        "rows": rows,
        "bulk_load": load,
        "prepare": cells,
        "big_over_small": ratio,
        "plans": plans,
        "rounds": rounds,
    }


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    m = result["machine"]
    rows, load = result["rows"], result["bulk_load"]
    lines = [
        f"ctxfold scale on PostgreSQL: {s['rounds']} interleaved rounds; {m['cpus']} CPUs, load average "
        f"{m['load_average'][0]}, Python {m['python']}",
        f"small database: {rows['small']['sessions']:,} sessions, {rows['small']['messages']:,} messages; "
        f"big database: {rows['big']['sessions']:,} sessions, {rows['big']['messages']:,} messages, "
        f"{rows['big']['tool_results']:,} raw tool results, {load['database_bytes'] / 2**20:,.0f} MiB "
        f"(bulk load {load['load_seconds']:.0f}s + ANALYZE {load['analyze_seconds']:.0f}s)",
        f"Prepare appends one message, delta view; {s['calls_per_session_and_round']} calls per session and round; "
        "RPC time as the client sees it, ms",
        "",
    ]
    header = ["sessions", "database", "calls", "p50", "p99", "big/small p50"]
    table_rows = []
    for kind, title in (("folded", f"folded ({s['folded_sessions']})"), ("plain", f"plain ({s['plain_sessions']})")):
        for name in ("small", "big"):
            c = result["prepare"][name][kind]
            ratio = result["big_over_small"][kind]["p50_ms"] if name == "big" else None
            table_rows.append(
                [
                    title if name == "small" else "",
                    name,
                    c["calls"],
                    c["p50_ms"],
                    c["p99_ms"],
                    f"x{ratio:.2f}" if ratio is not None else "",
                ]
            )
    lines.append(bl.render_table(header, table_rows, align_left=2))
    small_delete, big_delete = result["prepare"]["small"]["delete"], result["prepare"]["big"]["delete"]
    lines += [
        "",
        f"DeleteSession (RPC, p50 of {small_delete['calls']}): small {small_delete['p50_ms']:.1f} ms, "
        f"big {big_delete['p50_ms']:.1f} ms (x{result['big_over_small']['delete']['p50_ms']:.2f})",
        "",
        "query plans (EXPLAIN ANALYZE of the statements one Prepare / one DeleteSession sent; big database):",
    ]
    plan_rows = []
    small_plans = result["plans"]["small"]
    for what in ("prepare", "delete"):
        for index, entry in enumerate(result["plans"]["big"][what]):
            small_entry = small_plans[what][index] if index < len(small_plans[what]) else None
            plan_rows.append(
                [
                    what,
                    entry["label"],
                    "; ".join(dict.fromkeys(entry["scans"])) or "(no scan)",
                    _ms(small_entry["execution_ms"] if small_entry else None),
                    _ms(entry["execution_ms"]),
                ]
            )
    lines.append(bl.render_table(["rpc", "statement", "scans (big)", "small ms", "big ms"], plan_rows, align_left=3))
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, str | None]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000, help="sessions in the big database (default 10000)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="stored messages in the big database")
    parser.add_argument("--per-session", type=int, default=100, help="messages of the template session")
    parser.add_argument("--folded", type=int, default=8, help="measured folded sessions per database")
    parser.add_argument("--plain", type=int, default=8, help="measured plain sessions per database")
    parser.add_argument("--calls", type=int, default=10, help="Prepare calls per session and round")
    parser.add_argument("--deletes", type=int, default=5, help="DeleteSession calls timed per database")
    parser.add_argument("--chunk", type=int, default=1000, help="sessions cloned per transaction")
    parser.add_argument("--quick", action="store_true", help="300 sessions, 30k messages, fewer calls: a smoke run")
    bl.add_common_arguments(parser, rounds=5, backends=False)
    args = parser.parse_args(argv)
    postgres_url = bl.postgres_url_arg(args.postgres_url)
    if not postgres_url:
        parser.error("needs PostgreSQL: set CTXFOLD_TEST_POSTGRES_URL or --postgres-url")
    if not ID_FORMAT.fullmatch(new_id("x")):
        parser.error(f"the server's id format changed ({new_id('x')!r}); update NEW_ID in bench/scale.py")
    if args.quick:
        args.sessions, args.messages, args.folded, args.plain = 300, 30_000, 2, 2
        args.calls, args.rounds, args.deletes, args.chunk = 3, 1, 2, 150
    if min(args.sessions, args.messages, args.per_session, args.folded, args.plain, args.calls, args.rounds) < 1:
        parser.error("all counts must be positive")
    if args.deletes < 1 or args.chunk < 1:
        parser.error("--deletes and --chunk must be positive")
    opts = Options(
        sessions=args.sessions,
        messages=args.messages,
        per_session=args.per_session,
        folded=args.folded,
        plain=args.plain,
        calls=args.calls,
        rounds=args.rounds,
        deletes=args.deletes,
        chunk=args.chunk,
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

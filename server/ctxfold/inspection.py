"""`ctxfold sessions` and `ctxfold show SESSION`: read-only gRPC views of a running server for operators, with
`ctxfold replay`'s connection flags. The rendering is pure (`render_*`), the calls a thin shell around it."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from ctxfold_client import AsyncClient, Checkpoint, CtxfoldError, Session
from google.protobuf.json_format import MessageToDict

from ctxfold.config import TOKEN_ENV

DEFAULT_SERVER = "127.0.0.1:50051"


class InspectError(Exception):
    """A failure to report in one line: unreachable server, unreadable CA file, an RPC error."""


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=DEFAULT_SERVER, help=f"server address host:port (default {DEFAULT_SERVER})")
    parser.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV, ""), help=f"bearer token (default: ${TOKEN_ENV}, else none)"
    )
    parser.add_argument("--tls-ca", default="", help="PEM CA bundle: connect with TLS (default: plaintext)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per call (default 10)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (default: text)")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sessions = sub.add_parser(
        "sessions",
        help="list the sessions of a running server, newest first",
        description="List the sessions of a running ctxfold server (the caller's tenant), newest first.",
    )
    _connection_flags(sessions)
    sessions.add_argument("--limit", type=int, default=20, help="sessions to list (default 20)")
    show = sub.add_parser(
        "show",
        help="show one session: view, checkpoint chain with summaries, cache state, last receipts",
        description=(
            "Show one session of a running ctxfold server: its view, its checkpoint chain with each summary "
            "and its tokens, the prompt-cache state and the last maintenance receipts."
        ),
    )
    show.add_argument("session", help="the session id")
    _connection_flags(show)
    show.add_argument("--receipts", type=int, default=5, help="maintenance receipts to show (default 5)")
    show.add_argument("--abandoned", action="store_true", help="also checkpoints of abandoned branches (default off)")


def _when(moment: datetime | float | None) -> str:
    """A time as UTC text: a datetime (the SDK's) or epoch seconds (a receipt's); "-" when unset."""
    if isinstance(moment, int | float):
        moment = datetime.fromtimestamp(moment, UTC) if moment else None
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if moment else "-"


def render_sessions(sessions: Sequence[Session]) -> str:
    if not sessions:
        return "no sessions"
    rows = [("SESSION", "CREATED", "HEAD SEQ", "WINDOW", "SUMMARIZER", "CHECKPOINT", "FORKED FROM")]
    rows += [
        (
            s.id,
            _when(s.create_time),
            str(s.head_seq),
            f"{s.config.context_window:,}",
            s.config.summarizer or "-",
            s.checkpoint_id or "-",
            f"{s.forked_from_session_id}@{s.forked_at_seq}" if s.forked_from_session_id else "-",
        )
        for s in sessions
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


@dataclass(frozen=True)
class SessionReport:
    session: Session
    checkpoints: list[Checkpoint]
    state: dict[str, Any]  # GetContextState's JSON


def background_fold(receipts: Sequence[dict[str, Any]]) -> str:
    """The background fold as the receipts say: prepared or failed ("" when installed, discarded or none ran)."""
    for r in reversed(receipts):
        if r.get("action") == "background" and r.get("status") in ("prepared", "failed"):
            made = int(r.get("tokens_in", 0))
            if r["status"] == "failed":
                return f"background fold: failed at {made:,} tokens ({r.get('reason', '')}); the trigger folds itself"
            return f"background fold: prepared at {made:,} tokens, installed at the trigger ({r.get('reason', '')})"
        if r.get("action") == "background" or "prepared in the background" in str(r.get("reason", "")):
            return ""
    return ""


def render_show(report: SessionReport, receipts: int, now: float) -> str:
    s, state = report.session, report.state
    config = s.config
    lines = [
        f"session {s.id}",
        f"  created {_when(s.create_time)}, updated {_when(s.update_time)}, head seq {s.head_seq}",
        f"  window {config.context_window:,} tokens, compact at {config.compact_ratio:.2f}, "
        f"summarizer {config.summarizer or 'extractive'}"
        + (f", background folds from {config.prefold_ratio:.2f}" if config.prefold_ratio else ""),
    ]
    if s.forked_from_session_id:
        lines.append(f"  forked from {s.forked_from_session_id} at seq {s.forked_at_seq}")
    head = next((c for c in report.checkpoints if c.id == s.checkpoint_id), None)
    pruned = state.get("pruned") or {}
    view = [f"view: ~{state.get('projection_tokens', 0):,} tokens of messages"]
    if state.get("source_tokens"):
        view.append(f"({state['source_tokens']:,} before the last maintenance, {len(pruned)} tool results pruned)")
    if head is not None:
        view.append(
            f"after checkpoint {head.id} (summary {head.summary_tokens:,} tokens covering seq 1..{head.position_seq}, "
            f"{len(head.kept_message_ids)} covered messages kept verbatim)"
        )
    else:
        view.append("(nothing folded)")
    lines += ["", " ".join(view)]
    background = background_fold(state.get("receipts") or [])
    if background:
        lines.append(background)
    last = float(state.get("last_activity") or 0)
    idle = f", last activity {now - last:.0f} s ago" if last else ""
    lines.append(
        f"cache: {state.get('cache_state', 'unknown')} (key {state.get('prompt_cache_key') or '-'}{idle}), "
        f"calibration {float(state.get('calibration', 1.0)):.3f}"
    )
    lines += [
        "",
        f"checkpoints ({len(report.checkpoints)}, newest first):" if report.checkpoints else "checkpoints: none",
    ]
    for c in report.checkpoints:
        marks = ["head" if c.id == s.checkpoint_id else "", "" if c.on_head_chain else "abandoned"]
        flags = ", ".join(m for m in marks if m)
        lines.append(
            f"  {c.id}  seq ≤ {c.position_seq}  {c.summary_tokens:,} tokens  {_when(c.create_time)}"
            + (f"  [{flags}]" if flags else "")
            + (f"  parent {c.parent_id}" if c.parent_id else "")
        )
        lines.append("\n".join(f"      {line}" if line else line for line in c.summary.splitlines()))
    shown = list(state.get("receipts") or [])[-receipts:] if receipts > 0 else []
    lines += ["", f"receipts (last {len(shown)}, oldest first):" if shown else "receipts: none"]
    for r in shown:
        reason = f"  {r['reason']}" if r.get("reason") else ""
        lines.append(
            f"  {_when(float(r.get('time', 0)))}  {r.get('action', '?')} {r.get('status', '?')}  "
            f"{int(r.get('tokens_in', 0)):,} -> {int(r.get('tokens_out', 0)):,} tokens{reason}"
        )
    return "\n".join(lines)


async def _report(client: AsyncClient, session_id: str, abandoned: bool) -> SessionReport:
    session = await client.get_session(session_id)
    checkpoints = [c async for c in client.list_checkpoints(session_id, include_abandoned=abandoned, page_size=100)]
    return SessionReport(session, checkpoints, dict(await client.get_context_state(session_id)))


async def _run(args: argparse.Namespace) -> str:
    try:
        async with AsyncClient(
            args.server, token=args.token or None, ca_cert=args.tls_ca or None, timeout=args.timeout
        ) as client:
            if args.command == "sessions":
                sessions = []
                async for session in client.list_sessions(page_size=min(args.limit, 100)):
                    sessions.append(session)
                    if len(sessions) == args.limit:
                        break
                if args.json:
                    return json.dumps([MessageToDict(s.to_proto()) for s in sessions], indent=2)
                return render_sessions(sessions)
            report = await _report(client, args.session, args.abandoned)
    except CtxfoldError as error:
        unreachable = error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        where = f"cannot reach {args.server}: " if unreachable else ""
        raise InspectError(f"{where}{error.code.name}: {error.message}") from None
    if args.json:
        document = {
            "session": MessageToDict(report.session.to_proto()),
            "checkpoints": [MessageToDict(c.to_proto()) for c in report.checkpoints],
            "state": report.state,
        }
        return json.dumps(document, indent=2)
    return render_show(report, args.receipts, time.time())


def run(args: argparse.Namespace) -> int:
    if args.command == "sessions" and args.limit <= 0:
        raise InspectError("--limit must be > 0")
    print(asyncio.run(_run(args)))
    return 0

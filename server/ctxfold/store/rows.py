"""The store's records and the one row mapper of each, both ways (sessions, messages, raw results, checkpoints),
so a new field is added here and in its schema column only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import zstandard

from ctxfold.engine.briefing import FoldNotes
from ctxfold.engine.context import Appended, AppendedResult, Context, SessionRecord, Step
from ctxfold.engine.ids import new_id
from ctxfold.engine.model import (
    Author,
    ProviderPayload,
    Role,
    StoredMessage,
    ToolCall,
    Usage,
    text_chars,
)
from ctxfold.engine.state import stored_document
from ctxfold.engine.tool_results import sha256_hex
from ctxfold.engine.view import Checkpoint
from ctxfold.store.append import AppendRows, AppendWrite, Bookkeeping


@dataclass(frozen=True)
class RawResult:
    ref: str
    data: bytes
    sha256: str


@dataclass(frozen=True)
class EncodedResult:
    """A raw result as stored: its tool_results row (segment aside) and its tool_result_chunks rows."""

    row: dict[str, object]
    chunks: list[dict[str, object]]


@dataclass(frozen=True)
class ConfigTokens:
    system: int
    tools: int


@dataclass(frozen=True)
class BranchPoint:
    parent_segment_id: str | None
    seq: int
    checkpoint_id: str | None
    open_tool_calls: tuple[str, ...]


def _columns(row: object) -> Any:
    return row._mapping  # type: ignore[attr-defined]


_SESSION_FIELDS = tuple(f.name for f in fields(SessionRecord))


def session_from_row(row: object) -> SessionRecord:
    m = _columns(row)
    values = {name: m[name] for name in _SESSION_FIELDS}
    return SessionRecord(**{**values, "open_tool_calls": tuple(json.loads(m["open_tool_calls"]))})


def branch_values(point: BranchPoint, segment_id: str) -> dict[str, object]:
    """The columns of a session whose new branch (Create, Fork, Rewind) starts at `point`, its head in `segment_id`."""
    return {
        "segment_id": segment_id,
        "head_seq": point.seq,
        "branch_id": new_id("b"),
        "checkpoint_id": point.checkpoint_id,
        "open_tool_calls": json.dumps(list(point.open_tool_calls)),
    }


# The message fields converted below (or not stored: `abandoned`); every other is a column of the same name.
_MESSAGE_CONVERTED = ("role", "tool_calls", "tool_call_id", "result_ref", "abandoned", "payload", "author")
_MESSAGE_COLUMNS = tuple(f.name for f in fields(StoredMessage) if f.name not in _MESSAGE_CONVERTED)


def message_from_row(row: object, abandoned: bool = False) -> StoredMessage:
    m = _columns(row)
    calls = tuple(ToolCall(**c) for c in json.loads(m["tool_calls_json"])) if m["tool_calls_json"] else ()
    return StoredMessage(
        **{name: m[name] for name in _MESSAGE_COLUMNS},
        role=Role(m["role"]),
        tool_calls=calls,
        tool_call_id=m["tool_call_id"] or "",
        result_ref=m["result_ref"] or "",
        abandoned=abandoned,
        payload=ProviderPayload(**json.loads(m["provider_payload_json"])) if m["provider_payload_json"] else None,
        author=Author(m["author"]),
    )


def message_values(message: StoredMessage, segment_id: str) -> dict[str, object]:
    """The columns of `message`'s row in `segment_id` (the inverse of `message_from_row`)."""
    return {
        **{name: getattr(message, name) for name in _MESSAGE_COLUMNS},
        "segment_id": segment_id,
        "role": message.role.value,
        "tool_calls_json": json.dumps([c.__dict__ for c in message.tool_calls]) if message.tool_calls else None,
        "tool_call_id": message.tool_call_id or None,
        "author": message.author.value,
        "result_ref": message.result_ref or None,
        "provider_payload_json": json.dumps(message.payload.__dict__) if message.payload else None,
    }


# Raw results below this size are stored uncompressed; compression costs more than it saves.
_COMPRESS_MIN_BYTES = 1024
ZSTD_LEVEL = 3
# Longer results are stored in chunks of this many raw bytes, each compressed on its own, so a page read
# (at most 24 KiB) costs at most two chunks or one whole result of at most one chunk, whatever the size.
CHUNK_BYTES = 64 << 10


def encode_result(ref: str, message_id: str, raw: bytes, *, inline: bool = False) -> EncodedResult:
    """How `raw` is stored: only its identity when it is the message content (`inline`) of at most one
    chunk, whole when small, else in independently compressed chunks. The sha256 is of the whole result."""
    row: dict[str, object] = {
        "ref": ref,
        "message_id": message_id,
        "codec": "inline",
        "data": b"",
        "total_bytes": len(raw),
        "sha256": sha256_hex(raw),
        "chunk_bytes": None,
    }
    if inline and len(raw) <= CHUNK_BYTES:
        return EncodedResult(row, [])
    if len(raw) < _COMPRESS_MIN_BYTES:
        return EncodedResult({**row, "codec": "identity", "data": raw}, [])
    # A compressor per call: they are not thread-safe, and encoding runs in the CPU pool's workers.
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    view = memoryview(raw)
    chunks: list[dict[str, object]] = [
        {"ref": ref, "chunk_index": index, "data": compressor.compress(view[start : start + CHUNK_BYTES])}
        for index, start in enumerate(range(0, len(raw), CHUNK_BYTES))
    ]
    return EncodedResult({**row, "codec": "zstd_chunks", "chunk_bytes": CHUNK_BYTES}, chunks)


def checkpoint_from_row(row: object, id_column: str = "id") -> Checkpoint:
    """The checkpoint of a `checkpoints` row (or of a `prepared_folds` row, whose id is `checkpoint_id`)."""
    m = _columns(row)
    entries = json.loads(m["entries_json"])
    summary = next(e["text"] for e in entries if e["type"] == "summary")
    kept = tuple(e["id"] for e in entries if e["type"] == "message")
    notes = next((FoldNotes.from_json(e["notes"]) for e in entries if e["type"] == "notes"), None)
    native = next(
        (ProviderPayload(e["format"], e["json"], "", e["tokens"]) for e in entries if e["type"] == "native"), None
    )
    return Checkpoint(
        m[id_column], m["parent_id"], m["position_seq"], summary, m["summary_tokens"], kept, notes, native
    )


def checkpoint_values(checkpoint: Checkpoint) -> dict[str, object]:
    """The columns a checkpoint's row and a prepared fold's share (read back by `checkpoint_from_row`)."""
    entries: list[dict[str, object]] = [{"type": "summary", "text": checkpoint.summary}]
    entries += [{"type": "message", "id": kept_id} for kept_id in checkpoint.kept_ids]
    if checkpoint.notes is not None:
        entries.append({"type": "notes", "notes": checkpoint.notes.to_json()})
    native = checkpoint.native
    if native is not None:
        entries.append({"type": "native", "format": native.format, "json": native.json, "tokens": native.tokens})
    columns = {"parent_id": checkpoint.parent_id, "position_seq": checkpoint.position_seq}
    return {**columns, "entries_json": json.dumps(entries), "summary_tokens": checkpoint.summary_tokens}


def state_document(row: object) -> str:
    """The stored state of a context_states row (`stored_document`: the store knows nothing of either column)."""
    m = _columns(row)
    return stored_document(str(m["state_json"]), m["bookkeeping_json"])


def append_write(
    seen: SessionRecord,
    after: SessionRecord,
    messages: Sequence[StoredMessage],
    results: Sequence[AppendedResult],
    request_id: str = "",
    bookkeeping: Bookkeeping | None = None,
    usage: Usage | None = None,
) -> AppendWrite:
    """The write that makes `seen` into `after` by appending `messages` (stored forms, with seqs) and their raw
    `results` (compressed and hashed here: zstd and hashlib release the GIL in `cpu.run`'s workers)."""
    now, rows = after.update_time, None
    if messages:
        encoded = [encode_result(r.ref, r.message_id, r.data, inline=r.inline) for r in results]
        rows = AppendRows(
            head={
                "head_seq": after.head_seq,
                "open_tool_calls": json.dumps(list(after.open_tool_calls)),
                "version": after.version,
                "update_time": now,
            },
            request=_request_row(seen.id, request_id, messages, now) if request_id else None,
            messages=[message_values(m, seen.segment_id) for m in messages],
            results=[{**e.row, "segment_id": seen.segment_id} for e in encoded],
            chunks=[c for e in encoded for c in e.chunks],
        )
    usage_row = None if usage is None else {"session_id": seen.id, **asdict(usage), "create_time": now}
    data = sum(len(r.data) for r in results if not r.inline)
    size = text_chars(messages) + data + (len(bookkeeping.json) if bookkeeping else 0)
    return AppendWrite(seen, now, rows, size, request_id, bookkeeping, usage_row)


def _request_row(session_id: str, request_id: str, messages: Sequence[StoredMessage], now: float) -> dict[str, object]:
    """What a repeated `request_id` answers: the ids of the messages its first append stored."""
    ids = json.dumps([m.id for m in messages])
    return {"session_id": session_id, "request_id": request_id, "message_ids_json": ids, "create_time": now}


def step_write(step: Step, context: Context, now: float, request_id: str) -> tuple[Appended, AppendWrite]:
    """`step` on `context` at the store's time `now`, and the write it makes: one piece of work for `cpu.run`."""
    appended = step(context, now)
    book = appended.bookkeeping()
    bookkeeping = Bookkeeping(book[0], context.revision, book[1]) if book else None
    rest = (appended.messages, appended.results, request_id, bookkeeping, appended.usage)
    return appended, append_write(context.session, appended.context.session, *rest)


# The engine's `Usage` fields a row holds, in the order the PostgreSQL write passes them.
USAGE_FIELDS = tuple(f.name for f in fields(Usage))

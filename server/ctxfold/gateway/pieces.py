"""The unit the gateway reconciles: a *piece* is the part of an agent's request that becomes one
canonical message (a Chat message; an Anthropic assistant turn, or one tool_result block, or the
other blocks of a user turn; a Responses input item, or the run of output items of one assistant
turn). Its `source` is the provider JSON as the agent sent it; its fingerprint is a digest of that
JSON without `cache_control` (agents move their cache breakpoints from turn to turn, which changes
nothing the model reads)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson
from ctxfold_client import Message, ProviderPayload, Role

from ctxfold import cpu

Json = Any  # a value parsed from JSON: dict, list, str, int, float, bool or None
CACHE_CONTROL = "cache_control"
# Requests of more JSON objects than this are read, reconciled and rewritten in the CPU pool
# (`work_size`): up to ~20 ms of the event loop at once, against a thread hop per step beyond (in
# `bench/gateway.py --api anthropic`, which always takes the full path, hops cost 15-20 % of req/s).
OFFLOAD_MIN_OBJECTS = 1000
# orjson reads an integer outside 64 bits as a float (12345678901234567890123 comes back 1.2345678901234568e+22);
# every such literal has 19 digits in a row, which `loads` finds with a byte translation (memchr-fast).
_DIGITS = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_NUMBER = b"0" * 19
_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1


def loads(raw: bytes | str) -> Json:
    """JSON as orjson reads it (orjson.JSONDecodeError), but for integers beyond 64 bits: kept as the
    agent wrote them (`orjson.Fragment`, written back byte for byte), so a tool's input reaches the
    upstream and the transcript unchanged. Rare: only then is the text read again, by the standard library."""
    value = orjson.loads(raw)
    data = raw.encode() if isinstance(raw, str) else raw
    if _LONG_NUMBER not in data.translate(_DIGITS):
        return value
    try:
        exact: Json = json.loads(data, parse_int=_exact_int)
    except RecursionError:  # nested deeper than the standard library reads (orjson reads 1,024 levels)
        return value
    return exact


def _exact_int(literal: str) -> int | orjson.Fragment:
    number = int(literal)
    return number if _INT64_MIN <= number <= _UINT64_MAX else orjson.Fragment(literal)


def work_size(raw: bytes) -> int:
    """The size `cpu.run` is told of the work on a request's history: at least its threshold when the
    JSON has more than `OFFLOAD_MIN_OBJECTS` objects, else 0. That work (pieces, fingerprints, canonical
    messages, the rewritten view) is Python per message, ~20 µs each, and every message is at least one
    object; per byte it is orjson's and hashlib's, fast in C. Fewer run at once: a hop costs more."""
    return max(len(raw), cpu.OFFLOAD_MIN_BYTES) if raw.count(b"{") > OFFLOAD_MIN_OBJECTS else 0


class Piece(NamedTuple):
    """A tuple: a long history makes hundreds of pieces per request, and a tuple is built in C."""

    role: Role
    source: Json


def without_cache_control(value: Json) -> Json:
    """`value` with every `cache_control` key removed, at any depth."""
    if isinstance(value, dict):
        return {k: without_cache_control(v) for k, v in value.items() if k != CACHE_CONTROL}
    if isinstance(value, list):
        return [without_cache_control(v) for v in value]
    return value


def stable_json(source: Json) -> bytes:
    """The source as compact JSON without cache breakpoints: what a fingerprint digests and a payload
    stores. Most sources have no breakpoint and are serialized once."""
    raw = orjson.dumps(source)
    return orjson.dumps(without_cache_control(source)) if b'"cache_control"' in raw else raw


def fingerprint(api: str, piece: Piece) -> str:
    digest = hashlib.sha256(f"{api}\x00{piece.role.value}\x00".encode())
    digest.update(stable_json(piece.source))
    return digest.hexdigest()[:32]


def respelled_text(content: Json, kind: str) -> Json | None:
    """Text written the other way an API takes it: a string as one block of type `kind`, one such block
    (and its breakpoint) as its string; None for anything else."""
    if isinstance(content, str):
        return [{"type": kind, "text": content}]
    block = without_cache_control(content[0]) if isinstance(content, list) and len(content) == 1 else None
    if isinstance(block, dict) and block.keys() == {"type", "text"} and block["type"] == kind:
        text: Json = block["text"]
        return text if isinstance(text, str) else None
    return None


def request_fingerprints(
    api: str, pieces: Sequence[Piece], known: Sequence[str], known_json: bytes
) -> tuple[list[str], bytes]:
    """The fingerprints of a request's pieces, and the JSON of the pieces that vouches for them.

    `known` are the fingerprints of a previous request's pieces and `known_json` their JSON. When
    that JSON is a prefix of this request's, ending at a piece boundary (JSON values delimit
    themselves, so the first pieces are then byte-identical), their fingerprints are reused and only
    the new pieces are hashed: an appended turn costs one serialization and one comparison of the
    history, not a digest of every message."""
    current = orjson.dumps([(role, source) for role, source in pieces])  # Role is an IntEnum: a number
    reusable = (
        0 < len(known) <= len(pieces)
        and current.startswith(known_json[:-1])
        and current[len(known_json) - 1 : len(known_json)] in (b",", b"]")
    )
    if reusable:
        return [*known, *(fingerprint(api, piece) for piece in pieces[len(known) :])], current
    return [fingerprint(api, piece) for piece in pieces], current


def with_payload(api: str, piece: Piece, message: Message, plain: Json, tokens: int) -> Message:
    """`message` carrying its provider payload: the fingerprint always, the source JSON when the
    canonical fields do not render it (`plain` is what they render) or are all empty (the server
    refuses a message with no text, calls, reasoning or payload JSON, and agents do send empty ones:
    the whole request went without ctxfold), the attachments' tokens."""
    stable = without_cache_control(piece.source)
    empty = not (message.content or message.tool_calls or message.reasoning_content)
    json_text = "" if stable == plain and not empty else orjson.dumps(stable).decode()
    payload = ProviderPayload(format=api, json=json_text, fingerprint=fingerprint(api, piece), tokens=tokens)
    return Message(
        role=message.role,
        content=message.content,
        tool_calls=message.tool_calls,
        tool_call_id=message.tool_call_id,
        reasoning_content=message.reasoning_content,
        name=message.name,
        provider_payload=payload,
    )


def join(parts: list[str]) -> str:
    return "\n".join(p for p in parts if p)


def compact_json(value: Json) -> str:
    return orjson.dumps(value).decode()

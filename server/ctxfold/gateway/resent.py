"""A resent request recognized by its bytes.

Agents resend their whole request on every call, the new messages appended. When a request is the
session's previous one with bytes inserted just before the closing bracket of its history, and
nothing else changed, only the inserted bytes are parsed; when the view then only grew by those
messages, the upstream gets the previous upstream body with the same items inserted at the same
place. An appended turn costs a byte comparison of the history (memcmp) and work in proportion to
the new messages: the history is never parsed, hashed or serialized again. Anything else (an edit,
another field changed, a prune or a fold) takes the full path. Anthropic's requests are compared
without their cache breakpoints, and the upstream's two move with the turns (`ApiFormat.breakpoint`). Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from ctxfold_client import Message, Role, View

from ctxfold.gateway.formats import Conversation, Spliced
from ctxfold.gateway.pieces import loads

# With its scope, a request's first bytes find the sessions whose last request may be its prefix.
BUCKET_BYTES = 256
# Candidates for the history's closing bracket tried per request (each costs a parse).
MAX_CANDIDATES = 3
# The server's highest calibration of its token estimates (engine.estimator.MAX_CALIBRATION).
MAX_CALIBRATION = 2.0


@dataclass(frozen=True)
class Forwarded:
    """A session's last request as the agent sent it and as the upstream got it, each cut just
    before the closing bracket of its history."""

    head: bytes  # as `ApiFormat.comparable` has them
    tail: bytes
    upstream_head: Spliced  # where its last turn's breakpoint goes: the end of the next body's stable prefix
    upstream_tail: bytes
    conversation: Conversation  # its fields other than the pieces (they are not kept)
    last_role: Role  # its history's last piece's
    view: View  # what the upstream got
    offers_read: bool  # the upstream got the read tool

    @property
    def size(self) -> int:
        return len(self.head) + len(self.tail) + len(self.upstream_head.json) + len(self.upstream_tail)


def history_close(raw: bytes, body: dict[str, Any], key: str) -> int | None:
    """Where the closing bracket of `body[key]`, a non-empty array, is in `raw` (the JSON `body` was
    parsed from); None when it cannot be told. A candidate (the bracket before the next key, or
    before the object's end) is proven by parsing `raw` with a value inserted there."""
    keys = list(body)
    if key not in body or not isinstance(body[key], list) or not body[key]:
        return None
    after = keys.index(key) + 1
    ending = rb"\s*,\s*" + re.escape(orjson.dumps(keys[after])) + rb"\s*:" if after < len(keys) else rb"\s*\}\s*$"
    for number, match in enumerate(re.finditer(rb"\]" + ending, raw)):
        if number == MAX_CANDIDATES:
            break
        at = match.start()
        try:
            probe = orjson.loads(raw[:at] + b",0" + raw[at:])
        except orjson.JSONDecodeError:
            continue
        items = probe.get(key) if isinstance(probe, dict) else None
        if isinstance(items, list) and len(items) == len(body[key]) + 1 and items[-1] == 0:
            return at
    return None


def inserted(forwarded: Forwarded, raw: bytes) -> bytes | None:
    """The bytes `raw` inserts into the forwarded request just before its history's closing
    bracket when that is all it changes (they then start with the comma before a new item)."""
    head, tail = forwarded.head, forwarded.tail
    if len(raw) <= len(head) + len(tail) + 1 or not raw.startswith(head) or not raw.endswith(tail):
        return None
    middle = raw[len(head) : len(raw) - len(tail)]
    return middle if middle[:1] == b"," else None


def new_items(middle: bytes) -> list[Any] | None:
    """The items the inserted bytes add; None when they are not a list of JSON values."""
    try:
        items = loads(b"[" + middle[1:] + b"]")
    except orjson.JSONDecodeError:
        return None
    return items if isinstance(items, list) and items else None


def grew_by(forwarded: Forwarded, view: View, appended: Sequence[Message], reserve: int) -> bool:
    """The view is the forwarded one followed by the appended messages, each shown unchanged, and
    still `reserve` tokens under its trigger (the room of the read tool the forwarded body offers).
    (The prefix compares in C: the SDK builds a delta's view from the very messages it held.)"""
    known = len(forwarded.view.messages)
    new = view.messages[known:]
    return (
        view.trigger_tokens - view.estimated_tokens >= reserve
        and len(new) == len(appended)
        and view.messages[:known] == forwarded.view.messages
        and all(
            shown.seq == stored.seq and not (shown.summary or shown.pruned or shown.truncated)
            for shown, stored in zip(new, appended, strict=True)
        )
    )


def likely_grows(forwarded: Forwarded, middle: bytes, tool_content_max_bytes: int, reserve: int) -> bool:
    """Whether the view will likely only grow by the inserted messages, each shown whole: no result
    among them can be longer than the session's bound of a result in the view, and with every
    inserted byte counted as a token at the server's highest calibration the forwarded view stays
    `reserve` tokens under its trigger, so no maintenance is due (nor the read tool's room used up).
    Only a guess: it decides whether the upstream is called while the Prepare runs, and the Prepare
    confirms it or the early call is dropped."""
    view = forwarded.view
    fits = view.estimated_tokens + MAX_CALIBRATION * len(middle) + reserve < view.trigger_tokens
    return fits and len(middle) <= tool_content_max_bytes


def spliced(forwarded: Forwarded, items: Spliced, breakpoint: bytes) -> bytes:
    """The upstream body of a resent request: the forwarded one with the new `items` inserted, and
    `breakpoint` where each says (the forwarded body's last turn then ends the stable prefix)."""
    return b"".join([*_with_breakpoint(forwarded.upstream_head, breakpoint), *_with_breakpoint(items, breakpoint),
                     forwarded.upstream_tail])  # fmt: skip


def _with_breakpoint(json: Spliced, breakpoint: bytes) -> list[bytes | memoryview]:
    if json.breakpoint_at < 0:
        return [json.json]
    whole = memoryview(json.json)
    return [whole[: json.breakpoint_at], breakpoint, whole[json.breakpoint_at :]]


def continued(forwarded: Forwarded, middle: bytes, items: Spliced, view: View, last_role: Role) -> Forwarded:
    """The forwarded request after the resent one, `middle` adding pieces up to one of `last_role` (`items`
    upstream), went upstream."""
    head = forwarded.upstream_head.json
    at = len(head) + items.breakpoint_at if items.breakpoint_at >= 0 else -1
    return Forwarded(
        head=forwarded.head + middle,
        tail=forwarded.tail,
        upstream_head=Spliced(head + items.json, at),
        upstream_tail=forwarded.upstream_tail,
        conversation=forwarded.conversation,
        last_role=last_role,
        view=view,
        offers_read=forwarded.offers_read,
    )

"""Bounded tool results (invariant 7, docs/architecture.md) and byte-offset paging of raw results.

At append, a tool result above the session's byte bound keeps a head and a tail, cut on UTF-8
character boundaries, around a marker that names the stored raw result. Results that end in an
error keep more tail, because that is where the error is.

A NUL character (the output of `cat` on a binary file) is shown as its Unicode control picture "␀":
visible to the model and storable by every database (PostgreSQL's text cannot hold NUL); the raw
result, read with ReadToolResult, keeps it exactly as it came. Other control characters (terminal
escapes, bells) are kept as they are: every store and provider takes them, and agents' outputs are
full of colour codes the model reads as written."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ctxfold.engine.errors import failed_precondition, invalid, not_found

# What a result_ref looks like (minted by the store as "tr_" + 16 base32 characters).
RESULT_REF = re.compile(r"\btr_[a-z2-7]{16}\b")
DEFAULT_PAGE_BYTES = 16384
MAX_PAGE_BYTES = 24576
MIN_PAGE_BYTES = 4  # one UTF-8 character always fits

_ERROR_TAIL = re.compile(r"(?i)(traceback|exception|error|fail(ed|ure)?|fatal|panic|exit (code|status) [1-9])")
_ERROR_TAIL_WINDOW = 2048


@dataclass(frozen=True)
class BoundedContent:
    content: str
    truncated: bool
    raw_bytes: int
    kept_bytes: int
    pictured: bool = False  # NUL was shown as its picture: the content is not the raw text

    @property
    def exact(self) -> bool:
        """Whether the content is the raw text itself (so the raw text need not be stored apart)."""
        return not (self.truncated or self.pictured)


NUL_PICTURE = "\u2400"


def pictured(text: str) -> str:
    """`text` with NUL shown as its control picture (see the module docstring)."""
    return text.replace("\x00", NUL_PICTURE) if "\x00" in text else text


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _snap_back(data: bytes, index: int) -> int:
    """The largest character boundary <= index."""
    while 0 < index < len(data) and _is_continuation(data[index]):
        index -= 1
    return index


def _snap_forward(data: bytes, index: int) -> int:
    """The smallest character boundary >= index."""
    while index < len(data) and _is_continuation(data[index]):
        index += 1
    return index


def ends_in_error(text: str) -> bool:
    return _ERROR_TAIL.search(text[-_ERROR_TAIL_WINDOW:]) is not None


def marker(result_ref: str, original_bytes: int, kept_bytes: int, omitted_from: int, omitted_to: int) -> str:
    return (
        f"\n\n[ctxfold: tool result truncated: result_ref={result_ref} original_bytes={original_bytes} "
        f"kept_bytes={kept_bytes}; bytes {omitted_from}..{omitted_to} omitted. Read the full result with "
        f'ReadToolResult(result_ref="{result_ref}", offset={omitted_from}), 16 KiB per page.]\n\n'
    )


def bound_tool_content(text: str, max_bytes: int, result_ref: str) -> BoundedContent:
    """`text` as the view shows it: NUL pictured, and cut to at most `max_bytes` UTF-8
    bytes (marker included) when longer. The marker's offsets are the raw text's."""
    data = text.encode()
    total = len(data)
    shown = pictured(text)
    if len(shown.encode()) <= max_bytes:
        return BoundedContent(shown, False, total, total, pictured=shown != text)
    # The marker's length depends on the numbers in it; size it with the widest numbers possible.
    widest = marker(result_ref, total, total, total, total)
    budget = max_bytes - len(widest.encode())
    tail_share = 0.7 if ends_in_error(text) else 0.3
    while True:
        # Cut in the raw bytes (the offsets ReadToolResult reads), then picture; a picture takes three
        # bytes where NUL took one, so a cut that grew past the bound is cut shorter.
        tail_len = int(budget * tail_share)
        head_end = _snap_back(data, budget - tail_len)
        tail_start = _snap_forward(data, total - tail_len)
        raw_head, raw_tail = data[:head_end].decode(), data[tail_start:].decode()
        head, tail = pictured(raw_head), pictured(raw_tail)
        excess = len(head.encode()) + len(tail.encode()) - (max_bytes - len(widest.encode()))
        if excess <= 0:
            break
        budget = max(budget - excess, 0)
    kept = head_end + (total - tail_start)
    note = marker(result_ref, total, kept, head_end, tail_start)
    changed = head != raw_head or tail != raw_tail
    return BoundedContent(head + note + tail, truncated=True, raw_bytes=total, kept_bytes=kept, pictured=changed)


@dataclass(frozen=True)
class Page:
    data: str
    offset: int
    next_offset: int
    total_bytes: int
    complete: bool


@dataclass(frozen=True)
class RawSpan:
    """Bytes [start, start + len(data)) of a raw result of `total` bytes: what a page is cut from."""

    start: int
    data: bytes
    total: int


def page_span(offset: int, limit: int, total: int) -> tuple[int, int]:
    """The byte range [start, stop) of a `total`-byte result that the page at `offset` is cut from:
    up to 3 bytes before it (where a character the offset falls inside starts) and one byte after
    `offset + limit` (whether the page's end would cut a character). Raises on a bad offset or limit."""
    limit = limit or DEFAULT_PAGE_BYTES
    if not MIN_PAGE_BYTES <= limit <= MAX_PAGE_BYTES:
        raise invalid(
            "LIMIT_OUT_OF_RANGE",
            f"limit must be within [{MIN_PAGE_BYTES}, {MAX_PAGE_BYTES}] bytes (0 = {DEFAULT_PAGE_BYTES}), got {limit}",
            limit=limit,
        )
    if offset < 0 or offset > total:
        raise invalid(
            "OFFSET_OUT_OF_RANGE",
            f"offset {offset} is outside the result (0..{total} bytes)",
            offset=offset,
            total_bytes=total,
        )
    return max(offset - 3, 0), min(offset + limit + 1, total)


def read_page(raw: RawSpan, offset: int, limit: int) -> Page:
    """One page from byte `offset`, at most `limit` bytes, ending on a character boundary. `raw` must
    cover `page_span(offset, limit, raw.total)`; indices below are relative to `raw.start`."""
    start, stop = page_span(offset, limit, raw.total)
    if raw.start > start or raw.start + len(raw.data) < stop:
        raise ValueError(f"span {raw.start}+{len(raw.data)} does not cover the page's bytes {start}..{stop}")
    data, at = raw.data, offset - raw.start
    if offset < raw.total and _is_continuation(data[at]):
        previous = raw.start + _snap_back(data, at)
        raise invalid(
            "OFFSET_NOT_CHAR_BOUNDARY",
            f"offset {offset} is inside a UTF-8 character; the character starts at byte {previous}",
            offset=offset,
            char_start=previous,
        )
    end = _snap_back(data, min(offset + (limit or DEFAULT_PAGE_BYTES), raw.total) - raw.start)
    return Page(
        data=data[at:end].decode(),
        offset=offset,
        next_offset=raw.start + end,
        total_bytes=raw.total,
        complete=raw.start + end == raw.total,
    )


def sha256_hex(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def the_result_ref(tool_call_id: str, refs: list[str]) -> str:
    """The one raw result a tool call id names among `refs` (its results in the session)."""
    if not refs:
        raise not_found(
            "TOOL_CALL_NOT_FOUND",
            f"no tool result for tool_call_id {tool_call_id!r} in this session",
            tool_call_id=tool_call_id,
        )
    if len(refs) > 1:
        raise failed_precondition(
            "RESULT_REF_AMBIGUOUS",
            f"tool_call_id {tool_call_id!r} has {len(refs)} results; name one by result_ref: {', '.join(refs)}",
            tool_call_id=tool_call_id,
            candidates=",".join(refs),
        )
    return refs[0]

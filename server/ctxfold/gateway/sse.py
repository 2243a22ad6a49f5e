"""Server-sent events as they arrive: the upstream's bytes are cut into whole events (each with
its own bytes, to be written on unchanged) so that the gateway reads each event's JSON data for
usage while the client gets the event the moment it is complete."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
# The bytes before a chunk where an event's end may begin (the longest end, less one).
_END_OVERLAP = 3


@dataclass(frozen=True)
class Event:
    raw: bytes  # the event's bytes with its terminating blank line, as the upstream sent them
    data: dict[str, Any] | None  # its `data:` lines parsed as a JSON object, when they are one


def parse_data(raw: bytes) -> dict[str, Any] | None:
    lines = [line[5:].lstrip(b" ") for line in raw.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    try:
        value = orjson.loads(b"\n".join(lines))
    except orjson.JSONDecodeError:  # "[DONE]" and other non-JSON data
        return None
    return value if isinstance(value, dict) else None


class EventSplitter:
    """An event arriving in many chunks (a Responses image is megabytes of base64 in one event) is
    gathered in place and searched for its end once, each chunk's bytes only: gathered by
    concatenation and searched whole on every chunk, an 8 MiB event held the event loop for seconds."""

    def __init__(self) -> None:
        self._pending = bytearray()  # bytes of an event not complete yet, searched for an end already

    def feed(self, chunk: bytes) -> Iterator[Event]:
        """The events `chunk` completes, in order."""
        searched = len(self._pending)
        buffer = self._pending
        buffer += chunk
        # The ends found before any event is yielded: a search left open would pin the buffer's size.
        ends = [end.end() for end in _EVENT_END.finditer(buffer, max(0, searched - _END_OVERLAP))]
        events = [bytes(buffer[start:end]) for start, end in zip([0, *ends], ends, strict=False)]
        if ends:
            del buffer[: ends[-1]]
        for raw in events:
            yield Event(raw, parse_data(raw))

    def rest(self) -> bytes:
        """Bytes after the last complete event (a stream that ended without its blank line)."""
        rest = bytes(self._pending)
        self._pending.clear()
        return rest

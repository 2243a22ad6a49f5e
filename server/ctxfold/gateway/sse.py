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
    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> Iterator[Event]:
        """The events `chunk` completes, in order."""
        buffer = self._pending + chunk if self._pending else chunk
        start = 0
        for end in _EVENT_END.finditer(buffer):
            raw = buffer[start : end.end()]
            start = end.end()
            yield Event(raw, parse_data(raw))
        self._pending = buffer[start:]

    def rest(self) -> bytes:
        """Bytes after the last complete event (a stream that ended without its blank line)."""
        rest, self._pending = self._pending, b""
        return rest

"""The one write of an agent's step (an append and the answer's bookkeeping, or ObserveUsage's state and usage row)
and its outcome: a compare-and-swap run by the driver itself. See docs/architecture.md, One path for every append."""

from __future__ import annotations

from dataclasses import dataclass

from ctxfold.engine.context import SessionRecord

Row = dict[str, object]


@dataclass(frozen=True)
class Bookkeeping:
    """An answer's bookkeeping (`ContextState.bookkeeping_json`) written over `revision` only; or, when the state was
    new or rebuilt, the `whole` state (`ContextState.to_json`)."""

    json: str
    revision: int
    whole: bool = False


@dataclass(frozen=True)
class AppendRows:
    """The rows an append inserts and the session's columns it changes, for either store (`rows.append_write`)."""

    head: Row  # head_seq, open_tool_calls, version, update_time after it
    request: Row | None  # its append_requests row, with a request id
    messages: list[Row]
    results: list[Row]  # raw results, compressed and hashed
    chunks: list[Row]


@dataclass(frozen=True)
class AppendWrite:
    """One write, decided on the session as `seen` at the store's time `now`: an append's `rows`, or (None) the
    bookkeeping alone; `usage` goes with the bookkeeping. `size`: the bytes it carries (what committing it costs)."""

    seen: SessionRecord
    now: float
    rows: AppendRows | None
    size: int
    request_id: str = ""
    bookkeeping: Bookkeeping | None = None
    usage: Row | None = None


@dataclass(frozen=True)
class Written:
    revision: int  # the state's revision after the bookkeeping, 0 when there was none or it was skipped


@dataclass(frozen=True)
class Stale:
    """The session is no longer the one the append was decided on: nothing was written."""


@dataclass(frozen=True)
class Repeated:
    """The request id was seen before: nothing was written; these are the first append's messages."""

    message_ids: tuple[str, ...]


Outcome = Written | Stale | Repeated

"""The one write of an agent's step (an append's messages, raw results and request id, the answer's bookkeeping;
or ObserveUsage's state and usage row): what it carries and what it came to. A compare-and-swap in one
transaction, run by the database driver itself (`append_sqlite.py`, `append_postgres.py`). See
docs/architecture.md, One path for every append."""

from __future__ import annotations

from dataclasses import dataclass

from ctxfold.engine.context import SessionRecord

Row = dict[str, object]


@dataclass(frozen=True)
class Bookkeeping:
    """An answer's bookkeeping (`ContextState.bookkeeping_json`), written over `revision` only; or,
    when the stored state is not the one it was made from but for those fields (a new or rebuilt
    state), the `whole` state (`ContextState.to_json`)."""

    json: str
    revision: int
    whole: bool = False


@dataclass(frozen=True)
class AppendRows:
    """The rows an append inserts and the session's columns it changes, made once for either store
    (`rows.append_write`)."""

    head: Row  # head_seq, open_tool_calls, version, update_time after it
    request: Row | None  # its append_requests row, with a request id
    messages: list[Row]
    results: list[Row]  # raw results, compressed and hashed
    chunks: list[Row]


@dataclass(frozen=True)
class AppendWrite:
    """One write, decided on the session as `seen`, at the store's time `now`: an append's `rows`, or (None)
    the bookkeeping alone while the session is still `seen`. A `usage` row is recorded with the
    bookkeeping, when that is written. `size`: the bytes of text and data it carries (what committing it
    costs)."""

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

"""The one write of an agent's step (an append's messages, raw results and request id, the answer's bookkeeping;
or ObserveUsage's state and usage row): what it carries and what it came to. A compare-and-swap in one
transaction, run by the database driver itself (`append_sqlite.py`, `append_postgres.py`). See
docs/architecture.md, One path for every append."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ctxfold.engine.context import AppendedResult, SessionRecord
from ctxfold.engine.model import StoredMessage, Usage


@dataclass(frozen=True)
class Bookkeeping:
    """An answer's bookkeeping (`ContextState.bookkeeping_json`), written over `revision` only; or,
    when the stored state is not the one it was made from but for those fields (a new or rebuilt
    state), the `whole` state (`ContextState.to_json`)."""

    json: str
    revision: int
    whole: bool = False


@dataclass(frozen=True)
class AppendWrite:
    """One append, decided on the session as `seen`: it becomes `after` once `messages` (stored forms,
    with seqs) are written. No messages: the bookkeeping alone, while the session is still `seen`. A
    `usage` report is recorded with the bookkeeping, when that is written."""

    seen: SessionRecord
    after: SessionRecord
    messages: tuple[StoredMessage, ...]
    raw_results: tuple[AppendedResult, ...]  # compressed and hashed by the write (`rows.appended_result_values`)
    request_id: str = ""
    bookkeeping: Bookkeeping | None = None
    usage: Usage | None = None


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


class Appender(Protocol):
    async def write(self, append: AppendWrite) -> Outcome: ...

    async def close(self) -> None: ...

"""Sessions' current contexts, cached per process so an append costs what is new, and changed one at a time per
session by the one write (`Contexts.change`: an append, a usage report, a receipt). A cached context is a guess the
write's swap validates (docs/architecture.md, One path for every append)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from ctxfold import cpu
from ctxfold.engine.answer import PreparedContext
from ctxfold.engine.context import Appended, AppendRequest, AppendStep, Context, SessionRecord, Step, loaded
from ctxfold.engine.errors import DomainError, Kind, busy, invalid, kept_changing
from ctxfold.engine.ids import new_id, new_result_ref
from ctxfold.engine.model import NewMessage, StoredMessage, text_chars
from ctxfold.engine.transcript import AppendLimits
from ctxfold.store import Store
from ctxfold.store.append import Repeated, Written
from ctxfold.store.rows import step_write
from ctxfold.telemetry import INSTRUMENTS

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 << 20
# A change that keeps losing its compare-and-swap (or finding its cached context behind) gives up after this many.
MAX_ATTEMPTS = 8

MAX_REQUEST_ID_CHARS = 128

# A cached message's cost beyond its text (its objects, ids, headers): tracemalloc measures ~530 bytes without
# tool calls; the rest is room for tool-call ids and names and view-only text (pruned stubs, bounded anchors).
MESSAGE_OVERHEAD_BYTES = 1024
# The session record, the state (views, receipts, counters) and the projection itself.
SESSION_OVERHEAD_BYTES = 16 << 10


def message_bytes(messages: Sequence[StoredMessage]) -> int:
    """The estimated memory of cached messages: their text and the fixed overhead of each."""
    return MESSAGE_OVERHEAD_BYTES * len(messages) + text_chars(messages)


class KeyedLock:
    """One asyncio lock per key, dropped when nobody holds or waits for it. Beyond `max_waiting` waiters (None: the
    admission's bound) `hold` raises SESSION_BUSY at once, so a busy session's queue stays short."""

    def __init__(self, max_waiting: int | None) -> None:
        self.max_waiting = max_waiting
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def held(self, key: str) -> bool:
        return key in self._locks

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        if self.max_waiting is not None and users > self.max_waiting:  # one holder and max_waiting waiters
            raise busy(
                f"{users - 1} calls already wait to maintain session {key!r} (at most {self.max_waiting}); retry later",
                1.0,  # seconds before a retry
                scope="session",
                session_id=key,
                limit=self.max_waiting,
            )
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


@dataclass(frozen=True)
class AppendResult:
    """An append's messages as stored (the first append's, for a repeated request id), the context after it (None when
    repeated: the store has it), and the answer written with it when no maintenance was due."""

    messages: list[StoredMessage]
    context: Context | None
    answered: PreparedContext | None


@dataclass(frozen=True)
class _Entry:
    context: Context
    size_bytes: int


class Contexts:
    def __init__(self, store: Store, limits: AppendLimits, max_bytes: int = DEFAULT_MAX_BYTES):
        self.store = store
        self.limits = limits
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        # A session's turn to change its context in this process (appends, usage reports): each starts from
        # the context the one before wrote, instead of losing its swap to it; across processes the swap decides.
        self.turns = KeyedLock(max_waiting=None)

    def __len__(self) -> int:
        return len(self._entries)

    def cached(self, tenant: str, session_id: str) -> Context | None:
        entry = self._entries.get((tenant, session_id))
        INSTRUMENTS.hot_state_lookups.add(1, {"ctxfold.hit": entry is not None})
        if entry is None:
            return None
        self._entries.move_to_end((tenant, session_id))
        return entry.context

    async def load(self, tenant: str, session_id: str, *, fresh: bool = False) -> Context:
        """The session's context: cached unless `fresh`, else read from the store (and cached)."""
        cached = None if fresh else self.cached(tenant, session_id)
        if cached is not None:
            return cached
        stored = await self.store.load_context(tenant, session_id)
        work = (len(stored.kept) + len(stored.after)) * cpu.MESSAGE_WORK_BYTES
        context, why = await cpu.run(work, loaded, stored)
        if why not in ("", "new"):
            log.warning("context state of session %s rebuilt: %s", session_id, why)
        self.written(context.session, context)
        return context

    async def append_messages(
        self, tenant: str, session_id: str, messages: Sequence[NewMessage], request_id: str
    ) -> tuple[list[StoredMessage], SessionRecord]:
        """AppendMessages: the append alone (no answer); the messages as stored and the session after them."""
        written = await self.append(tenant, session_id, messages, request_id, AppendRequest((), answer=False))
        session = written.context.session if written.context else await self.store.get_session(tenant, session_id)
        return written.messages, session

    async def append(
        self, tenant: str, session_id: str, messages: Sequence[NewMessage], request_id: str, request: AppendRequest
    ) -> AppendResult:
        """Appends `messages` (all or none), with the answer's bookkeeping when `request` asks for one and no
        maintenance is due; a request id seen before appends nothing and answers the first append's messages."""
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise invalid("INVALID_REQUEST_ID", f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters")
        ids = [(new_id("m"), new_result_ref()) for _ in messages]
        step = AppendStep(messages, ids, self.limits, request, cpu.count_text)
        match await self.change(tenant, session_id, step, step.work, request_id):
            case Repeated(message_ids):
                return AppendResult(await self.store.messages(message_ids), None, None)
            case appended, context:
                return AppendResult(list(appended.messages), context, appended.answered)

    async def change(
        self,
        tenant: str,
        session_id: str,
        step: Step,
        work: Callable[[Context], tuple[int, int]] | None = None,
        request_id: str = "",
    ) -> tuple[Appended, Context] | Repeated:
        """`step` applied to the session's context and written by the one write (with `request_id`), in the session's
        turn; decided again on the store's context when the cached one was behind or failed a precondition. The step's
        result and the context after it, or Repeated. `work`: the messages and characters it reads (`cpu.run` size)."""
        async with self.turns.hold(session_id):
            for attempt in range(MAX_ATTEMPTS):
                context = await self.load(tenant, session_id, fresh=attempt > 0)
                messages, chars = work(context) if work else (0, 0)
                size = messages * cpu.MESSAGE_WORK_BYTES + chars
                try:
                    appended, write = await cpu.run(size, step_write, step, context, self.store.clock(), request_id)
                except DomainError as error:
                    # A precondition (the waiting tool calls, say) may be one the cached context got wrong.
                    if attempt or error.kind is not Kind.FAILED_PRECONDITION:
                        raise
                    continue
                session = context.session
                match await self.store.append(write):
                    case Repeated() as repeated:
                        return repeated
                    # An answer's bookkeeping may be skipped (the state changed meanwhile); a changed state must land.
                    case Written(revision) if revision or not appended.state_changed:
                        grown = appended.written(revision)  # None: the state write was skipped
                        self.written(session, grown, grown_by=appended.messages)
                        return appended, grown or appended.context
                    case _:
                        self.written(session, None)
        raise kept_changing(session_id, retry="retry with the same request_id" if request_id else "retry")

    def written(
        self, session: SessionRecord, context: Context | None, grown_by: Sequence[StoredMessage] | None = None
    ) -> None:
        """After a write: the context it left is cached, or (None: the swap lost, or the state is unknown) the cached
        one dropped; the one place but `load` the cache changes. `grown_by`: the cached context after an append of
        these (its size counted from theirs, not the whole view)."""
        key = (session.tenant, session.id)
        previous = self._entries.get(key)
        if context is None:
            self._remove(key)
            return
        if previous is not None and previous.context.session.version > context.session.version:
            return  # a call that finished later already left a newer one
        if previous is not None and grown_by is not None:
            size = previous.size_bytes + message_bytes(grown_by)
        else:
            size = SESSION_OVERHEAD_BYTES + message_bytes(context.projection.messages)
        self._remove(key)
        if size > self.max_bytes:
            return
        self._entries[key] = _Entry(context, size)
        self._change(size, 1)
        while self.bytes > self.max_bytes:  # the least recently used entries evicted until the bound holds
            _, evicted = self._entries.popitem(last=False)
            self._change(-evicted.size_bytes, -1)
            INSTRUMENTS.hot_state_evictions.add(1)

    def _remove(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._change(-entry.size_bytes, -1)

    def _change(self, size_bytes: int, sessions: int) -> None:
        self.bytes += size_bytes
        INSTRUMENTS.hot_state_bytes.add(size_bytes)
        INSTRUMENTS.hot_state_sessions.add(sessions)

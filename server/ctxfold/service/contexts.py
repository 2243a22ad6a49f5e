"""Sessions' current contexts, cached per process so an append costs what is new, not a reload of the view.
Each is a guess the write's swap validates (docs/architecture.md, One path for every append)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ctxfold import cpu
from ctxfold.engine.context import Context, SessionRecord, loaded
from ctxfold.engine.model import StoredMessage, config_from_json, text_chars
from ctxfold.service.exclusion import KeyedLock
from ctxfold.store import Store
from ctxfold.store.rows import StoredContext
from ctxfold.telemetry import INSTRUMENTS

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 << 20
# A cached message's cost beyond its text (its objects, ids, headers): tracemalloc measures ~530 bytes without
# tool calls; the rest is room for tool-call ids and names and view-only text (pruned stubs, bounded anchors).
MESSAGE_OVERHEAD_BYTES = 1024
# The session record, the state (views, receipts, counters) and the projection itself.
SESSION_OVERHEAD_BYTES = 16 << 10


def message_bytes(messages: Sequence[StoredMessage]) -> int:
    """The estimated memory of cached messages: their text and the fixed overhead of each."""
    return MESSAGE_OVERHEAD_BYTES * len(messages) + text_chars(messages)


def _loaded(stored: StoredContext) -> tuple[Context, str]:
    """The context of `stored` with its view built: what follows costs what is new, not the whole view."""
    session = stored.session
    context, why = loaded(
        session,
        config_from_json(session.config_json),
        stored.checkpoint,
        stored.kept,
        stored.after,
        stored.state_json,
        stored.state_revision,
    )
    context.projection.tokens()
    return context, why


@dataclass(frozen=True)
class _Entry:
    context: Context
    size_bytes: int


class Contexts:
    def __init__(self, store: Store, max_bytes: int = DEFAULT_MAX_BYTES):
        self.store = store
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
        context, why = await cpu.run(work, _loaded, stored)
        if why not in ("", "new"):
            log.warning("context state of session %s rebuilt: %s", session_id, why)
        self._put(context)
        return context

    def written(
        self, session: SessionRecord, context: Context | None, grown_by: Sequence[StoredMessage] | None = None
    ) -> None:
        """After a write to `session`: the context it left is kept (replacing an older one), or, None, the write lost
        its swap or left the state unknown and the cached one is dropped (the next `load` reads the store). The one
        place the cache changes but for `load`. `grown_by`: the context is the cached one after an append of these
        (its size is counted from theirs, not from the whole view again)."""
        if context is None:
            self._remove((session.tenant, session.id))
        else:
            self._put(context, grown_by)

    def _put(self, context: Context, grown_by: Sequence[StoredMessage] | None = None) -> None:
        """Keeps `context` for its session, then evicts the least recently used entries until the bound holds."""
        key = (context.session.tenant, context.session.id)
        previous = self._entries.get(key)
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
        while self.bytes > self.max_bytes:
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

"""The hot state: per process, the last answered snapshot of each active session (its record, the
projection with its view and token sums, the context state and its revision), so that an append-only
Prepare costs what is new instead of reloading and rebuilding the view.

An entry is only ever a guess: every use is validated by the write it makes, a compare-and-swap on
the session's version and branch and on the state's revision (`Store.append_answered`). A failed
swap (another replica or call wrote, the session was rewound, deleted or re-created) drops the entry
and the caller takes the full path, which reloads from the database. Entries are bounded by an
estimate of their bytes, least recently used evicted first."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ctxfold.engine.maintenance import Projection
from ctxfold.engine.model import StoredMessage, text_chars
from ctxfold.engine.state import ContextState
from ctxfold.store.rows import SessionRecord
from ctxfold.telemetry import INSTRUMENTS

DEFAULT_MAX_BYTES = 256 << 20
# What a cached message costs beyond its text: its StoredMessage and ViewMessage objects, ids, string
# headers and tuple slots. tracemalloc measures about 530 bytes for a message without tool calls; the
# rest is room for tool-call ids and names and view-only text (pruned stubs, bounded anchors).
MESSAGE_OVERHEAD_BYTES = 1024
# The session record, the state (views, receipts, counters) and the projection itself.
SESSION_OVERHEAD_BYTES = 16 << 10


def message_bytes(messages: Sequence[StoredMessage]) -> int:
    """The estimated memory of cached messages: their text (a pruned stub adds at most its 5 KiB to
    it) and the fixed overhead of each."""
    return MESSAGE_OVERHEAD_BYTES * len(messages) + text_chars(messages)


@dataclass(frozen=True)
class HotSession:
    """A session as its last answer left it in this process."""

    session: SessionRecord
    projection: Projection
    state: ContextState
    revision: int  # of the stored state
    size_bytes: int

    @staticmethod
    def of(session: SessionRecord, projection: Projection, state: ContextState, revision: int) -> HotSession:
        size = SESSION_OVERHEAD_BYTES + message_bytes(projection.messages)
        return HotSession(session, projection, state, revision, size)

    def advanced(
        self,
        session: SessionRecord,
        projection: Projection,
        appended: Sequence[StoredMessage],
        state: ContextState,
        revision: int,
    ) -> HotSession:
        """This entry after an append of `appended` (its size grows by theirs only)."""
        return HotSession(session, projection, state, revision, self.size_bytes + message_bytes(appended))


class HotState:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, str], HotSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, tenant: str, session_id: str) -> HotSession | None:
        entry = self._entries.get((tenant, session_id))
        if entry is None:
            INSTRUMENTS.hot_state_lookups.add(1, {"ctxfold.hit": False})
            return None
        self._entries.move_to_end((tenant, session_id))
        INSTRUMENTS.hot_state_lookups.add(1, {"ctxfold.hit": True})
        return entry

    def put(self, entry: HotSession) -> None:
        """Keeps `entry` for its session (replacing an older one), then evicts the least recently used
        entries until the bound holds. An entry larger than the whole bound is not kept."""
        key = (entry.session.tenant, entry.session.id)
        previous = self._entries.get(key)
        if previous is not None and previous.session.version > entry.session.version:
            return  # a call that finished later already left a newer snapshot
        self._remove(key)
        if entry.size_bytes > self.max_bytes:
            return
        self._entries[key] = entry
        self._change(entry.size_bytes, 1)
        while self.bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._change(-evicted.size_bytes, -1)
            INSTRUMENTS.hot_state_evictions.add(1)

    def drop(self, tenant: str, session_id: str) -> None:
        self._remove((tenant, session_id))

    def _remove(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._change(-entry.size_bytes, -1)

    def _change(self, size_bytes: int, sessions: int) -> None:
        self.bytes += size_bytes
        INSTRUMENTS.hot_state_bytes.add(size_bytes)
        INSTRUMENTS.hot_state_sessions.add(sessions)

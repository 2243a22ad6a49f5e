"""The background folds this process runs: at most one task per session, outliving the call that
started it, cancelled by a rewind below what it folds and by shutdown. Across replicas the fold lease
keeps a session's background fold to one process; what the fold decides is `engine/background.py`."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)

# Sessions remembered as "already tried over this head checkpoint" (oldest forgotten first).
MEMO_SESSIONS = 10_000


class BackgroundFolds:
    def __init__(self) -> None:
        # session id -> (task, the seq its fold reads up to)
        self._tasks: dict[str, tuple[asyncio.Task[bool], int]] = {}
        # session id -> the installed state (head checkpoint and generation) a background fold prepared
        # a fold over: it is not started again over the same one. One that made nothing (a failed
        # summary, another replica's lease) is forgotten, so a later Prepare tries again.
        self._tried: OrderedDict[str, str] = OrderedDict()

    def running(self, session_id: str) -> bool:
        return session_id in self._tasks

    def due(self, session_id: str, state_key: str) -> bool:
        """Whether a background fold may start for the session over this installed state."""
        return session_id not in self._tasks and self._tried.get(session_id) != state_key

    def start(self, session_id: str, state_key: str, head_seq: int, work: Coroutine[Any, Any, bool]) -> None:
        """Runs `work` as the session's background fold. It starts in a context of its own: it is not
        part of the calling RPC's trace (it links to it) and outlives it."""
        self._tried[session_id] = state_key
        self._tried.move_to_end(session_id)
        while len(self._tried) > MEMO_SESSIONS:
            self._tried.popitem(last=False)
        task = asyncio.create_task(work, context=contextvars.Context())
        self._tasks[session_id] = (task, head_seq)
        task.add_done_callback(lambda done: self._finished(session_id, done))

    def _finished(self, session_id: str, task: asyncio.Task[bool]) -> None:
        if self._tasks.get(session_id, (None, 0))[0] is task:
            del self._tasks[session_id]
        if task.cancelled() or task.exception() is not None or not task.result():
            self._tried.pop(session_id, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background fold of session %s failed: %s", session_id, task.exception())

    def rewound(self, session_id: str, to_seq: int) -> None:
        """A rewind to `to_seq`: a background fold reading past it is cancelled, and one may start again."""
        self._tried.pop(session_id, None)
        running = self._tasks.get(session_id)
        if running is not None and running[1] > to_seq:
            running[0].cancel()

    async def close(self) -> None:
        """Cancels every background fold and waits for them to unwind (their leases handed back)."""
        tasks = [task for task, _ in self._tasks.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

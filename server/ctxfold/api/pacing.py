"""Large requests are worked on one at a time; large answers go out one at a time, a turn of the event loop
apart. Why and what it measured: docs/operations.md, Limits ("Large work never blocks the server")."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

# A request or an answer this large takes gRPC about a millisecond to copy: smaller ones are not paced.
LARGE_BYTES = 1 << 20


class Turn:
    """A large request's turn until `end()` (or its call's end), which may come early if the rest waits elsewhere."""

    def __init__(self, pacer: RequestPacer | None = None, weight: int = 0) -> None:
        self._pacer = pacer
        self._weight = weight

    def end(self) -> None:
        if self._pacer is not None:
            pacer, self._pacer = self._pacer, None
            pacer.release(self._weight)


class RequestPacer:
    """Gives large requests turns in order of arrival, up to `capacity_bytes` at once (a larger one takes it all)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._in_use = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def turn(self, request_bytes: int) -> contextlib.AbstractAsyncContextManager[Turn]:
        """Waits for the turn of a request of `request_bytes`; a small one has it at once (no cost: most are small)."""
        if request_bytes < LARGE_BYTES:
            return _AT_ONCE
        return self._large_turn(min(request_bytes, self.capacity_bytes))

    @contextlib.asynccontextmanager
    async def _large_turn(self, weight: int) -> AsyncIterator[Turn]:
        # First come, first served: a large request is never overtaken by smaller ones that would fit.
        if not self._waiting and self._in_use + weight <= self.capacity_bytes:
            self._in_use += weight
        else:
            entry = (weight, asyncio.get_running_loop().create_future())
            self._waiting.append(entry)
            try:
                await entry[1]
            except asyncio.CancelledError:
                if entry[1].done() and not entry[1].cancelled():
                    self.release(weight)  # granted as the caller was cancelled: hand it on
                else:
                    self._waiting.remove(entry)
                    self._grant()  # the next ones may fit now
                raise
        turn = Turn(self, weight)
        try:
            yield turn
        finally:
            turn.end()

    def release(self, weight: int) -> None:
        self._in_use -= weight
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self._in_use + self._waiting[0][0] <= self.capacity_bytes:
            weight, granted = self._waiting.popleft()
            self._in_use += weight
            granted.set_result(None)


_AT_ONCE = contextlib.nullcontext(Turn())


class AnswerPacer:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def turn(self, answer_bytes: int) -> None:
        """Returns when an answer of `answer_bytes` may go out. The caller hands it to gRPC in the same
        step (returns it), so that gRPC's copy runs before the next large answer's turn."""
        if answer_bytes < LARGE_BYTES:
            return
        await self._lock.acquire()
        # Released in the loop's next turn: after this step, and with it gRPC's copy of the answer.
        asyncio.get_running_loop().call_soon(self._lock.release)

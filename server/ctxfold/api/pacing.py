"""Large requests are worked on one at a time; large answers go out one at a time, a turn of the
event loop apart.

Everything the server does with a large request (gRPC's copies, decoding it, its strings, its rows,
its answer) needs memory as large as the request, several times over, and every thread that first
touches fresh memory faults its pages in holding the GIL: on a virtual machine that costs several
times the copy, and the event loop, with every health check, waits for it. `RequestPacer` keeps
that memory small and reused: a large request is decoded and worked on only once the large
requests before it are done, so eight clients sending 20 MiB at once hold eight requests' wire
bytes and one request's working memory, not eight (the CPU pool, which works on one request at a
time anyway, would otherwise decode all of them first and count them after: 500-660 MiB of heap in
use at the peak instead of 275-315, glibc's `mallinfo2` during `bench/availability.py`). The eight
take as long either way (20-30 s): their CPU work queued for the same worker before.

When a handler returns its answer, gRPC copies it whole into a buffer of its own in the same step of
the event loop, holding the GIL (`SendMessageOperation`): 10-30 ms for 20 MiB here. When several large
answers are ready at once, their copies would run back to back while everything else that is ready
waits behind them: health checks, small calls, the next requests' reads. `AnswerPacer.turn` lets one
large answer go per turn of the loop: the next waits until the loop has polled for I/O and run what
was ready in between."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

# A request or an answer this large takes gRPC about a millisecond to copy: smaller ones are not paced.
LARGE_BYTES = 1 << 20


class Turn:
    """A large request's turn, from its decoding until `end()` (or the end of its call): `end()` may
    come earlier, when what is left of the call waits on something else (a Prepare's summarizer)."""

    def __init__(self, pacer: RequestPacer | None = None, weight: int = 0) -> None:
        self._pacer = pacer
        self._weight = weight

    def end(self) -> None:
        if self._pacer is not None:
            pacer, self._pacer = self._pacer, None
            pacer.release(self._weight)


class RequestPacer:
    """Gives large requests their turns in order of arrival, up to `capacity_bytes` of them at once
    (one request of the largest size; a larger request takes all of it)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._in_use = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def turn(self, request_bytes: int) -> contextlib.AbstractAsyncContextManager[Turn]:
        """Waits for the turn of a request of `request_bytes`; a small one has its turn at once (at
        no cost: most calls are small)."""
        if request_bytes < LARGE_BYTES:
            return _AT_ONCE
        return self._large_turn(min(request_bytes, self.capacity_bytes))

    @contextlib.asynccontextmanager
    async def _large_turn(self, weight: int) -> AsyncIterator[Turn]:
        await self._acquire(weight)
        turn = Turn(self, weight)
        try:
            yield turn
        finally:
            turn.end()

    async def _acquire(self, weight: int) -> None:
        # First come, first served: a large request is never overtaken by smaller ones that would fit.
        if not self._waiting and self._in_use + weight <= self.capacity_bytes:
            self._in_use += weight
            return
        granted = asyncio.get_running_loop().create_future()
        entry = (weight, granted)
        self._waiting.append(entry)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(weight)  # granted as the caller was cancelled: hand it on
            else:
                self._waiting.remove(entry)
                self._grant()  # the next ones may fit now
            raise

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

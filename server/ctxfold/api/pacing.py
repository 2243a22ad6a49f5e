"""Large answers go out one at a time, a turn of the event loop apart.

When a handler returns its answer, gRPC copies it whole into a buffer of its own in the same step of
the event loop, holding the GIL (`SendMessageOperation`): 10-30 ms for 20 MiB here. When several large
answers are ready at once, their copies would run back to back while everything else that is ready
waits behind them: health checks, small calls, the next requests' reads. `AnswerPacer.turn` lets one
large answer go per turn of the loop: the next waits until the loop has polled for I/O and run what
was ready in between."""

from __future__ import annotations

import asyncio

# An answer this large takes gRPC about a millisecond to copy: smaller ones go out unpaced.
LARGE_ANSWER_BYTES = 1 << 20


class AnswerPacer:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def turn(self, answer_bytes: int) -> None:
        """Returns when an answer of `answer_bytes` may go out. The caller hands it to gRPC in the same
        step (returns it), so that gRPC's copy runs before the next large answer's turn."""
        if answer_bytes < LARGE_ANSWER_BYTES:
            return
        await self._lock.acquire()
        # Released in the loop's next turn: after this step, and with it gRPC's copy of the answer.
        asyncio.get_running_loop().call_soon(self._lock.release)

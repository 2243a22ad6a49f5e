"""CPU-heavy work (tokenizing, compressing, hashing, decoding large requests) runs in a worker thread
when its input is large, so that one big request never stalls the event loop, and with it health
checks and every other session. zstandard, hashlib and tiktoken's encoder release the GIL while
they work; what still holds it (building token lists, copying strings) is kept to short calls by the
callers (token counts in slices, answers serialized per message), since a worker holding the GIL
stalls the loop just the same."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

# Below this many bytes (or characters) of input the work takes well under a millisecond: a thread
# hop would cost more than it saves.
OFFLOAD_MIN_BYTES = 64 << 10

P = ParamSpec("P")
T = TypeVar("T")


async def run(size: int, function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)`, in a worker thread when `size` (its input) is large."""
    if size < OFFLOAD_MIN_BYTES:
        return function(*args, **kwargs)
    return await asyncio.to_thread(function, *args, **kwargs)

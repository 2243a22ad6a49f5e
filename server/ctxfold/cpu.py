"""CPU-heavy work (tokenizing, compressing, hashing, decoding large requests) runs in a worker thread
when its input is large, so that one big request never stalls the event loop, and with it health
checks and every other session. zstandard, hashlib and tiktoken's encoder release the GIL while
they work; what still holds it (building token lists, copying strings) is kept to short calls by the
callers (token counts in slices, answers serialized per message), since a worker holding the GIL
stalls the loop just the same.

The workers are a pool of their own, one fewer than the CPUs this process may run on (at least one):
with asyncio's default pool (CPUs + 4 threads), eight concurrent large appends kept six threads
tokenizing on a 2-core machine, so the loop waited for a CPU and then for the GIL behind each of them
(health checks took up to 400 ms). Large requests queue for the pool instead; the loop keeps a CPU."""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import ParamSpec, TypeVar

# Below this many bytes (or characters) of input the work takes well under a millisecond: a thread
# hop would cost more than it saves.
OFFLOAD_MIN_BYTES = 64 << 10
WORKERS = max(1, len(os.sched_getaffinity(0)) - 1)

P = ParamSpec("P")
T = TypeVar("T")

_pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ctxfold-cpu")


async def run(size: int, function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)`, in a worker of the pool when `size` (its input) is large (with the
    caller's context variables, as `asyncio.to_thread` passes them: the trace context)."""
    if size < OFFLOAD_MIN_BYTES:
        return function(*args, **kwargs)
    call = partial(contextvars.copy_context().run, function, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_pool, call)

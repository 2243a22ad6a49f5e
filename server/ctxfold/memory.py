"""Process-wide memory tuning: glibc's allocator kept from handing large buffers back to the kernel
between requests (`retain_large_buffers`), and the objects alive at startup kept out of the garbage
collector's full passes (`freeze_startup_objects`).

gRPC copies every request and every answer whole, on the event loop and holding the GIL: a 20 MiB
request three times when it is received, a 20 MiB answer once when it is sent. glibc serves such a
buffer from a fresh `mmap`, or from heap it has just returned to the kernel, so each copy also
faults in and zeroes 5,000 new pages. On a virtual machine the faults cost several times the copy:
with a bare `grpc.aio` server, sending a 20 MiB answer held the loop 40-50 ms, and 9-12 ms once
the buffers were kept.

`retain_large_buffers` makes glibc serve buffers up to 32 MiB (its ceiling for `M_MMAP_THRESHOLD`)
from its heap, keep `retained_bytes` of freed heap at its top whenever it gives the rest back
(`M_TOP_PAD`; it gives back only beyond one more such buffer, `M_TRIM_THRESHOLD`), and touches that
much heap once, now, so that the first large requests find it ready too. It also gives every thread
that one heap (`M_ARENA_MAX` 1): glibc otherwise gives threads that allocate at the same time arenas
of their own (up to eight per CPU), and each arena grew from fresh pages. The CPU pool's worker
decodes requests and makes their strings there holding the GIL, and gRPC's threads receive there:
eight clients sending 20 MiB requests at once grew the server by 500 MiB of fresh pages the first
time, and health's p99 was twice as long as with one arena. Small allocations come from each
thread's own cache (tcache) either way: `bench/hot_path.py`, run side by side with per-thread arenas,
served as many calls per second with one (24 and 21-22 % of the echo server's, 16 in flight). The
price is resident memory that starts `retained_bytes` higher and stays near its high-water mark: at
most `retained_bytes` + 32 MiB unused. Elsewhere than glibc (musl, macOS) it does nothing.

protobuf's runtime (upb) calls `malloc_trim(0)` after every 10,000 message arenas it frees, and that
hands back the kept heap too: under steady traffic the heap is kept between those calls, and the
first large requests after one fault their pages in again."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import platform

log = logging.getLogger(__name__)

# mallopt(3) parameters.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_INT_MAX = (1 << 31) - 1  # mallopt takes an int
# glibc refuses a larger M_MMAP_THRESHOLD (HEAP_MAX_SIZE / 2 on 64-bit).
MMAP_THRESHOLD_CEILING = 32 << 20
# Heap is touched in pieces below the mmap threshold, so that it stays in the heap once freed.
_PREFAULT_PIECE = 16 << 20


def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def retain_large_buffers(retained_bytes: int) -> bool:
    """Tunes glibc's allocator as the module says, with a heap of `retained_bytes` touched in
    advance. Returns whether it could (False elsewhere than glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # glibc trims the free top of its heap once it reaches the threshold, and keeps the pad when it
    # does (without a pad it would hand back the touched heap too, all of it at once).
    pad = min(retained_bytes, _INT_MAX - MMAP_THRESHOLD_CEILING)
    tuned = all(
        libc.mallopt(parameter, value)
        for parameter, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_CEILING),
            (_M_TOP_PAD, pad),
            (_M_TRIM_THRESHOLD, pad + MMAP_THRESHOLD_CEILING),
            # Threads that have allocated already keep their arena: this runs before the server starts.
            (_M_ARENA_MAX, 1),
        )
    )
    if not tuned:
        log.warning("glibc refused the allocator settings for large messages; large requests may stall the loop")
        return False
    pieces = [libc.malloc(_PREFAULT_PIECE) for _ in range(pad // _PREFAULT_PIECE)]
    for piece in pieces:
        if piece:
            ctypes.memset(piece, 0, _PREFAULT_PIECE)
    for piece in pieces:
        libc.free(piece)
    return True


def freeze_startup_objects() -> None:
    """Moves every object alive now out of the collector's sight. What is alive once serving (modules,
    classes, gRPC's, aiohttp's and OpenTelemetry's machinery: over 100k objects) lives as long as the
    process; a full collection, which runs on whichever thread allocates (the event loop, mostly),
    walks them all: in the gateway, 35-50 ms once per 40 requests at a 100k-token history; about 1 ms
    once frozen (docs/gateway.md)."""
    gc.collect()
    gc.freeze()

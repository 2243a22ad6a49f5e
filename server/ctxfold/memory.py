"""Process-wide memory tuning: glibc kept from handing large buffers back to the kernel (`retain_large_buffers`),
and the garbage collector's passes made rarer and shorter (`tune_collector`). See docs/operations.md, Limits."""

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


# The collector's thresholds (youngest generation, then how many of its passes make one of the next); Python's
# default is (700, 10, 10). Requests in flight and a fold's views live across young passes and reached the oldest
# generation, whose full passes walk the whole heap: folding 100,000 messages (`bench/availability.py --cases
# fold`, side by side) took health checks over 100 ms 8 times, at worst 218-225 ms, with the defaults. A larger
# first threshold makes full passes rare (a gateway ran one every ~70 requests: 36-37 % of pass-through
# requests/s before, 40 % after, `bench/gateway.py`); a small second one keeps each middle pass short: with 20,
# a middle pass walked up to 400,000 young objects and held the loop 108-115 ms after that fold; with 4, the
# fold case's health max was 36-51 ms against 86-117 (four runs each, alternating).
GC_THRESHOLDS = (20_000, 4, 20)


def retain_large_buffers(retained_bytes: int) -> bool:
    """Tunes glibc's allocator (docs/operations.md, Limits), with a heap of `retained_bytes` touched in
    advance. Returns whether it could (False elsewhere than glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
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


def tune_collector() -> None:
    """Moves every object alive now (over 100k, alive as long as the process) out of the collector's
    sight, so full collections stop walking them, and sets `GC_THRESHOLDS` (docs/operations.md, Limits)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)

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


# The collector's thresholds (youngest generation, then how many of its passes make one of the next; Python's are
# (700, 10, 10)): full passes rare, middle ones short. Why and what it measured: docs/operations.md, Limits.
GC_THRESHOLDS = (20_000, 4, 20)


def retain_large_buffers(retained_bytes: int) -> bool:
    """Tunes glibc's allocator and touches `retained_bytes` of heap in advance; False where it cannot (not glibc)."""
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
    """Moves every object alive now (over 100k, alive for good) out of the collector's sight; sets `GC_THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)

"""The event loop's lag, watched: how late a timer set every 10 ms fires.

Health checks and every call are answered on the event loop, so anything that holds it (a long step,
or a thread holding the GIL) delays them all by as much. The lag is recorded as the histogram
`ctxfold.event_loop.lag`, and a lag of 100 ms or more while calls are in progress is logged as a
warning: where a slow health check coincides with none, the wait was outside the loop (for a CPU, in
gRPC's own threads). A hold while no call is in progress (another process loading the CPUs of an
idle server) delayed nobody: it is logged at DEBUG, not as a fault.

The lag falls short of how long the loop was held by up to the interval (a hold that starts late in
one wait is seen only from that wait's end). Every 50 ms, a hold of 140 ms could pass unwarned; a
5 ms timer saw holds of 70-100 ms in runs of `bench/availability.py` like those where the 50 ms one
warned of none. Every 10 ms costs under 1 % of one CPU on an idle loop (30-50 ms of CPU per 5 s,
against about 20 at 50 ms, measured on this 2-core machine)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import NoReturn

from ctxfold.telemetry import INSTRUMENTS

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 0.01
WARN_SECONDS = 0.1
HELD = "event loop held"  # how the warning starts (bench/availability.py counts them)


def log_level(lag: float, warn: float, calls_before: int, calls_after: int) -> int | None:
    """How a hold of `lag` seconds is logged: not below `warn`; a warning when a call was in progress
    as the hold began or ended (it waited as long), else DEBUG (nobody waited)."""
    if lag < warn:
        return None
    return logging.WARNING if calls_before or calls_after else logging.DEBUG


async def watch(
    calls_in_progress: Callable[[], int], interval: float = INTERVAL_SECONDS, warn: float = WARN_SECONDS
) -> NoReturn:
    """Runs until cancelled; `calls_in_progress` counts the calls admitted and not answered."""
    while True:
        before = calls_in_progress()
        due = time.perf_counter() + interval
        await asyncio.sleep(interval)
        lag = max(0.0, time.perf_counter() - due)
        INSTRUMENTS.event_loop_lag.record(lag)
        level = log_level(lag, warn, before, calls_in_progress())
        if level == logging.WARNING:
            log.warning("%s %.0f ms: health checks and every call waited as long", HELD, lag * 1000)
        elif level is not None:
            log.debug("%s %.0f ms while no call was in progress (no call waited)", HELD, lag * 1000)

"""The event loop's lag, watched: how late a timer set every 10 ms fires, as a metric and, from 100 ms while
calls are in progress, a warning. Why these numbers: docs/operations.md, Limits."""

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
    """How a hold of `lag` seconds is logged: None below `warn`; WARNING if a call was in progress as it began or ended,
    else DEBUG (nobody waited)."""
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

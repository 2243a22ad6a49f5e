"""CPU-heavy work off the event loop when its input is large: a pool of its own (`run`), and a low-priority
counting process for the tokens of large texts (`count_text`). Why, and what it measured: docs/operations.md, Limits."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import ParamSpec, TypeVar

from ctxfold.engine import estimator
from ctxfold.engine.projection import LOOP_VIEW_MESSAGES

log = logging.getLogger(__name__)

# Below this many bytes (or characters) the work takes well under a millisecond: moving it would cost more.
OFFLOAD_MIN_BYTES = 64 << 10
# A message's work counts as this many bytes, whatever its text (engine steps cost 1-10 µs each): so 64 short
# messages or more are worked on off the loop (docs/operations.md, Limits).
MESSAGE_WORK_BYTES = OFFLOAD_MIN_BYTES // LOOP_VIEW_MESSAGES
WORKERS = max(1, len(os.sched_getaffinity(0)) - 1)
COUNTING_NICE = 19
PARENT_POLL_SECONDS = 0.5

P = ParamSpec("P")
T = TypeVar("T")

_pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ctxfold-cpu")


async def run(size: int, function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)`, in a pool worker when `size` (its input) is large, with the caller's contextvars
    (as `asyncio.to_thread` passes them: the trace context)."""
    if size < OFFLOAD_MIN_BYTES:
        return function(*args, **kwargs)
    call = partial(contextvars.copy_context().run, function, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_pool, call)


def _start_counting() -> None:
    """The counting process's start: the lowest priority, a watch on its server, the encoding loaded before any text."""
    os.nice(COUNTING_NICE)
    server = os.getppid()

    def exit_when_orphaned() -> None:
        # A server killed with SIGKILL cannot stop it, and its end of the work queue does not close:
        # the process itself holds a copy of it.
        while os.getppid() == server:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(0)

    threading.Thread(target=exit_when_orphaned, name="ctxfold-orphan-watch", daemon=True).start()
    estimator.warm_up()


class _CountingProcess:
    """Counts large texts; started on first use and again if it dies (the owed count made in the calling thread);
    given up for the server's life, as the log says, if it cannot start or fails `MAX_FAILURES` times in a row."""

    MAX_FAILURES = 3

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._failures = 0

    def _executor_or_none(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._executor is None and self._failures < self.MAX_FAILURES:
                # spawn: a fork of a process running gRPC's threads is not safe.
                context = multiprocessing.get_context("spawn")
                self._executor = ProcessPoolExecutor(1, mp_context=context, initializer=_start_counting)
            return self._executor

    def _failed(self, executor: ProcessPoolExecutor | None, error: BaseException) -> None:
        with self._lock:
            if executor is not None and self._executor is not executor:
                return  # another thread has already replaced it
            self._executor = None
            self._failures += 1
            given_up = self._failures >= self.MAX_FAILURES
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if given_up:
            log.error(
                "the token counting process failed %d times (%s); counting in the server's threads",
                self._failures,
                error,
            )
        else:
            log.warning("the token counting process failed (%s); starting another, counting this text here", error)

    def run(self, function: Callable[[str], int], text: str) -> int:
        executor = None
        try:
            executor = self._executor_or_none()
            if executor is None:
                return function(text)
            counted = executor.submit(function, text).result()
        except (BrokenProcessPool, OSError) as error:
            self._failed(executor, error)
            return function(text)
        self._failures = 0
        return counted


_counting = _CountingProcess()


def start_counting() -> None:
    """Starts the counting process and waits for its encoding (~1 s), so no large append waits; blocks: off the loop."""
    _counting.run(len, "")  # a trivial call, answered once the process has started


def count_text(text: str) -> int:
    """`estimator.count_text(text)`, in the counting process when `text` is large. It blocks while
    the process counts: call it from a worker of the pool (`run`), never on the event loop."""
    if len(text) < estimator.LARGE_TEXT_CHARS:
        return estimator.count_text(text)
    return _counting.run(estimator.count_text, text)

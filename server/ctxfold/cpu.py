"""CPU-heavy work (tokenizing, compressing, hashing, decoding large requests) runs off the event loop
when its input is large, so that one big request never stalls the event loop, and with it health
checks and every other session.

Most of it runs in a worker thread. zstandard, hashlib and tiktoken's encoder release the GIL while
they work; what still holds it (copying strings, decoding) is kept to short calls by the callers
(answers serialized per message), since a worker holding the GIL stalls the loop just the same.
The workers are a pool of their own, one fewer than the CPUs this process may run on (at least one):
with asyncio's default pool (CPUs + 4 threads), eight concurrent large appends kept six threads
tokenizing on a 2-core machine, so the loop waited for a CPU and then for the GIL behind each of them
(health checks took up to 400 ms). Large requests queue for the pool instead; the loop keeps a CPU.

Counting the tokens of a large text, the bulk of that work (0.4 s per 4 MiB of the tokenizer's
slowest text), runs in a process of its own at the lowest CPU priority (`count_text`). In a thread
it held the GIL a few hundred times a second, to build each slice's list of token ids, and on a
machine whose CPUs were all busy it was preempted holding it, and the loop waited for it; and it
took a CPU from the loop, gRPC's threads and the clients on the same machine as much as any of them.
Renicing the server's other threads did not help (an earlier session measured it): a thread
preempted while it holds the GIL holds up the loop whatever its priority. A process has no GIL to
hold, and at nice 19 anything else that wants a CPU gets it first."""

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

log = logging.getLogger(__name__)

# Below this many bytes (or characters) of input the work takes well under a millisecond: a thread
# hop (or a trip to the counting process) would cost more than it saves.
OFFLOAD_MIN_BYTES = 64 << 10
WORKERS = max(1, len(os.sched_getaffinity(0)) - 1)
COUNTING_NICE = 19
PARENT_POLL_SECONDS = 0.5

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


def _start_counting() -> None:
    """The counting process's start: the lowest priority, a watch on its server, and the encoding
    loaded before any text."""
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
    """The process that counts large texts, started on first use (or by `start_counting`), and
    started again if it dies: a count it did not answer is made in the calling thread instead. A
    process that cannot start, or dies `MAX_FAILURES` times in a row, is given up for this server's
    life: counts are then made in the calling thread, as the log says."""

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
    """Starts the counting process and waits until it has loaded the encoding (about a second), so
    that the first large append does not wait for it. Blocks: call it off the event loop."""
    _counting.run(len, "")  # a trivial call, answered once the process has started


def count_text(text: str) -> int:
    """`estimator.count_text(text)`, in the counting process when `text` is large. It blocks while
    the process counts: call it from a worker of the pool (`run`), never on the event loop."""
    if len(text) < OFFLOAD_MIN_BYTES:
        return estimator.count_text(text)
    return _counting.run(estimator.count_text, text)

"""Admission of ContextService calls (per server, per tenant, bytes of large requests): a call past a bound is
refused at once, and the server is drained at shutdown. See docs/operations.md, Limits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ctxfold.api.pacing import LARGE_BYTES
from ctxfold.engine.errors import DomainError, Kind, busy

# How long cancelled calls get to send their status once the grace period is over.
CANCELLED_CALLS_SECONDS = 2.0
# After the drain, gRPC's stop cancels the calls it has received but not yet handed to a handler with a bare
# CANCELLED: the drain ends once that many ticks of the loop in a row saw no call arrive (at most ARRIVALS_SECONDS).
# Counted in ticks, not time, so that a stalled loop does not pass for a quiet one.
QUIET_TICKS, TICK_SECONDS, ARRIVALS_SECONDS = 5, 0.01, 1.0


def shutting_down() -> DomainError:
    return DomainError(
        Kind.UNAVAILABLE,
        "SERVER_SHUTTING_DOWN",
        "the server is shutting down; retry (on another replica, or on this one once it is back); what a call "
        "committed before it ended stays (an append, a fold's finished passes): retry with the same request_id",
        retry_after_seconds=1.0,
    )


@dataclass
class Admission:
    max_calls: int
    max_calls_per_tenant: int
    # At most this many bytes of large requests (`LARGE_BYTES` or more) in progress; one alone is admitted, any size.
    max_request_bytes: int
    retry_after_seconds: float = 1.0
    calls: int = 0  # admitted, not yet answered (the loop-lag watch reads it)
    arrivals: int = 0  # calls that asked to be admitted, ever
    _per_tenant: dict[str, int] = field(default_factory=dict)
    _request_bytes: int = 0
    draining: bool = False
    _running: set[asyncio.Task[Any]] = field(default_factory=set)

    @contextlib.contextmanager
    def admit(self, tenant: str, request_bytes: int) -> Iterator[None]:
        self.arrivals += 1
        if self.draining:
            raise shutting_down()
        held = self._per_tenant.get(tenant, 0)
        if held >= self.max_calls_per_tenant:
            raise busy(
                f"this tenant already has {held} calls in progress (at most {self.max_calls_per_tenant}); retry later",
                self.retry_after_seconds,
                scope="tenant",
                limit=self.max_calls_per_tenant,
            )
        if self.calls >= self.max_calls:
            raise busy(
                f"the server already has {self.calls} calls in progress (at most {self.max_calls}); retry later",
                self.retry_after_seconds,
                scope="server",
                limit=self.max_calls,
            )
        counted = request_bytes if request_bytes >= LARGE_BYTES else 0
        if counted and self._request_bytes and self._request_bytes + counted > self.max_request_bytes:
            raise busy(
                f"the server already holds {self._request_bytes} bytes of large requests in progress "
                f"(at most {self.max_request_bytes}, this one has {request_bytes}); retry later",
                self.retry_after_seconds,
                scope="server",
                limit_bytes=self.max_request_bytes,
                request_bytes=request_bytes,
            )
        self.calls += 1
        self._per_tenant[tenant] = held + 1
        self._request_bytes += counted
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._running.discard(task)
            self.calls -= 1
            self._request_bytes -= counted
            self._per_tenant[tenant] -= 1  # a tenant's entry stays: tenants are the tokens file's

    async def drain(self, grace_seconds: float) -> None:
        """Refuses new calls, waits up to `grace_seconds`, then cancels the rest (answering SERVER_SHUTTING_DOWN);
        returns once calls stop arriving (each refused SERVER_SHUTTING_DOWN)."""
        self.draining = True
        running = set(self._running)
        if running:
            _, late = await asyncio.wait(running, timeout=grace_seconds)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=CANCELLED_CALLS_SECONDS)
        quiet, deadline = 0, time.monotonic() + ARRIVALS_SECONDS
        while quiet < QUIET_TICKS and time.monotonic() < deadline:
            seen = self.arrivals
            await asyncio.sleep(TICK_SECONDS)
            quiet = quiet + 1 if self.arrivals == seen else 0

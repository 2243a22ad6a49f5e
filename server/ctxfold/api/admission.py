"""Admission of ContextService calls: how many run at once in the whole server and per tenant. A call
past a bound is refused at once (RESOURCE_EXHAUSTED, SESSION_BUSY, with a RetryInfo delay) instead of
queueing. Health and reflection are not counted, so they answer however busy the server is, and no
tenant can take the slots every other tenant needs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from ctxfold.engine.errors import busy


@dataclass
class Admission:
    max_calls: int
    max_calls_per_tenant: int
    retry_after_seconds: float = 1.0
    _calls: int = 0
    _per_tenant: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def admit(self, tenant: str) -> Iterator[None]:
        held = self._per_tenant.get(tenant, 0)
        if held >= self.max_calls_per_tenant:
            raise busy(
                f"this tenant already has {held} calls in progress (at most {self.max_calls_per_tenant}); retry later",
                self.retry_after_seconds,
                scope="tenant",
                limit=self.max_calls_per_tenant,
            )
        if self._calls >= self.max_calls:
            raise busy(
                f"the server already has {self._calls} calls in progress (at most {self.max_calls}); retry later",
                self.retry_after_seconds,
                scope="server",
                limit=self.max_calls,
            )
        self._calls += 1
        self._per_tenant[tenant] = held + 1
        try:
            yield
        finally:
            self._calls -= 1
            remaining = self._per_tenant[tenant] - 1
            if remaining:
                self._per_tenant[tenant] = remaining
            else:
                del self._per_tenant[tenant]

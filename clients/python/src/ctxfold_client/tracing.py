"""W3C trace-context propagation into gRPC metadata.

With `opentelemetry-api` importable (the `otel` extra), the active OpenTelemetry context is injected
through the globally configured propagator (W3C `traceparent`/`tracestate`, and `baggage`, by
default); without an active span nothing is sent. An explicit `traceparent` always wins.
"""

from __future__ import annotations

import re

from ctxfold_client._gen.enums import ErrorReason
from ctxfold_client.errors import CtxfoldError

try:
    from opentelemetry import propagate as _propagate
except ImportError:  # pragma: no cover - exercised only without the otel extra
    _propagate = None  # type: ignore[assignment]

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

OPENTELEMETRY_AVAILABLE = _propagate is not None


def trace_metadata(
    traceparent: str | None = None, tracestate: str | None = None, *, propagate: bool = True
) -> list[tuple[str, str]]:
    """The trace-context metadata pairs for one call."""
    if traceparent:
        if not _TRACEPARENT.match(traceparent) or traceparent.startswith("ff"):
            raise CtxfoldError.invalid_argument(
                ErrorReason.INVALID_CLIENT_ARGUMENT, "traceparent", f"not a W3C traceparent: {traceparent!r}"
            )
        pairs = [("traceparent", traceparent)]
        if tracestate:
            pairs.append(("tracestate", tracestate))
        return pairs
    if not propagate or _propagate is None:
        return []
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return [(key.lower(), value) for key, value in carrier.items()]

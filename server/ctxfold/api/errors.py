"""The one mapping from domain errors to gRPC status codes with a google.rpc.ErrorInfo detail."""

from __future__ import annotations

import datetime
import logging

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ctxfold.engine.errors import DomainError, Kind

DOMAIN = "ctxfold.dev"
log = logging.getLogger(__name__)

# Each Kind is named as its google.rpc code (a missing one fails at import).
_CODES = {kind: getattr(code_pb2, kind.name) for kind in Kind}


# Errors echo what the caller sent (ids, names). The status travels in trailing metadata, which
# clients cap (8 KiB soft, 16 KiB hard by default), so long echoes are clipped to stay readable.
MAX_MESSAGE_BYTES = 1024
MAX_METADATA_VALUE_BYTES = 512


def _clip(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 32].decode(errors="ignore") + f"…[{len(data)} bytes, clipped]"


def status_for(error: DomainError) -> grpc.Status:
    metadata = {key: _clip(value, MAX_METADATA_VALUE_BYTES) for key, value in error.metadata.items()}
    details: list[Message] = [error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata=metadata)]
    if error.retry_after_seconds > 0:
        delay = duration_pb2.Duration()
        delay.FromTimedelta(datetime.timedelta(seconds=error.retry_after_seconds))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    status = status_pb2.Status(code=_CODES[error.kind], message=_clip(error.message, MAX_MESSAGE_BYTES))
    for detail in details:
        status.details.add().Pack(detail)
    converted: grpc.Status = rpc_status.to_status(status)
    return converted


def internal_error(exc: BaseException) -> DomainError:
    log.exception("internal error", exc_info=exc)
    return DomainError(Kind.INTERNAL, "INTERNAL", "internal error; the server log has the details")

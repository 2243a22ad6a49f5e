"""`CtxfoldError`: every failure of a ctxfold call, carrying the gRPC code and the server's ErrorInfo.

The server answers every error with a gRPC status whose trailing metadata (`grpc-status-details-bin`)
holds a `google.rpc.Status` with one `google.rpc.ErrorInfo` (domain "ctxfold.dev", an UPPER_SNAKE
`reason` such as SESSION_NOT_FOUND and string `metadata`), plus a `google.rpc.RetryInfo` when
waiting helps. `reason` is a generated `ErrorReason`. Failures detected by this SDK itself carry
ErrorReason values too, with the domain "client.ctxfold.dev": STREAM_ENDED_WITHOUT_RESULT,
RESULT_CHECKSUM_MISMATCH, PROTOCOL_VIOLATION, INVALID_CLIENT_ARGUMENT, and for its argument checks the
reason the server gives for the same mistake (INVALID_CONFIG, INVALID_PAGE_SIZE, ...).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from ctxfold_client._gen.enums import ErrorReason

SERVER_DOMAIN = "ctxfold.dev"
CLIENT_DOMAIN = "client.ctxfold.dev"


class CtxfoldError(Exception):
    """A failed ctxfold call.

    Attributes:
        code: the gRPC status code (`grpc.StatusCode.NOT_FOUND`, ...).
        reason: the ErrorInfo reason as an `ErrorReason`; `ErrorReason.ERROR_REASON_UNSPECIFIED` when
            the status had none (e.g. UNAVAILABLE from the transport) or one this SDK version does not
            know (its name stays in `status`).
        domain: who raised it: SERVER_DOMAIN ("ctxfold.dev", the server's ErrorInfo as sent), CLIENT_DOMAIN
            ("client.ctxfold.dev", this SDK itself), or "" when the status had no ErrorInfo.
        metadata: the ErrorInfo metadata (e.g. `{"session_id": "s_..."}`), read-only.
        message: the human-readable status message.
        retry_delay: seconds to wait before retrying, from `google.rpc.RetryInfo` (None if unsent).
        status: the whole `google.rpc.Status`, when the server sent one.
    """

    code: grpc.StatusCode
    reason: ErrorReason
    domain: str
    metadata: Mapping[str, str]
    message: str
    retry_delay: float | None
    status: status_pb2.Status | None

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: ErrorReason = ErrorReason.ERROR_REASON_UNSPECIFIED,
        domain: str = "",
        metadata: Mapping[str, str] | None = None,
        retry_delay: float | None = None,
        status: status_pb2.Status | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata = MappingProxyType(dict(metadata or {}))
        self.retry_delay = retry_delay
        self.status = status

    def __str__(self) -> str:
        head = (
            self.code.name if self.reason is ErrorReason.ERROR_REASON_UNSPECIFIED else f"{self.code.name} {self.reason}"
        )
        return f"{head}: {self.message}" if self.message else head

    def __repr__(self) -> str:
        return (
            f"CtxfoldError(code={self.code.name}, reason={self.reason.value!r}, message={self.message!r}, "
            f"metadata={dict(self.metadata)!r})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        # Exceptions travel between processes (concurrent.futures): keep the fields, not the raw status.
        return (
            _rebuild,
            (self.code.name, self.message, self.reason.value, self.domain, dict(self.metadata), self.retry_delay),
        )

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> CtxfoldError:
        """Converts a `grpc.RpcError` (sync) or `grpc.aio.AioRpcError` into a CtxfoldError."""
        code = _status_code(error)
        message = _details(error)
        status = _rich_status(error)
        info = error_info(status) if status is not None else None
        delay = retry_delay(status) if status is not None else None
        if info is None:
            return cls(code, message, retry_delay=delay, status=status)
        return cls(
            code,
            message,
            reason=known_reason(info.reason),
            domain=info.domain,
            metadata=dict(info.metadata),
            retry_delay=delay,
            status=status,
        )

    @classmethod
    def client(cls, code: grpc.StatusCode, reason: ErrorReason, message: str, **metadata: str) -> CtxfoldError:
        """An error detected by the SDK itself (domain "client.ctxfold.dev")."""
        return cls(code, message, reason=reason, domain=CLIENT_DOMAIN, metadata=metadata)

    @classmethod
    def invalid_argument(cls, reason: ErrorReason, field: str, message: str) -> CtxfoldError:
        """An argument this SDK refuses before any call: the server's reason for the same mistake
        (or INVALID_CLIENT_ARGUMENT), metadata `field` naming the argument."""
        return cls.client(grpc.StatusCode.INVALID_ARGUMENT, reason, message, field=field)


def known_reason(name: str) -> ErrorReason:
    """The ErrorReason of a name; ERROR_REASON_UNSPECIFIED for "" and for names this SDK does not know."""
    try:
        return ErrorReason(name)
    except ValueError:
        return ErrorReason.ERROR_REASON_UNSPECIFIED


def _rebuild(
    code: str, message: str, reason: str, domain: str, metadata: dict[str, str], delay: float | None
) -> CtxfoldError:
    return CtxfoldError(
        grpc.StatusCode[code],
        message,
        reason=known_reason(reason),
        domain=domain,
        metadata=metadata,
        retry_delay=delay,
    )


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    """The first `google.rpc.ErrorInfo` among the details of a `google.rpc.Status`."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def retry_delay(status: status_pb2.Status) -> float | None:
    """The delay of the first `google.rpc.RetryInfo` among the details, in seconds."""
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToTimedelta().total_seconds())
    return None


def _status_code(error: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(error, "code", None)
    value = code() if callable(code) else None
    return value if isinstance(value, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def _details(error: grpc.RpcError) -> str:
    details = getattr(error, "details", None)
    value = details() if callable(details) else None
    return value if isinstance(value, str) else str(error)


def _rich_status(error: grpc.RpcError) -> status_pb2.Status | None:
    # rpc_status.from_call reads code(), details() and trailing_metadata(): the sync RpcError is a
    # grpc.Call, and grpc.aio.AioRpcError offers the same three methods.
    if not callable(getattr(error, "trailing_metadata", None)):
        return None
    try:
        status: status_pb2.Status | None = rpc_status.from_call(error)
    except ValueError:  # the rich status disagrees with the status line: trust neither detail
        return None
    return status


@contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raises `grpc.RpcError` (sync and asyncio) as `CtxfoldError`, chained to the original."""
    try:
        yield
    except grpc.RpcError as exc:
        raise CtxfoldError.from_rpc_error(exc) from exc

"""Domain errors. Each names what went wrong in a transport-agnostic `Kind` and a stable UPPER_SNAKE
`reason`; the gRPC layer maps them to a status code and a google.rpc.ErrorInfo in one place."""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Kind(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    FAILED_PRECONDITION = "failed_precondition"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    ABORTED = "aborted"
    ALREADY_EXISTS = "already_exists"
    UNAUTHENTICATED = "unauthenticated"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class DomainError(Exception):
    """An error a caller can act on: `message` is for people, `reason` and `metadata` for programs."""

    def __init__(
        self,
        kind: Kind,
        reason: str,
        message: str,
        metadata: Mapping[str, object] | None = None,
        retry_after_seconds: float = 0.0,
    ):
        super().__init__(message)
        self.kind = kind
        self.reason = reason
        self.message = message
        self.metadata = {k: str(v) for k, v in (metadata or {}).items()}
        self.retry_after_seconds = retry_after_seconds  # > 0: sent as a google.rpc.RetryInfo delay


def invalid(reason: str, message: str, **metadata: object) -> DomainError:
    return DomainError(Kind.INVALID_ARGUMENT, reason, message, metadata)


def not_found(reason: str, message: str, **metadata: object) -> DomainError:
    return DomainError(Kind.NOT_FOUND, reason, message, metadata)


def failed_precondition(reason: str, message: str, **metadata: object) -> DomainError:
    return DomainError(Kind.FAILED_PRECONDITION, reason, message, metadata)


def too_large(reason: str, message: str, **metadata: object) -> DomainError:
    return DomainError(Kind.RESOURCE_EXHAUSTED, reason, message, metadata)


def busy(message: str, retry_after_seconds: float, **metadata: object) -> DomainError:
    """Too many calls at once (on a session, a tenant or the server): refused now, retry after a delay."""
    return DomainError(Kind.RESOURCE_EXHAUSTED, "SESSION_BUSY", message, metadata, retry_after_seconds)


def kept_changing(session_id: str, during: str = "while this call wrote it", retry: str = "retry") -> DomainError:
    """A write that kept losing its compare-and-swap to other writers of the session."""
    message = f"session {session_id!r} kept changing {during}; {retry}"
    return DomainError(Kind.ABORTED, "CONCURRENT_MODIFICATION", message, {"session_id": session_id}, 1.0)


def session_not_found(session_id: str) -> DomainError:
    # Identical for a missing session and another tenant's session: nothing leaks across tenants.
    return not_found("SESSION_NOT_FOUND", f"session {session_id!r} not found", session_id=session_id)


def with_context(error: DomainError, note: str, **metadata: object) -> DomainError:
    """The same error, its message followed by `note` and its metadata extended."""
    return DomainError(
        error.kind, error.reason, f"{error.message}; {note}", {**error.metadata, **metadata}, error.retry_after_seconds
    )


class ConfigError(ValueError):
    """A setting (of the server or of a summarizer) names a file that cannot be read or is malformed;
    found at start-up, reported as a usage error."""

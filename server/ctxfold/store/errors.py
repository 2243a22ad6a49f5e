"""Database errors translated into domain errors, in one place (docs/operations.md, Errors); a bug stays a bug."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from typing import NoReturn

import asyncpg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ctxfold.engine.errors import DomainError, Kind

log = logging.getLogger(__name__)

UNAVAILABLE_RETRY_SECONDS = 1.0
CONFLICT_RETRY_SECONDS = 0.2

# PostgreSQL SQLSTATEs (appendix A of its manual) a retry of the same call can get past.
_PG_CONFLICT = {"40001": "serialization_failure", "40P01": "deadlock", "55P03": "lock_timeout"}
_PG_UNAVAILABLE = {
    "53100": "disk_full",
    "53200": "out_of_memory",
    "53300": "too_many_connections",
    "57014": "statement_timeout",
    "57P01": "shutting_down",
    "57P02": "shutting_down",
    "57P03": "starting_up",
    "25006": "read_only",
}
_PG_UNAVAILABLE_CLASSES = {"08": "connection_lost", "53": "out_of_resources", "58": "io_error"}
_PG_CORRUPT = {"XX001": "corrupt", "XX002": "corrupt_index"}
# SQLite extended result codes with a cause of their own, then primary codes (the low byte of an extended code).
_SQLITE_EXTENDED = {sqlite3.SQLITE_READONLY_DBMOVED: "file_moved"}
_SQLITE_CONFLICT = {sqlite3.SQLITE_BUSY: "lock_timeout", sqlite3.SQLITE_LOCKED: "lock_timeout"}
_SQLITE_UNAVAILABLE = {
    sqlite3.SQLITE_FULL: "disk_full",
    sqlite3.SQLITE_READONLY: "read_only",
    sqlite3.SQLITE_IOERR: "io_error",
    sqlite3.SQLITE_CANTOPEN: "cannot_open",
    sqlite3.SQLITE_NOMEM: "out_of_memory",
}
_SQLITE_CORRUPT = {sqlite3.SQLITE_CORRUPT: "corrupt", sqlite3.SQLITE_NOTADB: "not_a_database"}

# InternalClientError: a connection left mid-operation by an interruption, unusable from then on.
_LOST = (asyncpg.InterfaceError, asyncpg.PostgresConnectionError, asyncpg.InternalClientError, OSError, TimeoutError)
_MAY_HAVE_COMMITTED = "; the transaction was committing, so it may have been applied: retry with the same request_id"


def _causes(error: BaseException) -> Iterator[BaseException]:
    """`error`, the driver error SQLAlchemy wrapped, and what each was raised from."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [getattr(current, "orig", None), current.__cause__]


def _condition(error: BaseException) -> tuple[Kind, str] | None:
    """(kind, cause) of a database condition among `error`'s causes, or None."""
    for cause in _causes(error):
        if isinstance(cause, sqlite3.Error) and hasattr(cause, "sqlite_errorcode"):
            if cause.sqlite_errorcode in _SQLITE_EXTENDED:
                return Kind.UNAVAILABLE, _SQLITE_EXTENDED[cause.sqlite_errorcode]
            code = cause.sqlite_errorcode & 0xFF
            if code in _SQLITE_CONFLICT:
                return Kind.ABORTED, _SQLITE_CONFLICT[code]
            if code in _SQLITE_UNAVAILABLE:
                return Kind.UNAVAILABLE, _SQLITE_UNAVAILABLE[code]
            if code in _SQLITE_CORRUPT:
                return Kind.INTERNAL, _SQLITE_CORRUPT[code]
        state = getattr(cause, "sqlstate", None)
        if isinstance(state, str) and len(state) == 5:
            if state in _PG_CONFLICT:
                return Kind.ABORTED, _PG_CONFLICT[state]
            if state in _PG_CORRUPT:
                return Kind.INTERNAL, _PG_CORRUPT[state]
            name = _PG_UNAVAILABLE.get(state) or _PG_UNAVAILABLE_CLASSES.get(state[:2])
            if name:
                return Kind.UNAVAILABLE, name
        if isinstance(cause, _LOST) or (isinstance(cause, DBAPIError) and cause.connection_invalidated):
            return Kind.UNAVAILABLE, "connection_lost"
        if isinstance(cause, PoolTimeout):
            return Kind.UNAVAILABLE, "no_free_connection"
    return None


def store_error(error: BaseException, *, may_have_committed: bool = False, connecting: bool = False) -> BaseException:
    """The domain error a database failure means, or `error` itself. A failure while a connection opens (`connecting`:
    a missing database, refused credentials) makes the database unavailable."""
    if isinstance(error, DomainError):
        return error
    condition = _condition(error) or ((Kind.UNAVAILABLE, "cannot_connect") if connecting else None)
    if condition is None:
        return error
    kind, cause = condition
    outcome = _MAY_HAVE_COMMITTED if may_have_committed else ""
    metadata: dict[str, object] = {"cause": cause, **({"may_have_committed": "true"} if may_have_committed else {})}
    if kind is Kind.ABORTED:
        message = f"the database aborted the transaction ({cause}) because of a concurrent one; retry{outcome}"
        return DomainError(kind, "CONCURRENT_MODIFICATION", message, metadata, CONFLICT_RETRY_SECONDS)
    first_line = (str(getattr(error, "orig", None) or error) or type(error).__name__).splitlines()[0][:200]
    if kind is Kind.INTERNAL:  # a retry cannot help: an operator must repair or restore the database
        log.error("the database is corrupt (%s: %s)", cause, first_line)
        message = f"the database is corrupt ({cause}: {first_line}); it needs repair or a restore from a backup"
        return DomainError(kind, "STORAGE_CORRUPT", message, metadata)
    message = f"the database is unavailable ({cause}: {first_line}); retry{outcome}"
    return DomainError(kind, "STORE_UNAVAILABLE", message, metadata, UNAVAILABLE_RETRY_SECONDS)


def raise_store_error(error: BaseException, *, may_have_committed: bool = False, connecting: bool = False) -> NoReturn:
    """Re-raises `error` (from an `except` block) as the domain error it means, or as it is."""
    translated = store_error(error, may_have_committed=may_have_committed, connecting=connecting)
    if translated is error:
        raise error
    raise translated from error

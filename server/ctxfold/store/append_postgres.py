"""The one write on PostgreSQL: one statement of data-modifying CTEs (its own transaction, one round trip), its rows
as one array per column. Why: docs/architecture.md, One path for every append."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
from sqlalchemy import Column, Table
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from ctxfold.store import schema
from ctxfold.store.append import AppendWrite, Outcome, Repeated, Stale, Written
from ctxfold.store.base import connection
from ctxfold.store.errors import raise_store_error
from ctxfold.store.rows import USAGE_FIELDS


def _type(column: Column[Any]) -> str:
    return str(column.type.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]


def _unnest(table: Table, first: int) -> str:
    """`INSERT … SELECT u.* FROM swapped, unnest($first::type[], …)`: inserted only when the swap changed the row."""
    arrays = ", ".join(f"${first + i}::{_type(c)}[]" for i, c in enumerate(table.columns))
    return f"INSERT INTO {table.name} ({', '.join(table.c.keys())}) SELECT u.* FROM swapped, unnest({arrays}) AS u"


# $1-$4 the session as seen (id, tenant, version, branch), $5-$8 the bookkeeping, its revision (-1: none), whether
# whole, the time; $9 whether a usage row is recorded, then its fields; the append's own from _APPEND_FIRST on.
_USAGE_FIRST = 10
_APPEND_FIRST = _USAGE_FIRST + len(USAGE_FIELDS)
# The tables an append inserts into, in the order of their arrays.
_INSERTED = (schema.messages, schema.tool_results, schema.tool_result_chunks)


def _statements() -> tuple[str, str]:
    """With messages: swap, request id, rows, bookkeeping, usage; without: bookkeeping and usage if still current."""
    # The append adds: request id, the new head (3), message ids, then the rows' arrays.
    request, head, ids = f"${_APPEND_FIRST}", [f"${_APPEND_FIRST + i}" for i in (1, 2, 3)], f"${_APPEND_FIRST + 4}"
    current = "id = $1 AND tenant = $2 AND version = $3 AND branch_id = $4"
    # Bookkeeping's state written since (by this statement's snapshot) makes the write stale; one written
    # between the snapshot and the update only makes the bookkeeping skipped.
    state_current = "($6 < 0 OR EXISTS (SELECT 1 FROM context_states WHERE session_id = $1 AND revision = $6))"
    # The usage row is inserted only when the bookkeeping was written (the CTE `book`).
    u = schema.usage_observations.c
    usage = ", ".join(f"${_USAGE_FIRST + i}::{_type(u[name])}" for i, name in enumerate(USAGE_FIELDS))
    book = (
        "book AS (UPDATE context_states SET state_json = CASE WHEN $7 THEN $5 ELSE state_json END, "
        "bookkeeping_json = CASE WHEN $7 THEN NULL ELSE $5 END, revision = revision + 1, update_time = $8 "
        "WHERE session_id = $1 AND revision = $6 AND EXISTS (SELECT 1 FROM swapped) RETURNING revision), "
        f"usage AS (INSERT INTO usage_observations (session_id, create_time, {', '.join(USAGE_FIELDS)}) "
        f"SELECT $1::varchar, $8::float8, {usage} FROM book WHERE $9::boolean)"
    )
    first = _APPEND_FIRST + 5
    messages = _unnest(schema.messages, first)
    results = _unnest(schema.tool_results, first + len(schema.messages.c))
    chunks = _unnest(schema.tool_result_chunks, first + len(schema.messages.c) + len(schema.tool_results.c))
    append = (
        "WITH prior AS (SELECT message_ids_json FROM append_requests "
        f"WHERE session_id = $1 AND request_id = {request}), "
        f"swapped AS (UPDATE sessions SET head_seq = {head[0]}, open_tool_calls = {head[1]}, version = {head[2]}, "
        f"update_time = $8 WHERE {current} AND NOT EXISTS (SELECT 1 FROM prior) AND {state_current} RETURNING 1), "
        "request AS (INSERT INTO append_requests (session_id, request_id, message_ids_json, create_time) "
        f"SELECT $1::varchar, {request}::varchar, {ids}::text, $8::float8 FROM swapped WHERE {request} <> ''), "
        f"messages AS ({messages}), results AS ({results}), chunks AS ({chunks}), {book} "
        "SELECT (SELECT message_ids_json FROM prior), (SELECT count(*) FROM swapped), (SELECT revision FROM book)"
    )
    alone = (
        f"WITH swapped AS (SELECT 1 FROM sessions WHERE {current} AND {state_current}), {book} "
        "SELECT NULL, (SELECT count(*) FROM swapped), (SELECT revision FROM book)"
    )
    return append, alone


class PostgresAppender:
    """On connections of the store's pool (SQLAlchemy's), each write one statement of its own."""

    def __init__(self, engine: AsyncEngine):
        self._engine = engine
        self._append, self._bookkeeping = _statements()

    async def write(self, append: AppendWrite) -> Outcome:
        seen, rows, usage = append.seen, append.rows, append.usage
        book = append.bookkeeping
        args: list[object] = [
            *(seen.id, seen.tenant, seen.version, seen.branch_id),
            book.json if book else "",
            book.revision if book else -1,
            book.whole if book else False,
            append.now,
            usage is not None,
            *(usage[name] if usage else None for name in USAGE_FIELDS),
        ]
        sql = self._bookkeeping
        if rows is not None:
            sql, head = self._append, rows.head
            args += [append.request_id, head["head_seq"], head["open_tool_calls"], head["version"]]
            args.append(rows.request["message_ids_json"] if rows.request else "")  # kept with a request id only
            for table, inserted in zip(_INSERTED, (rows.messages, rows.results, rows.chunks), strict=True):
                args += [[row[c.name] for row in inserted] for c in table.columns]
        async with connection(self._engine) as conn:
            try:
                driver = (await conn.get_raw_connection()).driver_connection
                assert driver is not None
                prior, swapped, revision = await driver.fetchrow(sql, *args)
            except BaseException as error:
                if not isinstance(error, asyncpg.PostgresError):
                    # Cut off (cancelled, connection lost): it may be left mid-statement, so it is never used again.
                    await asyncio.shield(conn.invalidate())
                if not isinstance(error, Exception):
                    raise
                # One statement, its own transaction: cut off (no error from the server), it may have committed.
                raise_store_error(error, may_have_committed=not isinstance(error, asyncpg.PostgresError))
        if prior is not None:
            return Repeated(tuple(json.loads(prior)))
        if swapped != 1:
            return Stale()
        return Written(int(revision) if revision is not None else 0)

    async def close(self) -> None:
        pass  # the connections are the engine's

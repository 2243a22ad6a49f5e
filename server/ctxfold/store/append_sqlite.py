"""The one write on SQLite, in the writer turn: a small one commits on the loop without waiting for the lock, a larger
one (or any while another process holds it) in a thread. Why: docs/architecture.md, One path for every append."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Update, and_, bindparam, insert, literal_column, null, select, update
from sqlalchemy.dialects import sqlite as sqlite_dialect

from ctxfold import cpu
from ctxfold.store import schema
from ctxfold.store.append import AppendWrite, Outcome, Repeated, Row, Stale, Written
from ctxfold.store.database import BUSY_TIMEOUT_MS, configure_sqlite_connection
from ctxfold.store.errors import raise_store_error
from ctxfold.store.rows import USAGE_FIELDS

# A write of at most this many bytes commits on the event loop, a larger one in the thread.
INLINE_MAX_BYTES = cpu.OFFLOAD_MIN_BYTES
# No WAL checkpoint on commit (it syncs the file): a passive one, in the thread, after this many commits or bytes
# written (SQLite's own default is every 1000 pages), whichever comes first.
CHECKPOINT_EVERY_COMMITS = 100
CHECKPOINT_EVERY_BYTES = 4 << 20


class _Busy(Exception):
    """Another process holds SQLite's write lock: the loop must not wait for it."""


def _compile() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The statements of an append compiled once for SQLite, with their parameter names in order."""
    s, cs, ar = schema.sessions.c, schema.context_states.c, schema.append_requests.c
    current = and_(*(getattr(s, name) == bindparam(f"at_{name}") for name in ("id", "tenant", "version", "branch_id")))

    def state_write(**values: object) -> Update:
        """A write of the session's state over the revision seen, which it advances."""
        return (
            update(schema.context_states)
            .where(cs.session_id == bindparam("at_id"), cs.revision == bindparam("revision"))
            .values(**values, revision=cs.revision + literal_column("1"), update_time=bindparam("now"))
        )

    statements = {
        "prior": select(ar.message_ids_json).where(
            ar.session_id == bindparam("at_id"), ar.request_id == bindparam("request_id")
        ),
        "current": select(s.id).where(current),
        "revision": select(cs.revision).where(cs.session_id == bindparam("at_id")),
        "advance": update(schema.sessions)
        .where(current)
        .values({name: bindparam(name) for name in ("head_seq", "open_tool_calls", "version", "update_time")}),
        "request": insert(schema.append_requests),
        "message": insert(schema.messages),
        "result": insert(schema.tool_results),
        "chunk": insert(schema.tool_result_chunks),
        # Its id is the database's.
        "usage": insert(schema.usage_observations).values(
            {name: bindparam(name) for name in ("session_id", *USAGE_FIELDS, "create_time")}
        ),
        "bookkeeping": state_write(bookkeeping_json=bindparam("document")),
        "whole_state": state_write(state_json=bindparam("document"), bookkeeping_json=null()),
    }
    dialect = sqlite_dialect.dialect(paramstyle="qmark")
    compiled = {name: statement.compile(dialect=dialect) for name, statement in statements.items()}
    return {name: (str(done), tuple(done.positiontup or ())) for name, done in compiled.items()}


class MovedDatabaseFile(sqlite3.OperationalError):
    """SQLite's own error for a database file moved since it was opened (it checks in rollback-journal mode only)."""

    sqlite_errorcode = sqlite3.SQLITE_READONLY_DBMOVED


class SqliteFile:
    """The SQLite file at `path` as its first transaction found it. Once it is moved, deleted or replaced under the
    running server, every transaction fails (MovedDatabaseFile) until it is back: the pool's open connections would
    write on to a file nobody will open again, and a new one would create an empty database at the path."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._identity: tuple[int, int] | None = None

    def _current(self) -> tuple[int, int] | None:
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            return None
        return found.st_dev, found.st_ino

    def check(self) -> None:
        current = self._current()
        if self._identity is None:
            self._identity = current
        elif current != self._identity:
            raise MovedDatabaseFile(f"the database file {self.path} was moved, deleted or replaced; put it back")


class SqliteAppender:
    def __init__(self, file: SqliteFile, writer_turn: asyncio.Lock):
        self._sql = _compile()
        self._file = file
        self._writer_turn = writer_turn  # the in-process writers' queue for SQLite's one write lock
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ctxfold-append")
        self._conn: sqlite3.Connection | None = None
        self._commits = 0  # and bytes written since the last checkpoint
        self._bytes = 0

    async def write(self, append: AppendWrite) -> Outcome:
        """`append` committed on the loop when small, else (or while another process holds the lock) in the thread."""
        loop = asyncio.get_running_loop()
        async with self._writer_turn:
            conn = self._connection()
            outcome = self._commit_inline(conn, append) if append.size <= INLINE_MAX_BYTES else None
            if outcome is None:
                outcome = await loop.run_in_executor(self._thread, self._commit, conn, append, True)
            self._commits += 1
            self._bytes += append.size
            if self._commits >= CHECKPOINT_EVERY_COMMITS or self._bytes >= CHECKPOINT_EVERY_BYTES:
                self._commits = self._bytes = 0
                await loop.run_in_executor(self._thread, self._checkpoint_wal, conn)
            return outcome

    def _commit_inline(self, conn: sqlite3.Connection, append: AppendWrite) -> Outcome | None:
        """`append` committed on the loop, or None while another process holds the lock (the thread waits for it)."""
        try:
            return self._commit(conn, append, wait=False)
        except _Busy:
            return None

    async def close(self) -> None:
        async with self._writer_turn:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._thread.shutdown()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # `_commit` runs BEGIN/COMMIT itself; the loop and the thread use it in turn, never at once.
            self._conn = sqlite3.connect(self._file.path, isolation_level=None, check_same_thread=False)
            configure_sqlite_connection(self._conn)
            self._conn.execute("PRAGMA wal_autocheckpoint=0")
        return self._conn

    @staticmethod
    def _checkpoint_wal(conn: sqlite3.Connection) -> None:
        # PASSIVE: never waits for readers or blocks writers; a failure only delays it (the engine checkpoints too).
        with contextlib.suppress(sqlite3.Error):
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _commit(self, conn: sqlite3.Connection, append: AppendWrite, wait: bool) -> Outcome:
        """`append` in one transaction; without `wait` (on the loop) another process's lock raises _Busy first."""
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS if wait else 0}")
        try:
            self._file.check()
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if not wait and error.sqlite_errorcode == sqlite3.SQLITE_BUSY:
                raise _Busy from None
            raise_store_error(error)
        committing = False
        try:
            outcome = self._writes(conn, append)
            committing = True
            conn.execute("COMMIT" if isinstance(outcome, Written) else "ROLLBACK")
            return outcome
        except BaseException as error:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # a disk that failed the write may fail this too
                    conn.execute("ROLLBACK")
            raise_store_error(error, may_have_committed=committing)

    def _run(self, conn: sqlite3.Connection, name: str, row: Row) -> sqlite3.Cursor:
        sql, params = self._sql[name]
        return conn.execute(sql, tuple(row[p] for p in params))

    def _writes(self, conn: sqlite3.Connection, append: AppendWrite) -> Outcome:
        run, rows = self._run, append.rows
        at = {f"at_{name}": getattr(append.seen, name) for name in ("id", "tenant", "version", "branch_id")}
        if append.request_id:
            prior = run(conn, "prior", {**at, "request_id": append.request_id}).fetchone()
            if prior is not None:
                return Repeated(tuple(json.loads(prior[0])))
        book = append.bookkeeping
        if book is not None and run(conn, "revision", at).fetchone() != (book.revision,):
            return Stale()  # the state was written since the answer was made from it
        if rows is not None:
            if run(conn, "advance", {**at, **rows.head}).rowcount != 1:
                return Stale()
            if rows.request is not None:
                run(conn, "request", rows.request)
            for name, inserted in (("message", rows.messages), ("result", rows.results), ("chunk", rows.chunks)):
                if inserted:
                    sql, params = self._sql[name]
                    conn.executemany(sql, [tuple(r[p] for p in params) for r in inserted])
        elif run(conn, "current", at).fetchone() is None:
            return Stale()
        if book is None:
            return Written(0)
        values = {"at_id": append.seen.id, "revision": book.revision, "document": book.json, "now": append.now}
        run(conn, "whole_state" if book.whole else "bookkeeping", values)
        if append.usage is not None:
            run(conn, "usage", append.usage)
        return Written(book.revision + 1)  # the revision was checked in this transaction

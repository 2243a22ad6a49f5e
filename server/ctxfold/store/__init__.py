"""Persistence: SQLAlchemy Core tables (`schema`), Alembic migrations and `Store`, every query ctxfold
makes, scoped by tenant. Writers compare-and-swap on `sessions.version` (and the context state's
revision), so concurrent appends and replicas sharing one database never lose a write.

The store is split by aggregate, one module each: `sessions` (session rows, fold lease), `lineage`
(segments, branch points, Rewind, live ranges, collection of unreachable segments), `transcript`
(appends, request ids, message pages), `checkpoints` (checkpoint rows, chains, the readable index),
`tool_results` (encoding, chunks, page reads, fold documents), `prepared` (folds made in the
background, not installed yet) and `state` (the view's snapshot,
installs, the hot path's append, context states, usage), whose hot-path write runs on the driver
itself (`hot_write`). `rows` holds the records and the one row
mapper of each; `base` the engine, the transactions and the clock they share.

`Store` is one class assembled from the aggregates' classes rather than an object holding six: the
service keeps calling `store.append_messages(...)` and needs no map of which aggregate answers what.
An aggregate's class holds only its public operations, each one transaction. Work that spans
aggregates inside one transaction (an append checks the session row and inserts raw results; an
install writes a checkpoint, the session and the state) calls the other modules' query functions,
which take the open connection, never another aggregate's method."""

from ctxfold.store.base import StaleSession
from ctxfold.store.checkpoints import CheckpointStore
from ctxfold.store.lineage import LineageStore
from ctxfold.store.prepared import PreparedFoldStore
from ctxfold.store.sessions import SessionStore
from ctxfold.store.state import StateStore
from ctxfold.store.tool_results import ToolResultStore
from ctxfold.store.transcript import TranscriptStore


class Store(
    SessionStore, LineageStore, TranscriptStore, CheckpointStore, ToolResultStore, StateStore, PreparedFoldStore
):
    """The one store the service uses (see the module docstring); `clock` stamps every row it writes."""


__all__ = ["StaleSession", "Store"]

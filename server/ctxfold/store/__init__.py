"""Persistence: `Store`, every query ctxfold makes, scoped by tenant, assembled from one class per aggregate.
See docs/architecture.md, Storage model (the store's code) and Concurrency."""

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
    """The one store the service uses; `clock` stamps every row it writes."""


__all__ = ["StaleSession", "Store"]

"""Persistence: `Store`, every query scoped by tenant, one class per aggregate (docs/architecture.md, Storage model)."""

from ctxfold.store.base import StaleSession
from ctxfold.store.checkpoints import CheckpointStore
from ctxfold.store.lineage import LineageStore
from ctxfold.store.sessions import SessionStore
from ctxfold.store.state import StateStore
from ctxfold.store.tool_results import ToolResultStore
from ctxfold.store.transcript import TranscriptStore


class Store(SessionStore, LineageStore, TranscriptStore, CheckpointStore, ToolResultStore, StateStore):
    """The one store the service uses; `clock` stamps every row it writes."""


__all__ = ["StaleSession", "Store"]

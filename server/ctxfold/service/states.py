"""ObserveUsage, GetContextState and receipts written apart from a call: the context state read, and written
by compare-and-swap on its revision; the cached context follows what was written."""

from __future__ import annotations

from dataclasses import replace

from ctxfold.engine.context import SessionRecord
from ctxfold.engine.errors import kept_changing
from ctxfold.engine.model import Usage
from ctxfold.engine.state import ContextState, Receipt, check_usage, fingerprint, load_state, observed
from ctxfold.service.contexts import Contexts
from ctxfold.service.observer import MaintenanceObserver
from ctxfold.store import Store
from ctxfold.telemetry import INSTRUMENTS

# A write that keeps losing compare-and-swap races gives up after this many rounds.
MAX_ROUNDS = 8


class ContextStates:
    def __init__(self, store: Store, contexts: Contexts):
        self.store = store
        self.contexts = contexts

    async def observe_usage(self, tenant: str, session_id: str, usage: Usage) -> tuple[float, bool]:
        """Records provider usage and calibrates the estimator; never maintains anything."""
        check_usage(usage)
        session = await self.store.get_session(tenant, session_id)
        for _ in range(MAX_ROUNDS):
            text, revision = await self.store.read_state(session)
            state, _why = load_state(text, fingerprint(session.branch_id, session.checkpoint_id))
            result = observed(state, usage)
            written = await self.store.save_state(session.id, result.state.to_json(), revision)
            if written:
                self._recalibrate_cached(tenant, session_id, revision, result.state, written)
                break
            session = await self.store.get_session(tenant, session_id)
        else:
            raise kept_changing(session_id)
        await self.store.record_usage(session, replace(usage, estimated_tokens=result.estimated_tokens))
        INSTRUMENTS.usage_input_tokens.add(usage.cached_input_tokens, {"ctxfold.cached": True})
        INSTRUMENTS.usage_input_tokens.add(usage.input_tokens - usage.cached_input_tokens, {"ctxfold.cached": False})
        return result.state.calibration, result.accepted

    def _recalibrate_cached(self, tenant: str, session_id: str, read: int, state: ContextState, written: int) -> None:
        """Moves the cached context of a session to the state ObserveUsage wrote over revision `read`
        (else the next append's bookkeeping would be skipped); one of another revision is dropped."""
        cached = self.contexts.cached(tenant, session_id)
        if cached is None:
            return
        if cached.revision != read:
            self.contexts.drop(tenant, session_id)
            return
        projection = cached.projection.recalibrated(state.calibration)
        self.contexts.put(replace(cached, projection=projection, state=state, revision=written), grown_by=())

    async def context_state(self, tenant: str, session_id: str) -> str:
        """The stored state when it is valid for the session, else the state it would be rebuilt to."""
        session = await self.store.get_session(tenant, session_id)
        text, _revision = await self.store.read_state(session)
        state, _why = load_state(text, fingerprint(session.branch_id, session.checkpoint_id))
        return state.to_json()

    async def add_receipt(self, tenant: str, session: SessionRecord, receipt: Receipt) -> None:
        """Adds a receipt to the stored state (best effort: given up if the state keeps changing)."""
        MaintenanceObserver.receipt(receipt)
        for _ in range(MAX_ROUNDS):
            text, revision = await self.store.read_state(session)
            state, _why = load_state(text, fingerprint(session.branch_id, session.checkpoint_id))
            if await self.store.save_state(session.id, state.with_receipt(receipt).to_json(), revision):
                self.contexts.drop(tenant, session.id)
                return
            session = await self.store.get_session(tenant, session.id)

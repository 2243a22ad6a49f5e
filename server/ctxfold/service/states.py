"""ObserveUsage, GetContextState and receipts written apart from a call: the context state read, and written
by compare-and-swap on its revision; the cached context follows what was written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ctxfold.engine.context import SessionRecord, observe
from ctxfold.engine.errors import kept_changing
from ctxfold.engine.model import Usage
from ctxfold.engine.state import ContextState, Receipt, check_usage, fingerprint, load_state
from ctxfold.service.contexts import Contexts
from ctxfold.service.observer import MaintenanceObserver
from ctxfold.store import Store
from ctxfold.store.append import AppendWrite, Bookkeeping, Written
from ctxfold.telemetry import INSTRUMENTS

# A write that keeps losing compare-and-swap races gives up after this many rounds.
MAX_ROUNDS = 8


class ContextStates:
    def __init__(self, store: Store, contexts: Contexts):
        self.store = store
        self.contexts = contexts

    async def read(self, session: SessionRecord) -> tuple[ContextState, int]:
        """The stored state when it is valid for the session, else the state it is rebuilt to; its revision."""
        text, revision = await self.store.read_state(session)
        return load_state(text, fingerprint(session.branch_id, session.checkpoint_id))[0], revision

    async def change(
        self, session: SessionRecord, change: Callable[[ContextState], ContextState]
    ) -> SessionRecord | None:
        """`change` applied to the stored state by compare-and-swap on its revision, read again while others
        write it; the session as written (None when others kept writing)."""
        for _ in range(MAX_ROUNDS):
            state, revision = await self.read(session)
            changed = change(state)
            written = await self.store.save_state(session.id, changed.to_json(), revision)
            if written:
                self._follow(session, revision, changed, written)
                return session
            session = await self.store.get_session(session.tenant, session.id)
        return None

    def _follow(self, session: SessionRecord, read: int, state: ContextState, written: int) -> None:
        """The session's cached context of revision `read` takes the state written over it (else its next
        append's bookkeeping would be skipped); one of another revision is dropped."""
        cached = self.contexts.cached(session.tenant, session.id)
        if cached is None:
            return
        if cached.revision != read:
            self.contexts.written(session, None)
            return
        projection = cached.projection.recalibrated(state.calibration)
        changed = replace(cached, projection=projection, state=state, revision=written, state_stored=True)
        self.contexts.written(session, changed, grown_by=())

    async def observe_usage(self, tenant: str, session_id: str, usage: Usage) -> tuple[float, bool]:
        """Records provider usage and calibrates the estimator; never maintains anything. One write, as an
        append's: the session's context (cached), observed, written over its state's revision with the usage
        row; the cached context follows it."""
        check_usage(usage)
        async with self.contexts.turns.hold(session_id):
            return await self._observe(tenant, session_id, usage)

    async def _observe(self, tenant: str, session_id: str, usage: Usage) -> tuple[float, bool]:
        for attempt in range(MAX_ROUNDS):
            context = await self.contexts.load(tenant, session_id, fresh=attempt > 0)
            result = observe(context, usage)
            session, now = context.session, self.store.clock()
            book = Bookkeeping(result.context.state.to_json(), context.revision, whole=True)
            write = AppendWrite(session, replace(session, update_time=now), (), (), "", book, result.usage)
            match await self.store.append(write):
                case Written(revision) if revision:
                    self.contexts.written(session, result.written(revision), grown_by=())
                    INSTRUMENTS.usage_input_tokens.add(usage.cached_input_tokens, {"ctxfold.cached": True})
                    cached = {"ctxfold.cached": False}
                    INSTRUMENTS.usage_input_tokens.add(usage.input_tokens - usage.cached_input_tokens, cached)
                    return result.context.state.calibration, result.accepted
                case _:  # the session or its state changed since the context was read: read the store's
                    self.contexts.written(session, None)
        raise kept_changing(session_id)

    async def context_state(self, tenant: str, session_id: str) -> str:
        """The stored state when it is valid for the session, else the state it would be rebuilt to."""
        return (await self.read(await self.store.get_session(tenant, session_id)))[0].to_json()

    async def add_receipt(self, session: SessionRecord, receipt: Receipt) -> None:
        """Adds a receipt to the stored state (best effort: given up if the state keeps changing)."""
        MaintenanceObserver.receipt(receipt)
        await self.change(session, lambda state: state.with_receipt(receipt))

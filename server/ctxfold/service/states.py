"""ObserveUsage, GetContextState and receipts written apart from a call: the context state read, and changed
by the one write of an append (compare-and-swap on the state's revision); the cached context follows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ctxfold.engine.context import Context, SessionRecord, UsageObserved, observe
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

# A change of a session's context apart from an append: the context it becomes, and a usage row to record with it.
Change = Callable[[Context], tuple[Context, Usage | None]]


class ContextStates:
    def __init__(self, store: Store, contexts: Contexts):
        self.store = store
        self.contexts = contexts

    async def read(self, session: SessionRecord) -> tuple[ContextState, int]:
        """The stored state when it is valid for the session, else the state it is rebuilt to; its revision."""
        text, revision = await self.store.read_state(session)
        return load_state(text, fingerprint(session.branch_id, session.checkpoint_id))[0], revision

    async def observe_usage(self, tenant: str, session_id: str, usage: Usage) -> tuple[float, bool]:
        """Records provider usage and calibrates the estimator; never maintains anything."""
        check_usage(usage)
        observed: list[UsageObserved] = []

        def observing(context: Context) -> tuple[Context, Usage | None]:
            observed.append(observe(context, usage))
            return observed[-1].context, observed[-1].usage

        if not await self.change(tenant, session_id, observing):
            raise kept_changing(session_id)
        INSTRUMENTS.usage_input_tokens.add(usage.cached_input_tokens, {"ctxfold.cached": True})
        INSTRUMENTS.usage_input_tokens.add(usage.input_tokens - usage.cached_input_tokens, {"ctxfold.cached": False})
        return observed[-1].context.state.calibration, observed[-1].accepted

    async def add_receipt(self, session: SessionRecord, receipt: Receipt) -> None:
        """Adds a receipt to the stored state (best effort: given up if the state keeps changing)."""
        MaintenanceObserver.receipt(receipt)
        await self.change(session.tenant, session.id, lambda c: (replace(c, state=c.state.with_receipt(receipt)), None))

    async def change(self, tenant: str, session_id: str, change: Change) -> bool:
        """`change` applied to the session's context (cached) and its whole state written, with the usage row it
        gives, by the one write of an append, over the state's revision while the session is unchanged; in
        the session's turn, read again from the store while others write (False when they kept writing).
        The cached context follows what was written."""
        async with self.contexts.turns.hold(session_id):
            for attempt in range(MAX_ROUNDS):
                context = await self.contexts.load(tenant, session_id, fresh=attempt > 0)
                changed, usage = change(context)
                session, now = context.session, self.store.clock()
                book = Bookkeeping(changed.state.to_json(), context.revision, whole=True)
                write = AppendWrite(session, replace(session, update_time=now), (), (), "", book, usage)
                match await self.store.append(write):
                    case Written(revision) if revision:
                        written = replace(changed, revision=revision, state_stored=True)
                        self.contexts.written(session, written, grown_by=())
                        return True
                    case _:  # the session or its state changed since the context was read: read the store's
                        self.contexts.written(session, None)
        return False

    async def context_state(self, tenant: str, session_id: str) -> str:
        """The stored state when it is valid for the session, else the state it would be rebuilt to."""
        return (await self.read(await self.store.get_session(tenant, session_id)))[0].to_json()

"""ObserveUsage, GetContextState and receipts apart from a call: the state read, and changed by the one write."""

from __future__ import annotations

import logging

from ctxfold.engine.context import Observing, SessionRecord, receipted
from ctxfold.engine.errors import DomainError
from ctxfold.engine.model import Usage
from ctxfold.engine.state import ContextState, Receipt, check_usage, fingerprint, load_state
from ctxfold.service.contexts import Contexts
from ctxfold.service.observer import MaintenanceObserver
from ctxfold.telemetry import INSTRUMENTS

log = logging.getLogger(__name__)


class ContextStates:
    def __init__(self, contexts: Contexts):
        self.store, self.contexts = contexts.store, contexts

    async def read(self, session: SessionRecord) -> tuple[ContextState, int]:
        """The stored state when it is valid for the session, else the state it is rebuilt to; its revision."""
        text, revision = await self.store.read_state(session)
        return load_state(text, fingerprint(session.branch_id, session.checkpoint_id))[0], revision

    async def observe_usage(self, tenant: str, session_id: str, usage: Usage) -> tuple[float, bool]:
        """Records provider usage and calibrates the estimator; never maintains anything."""
        check_usage(usage)
        await self.contexts.change(tenant, session_id, step := Observing(usage))
        INSTRUMENTS.usage_input_tokens.add(usage.cached_input_tokens, {"ctxfold.cached": True})
        INSTRUMENTS.usage_input_tokens.add(usage.input_tokens - usage.cached_input_tokens, {"ctxfold.cached": False})
        assert step.observed is not None  # written: the step ran
        return step.observed.context.state.calibration, step.observed.accepted

    async def add_receipt(self, session: SessionRecord, receipt: Receipt) -> None:
        """Adds a receipt to the stored state (best effort: given up if the state keeps changing)."""
        MaintenanceObserver.receipt(receipt)
        try:
            await self.contexts.change(session.tenant, session.id, receipted(receipt))
        except DomainError as error:
            if error.reason != "CONCURRENT_MODIFICATION":
                raise
            log.info("session %s kept changing: receipt %r not recorded", session.id, receipt.reason)

    async def context_state(self, tenant: str, session_id: str) -> str:
        """The stored state when it is valid for the session, else the state it would be rebuilt to."""
        return (await self.read(await self.store.get_session(tenant, session_id)))[0].to_json()

"""Lineage use cases: Fork and Rewind; neither copies history (docs/architecture.md, Storage model)."""

from __future__ import annotations

from collections.abc import Callable

from ctxfold.engine.context import SessionRecord
from ctxfold.engine.errors import kept_changing
from ctxfold.engine.ids import new_id
from ctxfold.engine.model import ConfigInput, config_from_json, config_to_json, override_config
from ctxfold.engine.state import ContextState, Receipt, carried_over, fingerprint
from ctxfold.service.sessions import SessionInfo, Sessions, fitting_config_tokens, session_info
from ctxfold.service.states import ContextStates
from ctxfold.store import StaleSession, Store

REWIND_ATTEMPTS = 10


class Lineage:
    def __init__(
        self,
        store: Store,
        sessions: Sessions,
        states: ContextStates,
        on_rewound: Callable[[str, int], Receipt | None] = lambda _s, _q: None,
    ):
        self.store = store
        self.sessions = sessions
        self.states = states
        # Told of every rewind: a background fold reading past it is cancelled, its receipt kept in the state.
        self.on_rewound = on_rewound

    async def fork(self, tenant: str, session_id: str, at_seq: int, overrides: ConfigInput) -> SessionInfo:
        source = await self.store.get_session(tenant, session_id)
        new_session_id = new_id("s")
        config = self.sessions.resolve(override_config(config_from_json(source.config_json), overrides), new_session_id)
        record = await self.store.fork(
            source, at_seq, new_session_id, config_to_json(config), await fitting_config_tokens(config)
        )
        # The fork's first view equals the source's at the fork point: same checkpoint, same pruning.
        source_state, _ = await self.states.read(source)
        _, revision = await self.store.read_state(record)
        await self.store.save_state(record.id, self._carried(source_state, record), revision)
        return SessionInfo(record, config)

    @staticmethod
    def _carried(state: ContextState, branch: SessionRecord) -> str:
        return carried_over(state, fingerprint(branch.branch_id, branch.checkpoint_id), branch.checkpoint_id).to_json()

    async def rewind(self, tenant: str, session_id: str, to_seq: int) -> SessionInfo:
        for _ in range(REWIND_ATTEMPTS):
            session = await self.store.get_session(tenant, session_id)
            if to_seq == session.head_seq:
                return session_info(session)
            state, revision = await self.states.read(session)
            try:
                await self.store.rewind(session, to_seq)
            except StaleSession:
                continue
            if (stopped := self.on_rewound(session_id, to_seq)) is not None:
                state = state.with_receipt(stopped)
            info = await self.sessions.get(tenant, session_id)
            # Best effort: if the state changed meanwhile, the next Prepare rebuilds it safely.
            await self.store.save_state(session_id, self._carried(state, info.record), revision)
            return info
        raise kept_changing(session_id, "during the rewind")

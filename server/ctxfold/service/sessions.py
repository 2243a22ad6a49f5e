"""Session use cases: create, read, list, delete; Fork and Rewind, which copy no history (docs/architecture.md,
Storage model)."""

from __future__ import annotations

from collections.abc import Callable

from ctxfold import cpu
from ctxfold.engine.context import SessionRecord
from ctxfold.engine.errors import kept_changing
from ctxfold.engine.ids import new_session_id
from ctxfold.engine.model import (
    ConfigInput,
    SessionConfig,
    config_from_json,
    config_to_json,
    override_config,
    resolve_config,
)
from ctxfold.engine.paging import decode_token, encode_token, page_size
from ctxfold.engine.projection import check_config_fits
from ctxfold.engine.state import ContextState, Receipt, carried_over, fingerprint
from ctxfold.service.states import ContextStates
from ctxfold.store import StaleSession
from ctxfold.store.rows import ConfigTokens

REWIND_ATTEMPTS = 10


def config_tokens(config: SessionConfig) -> ConfigTokens:
    """Counted once, when a config is set, and stored (large texts in the counting process: call it in `cpu.run`)."""
    return ConfigTokens(system=cpu.count_text(config.system_prompt), tools=cpu.count_text(config.tools_json))


def _carried(state: ContextState, branch: SessionRecord) -> str:
    return carried_over(state, fingerprint(branch.branch_id, branch.checkpoint_id), branch.checkpoint_id).to_json()


class Sessions:
    def __init__(
        self,
        states: ContextStates,
        summarizer_names: frozenset[str],
        on_rewound: Callable[[str, int], Receipt | None] = lambda _s, _q: None,
    ):
        self.store, self.states, self.summarizer_names = states.store, states, summarizer_names
        # Told of every rewind: a background fold reading past it is cancelled, its receipt kept in the state. A delete
        # is told as a rewind to 0: nothing of the session is left to fold.
        self.on_rewound = on_rewound

    async def create(self, tenant: str, given: ConfigInput, session_key: str = "") -> SessionRecord:
        """A new session; with `session_key`, the session that key names, created when it does not exist."""
        session_id = new_session_id(tenant, session_key)
        if session_key:
            existing = await self.store.find_session(tenant, session_id)
            if existing is not None:
                return existing
        # A create of a key that lost the race gets the winner's session (the store's create_session).
        return await self._create(tenant, given, session_id)

    async def _create(
        self, tenant: str, given: ConfigInput, session_id: str, source: SessionRecord | None = None, at_seq: int = 0
    ) -> SessionRecord:
        """A session (a fork of `source` at `at_seq`, if given) with the config `given` resolves to, once its token
        counts (off the loop) are known to leave room for a view (else INVALID_CONFIG)."""
        config = resolve_config(given, self.summarizer_names, session_id)
        tokens = await cpu.run(len(config.system_prompt) + len(config.tools_json), config_tokens, config)
        check_config_fits(config, tokens.system, tokens.tools)
        return await self.store.create_session(
            tenant, config_to_json(config), tokens, session_id=session_id, source=source, at_seq=at_seq
        )

    async def get(self, tenant: str, session_id: str) -> SessionRecord:
        return await self.store.get_session(tenant, session_id)

    async def list(self, tenant: str, requested_size: int, token: str) -> tuple[list[SessionRecord], str]:
        scope = f"sessions:{tenant}"
        records, cursor = await self.store.list_sessions(
            tenant, page_size(requested_size), decode_token(scope, token, (float, str))
        )
        return records, encode_token(scope, list(cursor)) if cursor else ""

    async def delete(self, tenant: str, session_id: str) -> None:
        await self.store.delete_session(tenant, session_id)
        self.on_rewound(session_id, 0)

    async def fork(self, tenant: str, session_id: str, at_seq: int, overrides: ConfigInput) -> SessionRecord:
        source = await self.store.get_session(tenant, session_id)
        given = override_config(config_from_json(source.config_json), overrides)
        record = await self._create(tenant, given, new_session_id(tenant), source, at_seq)
        # The fork's first view equals the source's at the fork point: same checkpoint, same pruning.
        source_state, _ = await self.states.read(source)
        _, revision = await self.store.read_state(record)
        await self.store.save_state(record.id, _carried(source_state, record), revision)
        return record

    async def rewind(self, tenant: str, session_id: str, to_seq: int) -> SessionRecord:
        for _ in range(REWIND_ATTEMPTS):
            session = await self.store.get_session(tenant, session_id)
            if to_seq == session.head_seq:
                return session
            state, revision = await self.states.read(session)
            try:
                await self.store.rewind(session, to_seq)
            except StaleSession:
                continue
            if (stopped := self.on_rewound(session_id, to_seq)) is not None:
                state = state.with_receipt(stopped)
            rewound = await self.store.get_session(tenant, session_id)
            # Best effort: if the state changed meanwhile, the next Prepare rebuilds it safely.
            await self.store.save_state(session_id, _carried(state, rewound), revision)
            return rewound
        raise kept_changing(session_id, "during the rewind")

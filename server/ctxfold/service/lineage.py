"""Lineage use cases: Fork and Rewind. Neither copies history: both start a new transcript segment
whose parent holds the branch point (see engine/lineage.py)."""

from __future__ import annotations

from ctxfold.engine.errors import DomainError, Kind
from ctxfold.engine.model import ConfigInput, config_from_json, config_to_json, override_config
from ctxfold.service.sessions import SessionInfo, Sessions, config_tokens, session_info
from ctxfold.store.repository import StaleSession, Store, new_id

REWIND_ATTEMPTS = 10


class Lineage:
    def __init__(self, store: Store, sessions: Sessions):
        self.store = store
        self.sessions = sessions

    async def fork(self, tenant: str, session_id: str, at_seq: int, overrides: ConfigInput) -> SessionInfo:
        source = await self.store.get_session(tenant, session_id)
        new_session_id = new_id("s")
        config = self.sessions.resolve(override_config(config_from_json(source.config_json), overrides), new_session_id)
        record = await self.store.fork(
            source,
            at_seq or source.head_seq,
            new_session_id,
            config_to_json(config),
            config_tokens(config),
        )
        return SessionInfo(record, config)

    async def rewind(self, tenant: str, session_id: str, to_seq: int) -> SessionInfo:
        for _ in range(REWIND_ATTEMPTS):
            session = await self.store.get_session(tenant, session_id)
            if to_seq == session.head_seq:
                return session_info(session)
            try:
                await self.store.rewind(session, to_seq)
                return await self.sessions.get(tenant, session_id)
            except StaleSession:
                continue
        raise DomainError(
            Kind.ABORTED,
            "CONCURRENT_MODIFICATION",
            f"session {session_id!r} kept changing during the rewind; retry",
            {"session_id": session_id},
        )

"""Session use cases: create, read, list, delete."""

from __future__ import annotations

from dataclasses import dataclass

from ctxfold import cpu
from ctxfold.engine.context import SessionRecord
from ctxfold.engine.ids import new_session_id
from ctxfold.engine.model import ConfigInput, SessionConfig, config_from_json, config_to_json, resolve_config
from ctxfold.engine.paging import decode_token, encode_token, page_size
from ctxfold.engine.projection import check_config_fits
from ctxfold.store import Store
from ctxfold.store.rows import ConfigTokens


@dataclass(frozen=True)
class SessionInfo:
    record: SessionRecord
    config: SessionConfig


def config_tokens(config: SessionConfig) -> ConfigTokens:
    """Counted once, when a config is set, and stored (large texts in the counting process: call it in `cpu.run`)."""
    return ConfigTokens(system=cpu.count_text(config.system_prompt), tools=cpu.count_text(config.tools_json))


async def fitting_config_tokens(config: SessionConfig) -> ConfigTokens:
    """The config's token counts (off the loop), once known to leave room for a view (else INVALID_CONFIG)."""
    tokens = await cpu.run(len(config.system_prompt) + len(config.tools_json), config_tokens, config)
    check_config_fits(config, tokens.system, tokens.tools)
    return tokens


def session_info(record: SessionRecord) -> SessionInfo:
    return SessionInfo(record, config_from_json(record.config_json))


class Sessions:
    def __init__(self, store: Store, summarizer_names: frozenset[str]):
        self.store = store
        self.summarizer_names = summarizer_names

    def resolve(self, given: ConfigInput, session_id: str) -> SessionConfig:
        return resolve_config(given, self.summarizer_names, session_id)

    async def create(self, tenant: str, given: ConfigInput, session_key: str = "") -> SessionInfo:
        """A new session; with `session_key`, the session that key names, created when it does not exist."""
        session_id = new_session_id(tenant, session_key)
        if session_key:
            existing = await self.store.find_session(tenant, session_id)
            if existing is not None:
                return session_info(existing)
        config = self.resolve(given, session_id)
        record = await self.store.create_session(
            tenant, config_to_json(config), await fitting_config_tokens(config), session_id=session_id
        )
        return session_info(record)  # a create of a key that lost the race gets the winner's session

    async def get(self, tenant: str, session_id: str) -> SessionInfo:
        return session_info(await self.store.get_session(tenant, session_id))

    async def list(self, tenant: str, requested_size: int, token: str) -> tuple[list[SessionInfo], str]:
        scope = f"sessions:{tenant}"
        records, cursor = await self.store.list_sessions(
            tenant, page_size(requested_size), decode_token(scope, token, (float, str))
        )
        return [session_info(r) for r in records], encode_token(scope, list(cursor)) if cursor else ""

    async def delete(self, tenant: str, session_id: str) -> None:
        await self.store.delete_session(tenant, session_id)

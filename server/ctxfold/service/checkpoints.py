"""Checkpoint reads for operators: a session's checkpoint chain with each summary (ListCheckpoints,
GetCheckpoint)."""

from __future__ import annotations

from ctxfold.engine.view import StoredCheckpoint
from ctxfold.service.paging import decode_token, encode_token, page_size
from ctxfold.store import Store

# Checkpoints carry whole summaries, so pages are smaller than the other listings' (see the proto).
DEFAULT_CHECKPOINT_PAGE_SIZE = 20
MAX_CHECKPOINT_PAGE_SIZE = 100


class Checkpoints:
    def __init__(self, store: Store):
        self.store = store

    async def list(
        self, tenant: str, session_id: str, requested_size: int, token: str, include_abandoned: bool
    ) -> tuple[list[StoredCheckpoint], str]:
        size = page_size(requested_size, DEFAULT_CHECKPOINT_PAGE_SIZE, MAX_CHECKPOINT_PAGE_SIZE)
        scope = f"checkpoints:{tenant}:{session_id}:{int(include_abandoned)}"
        position = decode_token(scope, token, (float, str))
        after = (float(position[0]), position[1]) if position else None
        session = await self.store.get_session(tenant, session_id)
        listed, more = await self.store.list_checkpoints(session, include_abandoned, size, after)
        next_token = encode_token(scope, [listed[-1].create_time, listed[-1].checkpoint.id]) if more and listed else ""
        return listed, next_token

    async def get(self, tenant: str, session_id: str, checkpoint_id: str) -> StoredCheckpoint:
        session = await self.store.get_session(tenant, session_id)
        return await self.store.get_checkpoint(session, checkpoint_id)

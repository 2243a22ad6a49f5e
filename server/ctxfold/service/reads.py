"""Reads: pages of the transcript (ListMessages), of a raw tool result (ReadToolResult) and of a checkpoint chain."""

from __future__ import annotations

from ctxfold.engine.errors import DomainError, Kind, invalid
from ctxfold.engine.model import StoredMessage
from ctxfold.engine.paging import decode_token, encode_token, page_size
from ctxfold.engine.tool_results import Page, read_page, the_result_ref
from ctxfold.engine.view import StoredCheckpoint
from ctxfold.store import Store

# Checkpoints carry whole summaries, so pages are smaller than the other listings' (see the proto).
DEFAULT_CHECKPOINT_PAGE_SIZE = 20
MAX_CHECKPOINT_PAGE_SIZE = 100


class Reads:
    def __init__(self, store: Store, max_response_bytes: int):
        self.store = store
        # A page's characters at most (4 UTF-8 bytes each, and framing): it fits one response whatever page_size asks.
        self.max_page_chars = max_response_bytes // 8

    async def messages(
        self, tenant: str, session_id: str, requested_size: int, token: str, include_abandoned: bool
    ) -> tuple[list[StoredMessage], str]:
        size = page_size(requested_size)
        scope = f"messages:{session_id}:{int(include_abandoned)}"
        after = decode_token(scope, token, (int, int, str, str))
        session = await self.store.get_session(tenant, session_id)
        if after is not None and after[3] != session.branch_id:
            # Its next page would splice the new branch onto the old one, or list a message it moved off twice. ABORTED:
            # the listing, not this call, is to be done again (a retry of the same token fails alike).
            why = "the session was rewound since this page_token's page: list again from the first page"
            raise DomainError(Kind.ABORTED, "INVALID_PAGE_TOKEN", why, {"session_id": session_id})
        position = (after[0], after[1], after[2]) if after else None
        messages, cursor = await self.store.list_messages(
            session, size, position, include_abandoned, self.max_page_chars
        )
        return messages, encode_token(scope, [*cursor, session.branch_id]) if cursor else ""

    async def tool_result(
        self, tenant: str, session_id: str, tool_call_id: str, result_ref: str, offset: int, limit: int
    ) -> tuple[Page, str, str]:
        """A page of the raw result, the sha256 of the whole result and its ref."""
        if not result_ref and not tool_call_id:
            raise invalid("RESULT_REF_REQUIRED", "name the tool result by result_ref or tool_call_id")
        session = await self.store.get_session(tenant, session_id)
        if not result_ref:
            result_ref = the_result_ref(tool_call_id, await self.store.tool_result_refs(session, tool_call_id))
        span, sha256 = await self.store.read_raw_span(session, result_ref, offset, limit)
        return read_page(span, offset, limit), sha256, result_ref

    async def checkpoints(
        self, tenant: str, session_id: str, requested_size: int, token: str, include_abandoned: bool
    ) -> tuple[list[StoredCheckpoint], str]:
        size = page_size(requested_size, DEFAULT_CHECKPOINT_PAGE_SIZE, MAX_CHECKPOINT_PAGE_SIZE)
        scope = f"checkpoints:{tenant}:{session_id}:{int(include_abandoned)}"
        after = decode_token(scope, token, (float, str))
        session = await self.store.get_session(tenant, session_id)
        listed, cursor = await self.store.list_checkpoints(session, include_abandoned, size, after)
        return listed, encode_token(scope, list(cursor)) if cursor else ""

    async def checkpoint(self, tenant: str, session_id: str, checkpoint_id: str) -> StoredCheckpoint:
        session = await self.store.get_session(tenant, session_id)
        return await self.store.get_checkpoint(session, checkpoint_id)

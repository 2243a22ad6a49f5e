"""Pages of the canonical transcript (ListMessages); its one append is `Contexts.append`."""

from __future__ import annotations

from ctxfold.engine.model import StoredMessage
from ctxfold.service.paging import decode_token, encode_token, page_size
from ctxfold.store import Store


class Transcript:
    def __init__(self, store: Store, max_response_bytes: int):
        self.store = store
        # A ListMessages page holds at most this many characters (4 UTF-8 bytes each, and room for the framing),
        # so it fits one response whatever page_size asks; a shorter page comes with a next_page_token.
        self.max_page_chars = max_response_bytes // 8

    async def list(
        self, tenant: str, session_id: str, requested_size: int, token: str, include_abandoned: bool
    ) -> tuple[list[StoredMessage], str]:
        size = page_size(requested_size)
        scope = f"messages:{session_id}:{int(include_abandoned)}"
        position = decode_token(scope, token, (int, int, str))
        after = (position[0], position[1], position[2]) if position else None
        session = await self.store.get_session(tenant, session_id)
        messages, cursor = await self.store.list_messages(session, size, after, include_abandoned, self.max_page_chars)
        return messages, encode_token(scope, list(cursor)) if cursor else ""

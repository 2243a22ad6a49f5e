"""The canonical transcript: append (atomic, idempotent with a request id) and list."""

from __future__ import annotations

from collections.abc import Sequence

from ctxfold import cpu
from ctxfold.engine import estimator
from ctxfold.engine.errors import invalid
from ctxfold.engine.model import NewMessage, Role, SessionConfig, StoredMessage, config_from_json, text_chars
from ctxfold.engine.tool_results import bound_tool_content
from ctxfold.engine.transcript import AppendLimits, advance_open_calls, validate_new_messages
from ctxfold.service.paging import decode_token, encode_token, page_size
from ctxfold.store import Store
from ctxfold.store.rows import MessageRow, SessionRecord, new_id, new_result_ref

MAX_REQUEST_ID_CHARS = 128


def message_rows(messages: Sequence[NewMessage], config: SessionConfig) -> list[MessageRow]:
    """Bounds tool results and counts tokens once (large texts in the counting process: call it from a
    worker of `cpu.run`); the counts are stored and never recomputed.
    User messages get a result_ref too (stored by reference, no copy): a fold that shows only part
    of one (a large task anchor, a long instruction, an agent's observation) names where all of it
    is read with ReadToolResult."""
    rows = []
    for message in messages:
        result_ref, raw, raw_bytes, truncated, content = "", None, 0, False, message.content
        if message.role is Role.USER:
            result_ref = new_result_ref()
        if message.role is Role.TOOL:
            result_ref = new_result_ref()
            bounded = bound_tool_content(message.content, config.tool_content_max_bytes, result_ref)
            content, raw_bytes, truncated = bounded.content, bounded.raw_bytes, bounded.truncated
            raw = message.content.encode() if truncated else None
        rows.append(
            MessageRow(
                StoredMessage(
                    id=new_id("m"),
                    seq=0,  # given by the append, with the create_time
                    role=message.role,
                    content=content,
                    tokens=estimator.message_tokens(
                        content, message.tool_calls, message.reasoning_content, message.name, cpu.count_text
                    ),
                    tool_calls=message.tool_calls,
                    tool_call_id=message.tool_call_id,
                    reasoning_content=message.reasoning_content,
                    pinned=message.pinned,
                    name=message.name,
                    author=message.author,
                    result_ref=result_ref,
                    raw_bytes=raw_bytes,
                    truncated=truncated,
                ),
                raw,
            )
        )
    return rows


class Transcript:
    def __init__(self, store: Store, limits: AppendLimits, max_response_bytes: int):
        self.store = store
        self.limits = limits
        # A ListMessages page holds at most this many characters of text (at most 4 bytes each in
        # UTF-8, and room for the framing), so it fits one response whatever page_size asks; a shorter
        # page comes with a next_page_token.
        self.max_page_chars = max_response_bytes // 8

    async def append(
        self,
        tenant: str,
        session_id: str,
        messages: Sequence[NewMessage],
        request_id: str = "",
        config: SessionConfig | None = None,
    ) -> tuple[list[StoredMessage], SessionRecord]:
        """Appends all of `messages` or none; returns them stored and the session after the append.
        `config` spares a read when the caller already has the session's (immutable) config."""
        if config is None:
            config = config_from_json((await self.store.get_session(tenant, session_id)).config_json)
        rows = await self.rows(messages, request_id, config)
        return await self.append_rows(tenant, session_id, messages, rows, request_id)

    async def rows(self, messages: Sequence[NewMessage], request_id: str, config: SessionConfig) -> list[MessageRow]:
        """Checks an append and makes its rows (ids, bounded content, token counts), off the event loop."""
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise invalid("INVALID_REQUEST_ID", f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters")

        def checked_rows() -> list[MessageRow]:
            # Checking measures UTF-8 sizes, which copies each non-ASCII text (~10 ms per 16 MiB).
            validate_new_messages(messages, self.limits)
            return message_rows(messages, config)

        return await cpu.run(text_chars(messages), checked_rows)

    async def append_rows(
        self,
        tenant: str,
        session_id: str,
        messages: Sequence[NewMessage],
        rows: Sequence[MessageRow],
        request_id: str,
    ) -> tuple[list[StoredMessage], SessionRecord]:
        """Appends the `rows` made from `messages` by `rows()`."""
        return await self.store.append_messages(
            tenant, session_id, rows, request_id, lambda waiting: advance_open_calls(waiting, messages)
        )

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

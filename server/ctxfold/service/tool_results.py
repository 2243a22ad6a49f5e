"""ReadToolResult: pages of a stored raw tool result by UTF-8 byte offset."""

from __future__ import annotations

from dataclasses import dataclass

from ctxfold.engine.errors import failed_precondition, invalid, not_found
from ctxfold.engine.tool_results import Page, read_page
from ctxfold.store import Store


@dataclass(frozen=True)
class ResultPage:
    page: Page
    sha256: str
    result_ref: str


class ToolResults:
    def __init__(self, store: Store):
        self.store = store

    async def read(
        self, tenant: str, session_id: str, tool_call_id: str, result_ref: str, offset: int, limit: int
    ) -> ResultPage:
        if not result_ref and not tool_call_id:
            raise invalid("RESULT_REF_REQUIRED", "name the tool result by result_ref or tool_call_id")
        session = await self.store.get_session(tenant, session_id)
        if not result_ref:
            refs = await self.store.tool_result_refs(session, tool_call_id)
            if not refs:
                raise not_found(
                    "TOOL_CALL_NOT_FOUND",
                    f"no tool result for tool_call_id {tool_call_id!r} in this session",
                    tool_call_id=tool_call_id,
                )
            if len(refs) > 1:
                raise failed_precondition(
                    "RESULT_REF_AMBIGUOUS",
                    f"tool_call_id {tool_call_id!r} has {len(refs)} results; name one by result_ref: {', '.join(refs)}",
                    tool_call_id=tool_call_id,
                    candidates=",".join(refs),
                )
            result_ref = refs[0]
        span, sha256 = await self.store.read_raw_span(session, result_ref, offset, limit)
        return ResultPage(read_page(span, offset, limit), sha256, result_ref)

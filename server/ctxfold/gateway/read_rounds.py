"""The read tool's rounds: `read_tool_result` is offered when the view hides results, the model's
calls of it are answered here from ReadToolResult and the upstream is asked again, and the agent
gets one answer without them: the last round's JSON answer, or one stream spliced from every round
(`splice`). What the rounds add stays within the room the view leaves below its fold trigger: the
upstream never gets more than the trigger for reading (`read_room`)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from ctxfold_client import AsyncClient, CtxfoldError, Usage, View, tool_definitions, tools
from ctxfold_client.tools import READ_TOOL_RESULT
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import trace

from ctxfold.gateway.contexts import Contexts, Prepared
from ctxfold.gateway.formats import ApiFormat, Conversation, ToolFormat, as_dict, stated_input_tokens
from ctxfold.gateway.pieces import loads
from ctxfold.gateway.splice import KEEP, SPLICERS, Splicer, event_bytes
from ctxfold.gateway.sse import EventSplitter
from ctxfold.gateway.upstream import (
    Opened,
    Upstream,
    UpstreamCut,
    UpstreamUnreachable,
    answer_headers,
    cut_off,
    json_response,
)

log = logging.getLogger("ctxfold.gateway")

# Rounds are bounded in bytes, which never undercount tokens (a byte-level tokenizer makes at most one
# token of a byte). The read tool is offered when the view leaves at least this much room below the
# trigger, and a round continues while this much is left for the model's next call and a short answer.
MIN_READ_ROOM_BYTES = 2048
ROUND_RESERVE_BYTES = 512
PAGE_FOOTER_BYTES = 256  # `tools.page_answer`'s footer naming the next offset
SMALLEST_PAGE_BYTES = 256
PAGE_BYTES = 16384  # the SDK dispatcher's page
NO_ROOM = (
    "ctxfold: not read: this request has no room left below its context budget for more of the result; "
    "answer with what the context shows"
)


@dataclass(frozen=True)
class Exchange:
    """One agent request on its way upstream."""

    api: ApiFormat
    url: str
    forward: CIMultiDict[str]  # the headers the upstream gets
    prepared: Prepared
    headers: dict[str, str]  # the x-ctxfold-* headers the agent gets
    offers_read: bool  # read_tool_result is offered and answered here
    refusal_retried: bool = False  # a refusal as too long comes back as ViewTooLong unless it was retried once


class ViewTooLong(Exception):
    """The provider refused the exchange's view as longer than its window, before the agent got anything."""

    def __init__(self, status: int, headers: CIMultiDictProxy[str], payload: bytes):
        super().__init__(f"HTTP {status}")
        self.status, self.headers, self.payload = status, headers, payload
        self.stated_tokens = stated_input_tokens(payload)  # the provider's count of the view (0: not stated)

    def answer(self, exchange: Exchange) -> web.Response:
        """The refusal as the agent gets it when it is not retried: unchanged."""
        return json_response(self.status, self.payload, exchange.headers, self.headers)


def tool_name(tool: Any) -> str:
    """A tool definition's name in any of the three APIs."""
    tool = as_dict(tool)
    return str(as_dict(tool.get("function")).get("name") or tool.get("name") or "")


@functools.cache
def read_tool(tool_format: ToolFormat) -> tuple[list[Any], int]:
    """The read tool's definition in `tool_format`, and its size in bytes (not in a view's estimate)."""
    definition = [t for t in tool_definitions(tool_format) if tool_name(t) == READ_TOOL_RESULT]
    return definition, len(orjson.dumps(definition))


def read_room(view: View, api: ApiFormat) -> int:
    """The bytes the read rounds may add to the view's request: what it leaves below the trigger, less
    the read tool's definition."""
    return view.trigger_tokens - view.estimated_tokens - read_tool(api.tool_format)[1]


def read_reserve(api: ApiFormat) -> int:
    """What a view must leave below its trigger for the read tool to be offered: its definition and
    room to read."""
    return read_tool(api.tool_format)[1] + MIN_READ_ROOM_BYTES


def offers_read_tool(prepared: Prepared, conversation: Conversation, api: ApiFormat) -> bool:
    """The view hides a result (a summary, a bounded or pruned one), leaves room to read some of it, and
    the agent has no tool of that name."""
    hides = any(m.summary or m.pruned or m.truncated for m in prepared.view.messages)
    own = READ_TOOL_RESULT in {tool_name(tool) for tool in conversation.tools}
    return hides and not own and read_room(prepared.view, api) >= MIN_READ_ROOM_BYTES


def with_read_tool(api: ApiFormat, body: dict[str, Any]) -> dict[str, Any]:
    """`body` with the read tool among its tools."""
    return api.tools_with(body, read_tool(api.tool_format)[0])


def refused(exchange: Exchange, status: int, headers: CIMultiDictProxy[str], payload: bytes) -> None:
    """Raises ViewTooLong when the first round's answer refuses the view as too long and no smaller
    view was tried yet."""
    if not exchange.refusal_retried and exchange.api.refused_as_too_long(status, payload):
        raise ViewTooLong(status, headers, payload)


class ReadRounds:
    """Sends an exchange upstream and answers the model's read calls, up to `max_rounds` rounds.
    Each method answers the agent and the first round's usage (None when there is none to report)."""

    def __init__(self, upstream: Upstream, contexts: Contexts, max_rounds: int):
        self.upstream = upstream
        self.contexts = contexts
        self.max_rounds = max_rounds

    async def complete(
        self, exchange: Exchange, body: bytes, opening: Awaitable[Opened] | None = None
    ) -> tuple[web.StreamResponse, Usage | None]:
        """A JSON answer: the last round's (a final round that still reads, without its read calls).
        `opening`: the first round's call, already sent."""
        api, rounds = exchange.api, 0
        first_usage: Usage | None = None
        room = read_room(exchange.prepared.view, api) + len(body)  # `body` may grow to `room` bytes
        while True:
            status, upstream_headers, payload = await self.upstream.post(exchange.url, exchange.forward, body, opening)
            opening = None
            if status != 200:
                if rounds == 0:
                    refused(exchange, status, upstream_headers, payload)
                break
            try:
                response = as_dict(loads(payload))
            except orjson.JSONDecodeError:
                break
            if first_usage is None:
                first_usage = api.usage(response)
            if not exchange.offers_read or not api.read_calls(response, READ_TOOL_RESULT):
                break
            allowance = room - len(body) - len(payload)  # the model's turn counted by its whole answer
            if rounds >= self.max_rounds or allowance < ROUND_RESERVE_BYTES:
                payload = orjson.dumps(api.without_calls(response, READ_TOOL_RESULT))  # never a tool it did not define
                break
            rounds += 1
            body = await self._continued(exchange, body, response, allowance)
        trace.get_current_span().set_attribute("ctxfold.read_rounds", rounds)
        headers = {**exchange.headers, "x-ctxfold-read-rounds": str(rounds)}
        return json_response(status, payload, headers, upstream_headers), first_usage

    async def stream(
        self, exchange: Exchange, request: web.Request, body: bytes, opening: Awaitable[Opened] | None = None
    ) -> tuple[web.StreamResponse, Usage | None]:
        """Event by event, as each arrives; with the read tool offered, its rounds are spliced into
        the one stream the agent reads. `opening`: the first round's call, already sent."""
        api = exchange.api
        splicer = SPLICERS[api.api](READ_TOOL_RESULT) if exchange.offers_read else None
        response: web.StreamResponse | None = None
        usage = Usage(0)
        rounds = 0
        room = read_room(exchange.prepared.view, api) + len(body)  # `body` may grow to `room` bytes
        try:
            while True:
                try:
                    async with self.upstream.call("POST", exchange.url, body, exchange.forward, opening) as answer:
                        opening = None
                        if answer.status != 200:
                            if response is None:
                                payload = await answer.read()
                                refused(exchange, answer.status, answer.headers, payload)
                                return json_response(answer.status, payload, exchange.headers, answer.headers), None
                            log.warning("read round %d of session %s failed upstream: HTTP %d", rounds,
                                        exchange.prepared.session_id, answer.status)  # fmt: skip
                            break
                        if response is None:
                            headers = answer_headers(answer.headers, exchange.headers)
                            response = web.StreamResponse(status=200, headers=headers)
                            await response.prepare(request)
                        usage = await self._forward_events(api, answer.content, response, splicer, usage, rounds == 0)
                except UpstreamUnreachable as exc:
                    if response is None:
                        raise
                    log.warning("read round %d of session %s: %s", rounds, exchange.prepared.session_id, exc)
                    if isinstance(exc, UpstreamCut):
                        cut_off(request)
                        return response, usage
                    break
                if splicer is None or not splicer.holds_end:
                    break
                rounds += 1
                turn = splicer.turn()
                body = await self._continued(exchange, body, turn, room - len(body) - len(orjson.dumps(turn)))
                splicer.next_round(can_continue=rounds < self.max_rounds and room - len(body) >= ROUND_RESERVE_BYTES)
            trace.get_current_span().set_attribute("ctxfold.read_rounds", rounds)
            assert response is not None  # the loop returns before the first round sent anything, or sends
            await response.write_eof()
        except ConnectionResetError:  # the agent hung up: some close the stream once its last event is in
            if response is None:
                raise
            log.debug("session %s: the agent closed the stream before its end", exchange.prepared.session_id)
        return response, usage

    @staticmethod
    async def _forward_events(
        api: ApiFormat,
        content: aiohttp.StreamReader,
        response: web.StreamResponse,
        splicer: Splicer | None,
        usage: Usage,
        first: bool,
    ) -> Usage:
        """One round's events to the agent as each completes (as the splicer has them); the usage
        they report when `first`."""
        splitter = EventSplitter()
        async for chunk in content.iter_any():
            for event in splitter.feed(chunk):
                if event.data is not None and first:
                    usage = api.stream_usage(event.data, usage)
                step = splicer.step(event.data) if splicer is not None else KEEP
                if step.forward:
                    named = splicer is not None and splicer.named_events
                    await response.write(event.raw if step.data is None else event_bytes(step.data, named))
        await response.write(splitter.rest())
        return usage

    async def _continued(self, exchange: Exchange, body: bytes, turn: dict[str, Any], allowance: int) -> bytes:
        """`body` followed by the model's turn and ctxfold's answers to its read calls, which share
        `allowance` bytes."""
        calls = exchange.api.read_calls(turn, READ_TOOL_RESULT)
        client, prepared = self.contexts.client, exchange.prepared
        share = allowance // max(1, len(calls)) - PAGE_FOOTER_BYTES
        answers = {call.call_id: await read_answer(client, prepared, call.arguments, share) for call in calls}
        return orjson.dumps(exchange.api.continued(loads(body), turn, answers))


async def read_answer(client: AsyncClient, prepared: Prepared, arguments: str, limit: int) -> str:
    """A read call's answer: a page of at most `limit` bytes (NO_ROOM when that is too small to read),
    or what the model got wrong."""
    parsed = tools.parse_call(READ_TOOL_RESULT, arguments)
    if not isinstance(parsed, tools.ReadCall):
        return parsed.answer if isinstance(parsed, tools.BadCall) else ""
    if limit < SMALLEST_PAGE_BYTES:
        return NO_ROOM
    pages = client.tool_result_pages(
        prepared.session_id,
        result_ref=parsed.result_ref,
        offset=parsed.offset,
        page_bytes=min(limit, PAGE_BYTES),
        **prepared.state.call,
    )
    try:
        page = await anext(pages, None)  # one page: the model asks for the next offset when it wants it
    except CtxfoldError as error:
        return tools.error_answer(error)
    return tools.page_answer(page) if page is not None else ""

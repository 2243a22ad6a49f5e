"""Forwarding to the provider: the headers each way, one upstream call (its own span, whose trace
context the upstream gets), a request relayed as it came with its answer streamed back, and JSON
answers to the agent."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, StatusCode

log = logging.getLogger("ctxfold.gateway")
tracer = trace.get_tracer("ctxfold.gateway")

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding", "content-encoding"}
)  # fmt: skip
# An answer's bytes reach the agent as the upstream encoded them (the client does not decompress; an
# upstream may compress whatever the request's Accept-Encoding): its Content-Encoding goes with them.
ANSWER_HOP_BY_HOP = HOP_BY_HOP - {"content-encoding"}


class UpstreamUnreachable(Exception):
    """No answer came from the upstream (refused, reset, timed out before its headers)."""


class UpstreamCut(UpstreamUnreachable):
    """The upstream's answer broke off after its headers, before its end."""


def cut_off(request: web.Request) -> None:
    """The agent's connection closed before its answer's end, as the upstream's was: the agent sees the
    answer break off (an answer ended cleanly would pass a truncated stream for a whole one)."""
    if request.transport is not None:
        request.transport.close()


def forwarded_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The agent's headers as the upstream gets them: without hop-by-hop headers and ctxfold's own."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower not in HOP_BY_HOP and not lower.startswith("x-ctxfold-"):
            out.add(name, value)
    out["Accept-Encoding"] = "identity"  # the client gets the upstream's bytes as they are
    return out


def answer_headers(upstream: CIMultiDictProxy[str] | None, extra: Mapping[str, str]) -> CIMultiDict[str]:
    """The upstream's answer headers (if it answered) as the agent gets them: without hop-by-hop headers,
    with `extra`, ctxfold's own, whose values may quote the agent's request: its control and non-ASCII
    characters escaped, so no request can break a header (a raw newline was a 500)."""
    given = upstream.items() if upstream is not None else ()
    out: CIMultiDict[str] = CIMultiDict((k, v) for k, v in given if k.lower() not in ANSWER_HOP_BY_HOP)
    out.update({name: value.encode("unicode_escape").decode("ascii") for name, value in extra.items()})
    return out


def json_response(
    status: int, payload: bytes, extra: Mapping[str, str], upstream: CIMultiDictProxy[str] | None = None
) -> web.Response:
    """A whole answer to the agent: `payload` with the upstream's headers (when it came from there)
    and `extra`."""
    headers = answer_headers(upstream, extra)
    headers.setdefault("Content-Type", "application/json")
    return web.Response(status=status, body=payload, headers=headers)


@dataclass
class Opened:
    """An upstream answer whose headers arrived, open until released (which ends its span)."""

    answer: aiohttp.ClientResponse
    span: Span

    def release(self) -> None:
        self.answer.release()
        self.span.end()


class Upstream:
    """The provider, through one aiohttp client session."""

    def __init__(self, session: aiohttp.ClientSession):
        self.session = session

    async def open(self, method: str, url: str, data: bytes | None, forward: CIMultiDict[str]) -> Opened:
        """One upstream call until its answer's headers (a span of its own, whose trace context the
        upstream gets). UpstreamUnreachable when no answer came (nothing was sent to the agent). The
        span is not made current, so a call may be opened in one task and read in another."""
        span = tracer.start_span(f"{method} upstream", kind=trace.SpanKind.CLIENT)
        span.set_attribute("url.full", url)
        headers = CIMultiDict(forward)
        propagate.inject(headers, context=trace.set_span_in_context(span))
        try:
            answer = await self.session.request(method, url, data=data, headers=headers)
        except BaseException as exc:  # unreachable, or cancelled (an early call the Prepare did not confirm)
            span.record_exception(exc)
            span.set_status(StatusCode.ERROR)
            span.end()
            if isinstance(exc, aiohttp.ClientError | TimeoutError):
                raise UpstreamUnreachable(f"{url}: {exc or type(exc).__name__}") from exc
            raise
        span.set_attribute("http.response.status_code", answer.status)
        return Opened(answer, span)

    @contextlib.asynccontextmanager
    async def call(
        self,
        method: str,
        url: str,
        data: bytes | None,
        forward: CIMultiDict[str],
        opening: Awaitable[Opened] | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """`open` (or the call `opening` already sent), released when done."""
        opened = await (opening if opening is not None else self.open(method, url, data, forward))
        try:
            yield opened.answer
        except aiohttp.ClientPayloadError as exc:  # reading its body: the upstream hung up before the end
            raise UpstreamCut(f"{url}: the answer broke off: {exc}") from exc
        finally:
            opened.release()

    async def post(
        self, url: str, forward: CIMultiDict[str], body: bytes, opening: Awaitable[Opened] | None = None
    ) -> tuple[int, CIMultiDictProxy[str], bytes]:
        """`body` (JSON) posted (or the call `opening` already sent): the answer's status, headers and whole body."""
        async with self.call("POST", url, body, forward, opening) as answer:
            return answer.status, answer.headers, await answer.read()

    async def relay(self, request: web.Request, url: str, raw: bytes, extra: dict[str, str]) -> web.StreamResponse:
        """The request as it came, the answer as it comes (streamed chunk by chunk)."""
        response: web.StreamResponse | None = None
        try:
            async with self.call(request.method, url, raw or None, forwarded_headers(request.headers)) as answer:
                response = web.StreamResponse(status=answer.status, headers=answer_headers(answer.headers, extra))
                await response.prepare(request)
                with contextlib.suppress(ConnectionResetError):  # the agent hung up: nothing more to send it
                    async for chunk in answer.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
        except UpstreamCut as exc:
            if response is None:
                raise
            log.warning("%s", exc)
            cut_off(request)
        return response

"""The HTTP shell (aiohttp): read the agent's request, let `contexts` reconcile and prepare, rewrite,
forward upstream, stream the answer back event by event, answer the read tool in between, and say
what happened in response headers and one span per request. Decisions live in the pure modules."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from ctxfold_client import Action, CtxfoldError, ErrorReason, Usage, tool_definitions
from ctxfold_client.tools import READ_TOOL_RESULT
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import propagate, trace

from ctxfold import __version__, memory
from ctxfold.gateway.contexts import Contexts, NewSession, Prepared, unreachable
from ctxfold.gateway.formats import ApiFormat, BadRequest, CacheHints, Conversation, as_dict
from ctxfold.gateway.formats.anthropic_messages import AnthropicMessages
from ctxfold.gateway.formats.openai_chat import OpenAIChat
from ctxfold.gateway.formats.openai_responses import OpenAIResponses
from ctxfold.gateway.identity import context_window, session_key
from ctxfold.gateway.pieces import compact_json
from ctxfold.gateway.settings import GatewaySettings, key_sha256, load_tenants
from ctxfold.gateway.splice import KEEP, SPLICERS, event_bytes
from ctxfold.gateway.sse import EventSplitter

log = logging.getLogger("ctxfold.gateway")
tracer = trace.get_tracer("ctxfold.gateway")

OPENAI, ANTHROPIC = OpenAIChat(), AnthropicMessages()
APIS: tuple[ApiFormat, ...] = (OPENAI, OpenAIResponses(), ANTHROPIC)
# Agents send whole histories, with images: the largest request body accepted.
MAX_REQUEST_BYTES = 64 << 20
# The garbage collector's thresholds (youngest generation, then how many of its passes make one of
# the next): Python's default is (700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 20)
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding", "content-encoding"}
)  # fmt: skip
ACTION_NAMES = {Action.NONE: "none", Action.PRUNED: "pruned", Action.FOLDED: "folded"}
SESSION_HEADER = "x-ctxfold-session"
WINDOW_HEADER = "x-ctxfold-context-window"
TOKEN_HEADER = "x-ctxfold-token"


class UpstreamUnreachable(Exception):
    """No answer came from the upstream (refused, reset, timed out before its headers)."""


@dataclass(frozen=True)
class Caller:
    api_key: str  # the agent's provider key: forwarded, hashed into session keys, never stored
    token: str  # the ctxfold bearer token of its tenant ("" = the gateway's single tenant)


@dataclass(frozen=True)
class Exchange:
    """One agent request on its way upstream."""

    api: ApiFormat
    url: str
    forward: CIMultiDict[str]  # the headers the upstream gets
    prepared: Prepared
    headers: dict[str, str]  # the x-ctxfold-* headers the agent gets
    caller: Caller
    offers_read: bool  # read_tool_result is offered and answered here


def forwarded_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The agent's headers as the upstream gets them: without hop-by-hop headers and ctxfold's own."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower not in HOP_BY_HOP and not lower.startswith("x-ctxfold-"):
            out.add(name, value)
    out["Accept-Encoding"] = "identity"  # the client gets the upstream's bytes as they are
    return out


def answer_headers(upstream: CIMultiDictProxy[str], extra: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in HOP_BY_HOP)
    out.update(extra)
    return out


def api_key_of(headers: Mapping[str, str]) -> str:
    authorization = headers.get("Authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return headers.get("x-api-key", "")


def tool_name(tool: Any) -> str:
    """A tool definition's name in any of the three APIs."""
    tool = as_dict(tool)
    return str(as_dict(tool.get("function")).get("name") or tool.get("name") or "")


def offers_read_tool(prepared: Prepared, conversation: Conversation) -> bool:
    """The view hides a result (a summary, a bounded or pruned one) and the agent has no tool of that name."""
    hides = any(m.summary or m.pruned or m.truncated for m in prepared.view.messages)
    return hides and READ_TOOL_RESULT not in {tool_name(tool) for tool in conversation.tools}


def upstream_request(api: ApiFormat, body: dict[str, Any], prepared: Prepared, offers_read: bool) -> dict[str, Any]:
    """The agent's request with the view for its history (and the read tool when offered)."""
    cache = CacheHints(prepared.view.prompt_cache_key, prepared.view.stable_prefix_messages)
    rewritten = api.rewritten(body, prepared.entries, cache)
    if not offers_read:
        return rewritten
    return api.tools_with(rewritten, [t for t in tool_definitions(api.tool_format) if tool_name(t) == READ_TOOL_RESULT])


def answer_ctxfold_headers(prepared: Prepared, key: str) -> dict[str, str]:
    return {
        SESSION_HEADER: prepared.session_id,
        "x-ctxfold-session-key": key.split(":", 1)[1],  # without the API key's digest
        "x-ctxfold-action": ACTION_NAMES.get(prepared.view.action, "none"),
        "x-ctxfold-view-tokens": str(prepared.view.estimated_tokens),
    }


class Gateway:
    def __init__(self, settings: GatewaySettings, session: aiohttp.ClientSession):
        self.settings = settings
        self.contexts = Contexts(settings)
        self.tenants = load_tenants(settings.tenants_file)
        self.windows = settings.windows()
        self.upstream = session
        self._background: set[asyncio.Task[None]] = set()

    def application(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        for api in APIS:
            app.router.add_post(api.path, self._handler(api))
        app.router.add_route("*", "/{tail:.*}", self.pass_through)
        return app

    async def close(self) -> None:
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.contexts.close()

    def _handler(self, api: ApiFormat) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                return await self.handle(api, request)
            except UpstreamUnreachable as exc:
                return self._unreachable(api, exc)

        return handle

    def _unreachable(self, api: ApiFormat, exc: UpstreamUnreachable) -> web.Response:
        log.warning("the upstream cannot be reached: %s", exc)
        return self._error(api, 502, f"ctxfold gateway: the upstream cannot be reached ({exc})")

    def base_url(self, provider: str) -> str:
        base = self.settings.anthropic_base_url if provider == "anthropic" else self.settings.openai_base_url
        return base.rstrip("/")

    def caller(self, headers: Mapping[str, str]) -> Caller:
        api_key = api_key_of(headers)
        token = headers.get(TOKEN_HEADER) or self.tenants.get(key_sha256(api_key)) or self.settings.token
        return Caller(api_key, token)

    # ---- the three APIs ----------------------------------------------------------------------------

    async def handle(self, api: ApiFormat, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if self.settings.mode == "pass_through":
            return await self._relay(request, self.base_url(api.provider) + request.path_qs, raw, {})
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            conversation = api.conversation(body)
            window = self._window(request.headers, conversation.model)
        except orjson.JSONDecodeError as exc:
            return self._error(api, 400, f"the request body is not valid JSON: {exc}")
        except BadRequest as exc:
            return self._error(api, 400, str(exc))
        context = propagate.extract(request.headers)
        name = f"chat {conversation.model}" if conversation.model else "chat"
        with tracer.start_as_current_span(name, context=context, kind=trace.SpanKind.SERVER) as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.provider.name", api.provider)
            span.set_attribute("gen_ai.request.model", conversation.model)
            span.set_attribute("ctxfold.gateway.api", api.api)
            if conversation.not_reconciled:
                return await self._unchanged(api, request, raw, conversation.not_reconciled)
            caller = self.caller(request.headers)
            key = session_key(api.api, caller.api_key, request.headers.get(SESSION_HEADER, ""), conversation.model,
                              conversation.pieces)  # fmt: skip
            new = NewSession(
                window=window,
                max_output_tokens=min(conversation.max_output_tokens, window // 4),
                tools_json=compact_json(list(conversation.tools)) if conversation.tools else "",
                model=conversation.model,
            )
            try:
                prepared = await self.contexts.prepare(caller.token, key, api, conversation, new)
            except CtxfoldError as error:
                span.set_attribute("ctxfold.error.reason", error.reason)
                if error.reason == ErrorReason.CONTEXT_BUDGET_UNSATISFIED:
                    tokens = int(error.metadata.get("estimated_tokens", 0) or 0)
                    return self._raw(400, api.context_length_error(tokens, window), {})
                return await self._ctxfold_failed(api, request, raw, error)
            span.set_attribute("gen_ai.conversation.id", prepared.session_id)
            span.set_attribute("ctxfold.action", ACTION_NAMES.get(prepared.view.action, "none"))
            span.set_attribute("ctxfold.view_tokens", prepared.view.estimated_tokens)
            span.set_attribute("ctxfold.appended", prepared.appended)
            if prepared.rewound_to is not None:
                span.set_attribute("ctxfold.rewound_to_seq", prepared.rewound_to)
            offers_read = self.settings.max_read_rounds > 0 and offers_read_tool(prepared, conversation)
            upstream_body = upstream_request(api, body, prepared, offers_read)
            headers = answer_ctxfold_headers(prepared, key)
            url = self.base_url(api.provider) + request.path_qs
            exchange = Exchange(api, url, forwarded_headers(request.headers), prepared, headers, caller, offers_read)
            if conversation.stream:
                return await self._stream(exchange, request, upstream_body)
            return await self._complete(exchange, upstream_body)

    def _window(self, headers: Mapping[str, str], model: str) -> int:
        given = headers.get(WINDOW_HEADER)
        if given is None:
            return context_window(model, self.windows)
        if not given.isdigit() or int(given) < 1000:
            raise BadRequest(f"{WINDOW_HEADER}: must be a whole number of tokens, at least 1000 (got {given!r})")
        return int(given)

    async def _complete(self, exchange: Exchange, body: dict[str, Any]) -> web.StreamResponse:
        api, rounds = exchange.api, 0
        first_usage: Usage | None = None
        while True:
            status, upstream_headers, payload = await self._post(exchange.url, exchange.forward, body)
            if status != 200:
                break
            try:
                response = as_dict(orjson.loads(payload))
            except orjson.JSONDecodeError:
                break
            if first_usage is None:
                first_usage = api.usage(response)
            if not exchange.offers_read or not api.read_calls(response, READ_TOOL_RESULT):
                break
            if rounds >= self.settings.max_read_rounds:  # the agent never sees a tool it did not define
                payload = orjson.dumps(api.without_calls(response, READ_TOOL_RESULT))
                break
            rounds += 1
            body = api.continued(body, response, await self._read_answers(exchange, response))
        trace.get_current_span().set_attribute("ctxfold.read_rounds", rounds)
        if first_usage is not None:
            self._observe(exchange, first_usage)
        return self._raw(status, payload, {**exchange.headers, "x-ctxfold-read-rounds": str(rounds)}, upstream_headers)

    async def _post(
        self, url: str, forward: CIMultiDict[str], body: dict[str, Any]
    ) -> tuple[int, CIMultiDictProxy[str], bytes]:
        async with self._upstream("POST", url, orjson.dumps(body), forward) as answer:
            return answer.status, answer.headers, await answer.read()

    @contextlib.asynccontextmanager
    async def _upstream(
        self, method: str, url: str, data: bytes | None, forward: CIMultiDict[str]
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One upstream call (a span of its own, whose trace context the upstream gets), open until
        its body is read. UpstreamUnreachable when no answer came (nothing was sent to the agent)."""
        with tracer.start_as_current_span(f"{method} upstream", kind=trace.SpanKind.CLIENT) as span:
            span.set_attribute("url.full", url)
            headers = CIMultiDict(forward)
            propagate.inject(headers)
            try:
                answer = await self.upstream.request(method, url, data=data, headers=headers)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise UpstreamUnreachable(f"{url}: {exc or type(exc).__name__}") from exc
            span.set_attribute("http.response.status_code", answer.status)
            try:
                yield answer
            finally:
                answer.release()

    async def _stream(self, exchange: Exchange, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        """Event by event, as each arrives; with the read tool offered, its rounds are spliced into
        the one stream the agent reads (`splice`)."""
        api, url, headers = exchange.api, exchange.url, exchange.headers
        splicer = SPLICERS[api.api](READ_TOOL_RESULT) if exchange.offers_read else None
        response: web.StreamResponse | None = None
        usage = Usage(0)
        rounds = 0
        while True:
            try:
                async with self._upstream("POST", url, orjson.dumps(body), exchange.forward) as answer:
                    if answer.status != 200:
                        if response is None:
                            return self._raw(answer.status, await answer.read(), headers, answer.headers)
                        log.warning("read round %d of session %s failed upstream: HTTP %d", rounds,
                                    exchange.prepared.session_id, answer.status)  # fmt: skip
                        break
                    if response is None:
                        response = web.StreamResponse(status=200, headers=answer_headers(answer.headers, headers))
                        await response.prepare(request)
                    splitter = EventSplitter()
                    async for chunk in answer.content.iter_any():
                        for event in splitter.feed(chunk):
                            if event.data is not None and rounds == 0:
                                usage = api.stream_usage(event.data, usage)
                            step = splicer.step(event.data) if splicer is not None else KEEP
                            if step.forward:
                                named = splicer is not None and splicer.named_events
                                await response.write(event.raw if step.data is None else event_bytes(step.data, named))
                    await response.write(splitter.rest())
            except UpstreamUnreachable as exc:
                if response is None:
                    raise
                log.warning("read round %d of session %s: %s", rounds, exchange.prepared.session_id, exc)
                break
            if splicer is None or not splicer.holds_end:
                break
            rounds += 1
            turn = splicer.turn()
            body = api.continued(body, turn, await self._read_answers(exchange, turn))
            splicer.next_round(can_continue=rounds < self.settings.max_read_rounds)
        trace.get_current_span().set_attribute("ctxfold.read_rounds", rounds)
        assert response is not None  # the loop returns before the first round sent anything, or sends
        await response.write_eof()
        self._observe(exchange, usage)
        return response

    async def _read_answers(self, exchange: Exchange, turn: dict[str, Any]) -> dict[str, str]:
        """ctxfold's answers to the model's read calls in `turn`, by call id."""
        client, session_id = self.contexts.client(exchange.caller.token), exchange.prepared.session_id
        return {
            call.call_id: await client.dispatch_tool_call(session_id, READ_TOOL_RESULT, call.arguments) or ""
            for call in exchange.api.read_calls(turn, READ_TOOL_RESULT)
        }

    def _observe(self, exchange: Exchange, usage: Usage) -> None:
        """Reports usage after the answer, never delaying it; a failure is logged, not raised."""
        span = trace.get_current_span()
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        prepared, token = exchange.prepared, exchange.caller.token
        if not usage.input_tokens or not prepared.observe:
            return

        async def observe() -> None:
            try:
                await self.contexts.client(token).observe_usage(prepared.session_id, prepared.view, usage)
            except CtxfoldError as error:
                log.warning("ObserveUsage for session %s failed: %s", prepared.session_id, error)

        task = asyncio.get_running_loop().create_task(observe())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- when ctxfold does not take part --------------------------------------------------------

    async def _ctxfold_failed(
        self, api: ApiFormat, request: web.Request, raw: bytes, error: CtxfoldError
    ) -> web.StreamResponse:
        state = "unreachable" if unreachable(error) else "refused the request"
        why = f"ctxfold {state}: {error.reason or error.code.name}"
        if self.settings.fail_mode == "closed":
            log.warning("%s; answered 503 (fail_mode closed)", why)
            return self._raw(503, api.error(503, f"{why}: {error.message}"), {"x-ctxfold-warning": why})
        log.warning("%s; request forwarded unchanged (fail_mode open)", why)
        return await self._unchanged(api, request, raw, why)

    async def _unchanged(self, api: ApiFormat, request: web.Request, raw: bytes, why: str) -> web.StreamResponse:
        url = self.base_url(api.provider) + request.path_qs
        return await self._relay(request, url, raw, {"x-ctxfold-warning": why, "x-ctxfold-action": "none"})

    async def pass_through(self, request: web.Request) -> web.StreamResponse:
        """Anything the gateway does not change (`/v1/models`, `/v1/messages/count_tokens`, ...), to
        the upstream of its provider: Anthropic's paths and requests, else OpenAI's."""
        anthropic = request.path.startswith("/v1/messages") or "anthropic-version" in request.headers
        api = ANTHROPIC if anthropic else OPENAI
        try:
            return await self._relay(request, self.base_url(api.provider) + request.path_qs, await request.read(), {})
        except UpstreamUnreachable as exc:
            return self._unreachable(api, exc)

    async def _relay(self, request: web.Request, url: str, raw: bytes, extra: dict[str, str]) -> web.StreamResponse:
        """The request as it came, the answer as it comes (streamed chunk by chunk)."""
        async with self._upstream(request.method, url, raw or None, forwarded_headers(request.headers)) as answer:
            response = web.StreamResponse(status=answer.status, headers=answer_headers(answer.headers, extra))
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    def _error(self, api: ApiFormat, status: int, message: str) -> web.Response:
        return self._raw(status, api.error(status, message), {})

    @staticmethod
    def _raw(
        status: int, payload: bytes, extra: Mapping[str, str], upstream: CIMultiDictProxy[str] | None = None
    ) -> web.Response:
        headers = answer_headers(upstream, extra) if upstream is not None else CIMultiDict(extra)
        headers.setdefault("Content-Type", "application/json")
        return web.Response(status=status, body=payload, headers=headers)


@dataclass
class RunningGateway:
    port: int
    runner: web.AppRunner
    gateway: Gateway
    session: aiohttp.ClientSession

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.gateway.close()
        await self.session.close()


def listen_address(listen: str, port: int) -> str:
    return f"{listen.rpartition(':')[0] or '0.0.0.0'}:{port}"


async def serve_gateway(settings: GatewaySettings) -> None:
    """`ctxfold gateway`: serves until SIGTERM or SIGINT, then lets requests in flight finish."""
    running = await start_gateway(settings)
    memory.freeze_startup_objects()
    # A request's parsed history is in flight across several young collections and reaches the oldest
    # generation, whose full passes then ran every ~70 requests: with a larger nursery requests/s rose
    # from 36-37 % to 40 % of pass-through (`bench/gateway.py`, alternating with and without).
    gc.set_threshold(*GC_THRESHOLDS)
    log.info(
        "ctxfold gateway %s serving on %s (ctxfold at %s; OpenAI upstream %s, Anthropic upstream %s; fail %s)",
        __version__,
        listen_address(settings.listen, running.port),
        settings.server,
        settings.openai_base_url,
        settings.anthropic_base_url,
        settings.fail_mode,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await running.stop()
    log.info("stopped")


async def start_gateway(settings: GatewaySettings) -> RunningGateway:
    host, _, port = settings.listen.rpartition(":")
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        auto_decompress=False,
    )
    gateway = Gateway(settings, session)
    runner = web.AppRunner(gateway.application(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host.strip("[]") or "127.0.0.1", int(port))
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        await session.close()
        raise
    bound = int(runner.addresses[0][1])
    return RunningGateway(bound, runner, gateway, session)

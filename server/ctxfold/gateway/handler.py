"""The request handler: read the agent's request, let `contexts` reconcile and prepare, rewrite it
with the view, send it on (`read_rounds`, `upstream`), say what happened in response headers and one
span per request, and report usage afterwards; or, when ctxfold does not take part, forward the
request unchanged. Decisions live in the pure modules."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web
from ctxfold_client import Action, CtxfoldError, ErrorReason, Usage
from multidict import CIMultiDict
from opentelemetry import propagate, trace

from ctxfold import cpu
from ctxfold.engine.model import MAX_CONTEXT_WINDOW, MIN_CONTEXT_WINDOW
from ctxfold.gateway.contexts import Bucket, Contexts, NewSession, Prepared, Resent, unreachable
from ctxfold.gateway.formats import ApiFormat, BadRequest, Conversation
from ctxfold.gateway.formats.anthropic_messages import AnthropicMessages
from ctxfold.gateway.formats.openai_chat import OpenAIChat
from ctxfold.gateway.formats.openai_responses import OpenAIResponses
from ctxfold.gateway.identity import api_key_digest, api_key_of, context_window, session_key
from ctxfold.gateway.pieces import compact_json, work_size
from ctxfold.gateway.read_rounds import Exchange, ReadRounds, ViewTooLong, read_reserve
from ctxfold.gateway.request import SESSION_HEADER, Caller, Incoming, Read, parsed, rewritten_upstream
from ctxfold.gateway.resent import BUCKET_BYTES, likely_grows
from ctxfold.gateway.settings import GatewaySettings, key_sha256, load_tenants
from ctxfold.gateway.upstream import Opened, Upstream, UpstreamUnreachable, forwarded_headers, json_response

log = logging.getLogger("ctxfold.gateway")
tracer = trace.get_tracer("ctxfold.gateway")

OPENAI, ANTHROPIC = OpenAIChat(), AnthropicMessages()
APIS: tuple[ApiFormat, ...] = (OPENAI, OpenAIResponses(), ANTHROPIC)
# Agents send whole histories, with images: the largest request body accepted.
MAX_REQUEST_BYTES = 64 << 20
ACTION_NAMES = {Action.NONE: "none", Action.PRUNED: "pruned", Action.FOLDED: "folded"}
WINDOW_HEADER = "x-ctxfold-context-window"
TOKEN_HEADER = "x-ctxfold-token"
# What reading a request's body raises when it cannot be read (too large; not in its Content-Encoding).
UNREADABLE = (web.HTTPRequestEntityTooLarge, web.RequestPayloadError)
WINDOW_DIGITS = re.compile(r"[0-9]{1,18}")


def answer_ctxfold_headers(prepared: Prepared) -> dict[str, str]:
    return {
        SESSION_HEADER: prepared.session_id,
        "x-ctxfold-session-key": prepared.state.key[1].split(":", 1)[1],  # without the API key's digest
        "x-ctxfold-action": ACTION_NAMES.get(prepared.view.action, "none"),
        "x-ctxfold-view-tokens": str(prepared.view.estimated_input_tokens),  # what goes upstream
    }


def new_session(conversation: Conversation, window: int) -> NewSession:
    """What the request sets when it creates its session."""
    return NewSession(
        window=window,
        max_output_tokens=min(conversation.max_output_tokens, window // 4),
        tools_json=compact_json(list(conversation.tools)) if conversation.tools else "",
        model=conversation.model,
    )


def dropped(opening: asyncio.Task[Opened]) -> None:
    """An early upstream call the Prepare did not confirm: cancelled, or its answer released unread."""
    if opening.cancel():
        return
    if not opening.cancelled() and opening.exception() is None:
        opening.result().release()


def describe(span: trace.Span, prepared: Prepared) -> None:
    """What ctxfold did, on the request's span."""
    span.set_attribute("gen_ai.conversation.id", prepared.session_id)
    span.set_attribute("ctxfold.action", ACTION_NAMES.get(prepared.view.action, "none"))
    span.set_attribute("ctxfold.view_tokens", prepared.view.estimated_input_tokens)
    span.set_attribute("ctxfold.appended", prepared.appended)
    span.set_attribute("ctxfold.gateway.resent", prepared.upstream is not None)
    if prepared.rewound_to is not None:
        span.set_attribute("ctxfold.rewound_to_seq", prepared.rewound_to)


class Gateway:
    def __init__(self, settings: GatewaySettings, upstream: Upstream):
        self.settings = settings
        self.contexts = Contexts(settings)
        self.tenants = load_tenants(settings.tenants_file)
        self.windows = settings.windows()
        self.upstream = upstream
        self.rounds = ReadRounds(upstream, self.contexts, settings.max_read_rounds)
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
            except UNREADABLE as exc:
                return self._unreadable(api, request, exc)

        return handle

    def _unreadable(self, api: ApiFormat, request: web.Request, exc: Exception) -> web.Response:
        """The answer to a request whose body cannot be read: above the gateway's limit, or not in the
        Content-Encoding it names (a gzip body that is not gzip was a 500)."""
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            return self._error(api, 413, f"the request body is above this gateway's {MAX_REQUEST_BYTES} bytes")
        # The rest of the body is left unread and the connection closes after the answer (aiohttp would
        # read on, fail again with an error logged, and drop the connection under the agent's next request).
        request.content.feed_eof()
        answer = self._error(api, 400, f"the request body cannot be read: {' '.join(str(exc).split())}")
        answer.force_close()
        return answer

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

    def bucket(self, api: ApiFormat, caller: Caller, headers: Mapping[str, str], raw: bytes) -> Bucket | None:
        """Where `Contexts.resent` looks for the sessions whose last request `raw` (as it is compared) may repeat."""
        if not api.history_key or len(raw) <= BUCKET_BYTES:
            return None
        api_key = api_key_digest(caller.api_key)  # never the key itself
        scope = (caller.token, api_key, api.api, headers.get(SESSION_HEADER, ""), headers.get(WINDOW_HEADER, ""))
        return (*scope, raw[:BUCKET_BYTES])

    async def handle(self, api: ApiFormat, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if self.settings.mode == "pass_through":
            return await self.upstream.relay(request, self.base_url(api.provider) + request.path_qs, raw, {})
        caller = self.caller(request.headers)
        comparable = api.comparable(raw)
        bucket = self.bucket(api, caller, request.headers, comparable)
        resent = self.contexts.resent(api, bucket, comparable) if bucket is not None else None
        try:
            # A resent request's fields are the forwarded request's, byte for byte.
            read = Read(resent.forwarded.conversation) if resent is not None else await self._read_whole(api, raw)
            window = self._window(request.headers, read.conversation.model)
        except orjson.JSONDecodeError as exc:
            return self._error(api, 400, f"the request body is not valid JSON: {exc}")
        except BadRequest as exc:
            return self._error(api, 400, str(exc))
        context, conversation = propagate.extract(request.headers), read.conversation
        name = f"chat {conversation.model}" if conversation.model else "chat"
        with tracer.start_as_current_span(name, context=context, kind=trace.SpanKind.SERVER) as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.provider.name", api.provider)
            span.set_attribute("gen_ai.request.model", conversation.model)
            span.set_attribute("ctxfold.gateway.api", api.api)
            if conversation.not_reconciled:
                return await self._unchanged(api, request, raw, conversation.not_reconciled)
            incoming = Incoming(api, request, raw, comparable, caller, bucket, window)
            return await self._with_ctxfold(incoming, read, resent)

    async def _read_whole(self, api: ApiFormat, raw: bytes) -> Read:
        """The request parsed whole, in the CPU pool when its `work_size` says so."""
        work = work_size(raw)
        body, conversation = await cpu.run(work, parsed, api, raw)
        return Read(conversation, body, work)

    async def _with_ctxfold(self, incoming: Incoming, read: Read, resent: Resent | None) -> web.StreamResponse:
        """The request with the view ctxfold prepared for its history, upstream and back: a resent
        request's new messages spliced into the previous upstream body when the view only grew by
        them, else the whole request rewritten with the view."""
        api, request, raw = incoming.api, incoming.request, incoming.raw
        span = trace.get_current_span()
        url = self.base_url(api.provider) + request.path_qs
        forward = forwarded_headers(request.headers)
        # A spliced body keeps the read tool it offers only while the view leaves the tool its room.
        reserve = read_reserve(api) if resent is not None and resent.forwarded.offers_read else 0
        opening = self._early(url, forward, resent, reserve)
        try:
            try:
                prepared, read = await self._prepared(incoming, read, resent, reserve)
            except (orjson.JSONDecodeError, BadRequest) as exc:  # not expected: a resent request was checked
                return self._error(api, 400, f"the request body cannot be read: {exc}")
            except CtxfoldError as error:
                span.set_attribute("ctxfold.error.reason", error.reason)
                if error.reason == ErrorReason.CONTEXT_BUDGET_UNSATISFIED:
                    tokens = int(error.metadata.get("estimated_input_tokens", 0) or 0)
                    return json_response(400, api.context_length_error(tokens, incoming.window), {})
                return await self._ctxfold_failed(api, request, raw, error)
            describe(span, prepared)
            if prepared.upstream is not None and resent is not None:
                upstream_body, offers_read = prepared.upstream, resent.forwarded.offers_read
            else:
                upstream_body, offers_read = await self._rewritten(incoming, read, prepared)
            # The early call sent the very bytes the Prepare confirmed, or it is dropped.
            first, opening = (
                (opening, None) if resent is not None and upstream_body is resent.upstream else (None, opening)
            )
            if first is not None or opening is not None:
                span.set_attribute("ctxfold.gateway.early_call", "used" if first is not None else "dropped")
            headers = answer_ctxfold_headers(prepared)
            exchange = Exchange(api, url, forward, prepared, headers, offers_read)
            try:
                response, usage = await self._send(exchange, request, upstream_body, read.conversation.stream, first)
            except ViewTooLong as refusal:
                response, usage = await self._smaller(incoming, read, exchange, refusal)
        finally:
            if opening is not None:
                dropped(opening)
        if usage is not None:
            self._observe(exchange, usage)
        return response

    async def _prepared(
        self, incoming: Incoming, read: Read, resent: Resent | None, reserve: int
    ) -> tuple[Prepared, Read]:
        """The request's Prepare: a resent request's new messages appended (its previous upstream body
        kept when the view only grew by them, `reserve` under the trigger), else the request read whole
        and its history reconciled. And the request as read."""
        api, caller = incoming.api, incoming.caller
        prepared = await self.contexts.prepare_resent(api, resent, reserve) if resent else None
        if read.body is None and (prepared is None or prepared.upstream is None):
            read = await self._read_whole(api, incoming.raw)  # the full path for a resent request
        if prepared is None:
            conversation = read.conversation
            key = session_key(api, caller.api_key, incoming.request.headers.get(SESSION_HEADER, ""),
                              conversation.model, conversation.pieces)  # fmt: skip
            new = new_session(conversation, incoming.window)
            prepared = await self.contexts.prepare(caller.token, key, api, conversation, new, read.work)
        return prepared, read

    async def _send(
        self, exchange: Exchange, request: web.Request, body: bytes, stream: bool, first: asyncio.Task[Opened] | None
    ) -> tuple[web.StreamResponse, Usage | None]:
        if stream:
            return await self.rounds.stream(exchange, request, body, first)
        return await self.rounds.complete(exchange, body, first)

    async def _smaller(
        self, incoming: Incoming, read: Read, exchange: Exchange, refusal: ViewTooLong
    ) -> tuple[web.StreamResponse, Usage | None]:
        """After the provider refused the view as too long (ctxfold's estimate fell short of its count):
        a Prepare with `overflow` (one prune or fold whatever the view's size) and the request once more
        with the smaller view; the refusal reaches the agent unchanged when that cannot be had."""
        span, session_id = trace.get_current_span(), exchange.prepared.session_id
        if refusal.stated_tokens:  # the provider's count of the refused view: the estimate learns it first
            span.set_attribute("ctxfold.gateway.refused_input_tokens", refusal.stated_tokens)
            await self._report(exchange, Usage(refusal.stated_tokens))
        try:
            prepared = await self.contexts.prepare_overflow(exchange.prepared)
            # A resent request was spliced, not read: read it whole for its rewrite.
            whole = read if read.body is not None else await self._read_whole(incoming.api, incoming.raw)
        except (CtxfoldError, orjson.JSONDecodeError, BadRequest) as error:
            log.warning("session %s: the provider refused the view as too long; no smaller one: %s", session_id, error)
            return refusal.answer(exchange), None
        if prepared.view.action is Action.NONE:  # nothing left to prune or fold: the same view again is refused
            log.warning("session %s: the provider refused the view as too long; nothing to fold", session_id)
            return refusal.answer(exchange), None
        log.info("session %s: the provider refused the view as too long; sent again after %s", session_id,
                 ACTION_NAMES.get(prepared.view.action, "none"))  # fmt: skip
        describe(span, prepared)
        span.set_attribute("ctxfold.gateway.refused_as_too_long", True)
        upstream_body, offers_read = await self._rewritten(incoming, whole, prepared)
        headers = answer_ctxfold_headers(prepared)
        retried = replace(exchange, prepared=prepared, headers=headers, offers_read=offers_read, refusal_retried=True)
        response, usage = await self._send(retried, incoming.request, upstream_body, whole.conversation.stream, None)
        if usage is not None:
            self._observe(retried, usage)
        return response, None  # its usage reported: the view it describes is the smaller one

    def _early(
        self, url: str, forward: CIMultiDict[str], resent: Resent | None, reserve: int
    ) -> asyncio.Task[Opened] | None:
        """The upstream call of a resent request whose view likely only grows, sent while the Prepare runs
        (the upstream's time hides the Prepare's); None when the request waits for its Prepare."""
        if resent is None or not likely_grows(
            resent.forwarded, resent.middle, resent.state.tool_content_max_bytes, reserve
        ):
            return None
        return asyncio.ensure_future(self.upstream.open("POST", url, resent.upstream, forward))

    async def _rewritten(self, incoming: Incoming, read: Read, prepared: Prepared) -> tuple[bytes, bool]:
        """The upstream body with the whole view and whether it offers the read tool; kept for `resent`
        when the API allows."""
        assert read.body is not None  # read whole whenever the view is written in full
        read_rounds = self.settings.max_read_rounds > 0
        upstream, offers_read, kept = await cpu.run(
            read.work, rewritten_upstream, incoming, read.body, read.conversation, prepared, read_rounds
        )
        if kept is not None and incoming.bucket is not None:
            self.contexts.remember_forwarded(prepared, incoming.bucket, kept)
        return upstream, offers_read

    def _window(self, headers: Mapping[str, str], model: str) -> int:
        given = headers.get(WINDOW_HEADER)
        if given is None:
            return context_window(model, self.windows, headers.get("anthropic-beta", ""))
        # ASCII digits only, and few: str.isdigit takes "²" and int() refuses it, or more than 4,300 digits.
        if not WINDOW_DIGITS.fullmatch(given) or not MIN_CONTEXT_WINDOW <= int(given) <= MAX_CONTEXT_WINDOW:
            bounds = f"from {MIN_CONTEXT_WINDOW} to {MAX_CONTEXT_WINDOW}"
            raise BadRequest(f"{WINDOW_HEADER}: must be a whole number of tokens {bounds} (got {given!r})")
        return int(given)

    def _observe(self, exchange: Exchange, usage: Usage) -> None:
        """Reports usage after the answer, never delaying it; a failure is logged, not raised."""
        span = trace.get_current_span()
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        if not usage.input_tokens or not exchange.prepared.observe:
            return
        task = asyncio.get_running_loop().create_task(self._report(exchange, usage))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _report(self, exchange: Exchange, usage: Usage) -> None:
        """ObserveUsage for the exchange's view; a failure is logged, not raised."""
        prepared = exchange.prepared
        try:
            await self.contexts.client.observe_usage(prepared.session_id, prepared.view, usage, **prepared.state.call)
        except CtxfoldError as error:
            log.warning("ObserveUsage for session %s failed: %s", prepared.session_id, error)

    # ---- when ctxfold does not take part --------------------------------------------------------

    async def _ctxfold_failed(
        self, api: ApiFormat, request: web.Request, raw: bytes, error: CtxfoldError
    ) -> web.StreamResponse:
        state = "unreachable" if unreachable(error) else "refused the request"
        why = f"ctxfold {state}: {error.reason or error.code.name}"
        if self.settings.fail_mode == "closed":
            log.warning("%s; answered 503 (fail_mode closed)", why)
            return json_response(503, api.error(503, f"{why}: {error.message}"), {"x-ctxfold-warning": why})
        log.warning("%s; request forwarded unchanged (fail_mode open)", why)
        return await self._unchanged(api, request, raw, why)

    async def _unchanged(self, api: ApiFormat, request: web.Request, raw: bytes, why: str) -> web.StreamResponse:
        url = self.base_url(api.provider) + request.path_qs
        return await self.upstream.relay(request, url, raw, {"x-ctxfold-warning": why, "x-ctxfold-action": "none"})

    async def pass_through(self, request: web.Request) -> web.StreamResponse:
        """Anything the gateway does not change (`/v1/models`, `/v1/messages/count_tokens`, ...), to
        the upstream of its provider: Anthropic's paths and requests, else OpenAI's."""
        anthropic = request.path.startswith("/v1/messages") or "anthropic-version" in request.headers
        api = ANTHROPIC if anthropic else OPENAI
        if request.headers.get("Upgrade", "").lower() == "websocket":
            # Codex CLI asks for the Responses API over a WebSocket first: a 426 has it fall back to
            # HTTP streaming at once, where a 404 from upstream had it retry for up to seconds.
            return self._error(api, 426, "ctxfold gateway: WebSockets are not served; use HTTP (SSE streaming)")
        url = self.base_url(api.provider) + request.path_qs
        try:
            return await self.upstream.relay(request, url, await request.read(), {})
        except UpstreamUnreachable as exc:
            return self._unreachable(api, exc)
        except UNREADABLE as exc:
            return self._unreadable(api, request, exc)

    def _error(self, api: ApiFormat, status: int, message: str) -> web.Response:
        return json_response(status, api.error(status, message), {})

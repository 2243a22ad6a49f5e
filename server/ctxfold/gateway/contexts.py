"""The gateway's side of ContextService, through the Python SDK: one client per tenant token, the
sessions this process has seen (their ids and transcript fingerprints, so that reconciling a resent
history costs no call in the common case), reconcile, rewind, prepare."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import grpc
import orjson
from ctxfold_client import Action, AsyncClient, Message, SessionConfig, View

from ctxfold.gateway.formats import ApiFormat, Conversation, ViewEntry
from ctxfold.gateway.pieces import Json, request_fingerprints
from ctxfold.gateway.reconcile import reconcile
from ctxfold.gateway.settings import GatewaySettings

log = logging.getLogger("ctxfold.gateway")

# Sessions whose fingerprints a gateway process keeps (about 40 bytes per message); an evicted one
# costs one ListMessages when its agent comes back.
MAX_SESSIONS = 4096
# Views the SDK keeps per client so that Prepare answers with deltas.
VIEW_CACHE_SIZE = 4096
# Usage is reported for calibration, which moves slowly: at most this often per session, and after
# every prune or fold (the view the estimate describes changed). Each ObserveUsage is a few writes
# on the server, as costly as the Prepare itself.
OBSERVE_INTERVAL_SECONDS = 30.0
# The JSON of each session's last request kept for `request_fingerprints`, all sessions together;
# the least recently used sessions' go first (they then hash their next request whole).
MAX_KNOWN_JSON_BYTES = 256 << 20


def should_observe(last_observed: float | None, now: float, action: Action) -> bool:
    return last_observed is None or action is not Action.NONE or now - last_observed >= OBSERVE_INTERVAL_SECONDS


class TranscriptMoved(Exception):
    """Another writer appended to the session between our read and our append."""


@dataclass
class SessionState:
    session_id: str
    fingerprints: list[str]
    known_json: bytes = b""  # the JSON of the pieces `fingerprints` were made from, when kept
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    observed_at: float | None = None  # when usage was last reported (monotonic seconds)


@dataclass(frozen=True)
class Prepared:
    session_id: str
    view: View
    entries: list[ViewEntry]
    appended: int
    rewound_to: int | None  # the seq the transcript was rewound to, if it diverged
    observe: bool  # report this request's usage


@dataclass(frozen=True)
class NewSession:
    """What a request that creates its session sets."""

    window: int
    max_output_tokens: int
    tools_json: str
    model: str


def view_entries(view: View, conversation: Conversation, api: str = "") -> list[ViewEntry]:
    """Each view message with the agent's source of it when the view shows the canonical message
    unchanged (a live seq maps to the request's piece of that index); a summary made by the provider's
    own compaction, for that API family, as its item beside the engine's sections (`native_summary`);
    None renders it from its fields (a text summary, a pruned or bounded result, a bounded anchor)."""
    pieces, count = conversation.pieces, len(conversation.pieces)
    return [
        ViewEntry(m, pieces[m.seq - 1].source)
        if 0 < m.seq <= count and not (m.summary or m.pruned or m.truncated)
        else ViewEntry(m, native_summary(m, api))
        for m in view.messages
    ]


def native_summary(message: Message, api: str) -> Json | None:
    """The summary as the provider re-reads it: its compaction item (OpenAI Responses) or block
    (Anthropic Messages) byte for byte, then the engine's sections as text; None when the summary is
    text only or its item is of another API family (which cannot read it: the text goes)."""
    payload = message.provider_payload
    if not message.summary or payload is None or payload.format != api or not payload.json:
        return None
    item = orjson.loads(payload.json)
    if api == "openai_responses":
        return [item, {"role": "user", "content": message.content}]
    if api == "anthropic_messages":
        return [item, {"type": "text", "text": message.content}]
    return None


class Contexts:
    def __init__(self, settings: GatewaySettings):
        self.settings = settings
        self._clients: dict[str, AsyncClient] = {}
        self._sessions: OrderedDict[tuple[str, str], SessionState] = OrderedDict()
        self._known_json_bytes = 0

    def client(self, token: str) -> AsyncClient:
        found = self._clients.get(token)
        if found is None:
            found = AsyncClient(
                self.settings.server,
                token=token or None,
                ca_cert=self.settings.tls_ca or None,
                timeout=self.settings.timeout_seconds,
                stream_timeout=self.settings.timeout_seconds,
                view_cache_size=VIEW_CACHE_SIZE,
            )
            self._clients[token] = found
        return found

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self._clients.values()))

    async def prepare(
        self, token: str, key: str, api: ApiFormat, conversation: Conversation, new: NewSession
    ) -> Prepared:
        client = self.client(token)
        state = await self._state(client, token, key, api, new)
        async with state.lock:
            try:
                return await self._reconcile_and_prepare(client, state, api, conversation)
            except TranscriptMoved:
                log.info("session %s changed underneath this gateway; reloading its transcript", state.session_id)
                self._remember(state, await self._fingerprints(client, state.session_id), b"")
                return await self._reconcile_and_prepare(client, state, api, conversation)

    async def _reconcile_and_prepare(
        self, client: AsyncClient, state: SessionState, api: ApiFormat, conversation: Conversation
    ) -> Prepared:
        request, request_json = request_fingerprints(api.api, conversation.pieces, state.fingerprints, state.known_json)
        plan = reconcile(state.fingerprints, request)
        if plan.rewind:
            await client.rewind(state.session_id, plan.keep)
            self._remember(state, state.fingerprints[: plan.keep], b"")
        append: list[Message] = [api.canonical(piece) for piece in conversation.pieces[plan.keep :]]
        view = await client.prepare(state.session_id, append)
        if append and (not view.appended or view.appended[0].seq != plan.keep + 1):
            raise TranscriptMoved
        self._remember(state, request, request_json)
        now = time.monotonic()
        observe = should_observe(state.observed_at, now, view.action)
        if observe:
            state.observed_at = now
        return Prepared(
            session_id=state.session_id,
            view=view,
            entries=view_entries(view, conversation, api.api),
            appended=len(append),
            rewound_to=plan.keep if plan.rewind else None,
            observe=observe,
        )

    async def _state(self, client: AsyncClient, token: str, key: str, api: ApiFormat, new: NewSession) -> SessionState:
        cache_key = (token, key)
        state = self._sessions.get(cache_key)
        if state is not None:
            self._sessions.move_to_end(cache_key)
            return state
        config = SessionConfig(
            context_window=new.window, max_output_tokens=new.max_output_tokens, tools=new.tools_json, model=new.model
        )
        session = await client.create_session(config, session_key=key)
        fingerprints = await self._fingerprints(client, session.id) if session.head_seq else []
        state = SessionState(session.id, fingerprints)
        self._sessions[cache_key] = state
        if len(self._sessions) > MAX_SESSIONS:
            _, evicted = self._sessions.popitem(last=False)
            self._known_json_bytes -= len(evicted.known_json)
        return state

    async def _fingerprints(self, client: AsyncClient, session_id: str) -> list[str]:
        """The live transcript's fingerprints (a message another client appended has none, so the
        resent history diverges at it and the gateway rewinds to just before it)."""
        return [
            m.provider_payload.fingerprint if m.provider_payload is not None else ""
            async for m in client.list_messages(session_id, page_size=1000)
        ]

    def _remember(self, state: SessionState, fingerprints: list[str], known_json: bytes) -> None:
        self._known_json_bytes += len(known_json) - len(state.known_json)
        state.fingerprints, state.known_json = fingerprints, known_json
        for other in self._sessions.values():  # least recently used first
            if self._known_json_bytes <= MAX_KNOWN_JSON_BYTES:
                break
            self._known_json_bytes -= len(other.known_json)
            other.known_json = b""


def unreachable(error: Exception) -> bool:
    """ctxfold could not answer at all (down, overloaded, too slow), as opposed to refusing a request."""
    code = getattr(error, "code", None)
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN)

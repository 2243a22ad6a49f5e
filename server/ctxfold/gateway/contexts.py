"""The gateway's side of ContextService, through the Python SDK: one client, each call carrying its
tenant's token; the sessions this process has seen (their ids, transcript fingerprints and last
request, so that reconciling a resent history costs no call in the common case and an appended turn
is recognized by its bytes), reconcile, rewind, prepare."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import grpc
from ctxfold_client import Action, AsyncClient, CallOptions, CtxfoldError, ErrorReason, Message, SessionConfig, View

from ctxfold import cpu
from ctxfold.gateway.formats import ApiFormat, Conversation, Spliced, ViewEntry
from ctxfold.gateway.pieces import Json, Piece, loads, work_size
from ctxfold.gateway.reconcile import (
    append_batches,
    canonical_messages,
    message_chars,
    new_pieces,
    reconciled_request,
    with_agent_call_ids,
)
from ctxfold.gateway.resent import Forwarded, continued, grew_by, inserted, new_items, spliced
from ctxfold.gateway.settings import GatewaySettings

log = logging.getLogger("ctxfold.gateway")

# Sessions whose fingerprints a gateway process keeps (about 40 bytes per message); an evicted one
# costs one ListMessages when its agent comes back.
MAX_SESSIONS = 4096
# Views the SDK keeps (one per session) so that Prepare answers with deltas; their bytes count in
# `MAX_KEPT_BYTES` too, and a session's view goes with its kept request.
VIEW_CACHE_SIZE = 4096
# A view message's objects beyond its text, as the budget counts them (the server's cache counts 1 KiB too).
VIEW_MESSAGE_BYTES = 1024
# Usage is reported for calibration, which moves slowly: at most this often per session, and after
# every prune or fold (the view the estimate describes changed). Each ObserveUsage is a few writes
# on the server, as costly as the Prepare itself.
OBSERVE_INTERVAL_SECONDS = 30.0
# The bytes of sessions' last requests and views kept, all sessions together: the JSON of their pieces
# for `request_fingerprints`, the requests `resent` recognizes and the SDK's view of each. The least
# recently used sessions' go first (their next request then takes the full path, its Prepare answers the
# whole view).
MAX_KEPT_BYTES = 256 << 20
# Sessions a bucket of `resent` holds (requests with the same scope and first bytes).
MAX_BUCKET_SESSIONS = 32
# A bucket: the scope of a request (tenant token, API key digest, API, session and window headers) and
# its first `resent.BUCKET_BYTES` bytes.
Bucket = tuple[str, str, str, str, str, bytes]


def view_bytes(view: View, known_version: int, known_bytes: int) -> int:
    """The memory of `view` as the budget counts it: from `known_bytes` (of the view of `known_version`) and the
    messages beyond it when the view only grew from that one (the same generation), else every message's."""
    generation, count = divmod(view.view_version, 1 << 32)
    known_generation, known_count = divmod(known_version, 1 << 32)
    grown = known_version and generation == known_generation and count >= known_count
    messages = view.messages[known_count:] if grown else view.messages
    return (known_bytes if grown else 0) + sum(message_chars(m) + VIEW_MESSAGE_BYTES for m in messages)


def credentials(token: str) -> CallOptions:
    """A call made for the tenant of `token` ("": the server's single tenant): its bearer token as the call's
    metadata on the gateway's one channel, so that a caller's token costs nothing beyond its calls."""
    if not token:
        return {}
    if not (token.isascii() and token.isprintable()):
        why = "the ctxfold token is not printable ASCII: it cannot be a bearer token"
        raise CtxfoldError.client(grpc.StatusCode.UNAUTHENTICATED, ErrorReason.UNAUTHENTICATED, why)
    return {"metadata": (("authorization", f"Bearer {token}"),)}


def fingerprint_of(message: Message) -> str:
    """The fingerprint a message carries ("" for one no gateway appended)."""
    return message.provider_payload.fingerprint if message.provider_payload is not None else ""


def should_observe(last_observed: float | None, now: float, action: Action) -> bool:
    return last_observed is None or action is not Action.NONE or now - last_observed >= OBSERVE_INTERVAL_SECONDS


class TranscriptMoved(Exception):
    """Another writer appended to the session between our read and our append."""


@dataclass
class SessionState:
    key: tuple[str, str]  # (tenant token, session key)
    session_id: str
    fingerprints: list[str]
    tool_content_max_bytes: int  # the session's bound of a tool result's text in the view
    known_json: bytes = b""  # the JSON of the pieces `fingerprints` were made from, when kept
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    observed_at: float | None = None  # when usage was last reported (monotonic seconds)
    forwarded: Forwarded | None = None  # its last request, when its next one may be recognized by bytes
    prepares: int = 0  # Prepares this process made for it
    view_version: int = 0  # of the SDK's view of it, when kept
    view_bytes: int = 0  # that view's, as `view_bytes` counts them
    counted_bytes: int = 0  # its bytes in the gateway's count (`Contexts._recount`)

    @property
    def call(self) -> CallOptions:
        """The options of a call for this session (its tenant's credentials)."""
        return credentials(self.key[0])

    @property
    def kept_bytes(self) -> int:
        return len(self.known_json) + (self.forwarded.size if self.forwarded is not None else 0) + self.view_bytes

    def viewed(self, view: View) -> None:
        """After a Prepare: `view` is the SDK's view of the session."""
        self.view_bytes = view_bytes(view, self.view_version, self.view_bytes)
        self.view_version = view.view_version
        self.prepares += 1


@dataclass(frozen=True)
class Prepared:
    state: SessionState
    prepares: int  # the state's count of Prepares when this one answered
    view: View
    appended: int
    rewound_to: int | None  # the seq the transcript was rewound to, if it diverged
    observe: bool  # report this request's usage
    upstream: bytes | None = None  # the upstream body, when a resent request's messages only grew the view

    @property
    def session_id(self) -> str:
        return self.state.session_id


@dataclass(frozen=True)
class Resent:
    """A request recognized as a session's last one with `middle`, the JSON of new `pieces`, inserted
    into its history."""

    state: SessionState
    forwarded: Forwarded
    middle: bytes
    pieces: tuple[Piece, ...]
    items: Spliced  # what the upstream gets of `middle`
    upstream: bytes  # the forwarded upstream body with `items` inserted: sent when the view only grows


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
        else ViewEntry(with_agent_call_ids(m), native_summary(m, api))
        for m in view.messages
    ]


def native_summary(message: Message, api: str) -> Json | None:
    """The summary as the provider re-reads it: its compaction item (OpenAI Responses) or block
    (Anthropic Messages) byte for byte, then the engine's sections as text; None when the summary is
    text only or its item is of another API family (which cannot read it: the text goes)."""
    payload = message.provider_payload
    if not message.summary or payload is None or payload.format != api or not payload.json:
        return None
    item = loads(payload.json)
    if api == "openai_responses":
        return [item, {"role": "user", "content": message.content}]
    if api == "anthropic_messages":
        return [item, {"type": "text", "text": message.content}]
    return None


class Contexts:
    def __init__(self, settings: GatewaySettings):
        self.settings = settings
        self.client = AsyncClient(
            settings.server,
            ca_cert=settings.tls_ca or None,
            timeout=settings.timeout_seconds,
            stream_timeout=settings.timeout_seconds,
            view_cache_size=VIEW_CACHE_SIZE,
        )
        self._sessions: OrderedDict[tuple[str, str], SessionState] = OrderedDict()
        self._buckets: OrderedDict[Bucket, list[SessionState]] = OrderedDict()
        self._kept_bytes = 0

    async def close(self) -> None:
        await self.client.close()

    async def prepare(
        self, token: str, key: str, api: ApiFormat, conversation: Conversation, new: NewSession, size: int
    ) -> Prepared:
        """Reconciles the request's history with the session's transcript (its fingerprints and new
        messages made in the CPU pool when `size`, as `pieces.work_size`, says so) and prepares."""
        state = await self._state(token, key, api, new)
        async with state.lock:
            try:
                return await self._reconcile_and_prepare(state, api, conversation, size)
            except TranscriptMoved:
                await self._reload(state)
            try:
                return await self._reconcile_and_prepare(state, api, conversation, size)
            except TranscriptMoved:  # another writer (another gateway, an SDK) keeps appending meanwhile
                why = "the session's transcript kept moving while this request was appended"
                raise CtxfoldError.client(grpc.StatusCode.ABORTED, ErrorReason.CONCURRENT_MODIFICATION, why) from None

    def resent(self, api: ApiFormat, bucket: Bucket, raw: bytes) -> Resent | None:
        """The session whose last request `raw` repeats with new messages inserted, if this process has it;
        None too when they are many (reading them is Python per message: the full path does it off the loop)."""
        for state in self._buckets.get(bucket, ()):
            forwarded = state.forwarded
            middle = inserted(forwarded, raw) if forwarded is not None else None
            if forwarded is None or middle is None:
                continue
            items = None if work_size(middle) else new_items(middle)
            pieces = new_pieces(api, forwarded, items) if items is not None else None
            if items is None or pieces is None:
                return None
            self._buckets.move_to_end(bucket)
            self._sessions.move_to_end(state.key)  # kept: an evicted session keeps no request (`_remember`)
            upstream_items = api.spliced_items(middle, items)
            upstream = spliced(forwarded, upstream_items, api.breakpoint)
            return Resent(state, forwarded, middle, pieces, upstream_items, upstream)
        return None

    async def prepare_resent(self, api: ApiFormat, resent: Resent, reserve: int) -> Prepared | None:
        """Appends the resent request's new messages and prepares; None when the request must take
        the full path (another request of the session came first, another writer moved the
        transcript, or its new messages take more than one append). Its upstream body is the forwarded
        one spliced when the view only grew and leaves `reserve` under the trigger (`grew_by`)."""
        state, forwarded, pieces = resent.state, resent.forwarded, resent.pieces
        async with state.lock:
            if state.forwarded is not forwarded:
                return None
            append = canonical_messages(api, pieces, 0)
            if len(append_batches(append)) > 1:
                return None
            view = await self.client.prepare(state.session_id, append, **state.call)
            state.viewed(view)
            # The transcript is the forwarded history, fingerprinted: the new messages follow it.
            if not view.appended or view.appended[0].seq != len(state.fingerprints) + 1:
                await self._reload(state)
                return None
            grown = grew_by(forwarded, view, view.appended, reserve)
            fingerprints = [*state.fingerprints, *(fingerprint_of(message) for message in append)]
            after = continued(forwarded, resent.middle, resent.items, view, pieces[-1].role) if grown else None
            self._remember(state, fingerprints, b"", after)
            return Prepared(
                state=state,
                prepares=state.prepares,
                view=view,
                appended=len(append),
                rewound_to=None,
                observe=self._observes(state, view),
                upstream=resent.upstream if grown else None,
            )

    async def prepare_overflow(self, refused: Prepared) -> Prepared:
        """After the provider refused `refused`'s view as too long: a Prepare with `overflow` (nothing
        appended; the server prunes or folds once whatever the view's size). The session's last
        request is no longer what went upstream: its continuation takes the full path."""
        state = refused.state
        async with state.lock:
            view = await self.client.prepare(state.session_id, overflow=True, **state.call)
            state.viewed(view)
            self._remember(state, state.fingerprints, state.known_json, None)
            return replace(
                refused, prepares=state.prepares, view=view, observe=self._observes(state, view), upstream=None
            )

    def remember_forwarded(self, prepared: Prepared, bucket: Bucket, forwarded: Forwarded) -> None:
        """Keeps the request that went upstream so that its continuation is recognized by bytes, when
        no other Prepare of its session came in between and its session is still kept."""
        state = prepared.state
        if state.prepares != prepared.prepares:
            return
        self._remember(state, state.fingerprints, state.known_json, forwarded)
        sessions = [s for s in self._buckets.pop(bucket, []) if s is not state and s.forwarded is not None]
        self._buckets[bucket] = [*sessions[-MAX_BUCKET_SESSIONS + 1 :], state]
        if len(self._buckets) > MAX_SESSIONS:
            self._buckets.popitem(last=False)

    async def _reconcile_and_prepare(
        self, state: SessionState, api: ApiFormat, conversation: Conversation, size: int
    ) -> Prepared:
        reconciled = await cpu.run(size, reconciled_request, api, conversation, state.fingerprints, state.known_json)
        request, request_json, plan, batches = reconciled
        if plan.rewind:
            await self.client.rewind(state.session_id, plan.keep, **state.call)
            self._remember(state, state.fingerprints[: plan.keep], b"", None)
        *leading, last = batches or [[]]
        head_seq = plan.keep
        for batch in leading:  # a history longer than one append: all but its last batch appended alone
            stored = await self.client.append_messages(state.session_id, batch, **state.call)
            if stored[0].seq != head_seq + 1:
                raise TranscriptMoved
            head_seq += len(batch)
        view = await self.client.prepare(state.session_id, last, **state.call)
        state.viewed(view)
        if last and (not view.appended or view.appended[0].seq != head_seq + 1):
            raise TranscriptMoved
        self._remember(state, request, request_json, None)
        return Prepared(
            state=state,
            prepares=state.prepares,
            view=view,
            appended=sum(len(batch) for batch in batches),
            rewound_to=plan.keep if plan.rewind else None,
            observe=self._observes(state, view),
        )

    @staticmethod
    def _observes(state: SessionState, view: View) -> bool:
        now = time.monotonic()
        observe = should_observe(state.observed_at, now, view.action)
        if observe:
            state.observed_at = now
        return observe

    async def _state(self, token: str, key: str, api: ApiFormat, new: NewSession) -> SessionState:
        cache_key = (token, key)
        state = self._sessions.get(cache_key)
        if state is not None:
            self._sessions.move_to_end(cache_key)
            return state
        config = SessionConfig(
            context_window=new.window, max_output_tokens=new.max_output_tokens, tools=new.tools_json, model=new.model
        )
        call = credentials(token)
        session = await self.client.create_session(config, session_key=key, **call)
        fingerprints = await self._fingerprints(session.id, call) if session.head_seq else []
        opened = self._sessions.get(cache_key)
        if opened is not None:  # by a request of the same session meanwhile: one state, one lock, per session
            return opened
        state = SessionState(cache_key, session.id, fingerprints, session.config.tool_content_max_bytes)
        self._sessions[cache_key] = state
        if len(self._sessions) > MAX_SESSIONS:
            self._forget(self._sessions.popitem(last=False)[1])
        return state

    async def _reload(self, state: SessionState) -> None:
        log.info("session %s changed underneath this gateway; reloading its transcript", state.session_id)
        self._remember(state, await self._fingerprints(state.session_id, state.call), b"", None)

    async def _fingerprints(self, session_id: str, call: CallOptions) -> list[str]:
        """The live transcript's fingerprints (a message another client appended has none, so the
        resent history diverges at it and the gateway rewinds to just before it)."""
        return [fingerprint_of(m) async for m in self.client.list_messages(session_id, page_size=1000, **call)]

    def _remember(
        self, state: SessionState, fingerprints: list[str], known_json: bytes, forwarded: Forwarded | None
    ) -> None:
        state.fingerprints = fingerprints
        if self._sessions.get(state.key) is not state:  # evicted while it was prepared: it keeps nothing
            self._forget(state)
            return
        state.known_json, state.forwarded = known_json, forwarded
        self._recount(state)
        for other in self._sessions.values():  # least recently used first
            if self._kept_bytes <= MAX_KEPT_BYTES:
                break
            self._forget(other)

    def _forget(self, state: SessionState) -> None:
        """Drops what this process keeps of a session but its fingerprints: its last request and the SDK's view
        (its next Prepare answers the whole view)."""
        state.known_json, state.forwarded, state.view_version, state.view_bytes = b"", None, 0, 0
        self._recount(state)
        self.client.forget_view(state.session_id)

    def _recount(self, state: SessionState) -> None:
        self._kept_bytes += state.kept_bytes - state.counted_bytes
        state.counted_bytes = state.kept_bytes


def unreachable(error: Exception) -> bool:
    """ctxfold could not answer at all (down, overloaded, too slow), as opposed to refusing a request."""
    code = getattr(error, "code", None)
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN)

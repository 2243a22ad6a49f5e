"""The I/O-free layer under both clients.

Connection settings, per-call metadata, request builders, and the pure state machines behind the
helpers: the Prepare/Compact stream (progress events, exactly one result, delta application), list
paging and tool-result paging. Nothing here performs I/O: `_async_client.py` (and `_sync_client.py`,
generated from it) only drive these pieces with awaited or blocking calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.descriptor import Descriptor

from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client._gen.enums import ErrorReason
from ctxfold_client._version import VERSION
from ctxfold_client.config import SessionConfig
from ctxfold_client.errors import CtxfoldError
from ctxfold_client.models import (
    CallOptions,
    ContextState,
    FoldProgress,
    Message,
    ToolResult,
    ToolResultPage,
    Usage,
    View,
    messages_to_proto,
)
from ctxfold_client.tracing import trace_metadata

OnProgress = Callable[[FoldProgress], object]
StreamEvent = FoldProgress | View
PemSource = bytes | str | os.PathLike[str]
"""PEM data as bytes, a string holding PEM text, or the path of a PEM file."""
Metadata = tuple[tuple[str, str], ...]
Req = TypeVar("Req")

DEFAULT_TIMEOUT = 30.0
DEFAULT_STREAM_TIMEOUT = 600.0
DEFAULT_VIEW_CACHE_SIZE = 256
DEFAULT_PAGE_BYTES = 16384
MIN_PAGE_BYTES = 4
MAX_PAGE_BYTES = 24576
# The largest pages the server serves (ListSessions and ListMessages; ListCheckpoints).
MAX_PAGE_SIZE = 1000
MAX_CHECKPOINT_PAGE_SIZE = 100
MAX_RECEIVE_MESSAGE_BYTES = 64 << 20
USER_AGENT = f"ctxfold-python/{VERSION}"


# ---- connection -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    target: str
    credentials: grpc.ChannelCredentials | None
    channel_options: tuple[tuple[str, Any], ...]
    metadata: Metadata
    timeout: float | None
    stream_timeout: float | None
    propagate_trace: bool


def _bad_setting(field: str, message: str) -> CtxfoldError:
    return CtxfoldError.invalid_argument(ErrorReason.INVALID_CLIENT_ARGUMENT, field, message)


def _pem(value: PemSource | None, what: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    try:
        return Path(value).read_bytes()
    except OSError as exc:
        raise _bad_setting(what.replace(" ", "_"), f"cannot read the {what} {os.fspath(value)!r}: {exc}") from exc


def make_settings(
    address: str,
    *,
    token: str | None,
    tls: bool | None,
    ca_cert: PemSource | None,
    client_cert: PemSource | None,
    client_key: PemSource | None,
    server_name: str | None,
    timeout: float | None,
    stream_timeout: float | None,
    metadata: Sequence[tuple[str, str]],
    channel_options: Sequence[tuple[str, Any]],
    propagate_trace: bool,
) -> Settings:
    if not address:
        raise _bad_setting("address", "address is required, e.g. '127.0.0.1:50051'")
    if (client_cert is None) != (client_key is None):
        raise _bad_setting("client_cert", "client_cert and client_key go together (mutual TLS)")
    use_tls = tls if tls is not None else any(v is not None for v in (ca_cert, client_cert, server_name))
    if not use_tls and (ca_cert is not None or client_cert is not None):
        raise _bad_setting("tls", "ca_cert/client_cert need tls=True")
    for name, seconds in (("timeout", timeout), ("stream_timeout", stream_timeout)):
        if seconds is not None and seconds <= 0:
            raise _bad_setting(name, f"{name} must be > 0 seconds (None = no deadline), not {seconds}")
    credentials = (
        grpc.ssl_channel_credentials(
            root_certificates=_pem(ca_cert, "CA certificate"),
            private_key=_pem(client_key, "client key"),
            certificate_chain=_pem(client_cert, "client certificate"),
        )
        if use_tls
        else None
    )
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
        ("grpc.primary_user_agent", USER_AGENT),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    options.extend(channel_options)
    static: list[tuple[str, str]] = []
    if token is not None:
        if not token or any(c.isspace() for c in token):
            raise _bad_setting("token", "token must be a non-empty string without whitespace")
        static.append(("authorization", f"Bearer {token}"))
    static.extend((key.lower(), value) for key, value in metadata)
    return Settings(
        target=address,
        credentials=credentials,
        channel_options=tuple(options),
        metadata=tuple(static),
        timeout=timeout,
        stream_timeout=stream_timeout,
        propagate_trace=propagate_trace,
    )


def call_args(settings: Settings, call: CallOptions, *, streaming: bool = False) -> tuple[float | None, Metadata]:
    """The deadline and metadata of one call: client defaults, per-call options, trace context."""
    default = settings.stream_timeout if streaming else settings.timeout
    timeout = call.get("timeout", default)
    metadata = [
        *settings.metadata,
        *((key.lower(), value) for key, value in call.get("metadata", ())),
        *trace_metadata(call.get("traceparent"), call.get("tracestate"), propagate=settings.propagate_trace),
    ]
    return timeout, tuple(metadata)


# ---- requests ---------------------------------------------------------------------------------


def request_id(given: str) -> str:
    """The caller's request id, or a fresh UUIDv4: a retry of the same call then appends nothing twice."""
    return given or str(uuid.uuid4())


def append_request(session_id: str, messages: Iterable[Message], given_request_id: str) -> pb.AppendMessagesRequest:
    return pb.AppendMessagesRequest(
        session_id=session_id, messages=_converted(messages, "messages"), request_id=request_id(given_request_id)
    )


def _converted(messages: Iterable[Message], field: str) -> list[pb.Message]:
    if isinstance(messages, Message):
        raise TypeError("pass a list of messages, not a single message")
    with refusing_lone_surrogates(messages := tuple(messages), pb.Message.DESCRIPTOR, field):
        return messages_to_proto(messages)


@contextmanager
def refusing_lone_surrogates(value: object, descriptor: Descriptor, path: str) -> Iterator[None]:
    """Turns the UnicodeEncodeError of building a request from `value` (named as the proto `descriptor`; a sequence of
    them) into the error every SDK raises, as the server refuses a NUL: INVALID_TEXT, `field` the path in the request.
    A lone surrogate is text cut between the halves of an emoji, or bytes decoded with surrogateescape."""
    try:
        yield
    except UnicodeEncodeError:
        field = _lone_surrogate_field(value, descriptor, path)
        if not field:
            raise
        raise CtxfoldError.invalid_argument(
            ErrorReason.INVALID_TEXT, field, f"{field} is not valid Unicode text (a lone surrogate)"
        ) from None


def _lone_surrogate_field(value: object, descriptor: Descriptor, path: str) -> str:
    """The path of the first string of `value` holding a lone surrogate, following the proto's fields; or ""."""
    if isinstance(value, tuple | list):
        for index, item in enumerate(value):
            if found := _lone_surrogate_field(item, descriptor, f"{path}[{index}]"):
                return found
        return ""
    for field in descriptor.fields:
        item, where = getattr(value, field.name, None), f"{path}.{field.name}"
        if isinstance(item, str) and _LONE_SURROGATE.search(item):
            return where
        found = _lone_surrogate_field(item, field.message_type, where) if field.message_type and item else ""
        if found:
            return found
    return ""


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def checked(request: Req) -> Req:
    """`request` once its session id, if it names one, is there (SESSION_ID_REQUIRED otherwise)."""
    if getattr(request, "session_id", None) == "":
        raise CtxfoldError.invalid_argument(ErrorReason.SESSION_ID_REQUIRED, "session_id", "session_id is required")
    return request


def page_size(requested: int, maximum: int = MAX_PAGE_SIZE) -> int:
    """A list's page size: 0 (the server's default) up to the server's maximum."""
    if not 0 <= requested <= maximum:
        raise CtxfoldError.invalid_argument(
            ErrorReason.INVALID_PAGE_SIZE, "page_size", f"page_size must be within [0, {maximum}], got {requested}"
        )
    return requested


def list_sessions_request(size: int) -> pb.ListSessionsRequest:
    return pb.ListSessionsRequest(page_size=page_size(size))


def list_messages_request(session_id: str, size: int, include_abandoned: bool) -> pb.ListMessagesRequest:
    return pb.ListMessagesRequest(session_id=session_id, page_size=page_size(size), include_abandoned=include_abandoned)


def list_checkpoints_request(session_id: str, size: int, include_abandoned: bool) -> pb.ListCheckpointsRequest:
    return pb.ListCheckpointsRequest(
        session_id=session_id, page_size=page_size(size, MAX_CHECKPOINT_PAGE_SIZE), include_abandoned=include_abandoned
    )


PageRequest = TypeVar("PageRequest", pb.ListSessionsRequest, pb.ListMessagesRequest, pb.ListCheckpointsRequest)


def next_page(request: PageRequest, next_page_token: str) -> PageRequest | None:
    """The request for the page after `request`, or None after the last page."""
    if not next_page_token:
        return None
    if next_page_token == request.page_token:
        raise protocol_error("the server returned the same page token twice")
    following = type(request)()
    following.CopyFrom(request)
    following.page_token = next_page_token
    return following


def prepare_request(
    session_id: str, append: Iterable[Message], *, overflow: bool, given_request_id: str, known_view_version: int
) -> pb.PrepareRequest:
    return pb.PrepareRequest(
        session_id=session_id,
        append=_converted(append, "append"),
        overflow=overflow,
        request_id=request_id(given_request_id),
        known_view_version=known_view_version,
    )


def compact_request(session_id: str, focus: str, keep_tokens: int, dry_run: bool) -> pb.CompactRequest:
    if keep_tokens < 0:
        raise CtxfoldError.invalid_argument(
            ErrorReason.INVALID_REQUEST, "keep_tokens", f"keep_tokens must be >= 0, not {keep_tokens}"
        )
    return pb.CompactRequest(session_id=session_id, focus=focus, keep_tokens=keep_tokens, dry_run=dry_run)


def observe_usage_request(session_id: str, view: View | int, usage: Usage) -> pb.ObserveUsageRequest:
    return pb.ObserveUsageRequest(
        session_id=session_id,
        view_version=view.view_version if isinstance(view, View) else view,
        input_tokens=usage.input_tokens,
        cached_input_tokens=usage.cached_input_tokens,
        output_tokens=usage.output_tokens,
        finish_reason=usage.finish_reason,
    )


def _bad_seq(field: str, message: str) -> CtxfoldError:
    return CtxfoldError.invalid_argument(ErrorReason.SEQ_OUT_OF_RANGE, field, message)


def create_request(config: SessionConfig, session_key: str = "") -> pb.CreateSessionRequest:
    config.check_creatable()
    with refusing_lone_surrogates(config, pb.SessionConfig.DESCRIPTOR, "config"):
        return pb.CreateSessionRequest(config=config.to_proto(), session_key=session_key)


def fork_request(session_id: str, at_seq: int | None, at_head: bool, config: SessionConfig | None) -> pb.ForkRequest:
    """Forks name their point explicitly: `at_head=True` or `at_seq=N` (N >= 1), never both."""
    if at_head == (at_seq is not None):
        raise _bad_seq("at_seq", "fork at the head (at_head=True) or at a seq (at_seq=N), exactly one of them")
    if at_seq is not None and at_seq < 1:
        raise _bad_seq("at_seq", f"at_seq must name a stored message (>= 1), not {at_seq}; use at_head=True")
    with refusing_lone_surrogates(config, pb.SessionConfig.DESCRIPTOR, "config"):
        overrides = config.to_proto() if config is not None else None
    return pb.ForkRequest(session_id=session_id, at_seq=at_seq or 0, config=overrides)


def rewind_request(session_id: str, to_seq: int) -> pb.RewindRequest:
    if to_seq < 0:
        raise _bad_seq("to_seq", f"to_seq must be >= 0 (0 = empty), not {to_seq}")
    return pb.RewindRequest(session_id=session_id, to_seq=to_seq)


def seq_before(seq: int | Message) -> int:
    """The seq to rewind to so that message `seq` (and everything after it) becomes abandoned."""
    value = seq.seq if isinstance(seq, Message) else seq
    if value < 1:
        raise _bad_seq("seq", f"not the seq of a stored message: {value}")
    return value - 1


def context_state(response: pb.GetContextStateResponse) -> ContextState:
    state = json.loads(response.state_json)
    if not isinstance(state, dict):
        raise protocol_error("the context state is not a JSON object")
    return cast(ContextState, state)


def protocol_error(message: str, **metadata: str) -> CtxfoldError:
    """The server broke the protocol this SDK speaks (a bug on one side or the other)."""
    return CtxfoldError.client(grpc.StatusCode.INTERNAL, ErrorReason.PROTOCOL_VIOLATION, message, **metadata)


# ---- views ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KnownView:
    """The last whole view this client holds for a session (what a delta extends)."""

    view: View

    @property
    def version(self) -> int:
        return self.view.view_version

    @property
    def messages(self) -> tuple[Message, ...]:
        return self.view.messages


class ViewCache:
    """The last whole view per session (least recently used first out), for delta Prepare."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._views: OrderedDict[str, KnownView] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> KnownView | None:
        with self._lock:
            view = self._views.get(session_id)
            if view is not None:
                self._views.move_to_end(session_id)
            return view

    def put(self, session_id: str, view: KnownView) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._views[session_id] = view
            self._views.move_to_end(session_id)
            while len(self._views) > self.capacity:
                self._views.popitem(last=False)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._views.pop(session_id, None)

    def clear(self) -> None:
        with self._lock:
            self._views.clear()


class FoldStream:
    """Consumes the items of one Prepare or Compact stream: progress events, then exactly one result.

    A delta result is applied to the view the request named as known. When this client cannot
    assemble the whole view (it holds no view of that version, or the count disagrees), `result`
    stays None and `needs_whole_view` is set: the caller prepares once more without appending and
    without a known version (the append already happened), never raising for it; that stream is
    given the `appended` of this one, so the view still says what the call appended.
    """

    def __init__(
        self, session_id: str, known: KnownView | None, cache: ViewCache, appended: tuple[Message, ...] | None = None
    ) -> None:
        self.session_id = session_id
        self.known = known
        self.cache = cache
        self.appended = appended
        self.result: View | None = None
        self.needs_whole_view = False
        self._ended = False

    def feed(self, item: pb.PrepareResponse | pb.CompactResponse) -> StreamEvent | None:
        """The event of one stream item; None for an item kind this SDK does not know."""
        if self._ended:
            raise protocol_error("the stream went on after its result", session_id=self.session_id)
        kind = item.WhichOneof("event")
        if kind == "progress":
            return FoldProgress.from_proto(item.progress)
        if kind == "result":
            self._ended = True
            self.result = self._assemble(item.result)
            return self.result
        return None

    def finish(self) -> None:
        if not self._ended:
            raise CtxfoldError.client(
                grpc.StatusCode.UNAVAILABLE,
                ErrorReason.STREAM_ENDED_WITHOUT_RESULT,
                "the stream ended without a result",
                session_id=self.session_id,
            )

    def _assemble(self, result: pb.PreparedContext) -> View | None:
        received = tuple(Message.from_proto(m) for m in result.messages)
        messages: tuple[Message, ...] | None
        if not result.delta:
            messages = received
        elif self.known is not None:
            messages = self.known.messages + received
        else:  # a delta of a view this client does not hold
            messages = None
        if messages is not None and result.view_message_count and len(messages) != result.view_message_count:
            if not result.delta:
                raise protocol_error(
                    f"the view has {len(messages)} messages, the server counts {result.view_message_count}",
                    session_id=self.session_id,
                )
            messages = None
        if messages is None:
            self.cache.forget(self.session_id)
            self.needs_whole_view = True
            self.appended = tuple(Message.from_proto(m) for m in result.appended)
            return None
        view = View.from_proto(result, messages)
        if self.appended is not None:
            view = dataclasses.replace(view, appended=self.appended)
        self.cache.put(self.session_id, KnownView(view))
        return view


def notify(on_progress: OnProgress, event: FoldProgress) -> None:
    on_progress(event)


async def notify_async(on_progress: OnProgress, event: FoldProgress) -> None:
    """Calls a progress callback of the asyncio client; an awaitable it returns is awaited."""
    outcome = on_progress(event)
    if inspect.isawaitable(outcome):
        await outcome


# Making a result's messages takes ~10 µs each: the asyncio client makes those of a larger result in
# a thread, so its event loop is never held for much longer than this many take.
LARGE_RESULT_MESSAGES = 1024


async def feed_async(stream: FoldStream, item: pb.PrepareResponse | pb.CompactResponse) -> StreamEvent | None:
    """`stream.feed(item)` for the asyncio client: a large result's in a thread, while the loop goes on."""
    if item.WhichOneof("event") == "result" and len(item.result.messages) > LARGE_RESULT_MESSAGES:
        return await asyncio.to_thread(stream.feed, item)
    return stream.feed(item)


def whole_view_request(session_id: str) -> pb.PrepareRequest:
    """Prepare without append and without a known version: the whole current view."""
    return prepare_request(session_id, (), overflow=False, given_request_id="", known_view_version=0)


# ---- tool results -----------------------------------------------------------------------------


def page_limit(page_bytes: int | None) -> int:
    limit = DEFAULT_PAGE_BYTES if page_bytes is None else page_bytes
    if not MIN_PAGE_BYTES <= limit <= MAX_PAGE_BYTES:
        raise CtxfoldError.invalid_argument(
            ErrorReason.LIMIT_OUT_OF_RANGE,
            "page_bytes",
            f"page_bytes must be within [{MIN_PAGE_BYTES}, {MAX_PAGE_BYTES}], not {limit}",
        )
    return limit


class ToolResultReader:
    """Pages through one raw tool result: `next_request` until None, `feed` each page. With
    `whole`, the pages are kept for `result()` (the whole text, sha256 verified)."""

    def __init__(
        self,
        session_id: str,
        *,
        tool_call_id: str,
        result_ref: str,
        offset: int = 0,
        page_bytes: int | None,
        whole: bool,
    ) -> None:
        if not tool_call_id and not result_ref:
            raise CtxfoldError.invalid_argument(
                ErrorReason.RESULT_REF_REQUIRED, "result_ref", "name the tool result by result_ref or tool_call_id"
            )
        if offset < 0:
            raise CtxfoldError.invalid_argument(
                ErrorReason.OFFSET_OUT_OF_RANGE, "offset", f"offset must be >= 0, not {offset}"
            )
        self.session_id = session_id
        self.limit = page_limit(page_bytes)
        self.whole = whole
        self.next_request: pb.ReadToolResultRequest | None = pb.ReadToolResultRequest(
            session_id=session_id, tool_call_id=tool_call_id, result_ref=result_ref, offset=offset, limit=self.limit
        )
        self._first: ToolResultPage | None = None
        self._parts: list[str] = []

    def feed(self, response: pb.ReadToolResultResponse) -> ToolResultPage:
        request = self.next_request
        if request is None:
            raise RuntimeError("the tool result was already read to its end")
        page = ToolResultPage.from_proto(response)
        first = self._first
        if page.offset != request.offset:
            raise protocol_error(f"asked for offset {request.offset}, got {page.offset}")
        if first is None:
            self._first = page
        elif (page.result_ref, page.sha256, page.total_bytes) != (first.result_ref, first.sha256, first.total_bytes):
            raise protocol_error("the pages of one tool result disagree on its identity")
        if self.whole:
            self._parts.append(page.data)
        if page.complete:
            self.next_request = None
        elif page.next_offset <= page.offset:
            raise protocol_error(f"page at offset {page.offset} made no progress")
        else:  # later pages by the reference the server resolved: never ambiguous
            ref = page.result_ref or request.result_ref
            self.next_request = pb.ReadToolResultRequest(
                session_id=self.session_id,
                result_ref=ref,
                tool_call_id="" if ref else request.tool_call_id,
                offset=page.next_offset,
                limit=self.limit,
            )
        return page

    def result(self) -> ToolResult:
        first = self._first
        if self.next_request is not None or first is None or not self.whole or first.offset != 0:
            raise RuntimeError("the tool result was not read whole")
        whole = ToolResult(
            text="".join(self._parts), sha256=first.sha256, total_bytes=first.total_bytes, result_ref=first.result_ref
        )
        if not whole.verify():
            raise CtxfoldError.client(
                grpc.StatusCode.DATA_LOSS,
                ErrorReason.RESULT_CHECKSUM_MISMATCH,
                f"the pages of {first.result_ref} do not add up to its {first.total_bytes} bytes / sha256",
                result_ref=first.result_ref,
            )
        return whole

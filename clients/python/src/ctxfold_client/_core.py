"""The one conversion layer shared by the sync and the asyncio clients.

Connection settings, per-call metadata, request builders, and the pure state machines behind the
helpers: the Prepare/Compact stream (progress events, exactly one result, delta application), list
paging and tool-result paging. Nothing here performs I/O; `client.py` and `aio.py` only drive these
pieces with blocking or awaited calls.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client.config import SessionConfig, config_proto
from ctxfold_client.errors import CtxfoldError
from ctxfold_client.models import (
    Action,
    CacheState,
    CallOptions,
    FoldProgress,
    FoldStage,
    PreparedView,
    ToolResult,
)
from ctxfold_client.openai_chat import SupportsModelDump, from_openai_message
from ctxfold_client.tracing import trace_metadata

MessageInput = pb.Message | Mapping[str, Any] | SupportsModelDump
"""A message to append: a `pb.Message` (see `ctxfold_client.messages`) or an OpenAI-style message."""
OnProgress = Callable[[FoldProgress], object]
StreamEvent = FoldProgress | PreparedView
PemSource = bytes | str | os.PathLike[str]
"""PEM data as bytes, a string holding PEM text, or the path of a PEM file."""
Metadata = tuple[tuple[str, str], ...]

DEFAULT_TIMEOUT = 30.0
DEFAULT_STREAM_TIMEOUT = 600.0
DEFAULT_VIEW_CACHE_SIZE = 256
MAX_RECEIVE_MESSAGE_BYTES = 64 << 20


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
        raise ValueError(f"cannot read the {what} {os.fspath(value)!r}: {exc}") from exc


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
        raise ValueError("address is required, e.g. '127.0.0.1:50051'")
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key go together (mutual TLS)")
    use_tls = tls if tls is not None else any(v is not None for v in (ca_cert, client_cert, server_name))
    if not use_tls and (ca_cert is not None or client_cert is not None):
        raise ValueError("ca_cert/client_cert need tls=True")
    credentials = (
        grpc.ssl_channel_credentials(
            root_certificates=_pem(ca_cert, "CA certificate"),
            private_key=_pem(client_key, "client key"),
            certificate_chain=_pem(client_cert, "client certificate"),
        )
        if use_tls
        else None
    )
    options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES)]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    options.extend(channel_options)
    static: list[tuple[str, str]] = []
    if token is not None:
        if not token or any(c.isspace() for c in token):
            raise ValueError("token must be a non-empty string without whitespace")
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


def to_message(message: MessageInput) -> pb.Message:
    if isinstance(message, pb.Message):
        return message
    return from_openai_message(message)


def to_messages(messages: Iterable[MessageInput]) -> list[pb.Message]:
    if isinstance(messages, pb.Message | Mapping) or hasattr(messages, "model_dump"):
        raise TypeError("pass a list of messages, not a single message")
    return [to_message(m) for m in messages]


def create_session_request(config: SessionConfig | pb.SessionConfig) -> pb.CreateSessionRequest:
    return pb.CreateSessionRequest(config=config_proto(config))


def append_request(session_id: str, messages: Iterable[MessageInput], request_id: str) -> pb.AppendMessagesRequest:
    return pb.AppendMessagesRequest(session_id=session_id, messages=to_messages(messages), request_id=request_id)


def list_sessions_request(page_size: int) -> pb.ListSessionsRequest:
    return pb.ListSessionsRequest(page_size=page_size)


def list_messages_request(session_id: str, page_size: int, include_abandoned: bool) -> pb.ListMessagesRequest:
    return pb.ListMessagesRequest(session_id=session_id, page_size=page_size, include_abandoned=include_abandoned)


PageRequest = TypeVar("PageRequest", pb.ListSessionsRequest, pb.ListMessagesRequest)


def next_page(request: PageRequest, next_page_token: str) -> PageRequest | None:
    """The request for the page after `request`, or None after the last page."""
    if not next_page_token:
        return None
    if next_page_token == request.page_token:
        raise CtxfoldError.client(
            grpc.StatusCode.INTERNAL, "PAGE_TOKEN_REPEATED", "the server returned the same page token twice"
        )
    following = type(request)()
    following.CopyFrom(request)
    following.page_token = next_page_token
    return following


def prepare_request(
    session_id: str,
    append: Iterable[MessageInput],
    *,
    overflow: bool,
    request_id: str,
    known_view_version: int,
) -> pb.PrepareRequest:
    return pb.PrepareRequest(
        session_id=session_id,
        append=to_messages(append),
        overflow=overflow,
        request_id=request_id,
        known_view_version=known_view_version,
    )


def compact_request(session_id: str, focus: str) -> pb.CompactRequest:
    return pb.CompactRequest(session_id=session_id, focus=focus)


def observe_usage_request(
    session_id: str,
    view_version: int,
    *,
    input_tokens: int,
    cached_input_tokens: int,
    output_tokens: int,
    finish_reason: str,
) -> pb.ObserveUsageRequest:
    return pb.ObserveUsageRequest(
        session_id=session_id,
        view_version=view_version,
        input_tokens=input_tokens,
        cached_input_tokens=cached_input_tokens,
        output_tokens=output_tokens,
        finish_reason=finish_reason,
    )


def fork_request(session_id: str, at_seq: int, config: SessionConfig | pb.SessionConfig | None) -> pb.ForkRequest:
    return pb.ForkRequest(session_id=session_id, at_seq=at_seq, config=config_proto(config))


def rewind_request(session_id: str, to_seq: int) -> pb.RewindRequest:
    return pb.RewindRequest(session_id=session_id, to_seq=to_seq)


def seq_before(seq: int | pb.Message) -> int:
    """The seq to rewind to so that message `seq` (and everything after it) becomes abandoned."""
    value = seq.seq if isinstance(seq, pb.Message) else seq
    if value < 1:
        raise ValueError(f"not the seq of a stored message: {value}")
    return value - 1


def context_state(response: pb.GetContextStateResponse) -> dict[str, Any]:
    state = json.loads(response.state_json)
    if not isinstance(state, dict):
        raise CtxfoldError.client(grpc.StatusCode.INTERNAL, "BAD_CONTEXT_STATE", "the context state is not an object")
    return state


# ---- responses --------------------------------------------------------------------------------


def progress_from_pb(progress: pb.FoldProgress) -> FoldProgress:
    return FoldProgress(
        stage=FoldStage(progress.stage),
        pass_index=progress.pass_index,
        passes_planned=progress.passes_planned,
        tokens_before=progress.tokens_before,
        tokens_after=progress.tokens_after,
        checkpoint_id=progress.checkpoint_id,
        message=progress.message,
        summary_delta=progress.summary_delta,
    )


def view_from_pb(session_id: str, result: pb.PreparedContext, messages: tuple[pb.Message, ...]) -> PreparedView:
    return PreparedView(
        session_id=session_id,
        messages=messages,
        view_version=result.view_version,
        estimated_tokens=result.estimated_tokens,
        action=Action(result.action),
        cache_state=CacheState(result.cache_state),
        prompt_cache_key=result.prompt_cache_key,
        checkpoint_id=result.checkpoint_id,
        stable_prefix_messages=result.stable_prefix_messages,
        trigger_tokens=result.trigger_tokens,
        hard_limit_tokens=result.hard_limit_tokens,
        appended=tuple(result.appended),
        delta=result.delta,
        received=tuple(result.messages),
        raw=result,
    )


@dataclass(frozen=True, slots=True)
class KnownView:
    """The last whole view this client holds for a session (what a delta extends)."""

    version: int
    messages: tuple[pb.Message, ...]


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


def _protocol_error(reason: str, message: str, **metadata: str) -> CtxfoldError:
    return CtxfoldError.client(grpc.StatusCode.INTERNAL, reason, message, **metadata)


class FoldStream:
    """Consumes the items of one Prepare or Compact stream: progress events, then exactly one result,
    whose delta (if any) is applied to the view the request named as known."""

    def __init__(self, session_id: str, known: KnownView | None, cache: ViewCache) -> None:
        self.session_id = session_id
        self.known = known
        self.cache = cache
        self.result: PreparedView | None = None

    def feed(self, item: pb.PrepareResponse | pb.CompactResponse) -> StreamEvent | None:
        """The event of one stream item; None for an item kind this SDK does not know."""
        if self.result is not None:
            raise _protocol_error("STREAM_AFTER_RESULT", "the stream went on after its result")
        kind = item.WhichOneof("event")
        if kind == "progress":
            return progress_from_pb(item.progress)
        if kind == "result":
            self.result = self._assemble(item.result)
            return self.result
        return None

    def finish(self) -> PreparedView:
        if self.result is None:
            raise _protocol_error(
                "STREAM_WITHOUT_RESULT", "the stream ended without a result", session_id=self.session_id
            )
        return self.result

    def _assemble(self, result: pb.PreparedContext) -> PreparedView:
        received = tuple(result.messages)
        if result.delta:
            if self.known is None:
                self.cache.forget(self.session_id)
                raise _protocol_error(
                    "VIEW_DELTA_MISMATCH", "the server sent a delta for a view this client did not name"
                )
            messages = self.known.messages + received
        else:
            messages = received
        if (result.delta or result.view_message_count) and len(messages) != result.view_message_count:
            self.cache.forget(self.session_id)
            raise _protocol_error(
                "VIEW_DELTA_MISMATCH",
                f"the assembled view has {len(messages)} messages, the server counts {result.view_message_count}; "
                "prepare again (without appending) to get the whole view",
                session_id=self.session_id,
            )
        self.cache.put(self.session_id, KnownView(result.view_version, messages))
        return view_from_pb(self.session_id, result, messages)


class ToolResultReader:
    """Pages through one raw tool result: `next_request` until None, `feed` each page."""

    def __init__(
        self,
        session_id: str,
        *,
        tool_call_id: str = "",
        result_ref: str = "",
        offset: int = 0,
        limit: int = 0,
        keep_data: bool = True,
    ) -> None:
        if not tool_call_id and not result_ref:
            raise ValueError("name the tool result by tool_call_id or result_ref")
        self.session_id = session_id
        self.keep_data = keep_data
        self.limit = limit
        self.start = offset
        self.next_request: pb.ReadToolResultRequest | None = pb.ReadToolResultRequest(
            session_id=session_id, tool_call_id=tool_call_id, result_ref=result_ref, offset=offset, limit=limit
        )
        self._first: pb.ReadToolResultResponse | None = None
        self._parts: list[str] = []

    def feed(self, page: pb.ReadToolResultResponse) -> pb.ReadToolResultResponse:
        request = self.next_request
        if request is None:
            raise RuntimeError("the tool result was already read to its end")
        first = self._first
        if page.offset != request.offset:
            raise _protocol_error("TOOL_RESULT_PAGING", f"asked for offset {request.offset}, got {page.offset}")
        if first is None:
            self._first = page
        elif (page.result_ref, page.sha256, page.total_bytes) != (first.result_ref, first.sha256, first.total_bytes):
            raise _protocol_error("TOOL_RESULT_PAGING", "the pages of one tool result disagree on its identity")
        if self.keep_data:
            self._parts.append(page.data)
        if page.complete:
            self.next_request = None
        elif page.next_offset <= page.offset:
            raise _protocol_error("TOOL_RESULT_PAGING", f"page at offset {page.offset} made no progress")
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
        if self.next_request is not None or first is None or self.start != 0 or not self.keep_data:
            raise RuntimeError("the tool result was not read whole")
        whole = ToolResult(
            result_ref=first.result_ref,
            data="".join(self._parts),
            total_bytes=first.total_bytes,
            sha256=first.sha256,
            pages=len(self._parts),
        )
        if not whole.verify():
            raise CtxfoldError.client(
                grpc.StatusCode.DATA_LOSS,
                "TOOL_RESULT_CORRUPT",
                f"the pages of {first.result_ref} do not add up to its {first.total_bytes} bytes / sha256",
                result_ref=first.result_ref,
            )
        return whole

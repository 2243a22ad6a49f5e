"""`Client`: the blocking client (grpc). `AsyncClient` in `aio.py` is its asyncio twin; both drive
the same conversion layer (`_core.py`)."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from contextlib import closing
from types import TracebackType
from typing import Any, TypeVar, Unpack

import grpc

from ctxfold_client import _core as core
from ctxfold_client._base import ClientBase
from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client._gen import context_service_pb2_grpc as pb_grpc
from ctxfold_client.config import SessionConfig
from ctxfold_client.errors import translate_errors
from ctxfold_client.models import CallOptions, FoldProgress, PreparedView, ToolResult

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class Client(ClientBase[grpc.Channel]):
    """Blocking client of ctxfold's ContextService; safe to share between threads.

    >>> with Client("127.0.0.1:50051") as client:
    ...     session = client.create_session(SessionConfig(context_window=128_000))
    ...     view = client.prepare(session.id, [user("Fix the failing test")], on_progress=print)

    Every method also takes the `CallOptions` keywords (timeout, metadata, traceparent,
    tracestate) and raises `CtxfoldError` on failure. Connection options: see `ClientBase`.
    """

    _channel: grpc.Channel
    _stub: pb_grpc.ContextServiceStub

    def _open_channel(self, settings: core.Settings) -> grpc.Channel:
        options = list(settings.channel_options)
        if settings.credentials is None:
            return grpc.insecure_channel(settings.target, options=options)
        return grpc.secure_channel(settings.target, settings.credentials, options=options)

    def _connect(self, channel: grpc.Channel) -> None:
        self._channel = channel
        self._stub = pb_grpc.ContextServiceStub(channel)

    @property
    def stub(self) -> pb_grpc.ContextServiceStub:
        """The generated stub on this client's channel, for raw calls."""
        return self._stub

    def close(self) -> None:
        """Closes the channel (unless it was passed in)."""
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _unary(self, method: grpc.UnaryUnaryMultiCallable[Req, Resp], request: Req, call: CallOptions) -> Resp:
        timeout, metadata = self._args(call)
        with translate_errors():
            return method(request, timeout=timeout, metadata=metadata)

    def _stream(
        self,
        method: grpc.UnaryStreamMultiCallable[Req, Any],
        request: Req,
        stream: core.FoldStream,
        call: CallOptions,
    ) -> Generator[core.StreamEvent, None, None]:
        timeout, metadata = self._args(call, streaming=True)
        with translate_errors():
            responses = method(request, timeout=timeout, metadata=metadata)
            try:
                for item in responses:
                    event = stream.feed(item)
                    if event is not None:
                        yield event
                stream.finish()
            finally:
                responses.cancel()  # a no-op after the end; stops the RPC when the caller stops early

    # ---- sessions ----------------------------------------------------------------------------

    def create_session(self, config: SessionConfig | pb.SessionConfig, **call: Unpack[CallOptions]) -> pb.Session:
        """Creates a session; the returned session carries its `id` and the effective config."""
        return self._unary(self._stub.CreateSession, core.create_session_request(config), call).session

    def get_session(self, session_id: str, **call: Unpack[CallOptions]) -> pb.Session:
        return self._unary(self._stub.GetSession, pb.GetSessionRequest(session_id=session_id), call).session

    def list_sessions(self, *, page_size: int = 0, **call: Unpack[CallOptions]) -> Iterator[pb.Session]:
        """All sessions of the caller's tenant, newest first, fetched page by page as iterated."""
        request: pb.ListSessionsRequest | None = core.list_sessions_request(page_size)
        while request is not None:
            page = self._unary(self._stub.ListSessions, request, call)
            yield from page.sessions
            request = core.next_page(request, page.next_page_token)

    def delete_session(self, session_id: str, **call: Unpack[CallOptions]) -> None:
        self._unary(self._stub.DeleteSession, pb.DeleteSessionRequest(session_id=session_id), call)
        self._views.forget(session_id)

    # ---- transcript --------------------------------------------------------------------------

    def append_messages(
        self,
        session_id: str,
        messages: Iterable[core.MessageInput],
        *,
        request_id: str = "",
        **call: Unpack[CallOptions],
    ) -> list[pb.Message]:
        """Appends messages atomically; returns them with `id` and `seq` (and `result_ref` for
        tool results). A retried call with the same `request_id` appends nothing new."""
        request = core.append_request(session_id, messages, request_id)
        return list(self._unary(self._stub.AppendMessages, request, call).messages)

    def list_messages(
        self,
        session_id: str,
        *,
        include_abandoned: bool = False,
        page_size: int = 0,
        **call: Unpack[CallOptions],
    ) -> Iterator[pb.Message]:
        """The canonical transcript in seq order, fetched page by page as iterated."""
        request: pb.ListMessagesRequest | None = core.list_messages_request(session_id, page_size, include_abandoned)
        while request is not None:
            page = self._unary(self._stub.ListMessages, request, call)
            yield from page.messages
            request = core.next_page(request, page.next_page_token)

    # ---- context -----------------------------------------------------------------------------

    def prepare(
        self,
        session_id: str,
        append: Iterable[core.MessageInput] = (),
        *,
        overflow: bool = False,
        request_id: str = "",
        on_progress: core.OnProgress | None = None,
        **call: Unpack[CallOptions],
    ) -> PreparedView:
        """Appends `append` and returns the whole view to send to the model, folding history first
        when the window fills (each progress event goes to `on_progress`). Set `overflow` when the
        provider rejected the last view as too long."""
        events = self.prepare_events(session_id, append, overflow=overflow, request_id=request_id, **call)
        return _collect(events, on_progress)

    def prepare_events(
        self,
        session_id: str,
        append: Iterable[core.MessageInput] = (),
        *,
        overflow: bool = False,
        request_id: str = "",
        **call: Unpack[CallOptions],
    ) -> Generator[FoldProgress | PreparedView, None, None]:
        """`prepare()` as an iterator: FoldProgress events, then one PreparedView (the whole view)."""
        request, stream = self._start_prepare(session_id, append, overflow, request_id)
        return self._stream(self._stub.Prepare, request, stream, call)

    def compact(
        self,
        session_id: str,
        *,
        focus: str = "",
        on_progress: core.OnProgress | None = None,
        **call: Unpack[CallOptions],
    ) -> PreparedView:
        """Folds history into a summary checkpoint now (`focus`: what the summary should keep)."""
        return _collect(self.compact_events(session_id, focus=focus, **call), on_progress)

    def compact_events(
        self, session_id: str, *, focus: str = "", **call: Unpack[CallOptions]
    ) -> Generator[FoldProgress | PreparedView, None, None]:
        request, stream = self._start_compact(session_id, focus)
        return self._stream(self._stub.Compact, request, stream, call)

    def observe_usage(
        self,
        session_id: str,
        view: PreparedView | int,
        *,
        input_tokens: int,
        cached_input_tokens: int = 0,
        output_tokens: int = 0,
        finish_reason: str = "",
        **call: Unpack[CallOptions],
    ) -> pb.ObserveUsageResponse:
        """Reports the provider's usage for a prepared view (or its `view_version`)."""
        request = core.observe_usage_request(
            session_id,
            view.view_version if isinstance(view, PreparedView) else view,
            input_tokens=input_tokens,
            cached_input_tokens=cached_input_tokens,
            output_tokens=output_tokens,
            finish_reason=finish_reason,
        )
        return self._unary(self._stub.ObserveUsage, request, call)

    def get_context_state(self, session_id: str, **call: Unpack[CallOptions]) -> dict[str, Any]:
        """The session's context state ("sidecar", schema version 3) as a dict."""
        request = pb.GetContextStateRequest(session_id=session_id)
        return core.context_state(self._unary(self._stub.GetContextState, request, call))

    # ---- lineage -----------------------------------------------------------------------------

    def fork(
        self,
        session_id: str,
        *,
        at_seq: int = 0,
        config: SessionConfig | pb.SessionConfig | None = None,
        **call: Unpack[CallOptions],
    ) -> pb.Session:
        """A new session with this one's transcript up to `at_seq` (0 = the head); the fields set
        in `config` override the source's."""
        return self._unary(self._stub.Fork, core.fork_request(session_id, at_seq, config), call).session

    def rewind(self, session_id: str, to_seq: int, **call: Unpack[CallOptions]) -> pb.Session:
        """Moves the head back to `to_seq`; later messages become abandoned (still listable)."""
        session = self._unary(self._stub.Rewind, core.rewind_request(session_id, to_seq), call).session
        self._views.forget(session_id)
        return session

    def edit(
        self,
        session_id: str,
        seq: int | pb.Message,
        message: core.MessageInput,
        *,
        request_id: str = "",
        **call: Unpack[CallOptions],
    ) -> pb.Message:
        """Replaces message `seq` with a new version: rewinds to the message before it (the old
        version and everything after it become abandoned) and appends `message`. Returns the new
        version, with its id and seq."""
        self.rewind(session_id, core.seq_before(seq), **call)
        return self.append_messages(session_id, [message], request_id=request_id, **call)[0]

    def retry(
        self,
        session_id: str,
        answer_seq: int | pb.Message,
        *,
        on_progress: core.OnProgress | None = None,
        **call: Unpack[CallOptions],
    ) -> PreparedView:
        """Discards the assistant answer `answer_seq` (and all after it) and prepares again: the
        view to regenerate that answer from."""
        self.rewind(session_id, core.seq_before(answer_seq), **call)
        return self.prepare(session_id, on_progress=on_progress, **call)

    # ---- tool results ------------------------------------------------------------------------

    def read_tool_result(
        self,
        session_id: str,
        *,
        tool_call_id: str = "",
        result_ref: str = "",
        page_size: int = 0,
        **call: Unpack[CallOptions],
    ) -> ToolResult:
        """The whole raw tool result, read page by page and checked against its sha256."""
        reader = core.ToolResultReader(session_id, tool_call_id=tool_call_id, result_ref=result_ref, limit=page_size)
        while reader.next_request is not None:
            reader.feed(self._unary(self._stub.ReadToolResult, reader.next_request, call))
        return reader.result()

    def tool_result_pages(
        self,
        session_id: str,
        *,
        tool_call_id: str = "",
        result_ref: str = "",
        offset: int = 0,
        page_size: int = 0,
        **call: Unpack[CallOptions],
    ) -> Iterator[pb.ReadToolResultResponse]:
        """The pages of a raw tool result from UTF-8 byte `offset`, fetched as iterated."""
        reader = core.ToolResultReader(
            session_id,
            tool_call_id=tool_call_id,
            result_ref=result_ref,
            offset=offset,
            limit=page_size,
            keep_data=False,
        )
        while reader.next_request is not None:
            yield reader.feed(self._unary(self._stub.ReadToolResult, reader.next_request, call))


def _collect(events: Generator[core.StreamEvent, None, None], on_progress: core.OnProgress | None) -> PreparedView:
    result: PreparedView | None = None
    with closing(events):  # a failing callback ends the RPC now
        for event in events:
            if isinstance(event, PreparedView):
                result = event
            elif on_progress is not None:
                on_progress(event)
    if result is None:  # pragma: no cover - FoldStream.finish raises first
        raise AssertionError("stream without result")
    return result

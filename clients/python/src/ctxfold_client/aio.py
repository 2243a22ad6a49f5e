"""`AsyncClient`: the asyncio client (grpc.aio), the twin of `Client` over the same conversion
layer (`_core.py`). Besides `prepare()` with an `on_progress` callback (plain or async), Prepare and
Compact are offered as async iterators of events."""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from contextlib import aclosing
from types import TracebackType
from typing import Any, TypeVar, Unpack

import grpc
import grpc.aio

from ctxfold_client import _core as core
from ctxfold_client._base import ClientBase
from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client._gen import context_service_pb2_grpc as pb_grpc
from ctxfold_client.config import SessionConfig
from ctxfold_client.errors import translate_errors
from ctxfold_client.models import CallOptions, FoldProgress, PreparedView, ToolResult

Req = TypeVar("Req")
Resp = TypeVar("Resp")

AsyncOnProgress = Callable[[FoldProgress], object]
"""A progress callback; when it returns an awaitable, the awaitable is awaited."""


class AsyncClient(ClientBase[grpc.aio.Channel]):
    """asyncio client of ctxfold's ContextService. Create it inside the event loop that uses it.

    >>> async with AsyncClient("127.0.0.1:50051") as client:
    ...     session = await client.create_session(SessionConfig(context_window=128_000))
    ...     async for event in client.prepare_events(session.id, [user("Fix the failing test")]):
    ...         print(event)

    Every method also takes the `CallOptions` keywords (timeout, metadata, traceparent,
    tracestate) and raises `CtxfoldError` on failure. Connection options: see `ClientBase`.
    """

    _channel: grpc.aio.Channel
    _stub: pb_grpc.ContextServiceAsyncStub

    def _open_channel(self, settings: core.Settings) -> grpc.aio.Channel:
        options = list(settings.channel_options)
        if settings.credentials is None:
            return grpc.aio.insecure_channel(settings.target, options=options)
        return grpc.aio.secure_channel(settings.target, settings.credentials, options=options)

    def _connect(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel
        self._stub = pb_grpc.ContextServiceStub(channel)

    @property
    def stub(self) -> pb_grpc.ContextServiceAsyncStub:
        """The generated asyncio stub on this client's channel, for raw calls."""
        return self._stub

    async def close(self) -> None:
        """Closes the channel (unless it was passed in)."""
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _unary(
        self, method: grpc.aio.UnaryUnaryMultiCallable[Req, Resp], request: Req, call: CallOptions
    ) -> Resp:
        timeout, metadata = self._args(call)
        with translate_errors():
            return await method(request, timeout=timeout, metadata=metadata)

    async def _stream(
        self,
        method: grpc.aio.UnaryStreamMultiCallable[Req, Any],
        request: Req,
        stream: core.FoldStream,
        call: CallOptions,
    ) -> AsyncGenerator[core.StreamEvent, None]:
        timeout, metadata = self._args(call, streaming=True)
        responses = method(request, timeout=timeout, metadata=metadata)
        try:
            with translate_errors():
                async for item in responses:
                    event = stream.feed(item)
                    if event is not None:
                        yield event
                stream.finish()
        finally:
            responses.cancel()  # a no-op after the end; stops the RPC when the caller stops early

    # ---- sessions ----------------------------------------------------------------------------

    async def create_session(self, config: SessionConfig | pb.SessionConfig, **call: Unpack[CallOptions]) -> pb.Session:
        """Creates a session; the returned session carries its `id` and the effective config."""
        return (await self._unary(self._stub.CreateSession, core.create_session_request(config), call)).session

    async def get_session(self, session_id: str, **call: Unpack[CallOptions]) -> pb.Session:
        return (await self._unary(self._stub.GetSession, pb.GetSessionRequest(session_id=session_id), call)).session

    async def list_sessions(self, *, page_size: int = 0, **call: Unpack[CallOptions]) -> AsyncIterator[pb.Session]:
        """All sessions of the caller's tenant, newest first, fetched page by page as iterated."""
        request: pb.ListSessionsRequest | None = core.list_sessions_request(page_size)
        while request is not None:
            page = await self._unary(self._stub.ListSessions, request, call)
            for session in page.sessions:
                yield session
            request = core.next_page(request, page.next_page_token)

    async def delete_session(self, session_id: str, **call: Unpack[CallOptions]) -> None:
        await self._unary(self._stub.DeleteSession, pb.DeleteSessionRequest(session_id=session_id), call)
        self._views.forget(session_id)

    # ---- transcript --------------------------------------------------------------------------

    async def append_messages(
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
        return list((await self._unary(self._stub.AppendMessages, request, call)).messages)

    async def list_messages(
        self,
        session_id: str,
        *,
        include_abandoned: bool = False,
        page_size: int = 0,
        **call: Unpack[CallOptions],
    ) -> AsyncIterator[pb.Message]:
        """The canonical transcript in seq order, fetched page by page as iterated."""
        request: pb.ListMessagesRequest | None = core.list_messages_request(session_id, page_size, include_abandoned)
        while request is not None:
            page = await self._unary(self._stub.ListMessages, request, call)
            for message in page.messages:
                yield message
            request = core.next_page(request, page.next_page_token)

    # ---- context -----------------------------------------------------------------------------

    async def prepare(
        self,
        session_id: str,
        append: Iterable[core.MessageInput] = (),
        *,
        overflow: bool = False,
        request_id: str = "",
        on_progress: AsyncOnProgress | None = None,
        **call: Unpack[CallOptions],
    ) -> PreparedView:
        """Appends `append` and returns the whole view to send to the model, folding history first
        when the window fills (each progress event goes to `on_progress`). Set `overflow` when the
        provider rejected the last view as too long."""
        events = self.prepare_events(session_id, append, overflow=overflow, request_id=request_id, **call)
        return await _collect(events, on_progress)

    def prepare_events(
        self,
        session_id: str,
        append: Iterable[core.MessageInput] = (),
        *,
        overflow: bool = False,
        request_id: str = "",
        **call: Unpack[CallOptions],
    ) -> AsyncGenerator[FoldProgress | PreparedView, None]:
        """`prepare()` as an async iterator: FoldProgress events, then one PreparedView."""
        request, stream = self._start_prepare(session_id, append, overflow, request_id)
        return self._stream(self._stub.Prepare, request, stream, call)

    async def compact(
        self,
        session_id: str,
        *,
        focus: str = "",
        on_progress: AsyncOnProgress | None = None,
        **call: Unpack[CallOptions],
    ) -> PreparedView:
        """Folds history into a summary checkpoint now (`focus`: what the summary should keep)."""
        return await _collect(self.compact_events(session_id, focus=focus, **call), on_progress)

    def compact_events(
        self, session_id: str, *, focus: str = "", **call: Unpack[CallOptions]
    ) -> AsyncGenerator[FoldProgress | PreparedView, None]:
        request, stream = self._start_compact(session_id, focus)
        return self._stream(self._stub.Compact, request, stream, call)

    async def observe_usage(
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
        return await self._unary(self._stub.ObserveUsage, request, call)

    async def get_context_state(self, session_id: str, **call: Unpack[CallOptions]) -> dict[str, Any]:
        """The session's context state ("sidecar", schema version 3) as a dict."""
        request = pb.GetContextStateRequest(session_id=session_id)
        return core.context_state(await self._unary(self._stub.GetContextState, request, call))

    # ---- lineage -----------------------------------------------------------------------------

    async def fork(
        self,
        session_id: str,
        *,
        at_seq: int = 0,
        config: SessionConfig | pb.SessionConfig | None = None,
        **call: Unpack[CallOptions],
    ) -> pb.Session:
        """A new session with this one's transcript up to `at_seq` (0 = the head); the fields set
        in `config` override the source's."""
        return (await self._unary(self._stub.Fork, core.fork_request(session_id, at_seq, config), call)).session

    async def rewind(self, session_id: str, to_seq: int, **call: Unpack[CallOptions]) -> pb.Session:
        """Moves the head back to `to_seq`; later messages become abandoned (still listable)."""
        session = (await self._unary(self._stub.Rewind, core.rewind_request(session_id, to_seq), call)).session
        self._views.forget(session_id)
        return session

    async def edit(
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
        await self.rewind(session_id, core.seq_before(seq), **call)
        return (await self.append_messages(session_id, [message], request_id=request_id, **call))[0]

    async def retry(
        self,
        session_id: str,
        answer_seq: int | pb.Message,
        *,
        on_progress: AsyncOnProgress | None = None,
        **call: Unpack[CallOptions],
    ) -> PreparedView:
        """Discards the assistant answer `answer_seq` (and all after it) and prepares again: the
        view to regenerate that answer from."""
        await self.rewind(session_id, core.seq_before(answer_seq), **call)
        return await self.prepare(session_id, on_progress=on_progress, **call)

    # ---- tool results ------------------------------------------------------------------------

    async def read_tool_result(
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
            reader.feed(await self._unary(self._stub.ReadToolResult, reader.next_request, call))
        return reader.result()

    async def tool_result_pages(
        self,
        session_id: str,
        *,
        tool_call_id: str = "",
        result_ref: str = "",
        offset: int = 0,
        page_size: int = 0,
        **call: Unpack[CallOptions],
    ) -> AsyncIterator[pb.ReadToolResultResponse]:
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
            yield reader.feed(await self._unary(self._stub.ReadToolResult, reader.next_request, call))


async def _collect(events: AsyncGenerator[core.StreamEvent, None], on_progress: AsyncOnProgress | None) -> PreparedView:
    result: PreparedView | None = None
    async with aclosing(events):  # a failing callback ends the RPC now, not at garbage collection
        async for event in events:
            if isinstance(event, PreparedView):
                result = event
            elif on_progress is not None:
                outcome = on_progress(event)
                if inspect.isawaitable(outcome):
                    await outcome
    if result is None:  # pragma: no cover - FoldStream.finish raises first
        raise AssertionError("stream without result")
    return result

"""`Client`: the blocking client (grpc). GENERATED from `_async_client.py` by scripts/unasync.py:
edit that file and run the script, never this one."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping
from contextlib import closing
from types import TracebackType
from typing import Any, TypeVar, Unpack

import grpc

from ctxfold_client import _core as core
from ctxfold_client import tools
from ctxfold_client._base import ClientBase
from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client._gen import context_service_pb2_grpc as pb_grpc
from ctxfold_client.config import SessionConfig
from ctxfold_client.errors import CtxfoldError, translate_errors
from ctxfold_client.models import (
    CallOptions,
    Checkpoint,
    ContextState,
    FoldProgress,
    Message,
    Session,
    ToolResult,
    ToolResultPage,
    Usage,
    UsageResult,
    View,
)

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class Client(ClientBase[grpc.Channel]):
    """Client of ctxfold's ContextService (operations and defaults: clients/README.md).

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
            return method(core.checked(request), timeout=timeout, metadata=metadata)

    def _stream(
        self,
        method: grpc.UnaryStreamMultiCallable[Req, Any],
        request: Req,
        stream: core.FoldStream,
        call: CallOptions,
    ) -> Generator[core.StreamEvent, None, None]:
        timeout, metadata = self._args(call, streaming=True)
        with translate_errors():
            responses = method(core.checked(request), timeout=timeout, metadata=metadata)
            try:
                for item in responses:
                    event = stream.feed(item)
                    if event is not None:
                        yield event
                stream.finish()
            finally:
                responses.cancel()  # a no-op after the end; stops the RPC when the caller stops early
        if stream.needs_whole_view:  # a delta this client could not apply: the whole view, once
            whole_request, whole = self._start_whole_view(stream)
            for event in self._stream(self._stub.Prepare, whole_request, whole, call):
                yield event

    def _collect(self, events: Generator[core.StreamEvent, None, None], on_progress: core.OnProgress | None) -> View:
        result: View | None = None
        with closing(events):  # a failing callback ends the RPC now
            for event in events:
                if isinstance(event, View):
                    result = event
                elif on_progress is not None:
                    core.notify(on_progress, event)
        if result is None:
            raise core.protocol_error("the stream ended without a view")
        return result

    # ---- sessions ----------------------------------------------------------------------------

    def create_session(self, config: SessionConfig, *, session_key: str = "", **call: Unpack[CallOptions]) -> Session:
        """Creates a session; it carries its `id` and the effective config (defaults filled in). With
        `session_key`, the session that key names in the caller's tenant: created when it does not
        exist, else returned as it is."""
        request = core.create_request(config, session_key)
        return Session.from_proto(self._unary(self._stub.CreateSession, request, call).session)

    def get_session(self, session_id: str, **call: Unpack[CallOptions]) -> Session:
        request = pb.GetSessionRequest(session_id=session_id)
        return Session.from_proto(self._unary(self._stub.GetSession, request, call).session)

    def list_sessions(self, *, page_size: int = 0, **call: Unpack[CallOptions]) -> Iterator[Session]:
        """All sessions of the caller's tenant, newest first, fetched page by page as iterated."""
        request: pb.ListSessionsRequest | None = core.list_sessions_request(page_size)
        while request is not None:
            page = self._unary(self._stub.ListSessions, request, call)
            for session in page.sessions:
                yield Session.from_proto(session)
            request = core.next_page(request, page.next_page_token)

    def delete_session(self, session_id: str, **call: Unpack[CallOptions]) -> None:
        self._unary(self._stub.DeleteSession, pb.DeleteSessionRequest(session_id=session_id), call)
        self._views.forget(session_id)

    # ---- transcript --------------------------------------------------------------------------

    def append_messages(
        self, session_id: str, messages: Iterable[Message], *, request_id: str = "", **call: Unpack[CallOptions]
    ) -> list[Message]:
        """Appends messages atomically; returns them with `id` and `seq` (and `result_ref` for tool
        results). A retry with the same `request_id` (a UUIDv4 when not given) appends nothing new."""
        request = core.append_request(session_id, messages, request_id)
        response = self._unary(self._stub.AppendMessages, request, call)
        return [Message.from_proto(m) for m in response.messages]

    def list_messages(
        self, session_id: str, *, include_abandoned: bool = False, page_size: int = 0, **call: Unpack[CallOptions]
    ) -> Iterator[Message]:
        """The canonical transcript in seq order, fetched page by page as iterated."""
        request: pb.ListMessagesRequest | None = core.list_messages_request(session_id, page_size, include_abandoned)
        while request is not None:
            page = self._unary(self._stub.ListMessages, request, call)
            for message in page.messages:
                yield Message.from_proto(message)
            request = core.next_page(request, page.next_page_token)

    # ---- context -----------------------------------------------------------------------------

    def prepare(
        self,
        session_id: str,
        append: Iterable[Message] = (),
        *,
        overflow: bool = False,
        request_id: str = "",
        on_progress: core.OnProgress | None = None,
        **call: Unpack[CallOptions],
    ) -> View:
        """Appends `append` and returns the whole view to send to the model, folding history first
        when the window fills (each progress event goes to `on_progress`; the asyncio client awaits
        what it returns). Set `overflow` when the provider rejected the last view as too long."""
        events = self.prepare_events(session_id, append, overflow=overflow, request_id=request_id, **call)
        return self._collect(events, on_progress)

    def prepare_events(
        self,
        session_id: str,
        append: Iterable[Message] = (),
        *,
        overflow: bool = False,
        request_id: str = "",
        **call: Unpack[CallOptions],
    ) -> Generator[FoldProgress | View, None, None]:
        """`prepare()` as an iterator: FoldProgress events, then one View (the whole view)."""
        request, stream = self._start_prepare(session_id, append, overflow, request_id)
        return self._stream(self._stub.Prepare, request, stream, call)

    def compact(
        self,
        session_id: str,
        *,
        focus: str = "",
        keep_tokens: int = 0,
        dry_run: bool = False,
        on_progress: core.OnProgress | None = None,
        **call: Unpack[CallOptions],
    ) -> View:
        """Folds history into a summary checkpoint now. `focus`: what the summary should keep;
        `keep_tokens`: the recent tail kept verbatim; `dry_run`: plan and summarize without
        committing (the view's `candidate_summary`). `not_folded_reason` says why nothing folded."""
        events = self.compact_events(session_id, focus=focus, keep_tokens=keep_tokens, dry_run=dry_run, **call)
        return self._collect(events, on_progress)

    def compact_events(
        self,
        session_id: str,
        *,
        focus: str = "",
        keep_tokens: int = 0,
        dry_run: bool = False,
        **call: Unpack[CallOptions],
    ) -> Generator[FoldProgress | View, None, None]:
        """`compact()` as an iterator: FoldProgress events, then one View."""
        request, stream = self._start_compact(session_id, focus, keep_tokens, dry_run)
        return self._stream(self._stub.Compact, request, stream, call)

    def observe_usage(
        self, session_id: str, view: View | int, usage: Usage, **call: Unpack[CallOptions]
    ) -> UsageResult:
        """Reports the provider's usage for a prepared view (or its `view_version`)."""
        request = core.observe_usage_request(session_id, view, usage)
        return UsageResult.from_proto(self._unary(self._stub.ObserveUsage, request, call))

    def get_context_state(self, session_id: str, **call: Unpack[CallOptions]) -> ContextState:
        """The session's context state (schema version 3): the server's bookkeeping, for diagnostics."""
        request = pb.GetContextStateRequest(session_id=session_id)
        return core.context_state(self._unary(self._stub.GetContextState, request, call))

    # ---- lineage -----------------------------------------------------------------------------

    def fork(
        self,
        session_id: str,
        *,
        at_seq: int | None = None,
        at_head: bool = False,
        config: SessionConfig | None = None,
        **call: Unpack[CallOptions],
    ) -> Session:
        """A new session with this one's transcript at the head (`at_head=True`) or up to `at_seq`;
        the fields set in `config` override the source's."""
        request = core.fork_request(session_id, at_seq, at_head, config)
        return Session.from_proto(self._unary(self._stub.Fork, request, call).session)

    def rewind(self, session_id: str, to_seq: int, **call: Unpack[CallOptions]) -> Session:
        """Moves the head back to `to_seq`; later messages become abandoned (still listable)."""
        response = self._unary(self._stub.Rewind, core.rewind_request(session_id, to_seq), call)
        self._views.forget(session_id)
        return Session.from_proto(response.session)

    def edit(
        self,
        session_id: str,
        seq: int | Message,
        message: Message,
        *,
        request_id: str = "",
        **call: Unpack[CallOptions],
    ) -> Message:
        """Replaces message `seq` with a new version: rewinds to the message before it (the old
        version and everything after it become abandoned) and appends `message`; returns it stored."""
        self.rewind(session_id, core.seq_before(seq), **call)
        return self.append_messages(session_id, [message], request_id=request_id, **call)[0]

    def retry(
        self,
        session_id: str,
        answer_seq: int | Message,
        *,
        on_progress: core.OnProgress | None = None,
        **call: Unpack[CallOptions],
    ) -> View:
        """Discards the assistant answer `answer_seq` (and all after it) and prepares again: the
        view to regenerate that answer from."""
        self.rewind(session_id, core.seq_before(answer_seq), **call)
        return self.prepare(session_id, on_progress=on_progress, **call)

    # ---- tool results and checkpoints --------------------------------------------------------

    def read_tool_result(
        self,
        session_id: str,
        *,
        result_ref: str = "",
        tool_call_id: str = "",
        page_bytes: int | None = None,
        **call: Unpack[CallOptions],
    ) -> ToolResult:
        """The whole raw tool result, read page by page (`page_bytes`, default 16384, max 24576)
        and checked against its sha256."""
        reader = core.ToolResultReader(
            session_id, tool_call_id=tool_call_id, result_ref=result_ref, page_bytes=page_bytes, whole=True
        )
        while reader.next_request is not None:
            reader.feed(self._unary(self._stub.ReadToolResult, reader.next_request, call))
        return reader.result()

    def tool_result_pages(
        self,
        session_id: str,
        *,
        result_ref: str = "",
        tool_call_id: str = "",
        offset: int = 0,
        page_bytes: int | None = None,
        **call: Unpack[CallOptions],
    ) -> Iterator[ToolResultPage]:
        """The pages of a raw tool result from UTF-8 byte `offset`, one request per page as iterated."""
        reader = core.ToolResultReader(
            session_id,
            tool_call_id=tool_call_id,
            result_ref=result_ref,
            offset=offset,
            page_bytes=page_bytes,
            whole=False,
        )
        while reader.next_request is not None:
            yield reader.feed(self._unary(self._stub.ReadToolResult, reader.next_request, call))

    def list_checkpoints(
        self, session_id: str, *, include_abandoned: bool = False, page_size: int = 0, **call: Unpack[CallOptions]
    ) -> Iterator[Checkpoint]:
        """The session's summary checkpoints, newest first, fetched page by page as iterated."""
        request: pb.ListCheckpointsRequest | None = core.list_checkpoints_request(
            session_id, page_size, include_abandoned
        )
        while request is not None:
            page = self._unary(self._stub.ListCheckpoints, request, call)
            for checkpoint in page.checkpoints:
                yield Checkpoint.from_proto(checkpoint)
            request = core.next_page(request, page.next_page_token)

    def get_checkpoint(self, session_id: str, checkpoint_id: str, **call: Unpack[CallOptions]) -> Checkpoint:
        request = pb.GetCheckpointRequest(session_id=session_id, checkpoint_id=checkpoint_id)
        return Checkpoint.from_proto(self._unary(self._stub.GetCheckpoint, request, call).checkpoint)

    def dispatch_tool_call(
        self, session_id: str, name: str, arguments: str | Mapping[str, Any], **call: Unpack[CallOptions]
    ) -> str | None:
        """The text to append as the result of a model's call of a ctxfold tool (`read_tool_result`:
        one page, with a footer naming the next offset; `context_budget`), or None when `name` is
        not a ctxfold tool. A model's mistake (unknown ref, bad offset) is answered, never raised."""
        parsed = tools.parse_call(name, arguments)
        if parsed is None:
            return None
        if isinstance(parsed, tools.BadCall):
            return parsed.answer
        if isinstance(parsed, tools.BudgetCall):
            return tools.budget_answer(self.last_view(session_id))
        request = pb.ReadToolResultRequest(
            session_id=session_id, result_ref=parsed.result_ref, offset=parsed.offset, limit=core.DEFAULT_PAGE_BYTES
        )
        try:
            response = self._unary(self._stub.ReadToolResult, request, call)
        except CtxfoldError as error:
            return tools.error_answer(error)
        return tools.page_answer(ToolResultPage.from_proto(response))

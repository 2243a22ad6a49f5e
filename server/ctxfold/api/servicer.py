"""The gRPC servicer: authenticates, converts, calls the use case, maps errors (docs/architecture.md, The API shell)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError, Message

from ctxfold import cpu
from ctxfold.api import convert, tracing
from ctxfold.api.admission import Admission, shutting_down
from ctxfold.api.auth import tenant_of
from ctxfold.api.errors import internal_error, status_for
from ctxfold.api.pacing import LARGE_BYTES, AnswerPacer, RequestPacer, Turn
from ctxfold.api.validate import check_request
from ctxfold.engine.answer import PreparedContext
from ctxfold.engine.context import AppendRequest
from ctxfold.engine.errors import DomainError, invalid
from ctxfold.engine.model import NewMessage, StoredMessage, Usage, text_chars
from ctxfold.service.contexts import Contexts
from ctxfold.service.maintenance import Event, Maintenance
from ctxfold.service.observer import AppendStored
from ctxfold.service.reads import Reads
from ctxfold.service.sessions import Sessions
from ctxfold.service.states import ContextStates
from ctxfold.v1 import context_service_pb2 as pb

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
Events = AsyncGenerator[AppendStored | Event, None]


SERVICE = pb.DESCRIPTOR.services_by_name["ContextService"]
_REQUEST_TYPES: dict[str, type[Message]] = {m.name: getattr(pb, m.input_type.name) for m in SERVICE.methods}


# Messages are converted while decoding: contents make a request large, and every read of a string field copies it.
_MESSAGE_FIELDS = {"AppendMessages": "messages", "Prepare": "append"}
# The server-streaming RPCs: their methods answer events, which `_streamed` writes and returns.
EventResponse = pb.PrepareResponse | pb.CompactResponse
_STREAMED: dict[str, type[EventResponse]] = {"Prepare": pb.PrepareResponse, "Compact": pb.CompactResponse}


def _parse(method_name: str, raw: bytes) -> tuple[Any, list[NewMessage] | None]:
    """The request of `method_name` decoded and checked, and for `_MESSAGE_FIELDS` RPCs its messages converted."""
    request_type = _REQUEST_TYPES[method_name]
    try:
        request = request_type.FromString(raw)
    except DecodeError as exc:
        raise invalid(
            "INVALID_REQUEST",
            f"the {request_type.DESCRIPTOR.name} could not be decoded (truncated or invalid UTF-8): {exc}",
        ) from None
    tracing.annotate_request(request)
    check_request(request, raw)
    field = _MESSAGE_FIELDS.get(method_name)
    if field is None:
        return request, None
    messages = convert.new_messages(getattr(request, field), field=field)
    if len(raw) < LARGE_BYTES:
        return request, messages
    # The decoded request keeps a copy of every content until it is freed: the call keeps the rest.
    request.ClearField(field)
    return request_type.FromString(request.SerializeToString()), messages


def _in_parts(head: Message, repeated: Mapping[str, Iterable[Message]], within: str = "") -> list[bytes]:
    """`head`'s wire form with the `repeated` fields' elements (of field `within`, if given), in pieces a parser merges
    into one message, one element each, so no call holding the GIL copies more (docs/architecture.md, The API shell)."""

    def part(field: str, element: Message) -> bytes:
        piece = type(head)()
        getattr(getattr(piece, within) if within else piece, field).append(element)
        return piece.SerializeToString()

    parts = [part(field, element) for field, elements in repeated.items() for element in elements]
    parts.append(head.SerializeToString())
    return parts


async def _encoded(
    request: Message, response_type: type[Message], messages: Sequence[StoredMessage], **rest: Any
) -> bytes:
    """`response_type(messages=…, **rest)` annotated and serialized `_in_parts`, off the loop when large."""

    def encode() -> bytes:
        head = response_type(**rest)
        tracing.annotate_response(request, head, {"messages": len(messages)})
        return b"".join(_in_parts(head, {"messages": map(convert.message_pb, messages)}))

    return await cpu.run(text_chars(messages), encode)


def _serialize(response: Message | bytes) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


def add_to_server(servicer: ContextServicer, server: grpc.aio.Server) -> None:
    """Registers every handler as a traced unary coroutine on raw bytes (why: docs/architecture.md, The API shell)."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        method.name: grpc.unary_unary_rpc_method_handler(
            tracing.traced(f"{SERVICE.full_name}/{method.name}", unary(servicer, method.name)),
            response_serializer=_serialize,
        )
        for method in SERVICE.methods
    }
    server.add_registered_method_handlers(SERVICE.full_name, handlers)


async def _abort(context: Context, exc: Exception) -> NoReturn:
    """Ends the call with `exc` as a status with an ErrorInfo, recorded on the RPC's span."""
    # The store raises what a database failure means itself (store/errors.py): anything else is a bug.
    error = exc if isinstance(exc, DomainError) else internal_error(exc)
    status = status_for(error)
    tracing.mark_error(error, status.code, exc)
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("unreachable: abort raises")


def unary(servicer: ContextServicer, name: str) -> Callable[[bytes, Context], Awaitable[Message | bytes]]:
    """The handler of RPC `name`: authenticates, admits, waits for a large request's turn, decodes, and maps every
    failure to a status. The method gets (request, tenant), and the messages for `_MESSAGE_FIELDS` RPCs; the events it
    answers for `_STREAMED` RPCs are streamed here."""
    method, streamed = getattr(servicer, name), _STREAMED.get(name)

    async def handler(raw: bytes, context: Context) -> Message | bytes:
        try:
            tenant = tenant_of(servicer.tokens, context)
            tracing.annotate_tenant(tenant)
            with servicer.admission.admit(tenant, len(raw)):
                async with servicer.requests.turn(len(raw)) as turn:
                    request, messages = await cpu.run(len(raw), _parse, name, raw)
                    answer = await method(request, tenant, *(() if messages is None else (messages,)))
                    response: Message | bytes = (
                        answer if streamed is None else await _streamed(streamed, answer, context, turn)
                    )
            if isinstance(response, bytes):  # `_encoded` annotated it; it may be large
                await servicer.answers.turn(len(response))
            else:
                tracing.annotate_response(request, response)
            return response
        except grpc.aio.AbortError:
            raise
        except asyncio.CancelledError:
            if not servicer.admission.draining:
                raise  # the client went away
            await _abort(context, shutting_down())
        except Exception as exc:
            await _abort(context, exc)

    return handler


def _result_bytes(response_type: type[EventResponse], prepared: PreparedContext) -> bytes:
    """`response_type(result=prepared_pb(prepared))` serialized `_in_parts` (a view built whole is copied thrice)."""
    head = response_type(result=convert.prepared_pb(replace(prepared, messages=[], appended=())))
    repeated: dict[str, Iterable[Message]] = {
        "messages": map(convert.view_message_pb, prepared.messages),
        "appended": map(convert.message_pb, prepared.appended),
    }
    return b"".join(_in_parts(head, repeated, within="result"))


async def _event_response(response_type: type[EventResponse], event: Event) -> EventResponse | bytes:
    """A fold progress event as it is; a result (the whole view) serialized off the loop when large."""
    if not isinstance(event, PreparedContext):
        return response_type(progress=convert.progress_pb(event))
    size = sum(len(v.content) for v in event.messages) + text_chars(event.appended)
    if size < cpu.OFFLOAD_MIN_BYTES:
        # The common result, a delta: serialized at once, cheaper than in parts (docs/architecture.md, The API shell).
        return response_type(result=convert.prepared_pb(event)).SerializeToString()
    return await cpu.run(size, _result_bytes, response_type, event)


async def _streamed(
    response_type: type[EventResponse], events: Events, context: Context, turn: Turn
) -> EventResponse | bytes:
    """A server-streaming RPC run as unary: progress written as it comes, the result returned with the status; the
    request's `turn` ends once its append is stored (docs/architecture.md, The API shell)."""
    started = time.perf_counter()
    # Closed here, not by the collector: a cancelled call stops its maintenance task now.
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, AppendStored):
                turn.end()
                continue
            response = await _event_response(response_type, event)
            if isinstance(event, PreparedContext):
                operation = "prepare" if response_type is pb.PrepareResponse else "compact"
                tracing.annotate_answer(event, operation, started)
                return response
            # The context of a handler gRPC runs as unary has no serializer: bytes go as they are.
            await context.write(_serialize(response))
    raise AssertionError("unreachable: a maintenance stream ends with its result")


@dataclass(eq=False)
class ContextServicer:
    """The handlers of ContextService, registered by `add_to_server` (every RPC of the service needs one)."""

    tokens: dict[str, str] | None  # None: single tenant
    sessions: Sessions
    contexts: Contexts
    reads: Reads
    maintenance: Maintenance
    states: ContextStates
    admission: Admission
    requests: RequestPacer
    answers: AnswerPacer = field(default_factory=AnswerPacer, init=False)

    async def CreateSession(self, request: pb.CreateSessionRequest, tenant: str) -> pb.CreateSessionResponse:
        info = await self.sessions.create(tenant, convert.config_input(request.config), request.session_key)
        return pb.CreateSessionResponse(session=convert.session_pb(info))

    async def GetSession(self, request: pb.GetSessionRequest, tenant: str) -> pb.GetSessionResponse:
        info = await self.sessions.get(tenant, request.session_id)
        return pb.GetSessionResponse(session=convert.session_pb(info))

    async def ListSessions(self, request: pb.ListSessionsRequest, tenant: str) -> pb.ListSessionsResponse:
        infos, token = await self.sessions.list(tenant, request.page_size, request.page_token)
        return pb.ListSessionsResponse(sessions=[convert.session_pb(i) for i in infos], next_page_token=token)

    async def DeleteSession(self, request: pb.DeleteSessionRequest, tenant: str) -> pb.DeleteSessionResponse:
        await self.sessions.delete(tenant, request.session_id)
        return pb.DeleteSessionResponse()

    async def AppendMessages(self, request: pb.AppendMessagesRequest, tenant: str, messages: list[NewMessage]) -> bytes:
        stored, record = await self.contexts.append_messages(tenant, request.session_id, messages, request.request_id)
        session = convert.session_pb(record)
        return await _encoded(request, pb.AppendMessagesResponse, stored, session=session)

    async def ListMessages(self, request: pb.ListMessagesRequest, tenant: str) -> bytes:
        messages, token = await self.reads.messages(
            tenant, request.session_id, request.page_size, request.page_token, request.include_abandoned
        )
        return await _encoded(request, pb.ListMessagesResponse, messages, next_page_token=token)

    async def ReadToolResult(self, request: pb.ReadToolResultRequest, tenant: str) -> pb.ReadToolResultResponse:
        page, sha256, ref = await self.reads.tool_result(
            tenant, request.session_id, request.tool_call_id, request.result_ref, request.offset, request.limit
        )
        return pb.ReadToolResultResponse(**vars(page), sha256=sha256, result_ref=ref)

    async def Fork(self, request: pb.ForkRequest, tenant: str) -> pb.ForkResponse:
        overrides = convert.config_input(request.config)
        info = await self.sessions.fork(tenant, request.session_id, request.at_seq, overrides)
        return pb.ForkResponse(session=convert.session_pb(info))

    async def Rewind(self, request: pb.RewindRequest, tenant: str) -> pb.RewindResponse:
        info = await self.sessions.rewind(tenant, request.session_id, request.to_seq)
        return pb.RewindResponse(session=convert.session_pb(info))

    async def Prepare(self, request: pb.PrepareRequest, tenant: str, append: list[NewMessage]) -> Events:
        asked = AppendRequest((), request.overflow, request.known_view_version)
        return self.maintenance.prepare(tenant, request.session_id, append, asked, request.request_id)

    async def Compact(self, request: pb.CompactRequest, tenant: str) -> Events:
        return self.maintenance.compact(tenant, request.session_id, request.focus, request.keep_tokens, request.dry_run)

    async def ObserveUsage(self, request: pb.ObserveUsageRequest, tenant: str) -> pb.ObserveUsageResponse:
        usage = Usage(
            view_version=request.view_version,
            estimated_tokens=0,
            input_tokens=request.input_tokens,
            cached_input_tokens=request.cached_input_tokens,
            output_tokens=request.output_tokens,
            finish_reason=request.finish_reason[:64],
        )
        calibration, accepted = await self.states.observe_usage(tenant, request.session_id, usage)
        return pb.ObserveUsageResponse(calibration=calibration, calibration_accepted=accepted)

    async def GetContextState(self, request: pb.GetContextStateRequest, tenant: str) -> pb.GetContextStateResponse:
        return pb.GetContextStateResponse(state_json=await self.states.context_state(tenant, request.session_id))

    async def ListCheckpoints(self, request: pb.ListCheckpointsRequest, tenant: str) -> pb.ListCheckpointsResponse:
        listed, token = await self.reads.checkpoints(
            tenant, request.session_id, request.page_size, request.page_token, request.include_abandoned
        )
        return pb.ListCheckpointsResponse(checkpoints=[convert.checkpoint_pb(c) for c in listed], next_page_token=token)

    async def GetCheckpoint(self, request: pb.GetCheckpointRequest, tenant: str) -> pb.GetCheckpointResponse:
        stored = await self.reads.checkpoint(tenant, request.session_id, request.checkpoint_id)
        return pb.GetCheckpointResponse(checkpoint=convert.checkpoint_pb(stored))

"""The gRPC servicer: authenticates, converts, calls the use case, maps errors. Nothing else."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from sqlalchemy.exc import DBAPIError, OperationalError

from ctxfold.api import convert
from ctxfold.api.auth import Authenticator
from ctxfold.api.errors import internal_error, status_for
from ctxfold.api.validate import check_request
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.service.lineage import Lineage
from ctxfold.service.maintenance import Maintenance
from ctxfold.service.sessions import Sessions, session_info
from ctxfold.service.tool_results import ToolResults
from ctxfold.service.transcript import Transcript
from ctxfold.store.repository import Usage
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

Request = TypeVar("Request")
Response = TypeVar("Response")
Context = grpc.aio.ServicerContext[Any, Any]


def _as_domain_error(exc: Exception) -> DomainError:
    if isinstance(exc, DomainError):
        return exc
    if isinstance(exc, OperationalError | DBAPIError) and exc.connection_invalidated:
        return DomainError(Kind.UNAVAILABLE, "STORE_UNAVAILABLE", "the database is unavailable; retry")
    return internal_error(exc)


def unary(
    method: Callable[[Any, Request, Context, str], Awaitable[Response]],
) -> Callable[[Any, Request, Context], Awaitable[Response]]:
    """Authenticates the caller and turns every failure into a status with an ErrorInfo."""

    @functools.wraps(method)
    async def handler(self: ContextServicer, request: Request, context: Context) -> Response:
        try:
            tenant = self.auth.tenant(context)
            check_request(request)  # type: ignore[arg-type]
            return await method(self, request, context, tenant)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            status = status_for(_as_domain_error(exc))
            await context.abort(status.code, status.details, status.trailing_metadata)
            raise AssertionError("unreachable: abort raises") from None

    return handler


def server_stream(
    method: Callable[[Any, Request, str], AsyncIterator[Response]],
) -> Callable[[Any, Request, Context], AsyncIterator[Response]]:
    """`unary` for server-streaming RPCs: errors end the stream with a status and an ErrorInfo."""

    @functools.wraps(method)
    async def handler(self: ContextServicer, request: Request, context: Context) -> AsyncIterator[Response]:
        try:
            tenant = self.auth.tenant(context)
            check_request(request)  # type: ignore[arg-type]
            async for response in method(self, request, tenant):
                yield response
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            status = status_for(_as_domain_error(exc))
            await context.abort(status.code, status.details, status.trailing_metadata)

    return handler


class ContextServicer(pb_grpc.ContextServiceServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: Sessions,
        transcript: Transcript,
        tool_results: ToolResults,
        lineage: Lineage,
        maintenance: Maintenance,
    ):
        self.auth = auth
        self.sessions = sessions
        self.transcript = transcript
        self.tool_results = tool_results
        self.lineage = lineage
        self.maintenance = maintenance

    @unary
    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: Context, tenant: str
    ) -> pb.CreateSessionResponse:
        info = await self.sessions.create(tenant, convert.config_input(request.config))
        return pb.CreateSessionResponse(session=convert.session_pb(info))

    @unary
    async def GetSession(self, request: pb.GetSessionRequest, context: Context, tenant: str) -> pb.GetSessionResponse:
        info = await self.sessions.get(tenant, request.session_id)
        return pb.GetSessionResponse(session=convert.session_pb(info))

    @unary
    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: Context, tenant: str
    ) -> pb.ListSessionsResponse:
        infos, token = await self.sessions.list(tenant, request.page_size, request.page_token)
        return pb.ListSessionsResponse(sessions=[convert.session_pb(i) for i in infos], next_page_token=token)

    @unary
    async def DeleteSession(
        self, request: pb.DeleteSessionRequest, context: Context, tenant: str
    ) -> pb.DeleteSessionResponse:
        await self.sessions.delete(tenant, request.session_id)
        return pb.DeleteSessionResponse()

    @unary
    async def AppendMessages(
        self, request: pb.AppendMessagesRequest, context: Context, tenant: str
    ) -> pb.AppendMessagesResponse:
        messages = convert.new_messages(request.messages)
        stored, record = await self.transcript.append(tenant, request.session_id, messages, request.request_id)
        return pb.AppendMessagesResponse(
            messages=[convert.message_pb(m) for m in stored], session=convert.session_pb(session_info(record))
        )

    @unary
    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: Context, tenant: str
    ) -> pb.ListMessagesResponse:
        messages, token = await self.transcript.list(
            tenant, request.session_id, request.page_size, request.page_token, request.include_abandoned
        )
        return pb.ListMessagesResponse(messages=[convert.message_pb(m) for m in messages], next_page_token=token)

    @unary
    async def ReadToolResult(
        self, request: pb.ReadToolResultRequest, context: Context, tenant: str
    ) -> pb.ReadToolResultResponse:
        result = await self.tool_results.read(
            tenant,
            request.session_id,
            request.tool_call_id,
            request.result_ref,
            request.offset,
            request.limit,
        )
        page = result.page
        return pb.ReadToolResultResponse(
            data=page.data,
            offset=page.offset,
            next_offset=page.next_offset,
            total_bytes=page.total_bytes,
            sha256=result.sha256,
            complete=page.complete,
            result_ref=result.result_ref,
        )

    @unary
    async def Fork(self, request: pb.ForkRequest, context: Context, tenant: str) -> pb.ForkResponse:
        info = await self.lineage.fork(tenant, request.session_id, request.at_seq, convert.config_input(request.config))
        return pb.ForkResponse(session=convert.session_pb(info))

    @unary
    async def Rewind(self, request: pb.RewindRequest, context: Context, tenant: str) -> pb.RewindResponse:
        info = await self.lineage.rewind(tenant, request.session_id, request.to_seq)
        return pb.RewindResponse(session=convert.session_pb(info))

    @server_stream
    async def Prepare(self, request: pb.PrepareRequest, tenant: str) -> AsyncIterator[pb.PrepareResponse]:
        events = self.maintenance.prepare(
            tenant,
            request.session_id,
            convert.new_messages(request.append, field="append"),
            request.overflow,
            request.known_view_version,
            request.request_id,
        )
        async for event in events:
            yield pb.PrepareResponse(**convert.event_fields(event))  # type: ignore[arg-type]

    @server_stream
    async def Compact(self, request: pb.CompactRequest, tenant: str) -> AsyncIterator[pb.CompactResponse]:
        events = self.maintenance.compact(
            tenant, request.session_id, request.focus, request.keep_tokens, request.dry_run
        )
        async for event in events:
            yield pb.CompactResponse(**convert.event_fields(event))  # type: ignore[arg-type]

    @unary
    async def ObserveUsage(
        self, request: pb.ObserveUsageRequest, context: Context, tenant: str
    ) -> pb.ObserveUsageResponse:
        usage = Usage(
            view_version=request.view_version,
            estimated_tokens=0,
            input_tokens=request.input_tokens,
            cached_input_tokens=request.cached_input_tokens,
            output_tokens=request.output_tokens,
            finish_reason=request.finish_reason[:64],
        )
        calibration, accepted = await self.maintenance.observe_usage(tenant, request.session_id, usage)
        return pb.ObserveUsageResponse(calibration=calibration, calibration_accepted=accepted)

    @unary
    async def GetContextState(
        self, request: pb.GetContextStateRequest, context: Context, tenant: str
    ) -> pb.GetContextStateResponse:
        return pb.GetContextStateResponse(state_json=await self.maintenance.context_state(tenant, request.session_id))

    # Implemented on the operations branch (issue 13); until it lands they answer UNIMPLEMENTED.
    async def ListCheckpoints(self, request: pb.ListCheckpointsRequest, context: Context) -> pb.ListCheckpointsResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "ListCheckpoints is not implemented yet")
        raise AssertionError("unreachable: abort raises")

    async def GetCheckpoint(self, request: pb.GetCheckpointRequest, context: Context) -> pb.GetCheckpointResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetCheckpoint is not implemented yet")
        raise AssertionError("unreachable: abort raises")

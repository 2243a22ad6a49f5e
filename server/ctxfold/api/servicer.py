"""The gRPC servicer: authenticates, converts, calls the use case, maps errors. Nothing else."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from sqlalchemy.exc import DBAPIError, OperationalError

from ctxfold.api import convert
from ctxfold.api.auth import Authenticator
from ctxfold.api.errors import internal_error, status_for
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.service.lineage import Lineage
from ctxfold.service.sessions import Sessions, session_info
from ctxfold.service.tool_results import ToolResults
from ctxfold.service.transcript import Transcript
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
            return await method(self, request, context, self.auth.tenant(context))
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            status = status_for(_as_domain_error(exc))
            await context.abort(status.code, status.details, status.trailing_metadata)
            raise AssertionError("unreachable: abort raises") from None

    return handler


class ContextServicer(pb_grpc.ContextServiceServicer):
    def __init__(
        self,
        auth: Authenticator,
        sessions: Sessions,
        transcript: Transcript,
        tool_results: ToolResults,
        lineage: Lineage,
    ):
        self.auth = auth
        self.sessions = sessions
        self.transcript = transcript
        self.tool_results = tool_results
        self.lineage = lineage

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

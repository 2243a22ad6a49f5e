"""Builders of the messages, sessions and calls tests send, in one place."""

from __future__ import annotations

from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc


def user(text: str) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, content=text)


def assistant(text: str = "", *calls: pb.ToolCall) -> pb.Message:
    return pb.Message(role=pb.ROLE_ASSISTANT, content=text, tool_calls=calls)


def call(call_id: str, name: str = "bash", arguments: str = "{}") -> pb.Message:
    """An assistant message making one tool call."""
    return assistant("", pb.ToolCall(id=call_id, name=name, arguments=arguments))


def result(call_id: str, text: str) -> pb.Message:
    """The tool result answering `call_id`."""
    return pb.Message(role=pb.ROLE_TOOL, tool_call_id=call_id, content=text)


async def create_session(stub: pb_grpc.ContextServiceStub, **config: object) -> pb.Session:
    """A new session with `config` (a 128k window unless given)."""
    config.setdefault("context_window", 128_000)
    response = await stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(**config)))  # type: ignore[arg-type]
    return response.session


async def append(
    stub: pb_grpc.ContextServiceStub, session_id: str, *messages: pb.Message, request_id: str = ""
) -> pb.AppendMessagesResponse:
    return await stub.AppendMessages(
        pb.AppendMessagesRequest(session_id=session_id, messages=list(messages), request_id=request_id)
    )

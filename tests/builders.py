"""Builders of the messages, sessions and calls tests send, in one place."""

from __future__ import annotations

from ctxfold.v1 import context_service_pb2 as pb


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

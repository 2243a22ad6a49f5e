"""Builders of the messages, sessions and calls tests send, in one place."""

from __future__ import annotations

from collections.abc import AsyncIterable
from dataclasses import dataclass, field

from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc


def user(text: str) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, content=text)


def assistant(text: str = "", *calls: pb.ToolCall) -> pb.Message:
    return pb.Message(role=pb.ROLE_ASSISTANT, content=text, tool_calls=calls)


def call(call_id: str, name: str = "bash", arguments: str = "{}", *, text: str = "") -> pb.Message:
    """An assistant message making one tool call (saying `text` with it)."""
    return assistant(text, pb.ToolCall(id=call_id, name=name, arguments=arguments))


def result(call_id: str, text: str) -> pb.Message:
    """The tool result answering `call_id`."""
    return pb.Message(role=pb.ROLE_TOOL, tool_call_id=call_id, content=text)


async def create_session(stub: pb_grpc.ContextServiceStub, *, session_key: str = "", **config: object) -> pb.Session:
    """A new session with `config` (a 128k window unless given), named by `session_key` if given."""
    config.setdefault("context_window", 128_000)
    request = pb.CreateSessionRequest(config=pb.SessionConfig(**config), session_key=session_key)  # type: ignore[arg-type]
    return (await stub.CreateSession(request)).session


async def append(
    stub: pb_grpc.ContextServiceStub, session_id: str, *messages: pb.Message, request_id: str = ""
) -> pb.AppendMessagesResponse:
    return await stub.AppendMessages(
        pb.AppendMessagesRequest(session_id=session_id, messages=list(messages), request_id=request_id)
    )


@dataclass
class Outcome:
    """What a Prepare or Compact stream answered: its one result and the progress events before it."""

    result: pb.PreparedContext
    progress: list[pb.FoldProgress] = field(default_factory=list)


async def _outcome(stream: AsyncIterable[pb.PrepareResponse] | AsyncIterable[pb.CompactResponse]) -> Outcome:
    """Reads the whole stream: progress events, then exactly one result, which is the last event."""
    progress: list[pb.FoldProgress] = []
    results: list[pb.PreparedContext] = []
    async for event in stream:
        assert not results, "the result must be the last event of the stream"
        kind = event.WhichOneof("event")
        if kind == "progress":
            progress.append(event.progress)
        else:
            assert kind == "result", f"an event that is neither progress nor a result: {event}"
            results.append(event.result)
    assert len(results) == 1, "the stream ended without a result"
    return Outcome(results[0], progress)


async def prepare(stub: pb_grpc.ContextServiceStub, session_id: str, *append: pb.Message, **request: object) -> Outcome:
    """A Prepare appending `append`, with the other PrepareRequest fields from `request`
    (`overflow`, `known_view_version`, `request_id`)."""
    return await _outcome(stub.Prepare(pb.PrepareRequest(session_id=session_id, append=append, **request)))  # type: ignore[arg-type]


async def compact(stub: pb_grpc.ContextServiceStub, session_id: str, **request: object) -> Outcome:
    """A Compact, with the other CompactRequest fields from `request` (`focus`, `keep_tokens`, `dry_run`)."""
    return await _outcome(stub.Compact(pb.CompactRequest(session_id=session_id, **request)))  # type: ignore[arg-type]

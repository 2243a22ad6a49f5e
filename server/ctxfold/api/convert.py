"""Conversion between the generated proto messages and the domain types."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from ctxfold.engine.errors import invalid
from ctxfold.engine.model import ConfigInput, NewMessage, Role, SessionConfig, StoredMessage, ToolCall
from ctxfold.service.sessions import SessionInfo
from ctxfold.v1 import context_service_pb2 as pb

_ROLE_FROM_PB = {
    pb.ROLE_SYSTEM: Role.SYSTEM,
    pb.ROLE_USER: Role.USER,
    pb.ROLE_ASSISTANT: Role.ASSISTANT,
    pb.ROLE_TOOL: Role.TOOL,
}
_ROLE_TO_PB = {role: value for value, role in _ROLE_FROM_PB.items()}


def timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def config_input(config: pb.SessionConfig) -> ConfigInput:
    return ConfigInput(
        context_window=config.context_window,
        compact_ratio=config.compact_ratio,
        tail_ratio=config.tail_ratio,
        max_output_tokens=config.max_output_tokens,
        summary_max_tokens=config.summary_max_tokens,
        tool_content_max_bytes=config.tool_content_max_bytes,
        system_prompt=config.system_prompt,
        tools_json=config.tools_json,
        summarizer=config.summarizer,
        cache_ttl_seconds=config.cache_ttl_seconds,
        prompt_cache_key=config.prompt_cache_key,
        model=config.model,
    )


def config_pb(config: SessionConfig) -> pb.SessionConfig:
    return pb.SessionConfig(
        context_window=config.context_window,
        compact_ratio=config.compact_ratio,
        tail_ratio=config.tail_ratio,
        max_output_tokens=config.max_output_tokens,
        summary_max_tokens=config.summary_max_tokens,
        tool_content_max_bytes=config.tool_content_max_bytes,
        system_prompt=config.system_prompt,
        tools_json=config.tools_json,
        summarizer=config.summarizer,
        cache_ttl_seconds=config.cache_ttl_seconds,
        prompt_cache_key=config.prompt_cache_key,
        model=config.model,
    )


def session_pb(info: SessionInfo) -> pb.Session:
    r = info.record
    return pb.Session(
        id=r.id,
        config=config_pb(info.config),
        head_seq=r.head_seq,
        checkpoint_id=r.checkpoint_id or "",
        create_time=timestamp(r.create_time),
        update_time=timestamp(r.update_time),
        forked_from_session_id=r.forked_from_session_id or "",
        forked_at_seq=r.forked_at_seq,
    )


def new_messages(messages: Sequence[pb.Message], field: str = "messages") -> list[NewMessage]:
    out = []
    for index, m in enumerate(messages):
        role = _ROLE_FROM_PB.get(m.role)
        if role is None:
            raise invalid(
                "INVALID_MESSAGE",
                f"{field}[{index}]: role must be ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT or ROLE_TOOL "
                f"(got {pb.Role.Name(m.role) if m.role in pb.Role.values() else m.role})",
                index=index,
            )
        out.append(
            NewMessage(
                role=role,
                content=m.content,
                tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls),
                tool_call_id=m.tool_call_id,
                reasoning_content=m.reasoning_content,
                pinned=m.pinned,
                name=m.name,
            )
        )
    return out


def message_pb(message: StoredMessage) -> pb.Message:
    return pb.Message(
        id=message.id,
        seq=message.seq,
        role=_ROLE_TO_PB[message.role],
        content=message.content,
        tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in message.tool_calls],
        tool_call_id=message.tool_call_id,
        reasoning_content=message.reasoning_content,
        pinned=message.pinned,
        result_ref=message.result_ref,
        raw_bytes=message.raw_bytes,
        truncated=message.truncated,
        name=message.name,
        tokens=message.tokens,
        abandoned=message.abandoned,
        create_time=timestamp(message.create_time) if message.create_time else None,
    )

"""Conversion between ctxfold messages and OpenAI Chat Completions message dicts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client.models import PreparedView

_ROLE_NAMES: Mapping[int, str] = {
    pb.ROLE_SYSTEM: "system",
    pb.ROLE_USER: "user",
    pb.ROLE_ASSISTANT: "assistant",
    pb.ROLE_TOOL: "tool",
}
_ROLES: Mapping[str, pb.Role.ValueType] = {
    "system": pb.ROLE_SYSTEM,
    "developer": pb.ROLE_SYSTEM,
    "user": pb.ROLE_USER,
    "assistant": pb.ROLE_ASSISTANT,
    "tool": pb.ROLE_TOOL,
}


class SupportsModelDump(Protocol):
    """An object of the `openai` SDK (a pydantic model), e.g. `completion.choices[0].message`."""

    def model_dump(self) -> dict[str, Any]: ...


def to_openai_message(message: pb.Message, *, include_reasoning: bool = False) -> dict[str, Any]:
    """One view message as an OpenAI Chat Completions message dict."""
    role = _ROLE_NAMES.get(message.role)
    if role is None:
        raise ValueError(f"message {message.id or '(no id)'} has no role")
    out: dict[str, Any] = {"role": role}
    if role == "tool":
        out["tool_call_id"] = message.tool_call_id
        out["content"] = message.content
        return out
    if role == "assistant" and message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    else:
        out["content"] = message.content
    if include_reasoning and message.reasoning_content:
        out["reasoning_content"] = message.reasoning_content
    if message.name:
        out["name"] = message.name
    return out


def to_openai_messages(
    view: PreparedView | Iterable[pb.Message], *, include_reasoning: bool = False
) -> list[dict[str, Any]]:
    """The prepared view as the `messages` of an OpenAI Chat Completions request.

    Roles map one to one (the checkpoint summary keeps the role the server gave it); assistant tool
    calls become `tool_calls` entries of type "function"; tool results carry `tool_call_id`.
    `include_reasoning` adds `reasoning_content` (understood by some OpenAI-compatible providers).
    """
    messages = view.messages if isinstance(view, PreparedView) else view
    return [to_openai_message(m, include_reasoning=include_reasoning) for m in messages]


def from_openai_message(message: Mapping[str, Any] | SupportsModelDump) -> pb.Message:
    """An OpenAI Chat Completions message (a dict, or the `openai` SDK's message object) as a
    ctxfold message, ready to append."""
    data: Mapping[str, Any] = message if isinstance(message, Mapping) else message.model_dump()
    role_name = data.get("role")
    role = _ROLES.get(role_name) if isinstance(role_name, str) else None
    if role is None:
        raise ValueError(f"unsupported message role {role_name!r}")
    calls = []
    for call in data.get("tool_calls") or ():
        function = call.get("function") or {}
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        calls.append(pb.ToolCall(id=str(call.get("id", "")), name=str(function.get("name", "")), arguments=arguments))
    return pb.Message(
        role=role,
        content=_text(data.get("content")),
        tool_calls=calls,
        tool_call_id=str(data.get("tool_call_id") or ""),
        reasoning_content=str(data.get("reasoning_content") or ""),
        name=str(data.get("name") or ""),
    )


def _text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ValueError(f"only text content can be stored, not {kind!r}")
        return "\n".join(parts)
    raise ValueError(f"unsupported message content {type(content).__name__}")

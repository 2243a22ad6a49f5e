"""Constructors of `Message` for the four roles (provider responses become messages through the
adapters in `ctxfold_client.adapters`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ctxfold_client import _json
from ctxfold_client._gen.enums import Role
from ctxfold_client.models import Message, ToolCall


def system(content: str, *, pinned: bool = False, name: str = "") -> Message:
    """A system (or developer) instruction."""
    return Message(role=Role.SYSTEM, content=content, pinned=pinned, name=name)


def user(content: str, *, pinned: bool = False, name: str = "") -> Message:
    """A user turn; `pinned` keeps it verbatim through every fold."""
    return Message(role=Role.USER, content=content, pinned=pinned, name=name)


def tool_call(call_id: str, name: str, arguments: str | Mapping[str, Any] = "{}") -> ToolCall:
    """One tool call of an assistant message; `arguments` as the model wrote them, or a dict
    (written as the JSON all ctxfold SDKs write)."""
    if not isinstance(arguments, str):
        arguments = _json.dumps(arguments)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def assistant(
    content: str = "",
    tool_calls: Iterable[ToolCall] = (),
    *,
    reasoning_content: str = "",
    pinned: bool = False,
    name: str = "",
) -> Message:
    """A model answer, possibly with tool calls (their results must be appended next):
    `assistant("Running the tests.", [tool_call("call_1", "bash", {"command": "pytest"})])`."""
    return Message(
        role=Role.ASSISTANT,
        content=content,
        tool_calls=tuple(tool_calls),
        reasoning_content=reasoning_content,
        pinned=pinned,
        name=name,
    )


def tool_result(tool_call_id: str, content: str, *, name: str = "") -> Message:
    """The result of the tool call `tool_call_id`. The server bounds large results (head, tail and a
    marker naming `result_ref`) and keeps the whole raw text for `read_tool_result()`."""
    return Message(role=Role.TOOL, tool_call_id=tool_call_id, content=content, name=name)

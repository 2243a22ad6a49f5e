"""Constructors of `ctxfold.v1.Message` for the four roles (the SDK also accepts OpenAI-style
message dicts wherever it takes messages; see `from_openai_message`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ctxfold_client._gen import context_service_pb2 as pb


def system(content: str, *, pinned: bool = False, name: str = "") -> pb.Message:
    """A system (or developer) instruction."""
    return pb.Message(role=pb.ROLE_SYSTEM, content=content, pinned=pinned, name=name)


def user(content: str, *, pinned: bool = False, name: str = "") -> pb.Message:
    """A user turn; `pinned` keeps it verbatim through every fold."""
    return pb.Message(role=pb.ROLE_USER, content=content, pinned=pinned, name=name)


def tool_call(call_id: str, name: str, arguments: str | Mapping[str, Any] = "{}") -> pb.ToolCall:
    """One tool call of an assistant message; `arguments` as the model wrote them, or a dict."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return pb.ToolCall(id=call_id, name=name, arguments=arguments)


def assistant(
    content: str = "",
    *,
    tool_calls: Iterable[pb.ToolCall] = (),
    reasoning_content: str = "",
    pinned: bool = False,
    name: str = "",
) -> pb.Message:
    """A model answer, possibly with tool calls (their results must be appended next)."""
    return pb.Message(
        role=pb.ROLE_ASSISTANT,
        content=content,
        tool_calls=list(tool_calls),
        reasoning_content=reasoning_content,
        pinned=pinned,
        name=name,
    )


def tool_result(tool_call_id: str, content: str, *, name: str = "") -> pb.Message:
    """The result of the tool call `tool_call_id`. The server bounds large results (head, tail and a
    marker naming `result_ref`) and keeps the whole raw text for `read_tool_result()`."""
    return pb.Message(role=pb.ROLE_TOOL, tool_call_id=tool_call_id, content=content, name=name)

"""OpenAI Chat Completions: a View as the `messages`, `tools` (and `prompt_cache_key`) of a request,
a chat completion as the assistant message to append plus its usage, and recorded Chat messages as
messages to append."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxfold_client import _json
from ctxfold_client._gen.enums import Role
from ctxfold_client.adapters._common import (
    ProviderTurn,
    Response,
    as_mapping,
    count,
    fields,
    items,
    join,
    unconvertible,
    view_messages,
)
from ctxfold_client.config import Tools
from ctxfold_client.models import Message, ToolCall, Usage, View
from ctxfold_client.tools import request_tools

_ROLES = {Role.SYSTEM: "system", Role.USER: "user", Role.ASSISTANT: "assistant", Role.TOOL: "tool"}
_FROM_ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER, "assistant": Role.ASSISTANT}


def to_message(message: Message, *, include_reasoning: bool = False) -> dict[str, Any]:
    """One view message as a Chat Completions message."""
    role = _ROLES.get(message.role)
    if role is None:
        raise unconvertible(f"message {message.id or '(no id)'} has no role")
    if message.role is Role.TOOL:
        return {"role": role, "tool_call_id": message.tool_call_id, "content": message.content}
    out: dict[str, Any] = {"role": role, "content": message.content}
    if message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    if include_reasoning and message.reasoning_content:
        out["reasoning_content"] = message.reasoning_content
    if message.name:
        out["name"] = message.name
    return out


def to_request(
    view: View | Sequence[Message], *, tools: Tools | None = None, include_reasoning: bool = False
) -> dict[str, Any]:
    """`{"messages": [...], "tools": [...], "prompt_cache_key": ...}`: add `model`, ... and send.

    Roles map one to one (the system prompt first, the checkpoint summary as the server placed
    it); assistant tool calls become `tool_calls` of type "function" (content null when empty);
    tool results carry `tool_call_id`. `tools` are the session's (Chat format, a list or the JSON
    text of `session.config.tools`); the `read_tool_result` definition is added when the view hides
    a result and they lack it. `include_reasoning` sends `reasoning_content` back, for the
    OpenAI-compatible providers that take it.
    """
    request: dict[str, Any] = {
        "messages": [to_message(m, include_reasoning=include_reasoning) for m in view_messages(view)]
    }
    offered = request_tools(tools, view, "openai_chat")
    if offered:
        request["tools"] = offered
    if isinstance(view, View) and view.prompt_cache_key:
        request["prompt_cache_key"] = view.prompt_cache_key
    return request


def _text(content: object) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return join(str(part.get("text", "")) for part in items(content) if part.get("type") == "text")


def _tool_calls(calls: object) -> tuple[ToolCall, ...]:
    out = []
    for call in items(calls):
        function = fields(call.get("function"))
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = _json.dumps(arguments)
        out.append(ToolCall(id=str(call.get("id", "")), name=str(function.get("name", "")), arguments=arguments))
    return tuple(out)


def from_messages(messages: Iterable[Mapping[str, Any]]) -> list[Message]:
    """Recorded Chat Completions messages (a transcript kept in that format, a trace) as messages
    to append: roles one to one (`developer` as system), `content` as text (parts joined with a
    newline), `tool_calls`, `tool_call_id`, `reasoning_content` and `name` kept."""
    out = []
    for index, message in enumerate(messages):
        role = str(message.get("role", ""))
        if role == "tool":
            out.append(
                Message(
                    role=Role.TOOL,
                    tool_call_id=str(message.get("tool_call_id") or ""),
                    content=_text(message.get("content")),
                    name=str(message.get("name") or ""),
                )
            )
            continue
        if role not in _FROM_ROLES:
            raise unconvertible(f"message {index}: role {role!r} is not system, developer, user, assistant or tool")
        out.append(
            Message(
                role=_FROM_ROLES[role],
                content=_text(message.get("content")),
                tool_calls=_tool_calls(message.get("tool_calls")),
                reasoning_content=str(message.get("reasoning_content") or ""),
                name=str(message.get("name") or ""),
            )
        )
    return out


def from_response(response: Response) -> ProviderTurn:
    """The first choice's message (content or refusal, tool calls, `reasoning_content` where the
    provider sends it) and the usage: prompt_tokens, prompt_tokens_details.cached_tokens,
    completion_tokens, finish_reason."""
    data = as_mapping(response)
    choices = list(items(data.get("choices")))
    if not choices:
        raise unconvertible("the chat completion has no choices")
    choice = choices[0]
    message = fields(choice.get("message"))
    usage = fields(data.get("usage"))
    details = fields(usage.get("prompt_tokens_details"))
    return ProviderTurn(
        messages=(
            Message(
                role=Role.ASSISTANT,
                content=_text(message.get("content")) or str(message.get("refusal") or ""),
                tool_calls=_tool_calls(message.get("tool_calls")),
                reasoning_content=str(message.get("reasoning_content") or ""),
            ),
        ),
        usage=Usage(
            input_tokens=count(usage.get("prompt_tokens")),
            cached_input_tokens=count(details.get("cached_tokens")),
            output_tokens=count(usage.get("completion_tokens")),
            finish_reason=str(choice.get("finish_reason") or ""),
        ),
    )

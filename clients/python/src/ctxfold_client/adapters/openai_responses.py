"""OpenAI Responses: a View as the `instructions`, `input` items, `tools` (and `prompt_cache_key`)
of a request, and a response's output items as the assistant message to append plus its usage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

_ROLES = {Role.SYSTEM: "system", Role.USER: "user", Role.ASSISTANT: "assistant"}


def _items(message: Message) -> list[dict[str, Any]]:
    if message.role is Role.TOOL:
        return [{"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content}]
    role = _ROLES.get(message.role)
    if role is None:
        raise unconvertible(f"message {message.id or '(no id)'} has no role")
    out: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:
        out.append({"type": "message", "role": role, "content": message.content})
    out.extend(
        {"type": "function_call", "call_id": call.id, "name": call.name, "arguments": call.arguments}
        for call in message.tool_calls
    )
    return out


def to_request(view: View | Sequence[Message], *, tools: Tools | None = None) -> dict[str, Any]:
    """`{"instructions": ..., "input": [...], "tools": [...], "prompt_cache_key": ...}`: add `model`, ...

    A leading system message becomes `instructions`; every other message becomes input items: a
    `message` (role user, assistant or system) for its text, a `function_call` per tool call, a
    `function_call_output` per tool result. Reasoning is not sent back (its items are opaque).
    `tools` are the session's (Responses format); `read_tool_result` is added when the view hides a
    result and they lack it.
    """
    messages = list(view_messages(view))
    request: dict[str, Any] = {}
    if messages and messages[0].role is Role.SYSTEM:
        request["instructions"] = messages.pop(0).content
    request["input"] = [item for message in messages for item in _items(message)]
    offered = request_tools(tools, view, "openai_responses")
    if offered:
        request["tools"] = offered
    if isinstance(view, View) and view.prompt_cache_key:
        request["prompt_cache_key"] = view.prompt_cache_key
    return request


def from_response(response: Response) -> ProviderTurn:
    """The output items as one assistant message (output text, function calls, reasoning summary
    text as `reasoning_content`) and the usage: input_tokens, input_tokens_details.cached_tokens,
    output_tokens, and the response `status` as the finish reason."""
    data = as_mapping(response)
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for item in items(data.get("output")):
        kind = item.get("type")
        if kind == "message":
            for part in items(item.get("content")):
                if part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
                elif part.get("type") == "refusal":
                    texts.append(str(part.get("refusal") or ""))
        elif kind == "function_call":
            calls.append(
                ToolCall(
                    id=str(item.get("call_id", "")),
                    name=str(item.get("name", "")),
                    arguments=str(item.get("arguments") or ""),
                )
            )
        elif kind == "reasoning":
            reasoning.extend(str(part.get("text") or "") for part in items(item.get("summary")))
    usage = fields(data.get("usage"))
    details = fields(usage.get("input_tokens_details"))
    return ProviderTurn(
        messages=(
            Message(
                role=Role.ASSISTANT, content=join(texts), tool_calls=tuple(calls), reasoning_content=join(reasoning)
            ),
        ),
        usage=Usage(
            input_tokens=count(usage.get("input_tokens")),
            cached_input_tokens=count(details.get("cached_tokens")),
            output_tokens=count(usage.get("output_tokens")),
            finish_reason=str(data.get("status") or ""),
        ),
    )

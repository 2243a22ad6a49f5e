"""Anthropic Messages: a View as the `system`, `messages` and `tools` of a request, with a
prompt-cache breakpoint at the end of the stable prefix, and a message response as the assistant
message to append plus its usage."""

from __future__ import annotations

import json
from collections.abc import Sequence
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

EPHEMERAL = {"type": "ephemeral"}


def _input(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        raise unconvertible(f"tool call {call.id}: arguments are not JSON ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise unconvertible(f"tool call {call.id}: arguments are not a JSON object")
    return value


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role is Role.TOOL:
        return [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    blocks.extend({"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)} for c in message.tool_calls)
    return blocks


def to_request(view: View | Sequence[Message], *, tools: Tools | None = None) -> dict[str, Any]:
    """`{"system": [...], "messages": [...], "tools": [...]}`: add `model`, `max_tokens`, ... and send.

    A leading system message becomes `system` (one text block). Assistant messages become text and
    `tool_use` blocks (input parsed from the arguments); tool results become `tool_result` blocks
    of the user turn; later system messages become user text. Consecutive messages of one role form
    one turn (so the results of parallel tool calls share one user turn); empty text is left out.
    The last block of the view's stable prefix (`stable_prefix_messages`) gets `cache_control:
    {"type": "ephemeral"}`. Thinking is not sent back: its signature is not kept in the transcript.
    `tools` are the session's (Messages format); `read_tool_result` is added when the view hides a
    result and they lack it.
    """
    messages = list(view_messages(view))
    stable = view.stable_prefix_messages if isinstance(view, View) else 0
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    last_stable_block: dict[str, Any] | None = None
    for index, message in enumerate(messages):
        if index == 0 and message.role is Role.SYSTEM:
            blocks = [{"type": "text", "text": message.content}]
            system = blocks
        else:
            blocks = _blocks(message)
            role = "assistant" if message.role is Role.ASSISTANT else "user"
            if blocks and turns and turns[-1]["role"] == role:
                turns[-1]["content"].extend(blocks)
            elif blocks:
                turns.append({"role": role, "content": blocks})
        if index < stable and blocks:
            last_stable_block = blocks[-1]
    if last_stable_block is not None:
        last_stable_block["cache_control"] = dict(EPHEMERAL)
    request: dict[str, Any] = {"system": system} if system else {}
    request["messages"] = turns
    offered = request_tools(tools, view, "anthropic")
    if offered:
        request["tools"] = offered
    return request


def from_response(response: Response) -> ProviderTurn:
    """The content blocks as one assistant message (`text`, `tool_use` as tool calls with the input
    as JSON, `thinking` as `reasoning_content`) and the usage: input_tokens +
    cache_read_input_tokens + cache_creation_input_tokens as input, cache_read_input_tokens as
    cached, output_tokens, stop_reason."""
    data = as_mapping(response)
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for block in items(data.get("content")):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
        elif kind == "tool_use":
            arguments = _json.dumps(block.get("input") or {})
            calls.append(ToolCall(id=str(block.get("id", "")), name=str(block.get("name", "")), arguments=arguments))
    usage = fields(data.get("usage"))
    cache_read = count(usage.get("cache_read_input_tokens"))
    return ProviderTurn(
        messages=(
            Message(
                role=Role.ASSISTANT, content=join(texts), tool_calls=tuple(calls), reasoning_content=join(thinking)
            ),
        ),
        usage=Usage(
            input_tokens=count(usage.get("input_tokens"))
            + cache_read
            + count(usage.get("cache_creation_input_tokens")),
            cached_input_tokens=cache_read,
            output_tokens=count(usage.get("output_tokens")),
            finish_reason=str(data.get("stop_reason") or ""),
        ),
    )

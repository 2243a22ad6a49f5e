"""Views in the providers' chat formats: OpenAI Chat Completions and Anthropic Messages."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ctxfold.engine.model import Role
from ctxfold.engine.view import ViewMessage


def openai_messages(view: Sequence[ViewMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in view:
        item: dict[str, Any] = {"role": message.role.value, "content": message.content}
        source = message.source
        if source is not None:
            if source.tool_calls:
                item["content"] = message.content or None
                item["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in source.tool_calls
                ]
            if source.tool_call_id:
                item["tool_call_id"] = source.tool_call_id
            if source.name:
                item["name"] = source.name
        out.append(item)
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {"arguments": text}


def anthropic_messages(view: Sequence[ViewMessage]) -> tuple[str, list[dict[str, Any]]]:
    """(system text, messages): system messages join the system prompt; tool calls become tool_use
    blocks, results tool_result blocks in a user turn; consecutive turns of one role are merged."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for message in view:
        if message.role is Role.SYSTEM:
            system.append(message.content)
            continue
        blocks: list[dict[str, Any]] = []
        source = message.source
        if message.role is Role.TOOL and source is not None:
            role = "user"
            blocks.append({"type": "tool_result", "tool_use_id": source.tool_call_id, "content": message.content})
        else:
            role = "assistant" if message.role is Role.ASSISTANT else "user"
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            for call in source.tool_calls if source else ():
                blocks.append(
                    {"type": "tool_use", "id": call.id, "name": call.name, "input": _arguments(call.arguments)}
                )
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    return "\n\n".join(system), messages

"""Recorded conversations as plain, immutable messages, and how an agent replays them.

Input is OpenAI chat format: a JSON document `{"messages": [...], "tools": [...]}` or JSONL with one
message object per line (a line holding `{"tools": [...]}` instead of a message sets the tools) —
or an agent's own session log (Claude Code, Codex CLI, cctrace XML), converted by
`ctxfold.replay.sessions`. A leading system message becomes the system prompt; every other message
is replayed in order."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxfold.engine.model import ToolCall
from ctxfold.replay import sessions

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Msg:
    """One message as a provider sees it, plus where it came from.

    `source` is the index of the trace message it renders (-1 for synthetic messages: the system
    prompt, summaries, instructions); `elided` marks a rendering that does not show the whole
    content (a pruned or masked tool result); `ref` is a tool result's `result_ref` when a store
    can read it back."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    reasoning: str = ""
    source: int = -1
    summary: bool = False
    elided: bool = False
    ref: str = ""


@dataclass(frozen=True)
class Trace:
    name: str
    system_prompt: str
    tools_json: str
    messages: tuple[Msg, ...]


@dataclass(frozen=True)
class Turn:
    """One model call: the agent appends `append`, sends the view, and the model answers `answer`
    (the recorded assistant message, which the agent appends before the next call)."""

    append: tuple[Msg, ...]
    answer: Msg


class TraceError(ValueError):
    """The input is not a conversation this replay understands."""


def _text(value: Any) -> str:
    """Content as a string: OpenAI content-part lists are flattened to their text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(str(p.get("text", "")) for p in value if isinstance(p, dict) and p.get("type") == "text")
    return str(value)


def _message(raw: Any, index: int) -> Msg:
    if not isinstance(raw, dict):
        raise TraceError(f"message {index}: expected an object, got {type(raw).__name__}")
    role = raw.get("role")
    if role not in ROLES:
        raise TraceError(f"message {index}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
    calls = []
    for number, call in enumerate(raw.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not call.get("id") or not function.get("name"):
            raise TraceError(f"message {index}: tool call {number} needs an id and function.name")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(ToolCall(str(call["id"]), str(function["name"]), arguments))
    return Msg(
        role=role,
        content=_text(raw.get("content")),
        tool_calls=tuple(calls),
        tool_call_id=str(raw.get("tool_call_id") or ""),
        reasoning=_text(raw.get("reasoning_content")),
    )


def build_trace(name: str, raw_messages: Sequence[Any], tools: Any = None) -> Trace:
    messages = [_message(m, i) for i, m in enumerate(raw_messages)]
    system = ""
    if messages and messages[0].role == "system":
        system = messages.pop(0).content
    indexed = tuple(
        Msg(m.role, m.content, m.tool_calls, m.tool_call_id, m.reasoning, source=i) for i, m in enumerate(messages)
    )
    if not any(m.role == "assistant" for m in indexed):
        raise TraceError(f"{name}: no assistant message, so no model call to replay")
    return Trace(name, system, json.dumps(tools or []), indexed)


def parse_trace(name: str, text: str) -> Trace:
    """A trace from the text of a chat JSON document, of a JSONL file or of a native session log."""
    if sessions.detect(text):
        try:
            converted = sessions.convert(name, text)
        except sessions.SessionFormatError as exc:
            raise TraceError(f"{name}: {exc}") from None
        return build_trace(name, converted["messages"], converted["tools"])
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            document = json.loads(text)
        except ValueError:
            document = None  # maybe JSONL whose first line is an object
        if isinstance(document, dict) and "messages" in document:
            if not isinstance(document["messages"], list):
                raise TraceError(f"{name}: 'messages' must be a list")
            return build_trace(name, document["messages"], document.get("tools"))
    elif stripped.startswith("["):
        try:
            messages = json.loads(text)
        except ValueError as exc:
            raise TraceError(f"{name}: not valid JSON ({exc})") from None
        return build_trace(name, messages)
    raw: list[Any] = []
    tools: Any = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise TraceError(f"{name}:{number}: not valid JSON ({exc})") from None
        if isinstance(item, dict) and "role" not in item and "tools" in item:
            tools = item["tools"]
        else:
            raw.append(item)
    if not raw:
        raise TraceError(f"{name}: no messages")
    return build_trace(name, raw, tools)


def turns(trace: Trace) -> tuple[list[Turn], tuple[Msg, ...]]:
    """The model calls of the trace, and the messages after the last answer (appended at the end,
    never sent: they have no recorded answer)."""
    out: list[Turn] = []
    pending: list[Msg] = []
    for message in trace.messages:
        if message.role == "assistant":
            out.append(Turn(tuple(pending), message))
            pending = [message]
        else:
            pending.append(message)
    return out, tuple(pending)

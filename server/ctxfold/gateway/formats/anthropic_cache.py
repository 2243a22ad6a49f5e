"""Anthropic's prompt-cache breakpoints (`cache_control`) in a Messages request: where the gateway puts
them (the end of the stable prefix and the last turn, within the provider's four, keeping the agent's
own while they fit), and a request compared without them (agents move theirs every turn)."""

from __future__ import annotations

import re
from typing import Any

import orjson

from ctxfold.gateway.formats import Spliced, as_dict, as_list, text_of
from ctxfold.gateway.pieces import CACHE_CONTROL, Json, without_cache_control

# The provider's limit of cache breakpoints per request (tools, system and messages together).
MAX_BREAKPOINTS = 4
EPHEMERAL = {"type": "ephemeral"}
# The gateway's breakpoint as orjson writes it at the end of a block.
BREAKPOINT = b',"' + CACHE_CONTROL.encode() + b'":' + orjson.dumps(EPHEMERAL)
# A breakpoint member as any agent writes it: a JSON string cannot hold an unescaped quote, so what
# matches is a member, never text.
_KEY = b'"cache_control"'
_BREAKPOINT_MEMBER = re.compile(rb'"cache_control"\s*:\s*\{[^{}]*\}')
_COMMA = re.compile(rb"\s*,\s*")
_UNCACHEABLE = frozenset({"thinking", "redacted_thinking"})


def blocks(value: Json) -> list[Json]:
    """A turn's content as a list of blocks (a string is one text block)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}] if value else []
    return list(as_list(value))


def place_breakpoints(body: dict[str, Any], stable_turns: int) -> dict[str, Any]:
    """Cache breakpoints at the end of the stable prefix (the first `stable_turns` turns, or the
    system prompt when 0) and at the last turn, keeping the agent's own breakpoints while the total
    stays within the provider's four: the agent's oldest ones in messages go first."""
    out = dict(body)
    messages = [dict(m) for m in as_list(body.get("messages"))]
    out["messages"] = messages
    wanted: list[tuple[str, int]] = []  # ("system", -1) or ("message", index)
    if stable_turns > 0 and stable_turns <= len(messages):
        wanted.append(("message", stable_turns - 1))
    elif out.get("system"):
        wanted.append(("system", -1))
    if messages:
        wanted.append(("message", len(messages) - 1))
    for where, index in wanted:
        if where == "system":
            out["system"] = marked(out["system"])
        else:
            messages[index]["content"] = marked(messages[index].get("content"))
    required = {index for where, index in wanted if where == "message"}
    excess = count_breakpoints(out) - MAX_BREAKPOINTS
    for index, message in enumerate(messages):
        if excess <= 0:
            break
        if index in required or not isinstance(message.get("content"), list):
            continue
        blocks = []
        for block in message["content"]:
            if excess > 0 and isinstance(block, dict) and CACHE_CONTROL in block:
                blocks.append({k: v for k, v in block.items() if k != CACHE_CONTROL})
                excess -= 1
            else:
                blocks.append(block)
        message["content"] = blocks
    return out


def marked(content: Json) -> Json:
    """`content` with a breakpoint on its last block that can carry one (unchanged when one is there)."""
    parts = blocks(content)
    for position in range(len(parts) - 1, -1, -1):
        block = as_dict(parts[position])
        if text_of(block.get("type")) in _UNCACHEABLE:
            continue
        if CACHE_CONTROL not in block:
            parts[position] = {**block, CACHE_CONTROL: dict(EPHEMERAL)}
        return parts
    return content


def without_breakpoints(raw: bytes) -> bytes:
    """The JSON `raw` without its `cache_control` members (and their commas)."""
    parts: list[bytes] = []
    kept = 0
    found = raw.find(_KEY)  # in C: a regular expression's search of 400 kB took 0.7 ms
    while found >= 0:
        member = _BREAKPOINT_MEMBER.match(raw, found)
        found = raw.find(_KEY, found + len(_KEY))
        if member is None:
            continue
        before, end = raw[kept : member.start()].rstrip(), member.end()
        if before.endswith(b","):
            before = before[:-1]
        elif comma := _COMMA.match(raw, end):  # the object's first member: its comma follows
            end = comma.end()
        parts.append(before)
        kept = end
    if not parts:
        return raw
    parts.append(raw[kept:])
    return b"".join(parts)


def last_turn_marked(turns: list[Json]) -> list[Json]:
    """`turns` without breakpoints but one at the end of the last turn (its content as blocks)."""
    if not turns:
        return []
    *before, last = without_cache_control(turns)
    last = as_dict(last)
    return [*before, {**last, "content": marked(last.get("content"))}]


def unmarked(marked: bytes) -> Spliced:
    """JSON whose last breakpoint (the only one) is `BREAKPOINT`, without it and where it was."""
    at = marked.rfind(BREAKPOINT)
    return Spliced(marked, -1) if at < 0 else Spliced(marked[:at] + marked[at + len(BREAKPOINT) :], at)


def count_breakpoints(body: dict[str, Any]) -> int:
    """Breakpoints of the request; a top-level `cache_control` (automatic caching) takes one of the four too."""
    total = 1 if CACHE_CONTROL in body else 0
    total += sum(1 for tool in as_list(body.get("tools")) if CACHE_CONTROL in as_dict(tool))
    system = body.get("system")
    total += sum(1 for block in as_list(system) if CACHE_CONTROL in as_dict(block))
    for message in as_list(body.get("messages")):
        total += sum(1 for block in as_list(as_dict(message).get("content")) if CACHE_CONTROL in as_dict(block))
    return total

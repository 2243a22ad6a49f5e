"""Anthropic Messages (`POST /v1/messages`): `system` and `messages` of content blocks.

Pieces: the system prompt; each assistant turn whole (thinking blocks with their signatures stay in
its source, byte for byte); in a user turn, each `tool_result` block and then the other blocks.
Consecutive view messages of one role form one turn again, so a user turn split into pieces is
rendered as it was sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson
from ctxfold_client import Message, Role, ToolCall, Usage

from ctxfold.gateway import attachments
from ctxfold.gateway.formats import (
    ApiFormat,
    BadRequest,
    CacheHints,
    Conversation,
    ReadCall,
    Spliced,
    ViewEntry,
    as_dict,
    as_list,
    count,
    dumps,
    error_of,
    split_json,
    text_of,
)
from ctxfold.gateway.formats.anthropic_cache import (
    BREAKPOINT,
    MAX_BREAKPOINTS,
    blocks,
    count_breakpoints,
    last_turn_marked,
    place_breakpoints,
    unmarked,
    without_breakpoints,
)
from ctxfold.gateway.pieces import (
    Json,
    Piece,
    compact_json,
    join,
    loads,
    respelled_text,
    with_payload,
)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
NOT_RUN = "ctxfold: this call was not run (the same turn read a stored result); call it again if it is still needed"


def _block_text(block: dict[str, Any]) -> tuple[str, int]:
    """The canonical text of one non-tool block and the tokens its non-text part costs."""
    kind = block.get("type")
    if kind == "text":
        return text_of(block.get("text")), 0
    source = as_dict(block.get("source"))
    if kind == "image":
        if source.get("type") == "base64":
            width, height = attachments.inline_image_size(text_of(source.get("data")))
            image = attachments.Attachment("image", text_of(source.get("media_type")), width, height)
        elif source.get("type") == "url":
            image = attachments.image_from_url(text_of(source.get("url")))
        else:
            image = attachments.Attachment("image", text_of(source.get("file_id")))
        return image.describe(), attachments.anthropic_image_tokens(image.width, image.height)
    if kind == "document":
        name = text_of(block.get("title")) or text_of(source.get("media_type")) or text_of(source.get("url"))
        text = text_of(source.get("data")) if source.get("type") == "text" else ""
        tokens = len(text) // 4 if text else attachments.UNKNOWN_DOCUMENT_TOKENS
        return attachments.Attachment("document", name).describe(), tokens
    return attachments.Attachment(str(kind), text_of(block.get("title")) or text_of(block.get("name"))).describe(), 0


def _content_text(content: Json) -> tuple[str, int]:
    if isinstance(content, str):
        return content, 0
    texts, tokens = [], 0
    for block in as_list(content):
        text, cost = _block_text(as_dict(block))
        texts.append(text)
        tokens += cost
    return join(texts), tokens


class AnthropicMessages(ApiFormat):
    api = "anthropic_messages"
    provider = "anthropic"
    tool_format = "anthropic"
    path = "/v1/messages"
    history_key = "messages"
    breakpoint = BREAKPOINT

    def conversation(self, body: dict[str, Any]) -> Conversation:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("messages: Field required (a list of messages)")
        pieces: list[Piece] = []
        system = body.get("system")
        if system:
            pieces.append(Piece(Role.SYSTEM, system))
        for index, message in enumerate(map(as_dict, messages)):
            role, content = message.get("role"), message.get("content")
            if role not in ("user", "assistant") or not isinstance(content, str | list):
                raise BadRequest(f"messages.{index}: a message needs role user or assistant and a content")
            if role == "assistant":
                pieces.append(Piece(Role.ASSISTANT, content))
            elif isinstance(content, str):
                pieces.append(Piece(Role.USER, content))
            else:
                results = [b for b in content if as_dict(b).get("type") == "tool_result"]
                others = [b for b in content if as_dict(b).get("type") != "tool_result"]
                pieces.extend(Piece(Role.TOOL, [result]) for result in results)
                if others:
                    pieces.append(Piece(Role.USER, others))
        return Conversation(
            pieces=tuple(pieces),
            model=text_of(body.get("model")),
            stream=body.get("stream") is True,
            max_output_tokens=count(body.get("max_tokens")),
            tools=tuple(as_list(body.get("tools"))),
        )

    def canonical(self, piece: Piece) -> Message:
        if piece.role is Role.TOOL:
            block = as_dict(piece.source[0])
            text, tokens = _content_text(block.get("content", ""))
            call_id = text_of(block.get("tool_use_id"))
            message = Message(role=Role.TOOL, content=text, tool_call_id=call_id)
            plain: Json = [{"type": "tool_result", "tool_use_id": call_id, "content": text}]
            return with_payload(self.api, piece, message, plain, tokens)
        if piece.role is Role.ASSISTANT:
            message = self._assistant(piece.source)
            return with_payload(self.api, piece, message, self._plain_assistant(message), 0)
        text, tokens = _content_text(piece.source)
        return with_payload(self.api, piece, Message(role=piece.role, content=text), text, tokens)

    def _assistant(self, content: Json) -> Message:
        if isinstance(content, str):
            return Message(role=Role.ASSISTANT, content=content)
        texts, thinking, calls = [], [], []
        for block in map(as_dict, as_list(content)):
            kind = block.get("type")
            if kind == "text":
                texts.append(text_of(block.get("text")))
            elif kind == "thinking":
                thinking.append(text_of(block.get("thinking")))
            elif kind == "tool_use":
                arguments = compact_json(block.get("input") or {})
                calls.append(
                    ToolCall(id=text_of(block.get("id")), name=text_of(block.get("name")), arguments=arguments)
                )
        return Message(
            role=Role.ASSISTANT, content=join(texts), reasoning_content=join(thinking), tool_calls=tuple(calls)
        )

    def _plain_assistant(self, message: Message) -> Json:
        blocks: list[Json] = [{"type": "text", "text": message.content}] if message.content else []
        for call in message.tool_calls:
            blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": adapters_input(call)})
        return blocks

    def _plain(self, message: Message) -> Json:
        if message.role is Role.ASSISTANT:
            return self._plain_assistant(message)
        if message.role is Role.TOOL:
            return [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}]
        return message.content

    def rewritten(self, body: dict[str, Any], view: Sequence[ViewEntry], cache: CacheHints) -> dict[str, Any]:
        """Anthropic caches by prefix and breakpoints (no cache key): one at the end of the stable
        prefix, one at the last turn."""
        out = dict(body)
        out.pop("system", None)
        turns: list[tuple[str, Json]] = []
        stable_turns = 0
        for index, entry in enumerate(view):
            value = entry.source if entry.source is not None else self._plain(entry.message)
            if index == 0 and entry.message.role is Role.SYSTEM:
                out["system"] = value
                continue
            role = "assistant" if entry.message.role is Role.ASSISTANT else "user"
            if turns and turns[-1][0] == role:
                turns[-1] = (role, [*blocks(turns[-1][1]), *blocks(value)])
            else:
                turns.append((role, value))
            if index < cache.stable_messages:
                stable_turns = len(turns)
        out["messages"] = [{"role": role, "content": content} for role, content in turns]
        return place_breakpoints(out, stable_turns)

    def joins(self, last: Role, first: Role) -> bool:
        return (last is Role.ASSISTANT) == (first is Role.ASSISTANT)  # one role's consecutive pieces are one turn

    def respelled(self, piece: Piece) -> Piece | None:
        content = None if piece.role is Role.TOOL else respelled_text(piece.source, "text")
        return None if content is None else Piece(piece.role, content)

    def comparable(self, raw: bytes) -> bytes:
        """Without its breakpoints: agents move theirs to the last turn each time, which changes nothing
        the model reads (fingerprints and payloads leave them out too)."""
        return without_breakpoints(raw)

    def history_cut(self, body: dict[str, Any]) -> tuple[Spliced, bytes] | None:
        """Its turns without breakpoints but where the last turn's goes, which a resent request's body
        keeps as the end of its stable prefix (None when the two breakpoints it places would be too many)."""
        if count_breakpoints({**body, "messages": []}) > MAX_BREAKPOINTS - 2:
            return None
        head, tail = split_json({**body, "messages": last_turn_marked(as_list(body.get("messages")))}, "messages")
        return unmarked(head), tail

    def spliced_items(self, middle: bytes, items: list[Json]) -> Spliced:
        """The new turns, their last one's content as blocks, which gets the last breakpoint."""
        return unmarked(b"".join(b"," + orjson.dumps(turn) for turn in last_turn_marked(items)))

    def usage(self, response: dict[str, Any]) -> Usage:
        usage = as_dict(response.get("usage"))
        cached = count(usage.get("cache_read_input_tokens"))
        total = count(usage.get("input_tokens")) + cached + count(usage.get("cache_creation_input_tokens"))
        return Usage(total, cached, count(usage.get("output_tokens")), text_of(response.get("stop_reason")))

    def stream_usage(self, event: dict[str, Any], so_far: Usage) -> Usage:
        kind = event.get("type")
        if kind == "message_start":  # the message as it starts: its input, no stop reason yet
            return replace(self.usage(as_dict(event.get("message"))), finish_reason=so_far.finish_reason)
        if kind == "message_delta":
            usage = as_dict(event.get("usage"))
            reason = text_of(as_dict(event.get("delta")).get("stop_reason")) or so_far.finish_reason
            output = count(usage.get("output_tokens")) or so_far.output_tokens
            return Usage(so_far.input_tokens, so_far.cached_input_tokens, output, reason)
        return so_far

    def read_calls(self, response: dict[str, Any], name: str) -> list[ReadCall]:
        return [
            ReadCall(text_of(block.get("id")), compact_json(block.get("input") or {}))
            for block in map(as_dict, as_list(response.get("content")))
            if _is_call(block, name)
        ]

    def without_calls(self, response: dict[str, Any], name: str) -> dict[str, Any]:
        content = [b for b in map(as_dict, as_list(response.get("content"))) if not _is_call(b, name)]
        stop = response.get("stop_reason")
        if stop == "tool_use" and not any(b.get("type") == "tool_use" for b in content):
            stop = "end_turn"
        return {**response, "content": content, "stop_reason": stop}

    def continued(self, body: dict[str, Any], response: dict[str, Any], answers: dict[str, str]) -> dict[str, Any]:
        content = as_list(response.get("content"))
        results = [
            {
                "type": "tool_result",
                "tool_use_id": block.get("id"),
                "content": answers.get(text_of(block.get("id")), NOT_RUN),
            }
            for block in map(as_dict, content)
            if block.get("type") == "tool_use"
        ]
        turns = [{"role": "assistant", "content": content}, {"role": "user", "content": results}]
        return {**body, "messages": [*as_list(body.get("messages")), *turns]}

    def error(self, status: int, message: str, code: str = "") -> bytes:
        kind = code or _ERROR_TYPES.get(status, "api_error")
        return dumps({"type": "error", "error": {"type": kind, "message": message}})

    def context_length_error(self, tokens: int, limit: int) -> bytes:
        return self.error(400, f"prompt is too long: {tokens} tokens > {limit} maximum")

    def refused_as_too_long(self, status: int, payload: bytes) -> bool:
        return status == 400 and text_of(error_of(payload).get("message")).startswith("prompt is too long")


def _is_call(block: dict[str, Any], name: str) -> bool:
    return block.get("type") == "tool_use" and block.get("name") == name


def adapters_input(call: ToolCall) -> Json:
    """A tool call's arguments as the `input` object of a tool_use block."""
    try:
        value = loads(call.arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}

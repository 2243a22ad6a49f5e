"""OpenAI Responses (`POST /v1/responses`): `instructions` and `input` items.

Pieces: the instructions; each user, system or developer message item; each call output item; and
the run of output items of one assistant turn (reasoning items with their `encrypted_content`,
messages, function calls with their item ids), kept whole in its source. A request that continues
a stored response (`previous_response_id`, `conversation`) holds only the new items: its history is
the provider's, so it is forwarded as it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxfold_client import Message, Role, ToolCall, Usage, adapters

from ctxfold.gateway.formats import (
    ApiFormat,
    BadRequest,
    CacheHints,
    Conversation,
    ReadCall,
    ViewEntry,
    as_dict,
    as_list,
    count,
    text_of,
)
from ctxfold.gateway.formats.openai_chat import (
    NOT_RUN,
    content_text,
    openai_context_length_error,
    openai_error,
    openai_refused_as_too_long,
    part_text,
)
from ctxfold.gateway.pieces import Json, Piece, compact_json, join, respelled_text, with_payload

MESSAGE_ROLES = {"user": Role.USER, "system": Role.SYSTEM, "developer": Role.SYSTEM}
# Output items of an assistant turn, and the name of the tool call each is (when it is one).
TURN_ITEMS = {
    "reasoning": "",
    "message": "",
    "function_call": "",
    "custom_tool_call": "",
    "computer_call": "computer",
    "local_shell_call": "local_shell",
    "shell_call": "shell",
    "apply_patch_call": "apply_patch",
    "web_search_call": "",
    "file_search_call": "",
    "image_generation_call": "",
    "code_interpreter_call": "",
    "mcp_call": "",
    "mcp_list_tools": "",
    "compaction": "",
}
CALL_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "computer_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
    }
)


def _item_type(item: dict[str, Any]) -> str:
    return text_of(item.get("type")) or ("message" if "role" in item else "")


def _turn_call(item: dict[str, Any]) -> ToolCall | None:
    kind = _item_type(item)
    call_id = text_of(item.get("call_id"))
    if kind == "function_call":
        return ToolCall(id=call_id, name=text_of(item.get("name")), arguments=text_of(item.get("arguments")))
    if kind == "custom_tool_call":
        return ToolCall(id=call_id, name=text_of(item.get("name")), arguments=text_of(item.get("input")))
    name = TURN_ITEMS.get(kind, "")
    if name and call_id:
        arguments = item.get("action", item.get("operation", {}))
        return ToolCall(id=call_id, name=name, arguments=compact_json(arguments))
    return None


def _answered_call(output: dict[str, Any]) -> str:
    """The call id a call output item answers: its `call_id`, or a local shell call's output's `id` (that
    item has no `call_id`: without it the message had none, which the server refuses)."""
    call_id = text_of(output.get("call_id"))
    return call_id or (text_of(output.get("id")) if _item_type(output) == "local_shell_call_output" else "")


class OpenAIResponses(ApiFormat):
    api = "openai_responses"
    provider = "openai"
    tool_format = "openai_responses"
    path = "/v1/responses"
    history_key = "input"

    def joins(self, last: Role, first: Role) -> bool:
        return last is Role.ASSISTANT and first is Role.ASSISTANT  # one turn's items are one piece

    def conversation(self, body: dict[str, Any]) -> Conversation:
        given = body.get("input")
        if not isinstance(given, str | list):
            raise BadRequest("input: a string or a list of input items is required")
        pieces: list[Piece] = []
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            pieces.append(Piece(Role.SYSTEM, instructions))
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given
        turn: list[Json] = []
        not_reconciled = ""
        for index, item in enumerate(map(as_dict, items)):
            kind = _item_type(item)
            if kind in TURN_ITEMS and (kind != "message" or item.get("role") == "assistant"):
                turn.append(item)
                continue
            if turn:
                pieces.append(Piece(Role.ASSISTANT, turn))
                turn = []
            role = MESSAGE_ROLES.get(text_of(item.get("role"))) if kind == "message" else None
            if role is not None:
                pieces.append(Piece(role, item))
            elif kind in CALL_OUTPUTS:
                pieces.append(Piece(Role.TOOL, item))
            else:
                not_reconciled = (
                    not_reconciled or f"input[{index}]: items of type {kind or '(none)'} are forwarded as sent"
                )
        if turn:
            pieces.append(Piece(Role.ASSISTANT, turn))
        for field in ("previous_response_id", "conversation"):
            if body.get(field):
                not_reconciled = f"{field}: the history is kept by the provider"
        return Conversation(
            pieces=tuple(pieces),
            model=text_of(body.get("model")),
            stream=body.get("stream") is True,
            max_output_tokens=count(body.get("max_output_tokens")),
            tools=tuple(as_list(body.get("tools"))),
            not_reconciled=not_reconciled,
        )

    def respelled(self, piece: Piece) -> Piece | None:
        """A message item that says only its role and text, as a string `input` is read: an agent that sent its
        first message as that string sends it back as an item (`{"content": ..., "role": "user"}`, its text
        maybe one `input_text` block)."""
        item = piece.source
        if piece.role is Role.ASSISTANT or not isinstance(item, dict) or not item.keys() <= {"type", "role", "content"}:
            return None
        content = item.get("content")
        text = content if isinstance(content, str) else respelled_text(content, "input_text")
        if _item_type(item) != "message" or not isinstance(text, str):
            return None
        return Piece(piece.role, {"role": item.get("role"), "content": text})

    def canonical(self, piece: Piece) -> Message:
        if isinstance(piece.source, str):  # the instructions
            return with_payload(self.api, piece, Message(role=Role.SYSTEM, content=piece.source), piece.source, 0)
        if piece.role is Role.ASSISTANT:
            message = self._turn(piece.source)
            return with_payload(self.api, piece, message, self._plain(message), 0)
        item = as_dict(piece.source)
        if piece.role is Role.TOOL:
            text, tokens = content_text(item.get("output"))
            message = Message(role=Role.TOOL, content=text, tool_call_id=_answered_call(item))
            return with_payload(self.api, piece, message, self._plain(message), tokens)
        text, tokens = content_text(item.get("content"))
        message = Message(role=piece.role, content=text)
        return with_payload(self.api, piece, message, {"role": item.get("role"), "content": text}, tokens)

    def _turn(self, items: Json) -> Message:
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        for item in map(as_dict, as_list(items)):
            kind = _item_type(item)
            call = _turn_call(item)
            if call is not None:
                calls.append(call)
            elif kind == "message":
                texts.extend(part_text(as_dict(part))[0] for part in as_list(item.get("content")))
                if isinstance(item.get("content"), str):
                    texts.append(item["content"])
            elif kind == "reasoning":
                reasoning.extend(text_of(as_dict(part).get("text")) for part in as_list(item.get("summary")))
            elif kind != "reasoning":
                texts.append(f"[{kind}]")
        return Message(
            role=Role.ASSISTANT, content=join(texts), reasoning_content=join(reasoning), tool_calls=tuple(calls)
        )

    def _plain(self, message: Message) -> Json:
        if message.role is Role.TOOL:
            return {"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content}
        items = adapters.openai_responses.to_request([message])["input"]
        return items if message.role is Role.ASSISTANT else items[0]

    def rewritten(self, body: dict[str, Any], view: Sequence[ViewEntry], cache: CacheHints) -> dict[str, Any]:
        out = dict(body)
        out.pop("instructions", None)
        items: list[Json] = []
        for index, entry in enumerate(view):
            value = entry.source if entry.source is not None else self._plain(entry.message)
            if index == 0 and entry.message.role is Role.SYSTEM and not isinstance(value, dict):
                out["instructions"] = value if isinstance(value, str) else entry.message.content
            elif isinstance(value, list):
                items.extend(value)
            else:
                items.append(value)
        out["input"] = items
        if cache.key and "prompt_cache_key" not in body:
            out["prompt_cache_key"] = cache.key
        return out

    def usage(self, response: dict[str, Any]) -> Usage:
        usage = as_dict(response.get("usage"))
        cached = count(as_dict(usage.get("input_tokens_details")).get("cached_tokens"))
        output, status = count(usage.get("output_tokens")), text_of(response.get("status"))
        return Usage(count(usage.get("input_tokens")), cached, output, status)

    def stream_usage(self, event: dict[str, Any], so_far: Usage) -> Usage:
        if event.get("type") not in ("response.completed", "response.incomplete", "response.failed"):
            return so_far
        return self.usage(as_dict(event.get("response")))

    def read_calls(self, response: dict[str, Any], name: str) -> list[ReadCall]:
        return [
            ReadCall(text_of(item.get("call_id")), text_of(item.get("arguments")))
            for item in map(as_dict, as_list(response.get("output")))
            if item.get("type") == "function_call" and item.get("name") == name
        ]

    def without_calls(self, response: dict[str, Any], name: str) -> dict[str, Any]:
        output = [
            i for i in map(as_dict, as_list(response.get("output")))
            if not (i.get("type") == "function_call" and i.get("name") == name)
        ]  # fmt: skip
        return {**response, "output": output}

    def continued(self, body: dict[str, Any], response: dict[str, Any], answers: dict[str, str]) -> dict[str, Any]:
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else as_list(given)
        output = as_list(response.get("output"))
        results = [
            {
                "type": "function_call_output",
                "call_id": item.get("call_id"),
                "output": answers.get(text_of(item.get("call_id")), NOT_RUN),
            }
            for item in map(as_dict, output)
            if item.get("type") == "function_call"
        ]
        return {**body, "input": [*items, *output, *results]}

    def error(self, status: int, message: str, code: str = "") -> bytes:
        return openai_error(status, message, code)

    def context_length_error(self, tokens: int, limit: int) -> bytes:
        return openai_context_length_error(tokens, limit)

    def refused_as_too_long(self, status: int, payload: bytes) -> bool:
        return openai_refused_as_too_long(status, payload)

"""OpenAI Chat Completions (`POST /v1/chat/completions`): one piece per message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxfold_client import Message, Role, ToolCall, Usage, adapters

from ctxfold.gateway import attachments
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
    dumps,
    error_of,
    text_of,
)
from ctxfold.gateway.pieces import Json, Piece, join, respelled_text, with_payload

ROLES = {
    "system": Role.SYSTEM,
    "developer": Role.SYSTEM,
    "user": Role.USER,
    "assistant": Role.ASSISTANT,
    "tool": Role.TOOL,
}
_ROLE_NAMES = {Role.SYSTEM: "system", Role.USER: "user", Role.ASSISTANT: "assistant", Role.TOOL: "tool"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
NOT_RUN = "ctxfold: this call was not run (the same turn read a stored result); call it again if it is still needed"


def openai_error(status: int, message: str, code: str = "") -> bytes:
    """OpenAI's error body, shared by Chat Completions and Responses."""
    kind = _ERROR_TYPES.get(status, "server_error")
    return dumps({"error": {"message": message, "type": kind, "param": None, "code": code or None}})


def openai_context_length_error(tokens: int, limit: int) -> bytes:
    message = (
        f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
        f"{tokens} tokens. Please reduce the length of the messages."
    )
    return openai_error(400, message, "context_length_exceeded")


def openai_refused_as_too_long(status: int, payload: bytes) -> bool:
    """OpenAI's `context_length_exceeded`, or the message compatible servers (vLLM, LiteLLM) send with it."""
    error = error_of(payload)
    message = text_of(error.get("message"))
    return status == 400 and (error.get("code") == "context_length_exceeded" or "maximum context length" in message)


def part_text(part: dict[str, Any]) -> tuple[str, int]:
    """The canonical text of one content part (Chat or Responses) and the tokens of what it is not."""
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text"):
        return text_of(part.get("text")), 0
    if kind == "refusal":
        return text_of(part.get("refusal")), 0
    if kind in ("image_url", "input_image"):
        image_url = part.get("image_url")
        detail = text_of(as_dict(image_url).get("detail")) or text_of(part.get("detail")) or "auto"
        url = text_of(as_dict(image_url).get("url")) or text_of(image_url)
        image = (
            attachments.image_from_url(url) if url else attachments.Attachment("image", text_of(part.get("file_id")))
        )
        return image.describe(), attachments.openai_image_tokens(image.width, image.height, detail)
    if kind in ("file", "input_file"):
        file = as_dict(part.get("file")) or part
        name = text_of(file.get("filename")) or text_of(file.get("file_id")) or text_of(file.get("file_url"))
        return attachments.Attachment("file", name).describe(), attachments.UNKNOWN_DOCUMENT_TOKENS
    if kind in ("input_audio",):
        return attachments.Attachment("audio", text_of(as_dict(part.get("input_audio")).get("format"))).describe(), 0
    return attachments.Attachment(str(kind), "").describe(), 0


def tool_call(call: dict[str, Any]) -> ToolCall:
    """A function call, or a custom tool's call (its free-form `input` as the arguments)."""
    kind, arguments = ("custom", "input") if call.get("type") == "custom" else ("function", "arguments")
    spec = as_dict(call.get(kind))
    return ToolCall(id=text_of(call.get("id")), name=text_of(spec.get("name")), arguments=text_of(spec.get(arguments)))


def content_text(content: Json) -> tuple[str, int]:
    if isinstance(content, str) or content is None:
        return content or "", 0
    texts, tokens = [], 0
    for part in as_list(content):
        text, cost = part_text(as_dict(part))
        texts.append(text)
        tokens += cost
    return join(texts), tokens


class OpenAIChat(ApiFormat):
    api = "openai_chat"
    provider = "openai"
    tool_format = "openai_chat"
    path = "/v1/chat/completions"
    history_key = "messages"

    def conversation(self, body: dict[str, Any]) -> Conversation:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("messages: a list of messages is required")
        pieces, not_reconciled = [], ""
        for index, message in enumerate(messages):
            name = as_dict(message).get("role")
            if name == "function":  # the legacy functions API's results: the provider reads them, ctxfold does not
                not_reconciled = (
                    not_reconciled or f"messages[{index}]: messages of role 'function' are forwarded as sent"
                )
                continue
            role = ROLES.get(text_of(name))
            if role is None:
                raise BadRequest(
                    f"messages[{index}].role: must be system, developer, user, assistant, tool or function"
                )
            pieces.append(Piece(role, message))
        return Conversation(
            pieces=tuple(pieces),
            model=text_of(body.get("model")),
            stream=body.get("stream") is True,
            max_output_tokens=count(body.get("max_completion_tokens")) or count(body.get("max_tokens")),
            tools=tuple(as_list(body.get("tools"))),
            not_reconciled=not_reconciled,
        )

    def respelled(self, piece: Piece) -> Piece | None:
        source = as_dict(piece.source)
        content = respelled_text(source.get("content"), "text")
        return None if content is None else Piece(piece.role, {**source, "content": content})

    def canonical(self, piece: Piece) -> Message:
        source = as_dict(piece.source)
        text, tokens = content_text(source.get("content"))
        calls = tuple(map(tool_call, map(as_dict, as_list(source.get("tool_calls")))))
        message = Message(
            role=piece.role,
            content=text or text_of(source.get("refusal")),
            tool_calls=calls,
            tool_call_id=text_of(source.get("tool_call_id")),
            reasoning_content=text_of(source.get("reasoning_content")),
            name=text_of(source.get("name")) if piece.role is not Role.TOOL else "",
        )
        return with_payload(self.api, piece, message, self._plain(message), tokens)

    def _plain(self, message: Message) -> Json:
        return adapters.openai_chat.to_message(message, include_reasoning=True)

    def rewritten(self, body: dict[str, Any], view: Sequence[ViewEntry], cache: CacheHints) -> dict[str, Any]:
        messages = [entry.source if entry.source is not None else self._plain(entry.message) for entry in view]
        out = {**body, "messages": messages}
        if cache.key and "prompt_cache_key" not in body:
            out["prompt_cache_key"] = cache.key
        return out

    def usage(self, response: dict[str, Any]) -> Usage:
        return self.stream_usage(response, Usage(0))  # a completion has the fields of its stream's last chunks

    def stream_usage(self, event: dict[str, Any], so_far: Usage) -> Usage:
        reason = so_far.finish_reason
        for choice in map(as_dict, as_list(event.get("choices"))):
            reason = text_of(choice.get("finish_reason")) or reason
        usage = as_dict(event.get("usage"))
        if not usage:
            return Usage(so_far.input_tokens, so_far.cached_input_tokens, so_far.output_tokens, reason)
        cached = count(as_dict(usage.get("prompt_tokens_details")).get("cached_tokens"))
        return Usage(count(usage.get("prompt_tokens")), cached, count(usage.get("completion_tokens")), reason)

    def read_calls(self, response: dict[str, Any], name: str) -> list[ReadCall]:
        message = as_dict(as_dict(next(iter(as_list(response.get("choices"))), {})).get("message"))
        return [
            ReadCall(text_of(call.get("id")), text_of(as_dict(call.get("function")).get("arguments")))
            for call in map(as_dict, as_list(message.get("tool_calls")))
            if as_dict(call.get("function")).get("name") == name
        ]

    def without_calls(self, response: dict[str, Any], name: str) -> dict[str, Any]:
        choices = [dict(as_dict(c)) for c in as_list(response.get("choices"))]
        if choices:
            message = dict(as_dict(choices[0].get("message")))
            calls = [
                c
                for c in map(as_dict, as_list(message.get("tool_calls")))
                if as_dict(c.get("function")).get("name") != name
            ]
            if calls:
                message["tool_calls"] = calls
            else:
                message.pop("tool_calls", None)
                choices[0]["finish_reason"] = "stop"
            choices[0]["message"] = message
        return {**response, "choices": choices}

    def continued(self, body: dict[str, Any], response: dict[str, Any], answers: dict[str, str]) -> dict[str, Any]:
        message = as_dict(as_dict(next(iter(as_list(response.get("choices"))), {})).get("message"))
        results = [
            {"role": "tool", "tool_call_id": call.get("id"), "content": answers.get(text_of(call.get("id")), NOT_RUN)}
            for call in map(as_dict, as_list(message.get("tool_calls")))
        ]
        return {**body, "messages": [*as_list(body.get("messages")), message, *results]}

    def error(self, status: int, message: str, code: str = "") -> bytes:
        return openai_error(status, message, code)

    def context_length_error(self, tokens: int, limit: int) -> bytes:
        return openai_context_length_error(tokens, limit)

    def refused_as_too_long(self, status: int, payload: bytes) -> bool:
        return openai_refused_as_too_long(status, payload)

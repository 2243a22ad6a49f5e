"""Rules for appending to the canonical transcript: what a well-formed message is, and which tool
calls are still waiting for results (a tool result must answer one of them; no other message may be
appended while they wait, so a view can never hold a call without its result or the reverse)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ctxfold.engine import estimator
from ctxfold.engine.errors import failed_precondition, invalid, too_large
from ctxfold.engine.model import MAX_NAME_CHARS, NewMessage, ProviderPayload, Role, SessionConfig, StoredMessage
from ctxfold.engine.tool_results import bound_tool_content

MAX_MESSAGES_PER_APPEND = 1000
MAX_TOOL_CALLS_PER_MESSAGE = 256
MAX_ID_CHARS = 256
MAX_PAYLOAD_FORMAT_CHARS = 64
MAX_PAYLOAD_FINGERPRINT_CHARS = 128
MAX_PAYLOAD_TOKENS = 10_000_000


@dataclass(frozen=True)
class AppendLimits:
    max_message_bytes: int  # non-tool content, reasoning and arguments of one message
    max_tool_result_bytes: int  # the raw result of one tool message


def validate_new_messages(messages: Sequence[NewMessage], limits: AppendLimits, field: str = "messages") -> None:
    """Checks each message on its own; errors name it as `field[index]` (the request's field)."""
    if len(messages) > MAX_MESSAGES_PER_APPEND:
        raise too_large(
            "TOO_MANY_MESSAGES",
            f"{len(messages)} messages in one append; at most {MAX_MESSAGES_PER_APPEND} are accepted",
        )
    for index, message in enumerate(messages):
        _validate_message(index, message, limits, field)


def _utf8_bytes(text: str) -> int:
    # `isascii` reads a flag of the string: most texts are measured without the copy `encode` makes
    # (for contents of up to `max_tool_result_bytes`; large appends are checked in a worker).
    return len(text) if text.isascii() else len(text.encode())


def _validate_message(index: int, message: NewMessage, limits: AppendLimits, field: str) -> None:
    where = f"{field}[{index}]"
    content_bytes = _utf8_bytes(message.content)
    if message.role is Role.TOOL:
        if not message.tool_call_id:
            raise invalid("INVALID_MESSAGE", f"{where}: a tool result needs tool_call_id", index=index)
        if content_bytes > limits.max_tool_result_bytes:
            raise too_large(
                "MESSAGE_TOO_LARGE",
                f"{where}: tool result of {content_bytes} bytes exceeds the server limit of "
                f"{limits.max_tool_result_bytes} bytes",
                index=index,
                bytes=content_bytes,
            )
        if message.tool_calls:
            raise invalid("INVALID_MESSAGE", f"{where}: a tool result cannot carry tool_calls", index=index)
    else:
        if message.tool_call_id:
            raise invalid("INVALID_MESSAGE", f"{where}: only tool results carry tool_call_id", index=index)
        size = content_bytes + _utf8_bytes(message.reasoning_content)
        size += sum(_utf8_bytes(c.arguments) for c in message.tool_calls)
        size += _utf8_bytes(message.payload.json) if message.payload else 0
        if size > limits.max_message_bytes:
            raise too_large(
                "MESSAGE_TOO_LARGE",
                f"{where}: message of {size} bytes exceeds the server limit of {limits.max_message_bytes} bytes",
                index=index,
                bytes=size,
            )
    if message.tool_calls and message.role is not Role.ASSISTANT:
        raise invalid("INVALID_MESSAGE", f"{where}: only assistant messages carry tool_calls", index=index)
    if len(message.tool_calls) > MAX_TOOL_CALLS_PER_MESSAGE:
        raise too_large("MESSAGE_TOO_LARGE", f"{where}: more than {MAX_TOOL_CALLS_PER_MESSAGE} tool calls")
    seen: set[str] = set()
    for call in message.tool_calls:
        if not call.id or not call.name:
            raise invalid("INVALID_MESSAGE", f"{where}: every tool call needs an id and a name", index=index)
        if call.id in seen:
            raise invalid("INVALID_MESSAGE", f"{where}: tool call id {call.id!r} repeats", index=index)
        if len(call.id) > MAX_ID_CHARS or len(call.name) > MAX_ID_CHARS:
            raise invalid("INVALID_MESSAGE", f"{where}: tool call id or name too long", index=index)
        seen.add(call.id)
    if len(message.tool_call_id) > MAX_ID_CHARS:
        raise invalid("INVALID_MESSAGE", f"{where}: tool_call_id too long", index=index)
    if len(message.name) > MAX_NAME_CHARS:
        raise invalid("INVALID_MESSAGE", f"{where}: name longer than {MAX_NAME_CHARS} characters", index=index)
    if message.payload is not None:
        _validate_payload(where, index, message.role, message.payload, limits)
    if (
        message.role is not Role.TOOL
        and not message.content
        and not message.tool_calls
        and not message.reasoning_content
        and not (message.payload and message.payload.json)
    ):
        raise invalid("INVALID_MESSAGE", f"{where}: message has no content", index=index)


def _validate_payload(where: str, index: int, role: Role, payload: ProviderPayload, limits: AppendLimits) -> None:
    if not payload.format or len(payload.format) > MAX_PAYLOAD_FORMAT_CHARS:
        raise invalid(
            "INVALID_MESSAGE",
            f"{where}: provider_payload.format must name the provider API in 1..{MAX_PAYLOAD_FORMAT_CHARS} characters",
            index=index,
        )
    if len(payload.fingerprint) > MAX_PAYLOAD_FINGERPRINT_CHARS:
        raise invalid(
            "INVALID_MESSAGE",
            f"{where}: provider_payload.fingerprint longer than {MAX_PAYLOAD_FINGERPRINT_CHARS} characters",
            index=index,
        )
    if not 0 <= payload.tokens <= MAX_PAYLOAD_TOKENS:
        raise invalid(
            "INVALID_MESSAGE", f"{where}: provider_payload.tokens must be within [0, {MAX_PAYLOAD_TOKENS}]", index=index
        )
    if role is Role.TOOL and _utf8_bytes(payload.json) > limits.max_message_bytes:
        # A tool result's own text is bounded by max_tool_result_bytes; its payload by the message limit.
        raise too_large(
            "MESSAGE_TOO_LARGE",
            f"{where}: provider_payload of {_utf8_bytes(payload.json)} bytes exceeds the server limit of "
            f"{limits.max_message_bytes} bytes",
            index=index,
        )


def advance_open_calls(
    open_calls: tuple[str, ...], messages: Sequence[NewMessage | StoredMessage], field: str = "messages"
) -> tuple[str, ...]:
    """The tool calls still awaiting results after appending `messages`, or FAILED_PRECONDITION when a
    result answers no waiting call or a message other than a result arrives while calls wait."""
    waiting = list(open_calls)
    for index, message in enumerate(messages):
        if message.role is Role.TOOL:
            if message.tool_call_id not in waiting:
                raise failed_precondition(
                    "TOOL_CALL_NOT_OPEN",
                    f"{field}[{index}]: tool result for {message.tool_call_id!r} answers no tool call that "
                    f"is waiting for a result (waiting: {', '.join(waiting) or 'none'})",
                    index=index,
                    tool_call_id=message.tool_call_id,
                )
            waiting.remove(message.tool_call_id)
            continue
        if waiting:
            raise failed_precondition(
                "TOOL_RESULTS_PENDING",
                f"{field}[{index}]: tool calls {', '.join(waiting)} are waiting for results; append their "
                "tool results first",
                index=index,
                waiting=",".join(waiting),
            )
        if message.role is Role.ASSISTANT:
            waiting = [call.id for call in message.tool_calls]
    return tuple(waiting)


def open_calls_at_end(messages: Sequence[StoredMessage]) -> tuple[str, ...]:
    """Calls still waiting at the end of a stored transcript suffix that starts at or before the last
    assistant message (used after Rewind and Fork move the head)."""
    waiting: list[str] = []
    for message in messages:
        if message.role is Role.ASSISTANT:
            waiting = [call.id for call in message.tool_calls]
        elif message.role is Role.TOOL:
            if message.tool_call_id in waiting:
                waiting.remove(message.tool_call_id)
        else:
            waiting = []
    return tuple(waiting)


def keeps_raw_result(role: Role) -> bool:
    """Tool results and user messages are stored whole under a result_ref (a user message by reference,
    no copy): a view or fold that shows part of one (a bounded result, a large task anchor, a long
    instruction) names where all of it is read with ReadToolResult."""
    return role in (Role.TOOL, Role.USER)


def stored_form(
    message: NewMessage, config: SessionConfig, message_id: str, result_ref: str, count_large: Callable[[str], int]
) -> tuple[StoredMessage, bytes | None]:
    """`message` as stored, but for its seq and time (given by the append): a tool result bounded to
    `tool_content_max_bytes`, its tokens counted once (never recomputed), and the raw bytes when its
    content is a cut of them. `result_ref` is "" unless `keeps_raw_result`; `count_large` counts large texts."""
    content, raw, raw_bytes, truncated = message.content, None, 0, False
    if message.role is Role.TOOL:
        bounded = bound_tool_content(message.content, config.tool_content_max_bytes, result_ref)
        content, raw_bytes, truncated = bounded.content, bounded.raw_bytes, bounded.truncated
        raw = None if bounded.exact else message.content.encode()
    tokens = estimator.message_tokens(content, message.tool_calls, message.reasoning_content, message.name, count_large)
    stored = StoredMessage(
        id=message_id,
        seq=0,
        role=message.role,
        content=content,
        tokens=tokens + (message.payload.tokens if message.payload else 0),
        tool_calls=message.tool_calls,
        tool_call_id=message.tool_call_id,
        reasoning_content=message.reasoning_content,
        pinned=message.pinned,
        name=message.name,
        author=message.author,
        result_ref=result_ref,
        raw_bytes=raw_bytes,
        truncated=truncated,
        payload=message.payload,
    )
    return stored, raw

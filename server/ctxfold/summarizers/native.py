"""The providers' own compaction, as a summarizer mode (`"compaction": "native"` in a summarizer's spec).

OpenAI Responses: `POST /v1/responses/compact` with the folded view as Responses input items; the
answer's `compaction` item (opaque `encrypted_content`, valid only for the Responses family, that
organisation and model) is kept verbatim and gives no text. Anthropic Messages: the folded view with
the `compact_20260112` context-management edit (beta `compact-2026-01-12`, paused after compaction);
the answer's `compaction` block is kept verbatim and its `content` is the summary text.

Either becomes the checkpoint's native item (`ProviderPayload`, format `openai_responses` or
`anthropic_messages`), re-emitted byte for byte with the summary message of every later view. When
the provider answers that it cannot compact (a 400 or 404, no compaction in the answer, an input
below Anthropic's trigger minimum) `Unsupported` says why, and the summarizer writes the
application summary instead."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from ctxfold.engine import estimator
from ctxfold.engine.errors import ConfigError
from ctxfold.engine.model import ProviderPayload, Role
from ctxfold.engine.view import ViewMessage
from ctxfold.summarizers.base import SummarizerError, SummaryResult

OPENAI_RESPONSES = "openai_responses"  # the API families, named as the gateway names them
ANTHROPIC_MESSAGES = "anthropic_messages"
ANTHROPIC_BETA = "compact-2026-01-12"
ANTHROPIC_EDIT = "compact_20260112"
# Anthropic compacts only from this many input tokens on (the trigger's least value).
ANTHROPIC_MIN_TRIGGER_TOKENS = 50_000
NATIVE = "native"
MODES = ("summary", NATIVE)


class Unsupported(Exception):
    """The provider cannot compact this request natively; the message says why."""


async def compacted_or_summary(
    compaction: str,
    compact: Callable[[], Awaitable[SummaryResult]],
    summary: Callable[[], Awaitable[SummaryResult]],
) -> SummaryResult:
    """The provider's compaction when the summarizer asks for it (`compaction` is NATIVE) and the
    provider can; else the application summary, which says why native compaction was not used."""
    if compaction != NATIVE:
        return await summary()
    try:
        return await compact()
    except Unsupported as why:
        return replace(await summary(), native_fallback=f"native compaction unsupported ({why})")


def payload(format_name: str, item: dict[str, Any]) -> ProviderPayload:
    """The native item as kept: its JSON as the provider wrote it (keys in order, compact)."""
    text = json.dumps(item, separators=(",", ":"), ensure_ascii=False)
    return ProviderPayload(format_name, text, "", estimator.count_text(text))


def responses_input(prefix: Sequence[ViewMessage]) -> list[dict[str, Any]]:
    """The folded view as OpenAI Responses input items: messages by role, an assistant's tool calls as
    `function_call` items and tool results as `function_call_output` items."""
    items: list[dict[str, Any]] = []
    for message in prefix:
        source = message.source
        if message.role is Role.TOOL:
            call_id = source.tool_call_id if source is not None else ""
            items.append({"type": "function_call_output", "call_id": call_id, "output": message.content})
            continue
        if message.content:
            items.append({"role": message.role.value, "content": message.content})
        for call in source.tool_calls if source is not None and message.role is Role.ASSISTANT else ():
            items.append({"type": "function_call", "call_id": call.id, "name": call.name, "arguments": call.arguments})
    return items


def compaction_of(content: bytes, what: str, provider: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The answer (its JSON object) and its one `compaction` item (OpenAI `output`) or block (Anthropic
    `content`); Unsupported when it holds none, SummarizerError when it is not JSON."""
    try:
        answer = json.loads(content)
    except ValueError:
        raise SummarizerError(f"{provider}: the compaction answer is not JSON") from None
    if not isinstance(answer, dict):
        raise SummarizerError(f"{provider}: the compaction answer is not a JSON object")
    entries = answer.get(what)
    found = [e for e in entries or [] if isinstance(e, dict) and e.get("type") == "compaction"]
    if not found:
        raise Unsupported(f"the answer holds no compaction {'item' if what == 'output' else 'block'}")
    return answer, found[-1]


def mode(name: str, spec: dict[str, Any]) -> str:
    """A summarizer spec's `compaction`: "summary" (the default: ctxfold's instruction) or "native"."""
    chosen = spec.get("compaction", "summary")
    if chosen not in MODES:
        raise ConfigError(f"summarizers.{name}: compaction must be one of {', '.join(MODES)}, got {chosen!r}")
    return str(chosen)


def unsupported_status(status: int, message: str) -> Unsupported:
    return Unsupported(f"the provider answered {status}: {message[:200]}")

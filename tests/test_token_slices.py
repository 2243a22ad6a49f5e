"""Counting a long text in slices gives exactly the count of the whole text (the slices exist so that
tiktoken never builds one huge token list while holding the GIL)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxfold.engine import estimator

# Characters around which the tokenizer's pre-split is subtle: spaces and other whitespace (also
# those only Python calls whitespace), newlines after punctuation, contractions, digit groups,
# numbers that are not decimal digits, letters outside ASCII, CJK without spaces, emoji.
TRICKY = (
    list(" \t\n\r\x0b\x0c\x1c\x85\xa0\u3000'.,;:!?/+-_=()[]{}\"#")
    + list("sdmtlverSDMT")
    + list("aZq0123456789²½٣éßЖ漢字かな。、😀")
)
texts = st.text(alphabet=st.sampled_from(TRICKY) | st.characters(), max_size=300)


def whole_count(text: str) -> int:
    return len(estimator._encoding().encode_ordinary(text))


@settings(max_examples=1500, deadline=None)
@given(text=texts, slice_chars=st.integers(min_value=1, max_value=40))
def test_slices_rejoin_to_the_text_and_their_counts_add_up_to_the_whole_count(text: str, slice_chars: int) -> None:
    parts = list(estimator.token_slices(text, slice_chars))
    assert "".join(parts) == text
    assert all(len(part) >= slice_chars for part in parts[:-1])
    assert sum(whole_count(part) for part in parts) == whole_count(text)


@settings(max_examples=30, deadline=None)
@given(words=st.lists(st.sampled_from(["hello", " world", "\n", "  ", "x1", "2024", "don't", '{"a": 1}']), max_size=40))
def test_count_text_is_the_whole_count(words: list[str]) -> None:
    text = "".join(words) * 3000  # long enough for many slices of the default size
    assert estimator.count_text(text) == whole_count(text)


def test_a_long_text_is_cut_into_slices_of_about_the_slice_size() -> None:
    text = ("abc12 " * 100_000)[:500_000]
    parts = list(estimator.token_slices(text))
    # Cut at the first position at or after the slice size: within one "abc12 " of it.
    assert all(estimator.SLICE_CHARS <= len(part) < estimator.SLICE_CHARS + 6 for part in parts[:-1])
    assert len(parts[-1]) <= estimator.SLICE_CHARS + 6


def test_text_without_cut_positions_is_one_slice() -> None:
    text = "漢字かな" * 30_000
    assert list(estimator.token_slices(text)) == [text]

"""The extractive summarizer: seven sections, refs of every folded result, within the token budget."""

from __future__ import annotations

from ctxfold.engine import estimator
from ctxfold.engine.model import Role
from ctxfold.engine.view import render
from ctxfold.summarizers.base import SECTIONS, SummaryRequest
from ctxfold.summarizers.extractive import HEADER, REFS_LABEL, ExtractiveSummarizer, briefing
from test_engine_view import conversation, msg


def request_for(messages, max_tokens: int = 2000, previous: str = "") -> SummaryRequest:  # type: ignore[no-untyped-def]
    return SummaryRequest(
        system_prompt="",
        tools_json="",
        prompt_cache_key="k",
        previous_summary=previous,
        prefix=[render(m, {}) for m in messages],
        folded=[render(m, {}) for m in messages],
        max_tokens=max_tokens,
    )


async def test_briefing_has_every_section_and_every_folded_ref() -> None:
    messages = conversation(4)
    messages.append(msg(Role.ASSISTANT, "Next I will edit src/app.py and rerun pytest"))
    result = await ExtractiveSummarizer().summarize(request_for(messages))
    assert result.finish_reason == "stop"
    for name in SECTIONS:
        assert f"## {name}" in result.text
    for m in messages:
        if m.role is Role.TOOL:
            assert m.result_ref in result.text
    assert "src/app.py" in result.text
    assert "Fix the failing test in src/app.py" in result.text
    assert "Next I will edit src/app.py" in result.text


def test_briefing_stays_within_budget_and_is_deterministic() -> None:
    messages = conversation(80, result_chars=400)
    text = briefing(request_for(messages, max_tokens=1500))
    assert estimator.count_text(text) <= 1500
    assert text == briefing(request_for(messages, max_tokens=1500))
    assert all(m.result_ref in text for m in messages if m.role is Role.TOOL)


def test_errors_are_reported_with_their_ref() -> None:
    messages = conversation(1)
    messages.append(msg(Role.ASSISTANT, "", calls=("boom",)))
    failing = msg(Role.TOOL, "Traceback (most recent call last):\nValueError: bad input", answers="boom")
    messages.append(failing)
    text = briefing(request_for(messages))
    errors = text.split("## Errors & fixes")[1].split("##")[0]
    assert "ValueError: bad input" in errors and failing.result_ref in errors


def test_previous_summary_is_rolled_in() -> None:
    text = briefing(request_for(conversation(1), previous="GOAL-SENTINEL-42 from the first fold"))
    assert "GOAL-SENTINEL-42" in text


def test_refs_of_earlier_folds_are_rolled_forward() -> None:
    first = conversation(3)
    first_text = briefing(request_for(first))
    second = conversation(3)
    text = briefing(request_for(second, previous=first_text))
    for m in [*first, *second]:
        if m.role is Role.TOOL:
            assert m.result_ref in text


def ref(i: int) -> str:
    """A made-up result_ref of the real shape."""
    return "tr_" + "".join("abcdefghijklmnopqrstuvwxyz234567"[(i >> (5 * k)) % 32] for k in range(16))


def test_the_ref_list_keeps_the_newest_within_its_share_and_counts_the_rest() -> None:
    refs = " ".join(ref(i) for i in range(300))
    previous = f"{HEADER}\n\n{REFS_LABEL}{refs}"
    messages = conversation(2)
    text = briefing(request_for(messages, max_tokens=1500, previous=previous))
    assert estimator.count_text(text) <= 1500
    assert all(m.result_ref in text for m in messages if m.role is Role.TOOL)
    assert ref(299) in text and ref(0) not in text
    assert "older ones: ListMessages shows every tool result" in text

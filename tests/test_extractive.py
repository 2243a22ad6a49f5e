"""The extractive summarizer: the narrative body (decisions, plan), merged section by section with the
previous body, deterministic and within its share of the budget."""

from __future__ import annotations

from ctxfold.engine import estimator
from ctxfold.engine.briefing import FoldNotes, render_summary
from ctxfold.engine.model import Role
from ctxfold.engine.view import render
from ctxfold.summarizers.base import SummaryRequest
from ctxfold.summarizers.extractive import BODY_SHARE, NO_PLAN, ExtractiveSummarizer, briefing
from test_engine_view import conversation, msg


def request_for(messages, max_tokens: int = 2000, previous: str = "", focus: str = "") -> SummaryRequest:  # type: ignore[no-untyped-def]
    return SummaryRequest(
        system_prompt="",
        tools_json="",
        prompt_cache_key="k",
        previous_summary=previous,
        prefix=[render(m, {}) for m in messages],
        folded=[render(m, {}) for m in messages],
        max_tokens=max_tokens,
        focus=focus,
    )


async def test_body_holds_the_decisions_and_the_last_plan() -> None:
    messages = conversation(4)
    messages.append(msg(Role.ASSISTANT, "Next I will edit src/app.py and rerun pytest"))
    result = await ExtractiveSummarizer().summarize(request_for(messages, focus="keep the API"))
    assert result.finish_reason == "stop"
    decisions, pending = result.text.split("## Pending & next step")
    assert "## Decisions" in decisions and "- step 0" in decisions and "- step 3" in decisions
    assert "Last stated plan: Next I will edit src/app.py" in pending and "Focus: keep the API" in pending


def test_body_without_any_assistant_text_is_never_empty() -> None:
    messages = [msg(Role.ASSISTANT, "", calls=("a",)), msg(Role.TOOL, "ok", answers="a")]
    assert briefing(request_for(messages)) == f"## Pending & next step\n- {NO_PLAN}"


def test_body_stays_within_its_share_and_is_deterministic() -> None:
    messages = conversation(200, result_chars=50)
    text = briefing(request_for(messages, max_tokens=1500))
    assert estimator.count_text(text) <= 1500 * BODY_SHARE
    assert text == briefing(request_for(messages, max_tokens=1500))
    # The oldest decisions went first.
    assert "- step 199" in text and "- step 0\n" not in text


def test_the_plan_is_clipped_to_what_the_body_may_take_in_any_language() -> None:
    """600 characters of a plan in Chinese are some 700 tokens: the body was over its budget, so every fold of a
    Chinese session at a 4k window failed (SUMMARIZER_FAILED), and every Prepare with it."""
    plan = "下一步我会修改源文件并重新运行测试，" * 40
    for focus in ("", "只修改解析器" * 100):
        text = briefing(request_for([msg(Role.ASSISTANT, plan)], max_tokens=256, focus=focus))
        assert estimator.count_text(text) <= 256 and "Last stated plan: 下一步我会修改" in text


def test_a_second_fold_merges_section_by_section_instead_of_nesting() -> None:
    first = briefing(request_for(conversation(2)))
    # What the view shows is the engine's rendering around the body; the next fold gets the body.
    shown = render_summary(FoldNotes(body=first, index_ref="tr_aaaaaaaaaaaaaaaa", index_results=4))
    later = conversation(1)
    later[1] = msg(Role.ASSISTANT, "later step", calls=("z",))
    for previous in (first, shown):
        text = briefing(request_for(later, previous=previous))
        assert text.count("## Decisions") == 1 and text.count("## Pending & next step") == 1
        assert "Earlier briefing" not in text and "[ctxfold summary" not in text and "Folded tool results" not in text
        decisions = text.split("## Decisions")[1].split("##")[0]
        assert decisions.index("- step 0") < decisions.index("- step 1") < decisions.index("- later step")
        assert "Last stated plan: later step" in text and "Last stated plan: step 1" not in text

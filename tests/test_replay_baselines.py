"""The baseline context policies of the replay benchmark: what each one sends, on small synthetic
conversations whose sizes are known, and their invariants on a real recorded trace."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from ctxfold.engine.model import ToolCall
from ctxfold.replay import baselines as b
from ctxfold.replay.metrics import AGENT_KEY, bill
from ctxfold.replay.prices import BUILT_IN
from ctxfold.replay.runner import load_trace_file
from ctxfold.replay.simulator import Provider, cache_model
from ctxfold.replay.trace import Msg, Trace, turns

TRACES = Path(__file__).resolve().parent / "data" / "traces"


def agent_trace(steps: int, result_words: int = 300) -> Trace:
    """user task, then `steps` × (assistant tool call, tool result of about `result_words` tokens)."""
    messages = [Msg("user", "Fix the failing test in app/models.py", source=0)]
    for step in range(steps):
        index = len(messages)
        messages.append(
            Msg("assistant", f"step {step}", tool_calls=(ToolCall(f"c{step}", "bash", f'{{"cmd": "run {step}"}}'),))
        )
        messages.append(Msg("tool", f"output{step} " + "lorem " * result_words, tool_call_id=f"c{step}"))
        messages[index] = Msg(messages[index].role, messages[index].content, messages[index].tool_calls, source=index)
        messages[index + 1] = Msg("tool", messages[index + 1].content, tool_call_id=f"c{step}", source=index + 1)
    messages.append(Msg("assistant", "All tests pass.", source=len(messages)))
    return Trace("synthetic", "You are a careful engineer.", "[]", tuple(messages))


def views(trace: Trace, policy: b.Policy) -> list[b.Step]:
    return [policy.step(turn.append) for turn in turns(trace)[0]]


def assert_well_formed(view: Sequence[Msg]) -> None:
    """Every tool result follows its call; every call has its results, except in the last message."""
    waiting: set[str] = set()
    for index, m in enumerate(view):
        if m.role == "tool":
            assert m.tool_call_id in waiting, f"result {m.tool_call_id} without its call"
            waiting.discard(m.tool_call_id)
        else:
            assert not waiting or index == len(view) - 1, f"calls {waiting} without results"
            waiting = {c.id for c in m.tool_calls}


def test_budget_uses_ctxfold_window_arithmetic() -> None:
    budget = b.Budget(window=16000, ratio=0.8, max_output_tokens=1000)
    assert (budget.trigger, budget.hard, budget.summary_max) == (12800, 16000 - 1000 - 256, 2000)
    assert b.Budget(window=1000).summary_max == 256


def test_full_history_sends_everything() -> None:
    trace = agent_trace(5)
    steps = views(trace, b.FullHistory(trace))
    assert [len(s.view) for s in steps] == [2, 4, 6, 8, 10, 12]
    assert all(s.action == "none" and not s.summary_calls for s in steps)


def test_truncate_drops_the_oldest_call_groups_to_fit_the_window() -> None:
    trace = agent_trace(30)  # ~310 tokens per step
    budget = b.Budget(window=3000)
    policy = b.Truncate(trace, budget)
    steps = views(trace, policy)
    for step in steps:
        assert policy.estimate(step.view) <= budget.hard
        assert step.view[0].role == "system"
        assert_well_formed(step.view)
    truncated = [s for s in steps if s.action == "truncated"]
    assert truncated and steps[-1].view[1].source > 1  # the task itself is gone: oldest first
    # Once truncation starts, each new step pushes the oldest group out: the start moves every call.
    firsts = [s.view[1].source for s in steps if s.action == "truncated"]
    assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)


def test_summarize_all_replaces_history_with_one_summary_at_the_trigger() -> None:
    trace = agent_trace(30)
    budget = b.Budget(window=4000)
    policy = b.SummarizeAll(trace, budget)
    steps = views(trace, policy)
    folds = [s for s in steps if s.action == "folded"]
    assert len(folds) >= 2
    for step in steps:
        assert policy.estimate(step.view) <= budget.hard
        assert sum(m.summary for m in step.view) <= 1
        assert_well_formed(step.view)
    previous = None
    for step in steps:
        if step.action == "folded":
            # system + summary + only the newest call group (the input the next call answers)
            assert [m.role for m in step.view] == ["system", "user", "assistant", "tool"]
            assert step.view[1].summary and "result_ref" not in step.view[1].content
            (call,) = step.summary_calls
            # A cache-safe fork: the agent's cache key, the view as it was sent so far, then the instruction.
            assert call.key == AGENT_KEY
            assert previous is not None and call.messages[: len(previous.view)] == previous.view
            assert "resume briefing" in call.messages[-1].content and call.output_tokens > 0
        previous = step


def test_rolling_condenser_keeps_the_first_message_and_a_half_window_tail() -> None:
    trace = agent_trace(30)
    budget = b.Budget(window=6000)
    policy = b.RollingCondenser(trace, budget, keep_first=1, max_events=12)
    steps = views(trace, policy)
    folds = [s for s in steps if s.action == "folded"]
    assert len(folds) >= 3
    for step in folds:
        view = step.view
        assert view[1].source == 0 and view[1].content.startswith("Fix the failing test")  # the task stays
        assert view[2].summary
        tail = view[3:]
        assert sum(b.message_estimate(m) + 4 for m in tail) <= budget.window // 2
        assert len(tail) <= 12 // 2
        (call,) = step.summary_calls
        assert call.key == b.CONDENSER_KEY and call.messages[0].content == b.CONDENSER_PROMPT
    for step in steps:
        assert len(step.view) - 1 <= 12 + 2 or step.action == "folded"
        assert_well_formed(step.view)
    # The second and later condensations roll the previous summary in.
    assert any(m.content.startswith("<PREVIOUS SUMMARY>") for m in folds[1].summary_calls[0].messages)


def test_masking_replaces_all_but_the_newest_tool_outputs() -> None:
    trace = agent_trace(8, result_words=20)
    policy = b.ToolMasking(trace, b.Budget(window=100_000), keep_recent=3)
    last = views(trace, policy)[-1].view
    results = [m for m in last if m.role == "tool"]
    assert len(results) == 8
    assert [m.content == b.MASK for m in results] == [True] * 5 + [False] * 3
    assert all(m.elided for m in results[:5]) and not any(m.elided for m in results[5:])
    assert_well_formed(last)


@pytest.mark.skipif(not (TRACES / "openhands-multi-swe-bench-0.json").exists(), reason="no traces")
def test_every_policy_on_a_real_trace_stays_well_formed_and_bills_consistently() -> None:
    trace = load_trace_file(TRACES / "openhands-multi-swe-bench-0.json")
    budget = b.Budget(window=10000)
    model_calls = sum(m.role == "assistant" for m in trace.messages)
    policies: list[b.Policy] = [
        b.Truncate(trace, budget),
        b.SummarizeAll(trace, budget),
        b.RollingCondenser(trace, budget),
        b.ToolMasking(trace, budget),
    ]
    for policy in policies:
        recording = b.record(trace, policy)
        assert len(recording.calls) == model_calls
        for call in recording.calls:
            assert_well_formed(call.view)
            assert call.over_limit == (policy.estimate(call.view) > budget.hard)  # type: ignore[attr-defined]
            if call.over_limit:  # only when the newest call group alone (a ~20k-character result) is too large
                assert call.view[-1].role == "tool" and b.message_estimate(call.view[-1]) > 4000
        result = bill(trace, recording, Provider(cache_model("deepseek"), BUILT_IN["deepseek-chat"]))
        assert result.turns == model_calls
        assert result.cache_hit_tokens + result.cache_miss_tokens == result.input_tokens
        assert 0 < result.cache_hit_ratio <= result.ideal_cache_hit_ratio
        assert result.over_limit_calls == sum(c.over_limit for c in recording.calls)
        assert result.summarizer_calls == len([s for c in recording.calls for s in c.summary_calls])

"""The baseline context policies of the replay benchmark: what each one sends, on small synthetic
conversations whose sizes are known, and their invariants on a real recorded trace."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest

from ctxfold.engine import estimator
from ctxfold.engine.model import ToolCall
from ctxfold.replay import baselines as b
from ctxfold.replay import peer_summary, probes
from ctxfold.replay.metrics import AGENT_KEY, bill
from ctxfold.replay.options import load_trace_file
from ctxfold.replay.prices import BUILT_IN
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


def test_peer_summary_is_a_self_contained_briefing_within_its_budget() -> None:
    trace = agent_trace(30)
    roles, folded = probes.classify(trace), trace.messages[:-1]
    text = peer_summary.briefing("", folded, roles, False, 400)
    assert estimator.count_text(text) <= 400
    assert "## Goal\n- Fix the failing test in app/models.py" in text  # the task survives the trimming
    assert "## Commands & outcomes" in text and 'bash({"cmd": "run 29"}) -> output29' in text  # newest kept
    assert 'run 0"' not in text  # the oldest commands went first
    later = peer_summary.briefing(text, folded[-2:], roles, False, 400)
    assert later.count(peer_summary.HEADER) == 1 and "- Earlier: " in later


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
        assert not budget.above_ceiling(policy.estimate(step.view))
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
        assert not budget.above_ceiling(policy.estimate(step.view))
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


def test_masking_masks_text_action_observations_too() -> None:
    # SWE-agent's observations are user messages answering a fenced command; the person's are not masked.
    messages = [Msg("user", "Fix the bug in app/x.py", source=0)]
    for step in range(12):
        messages.append(Msg("assistant", f"```\nrun {step}\n```", source=len(messages)))
        messages.append(Msg("user", f"output {step} " + "lorem " * 20, source=len(messages)))
    messages.append(Msg("assistant", "```\nsubmit\n```", source=len(messages)))
    trace = Trace("text", "sys", "[]", tuple(messages))
    last = views(trace, b.ToolMasking(trace, b.Budget(window=100_000)))[-1].view
    assert [m.content == b.MASK for m in last if m.role == "user"] == [False] + [True] * 2 + [False] * 10


def test_context_editing_clears_all_but_the_newest_three_when_that_frees_enough() -> None:
    trace = agent_trace(30)  # ~310 tokens per step
    budget = b.Budget(window=6000)  # trigger 4800
    policy = b.ContextEditing(trace, budget, keep=3, clear_at_least=2000)
    steps = views(trace, policy)
    clearings = [i for i, s in enumerate(steps) if s.action == "pruned"]
    assert clearings and all(steps[i].prunes == 1 for i in clearings)
    for index in clearings:
        view = steps[index].view
        results = [m for m in view if m.role == "tool"]
        assert [m.content == b.CLEARED for m in results[-3:]] == [False] * 3  # the newest three stay
        assert all(m.content == b.CLEARED and m.elided for m in results[:-3])
        cleared_ids = {m.tool_call_id for m in results[:-3]}
        calls = [c for m in view for c in m.tool_calls if c.id in cleared_ids]
        assert calls and all(c.arguments == b.CLEARED_INPUT for c in calls)  # clear_tool_inputs
        assert policy.estimate(view) < budget.trigger
    # Between clearings nothing is cleared again: each view extends the previous one (a stable prefix).
    for before, after in itertools.pairwise(steps):
        if after.action == "none":
            assert after.view[: len(before.view)] == before.view
    for step in steps:
        assert_well_formed(step.view)
        assert not budget.above_ceiling(policy.estimate(step.view))


def test_context_editing_does_not_clear_when_it_would_free_too_little() -> None:
    trace = agent_trace(30)
    policy = b.ContextEditing(trace, b.Budget(window=6000), clear_at_least=100_000)
    steps = views(trace, policy)
    assert not any(s.action == "pruned" for s in steps)
    assert any(s.action == "truncated" for s in steps)  # it falls back to dropping the oldest groups
    assert all(m.content != b.CLEARED for s in steps for m in s.view)


def test_summarize_all_keeping_user_messages_quotes_every_one_verbatim() -> None:
    messages = list(agent_trace(30).messages[:-1])
    # Longer than the extractive briefing quotes (400 characters), so plain summarize-all clips them.
    messages[0] = Msg("user", "Fix the failing test in app/models.py. " + "Detail. " * 80)
    asks = {5: "Please keep the public API unchanged.", 31: "Also add a regression test. " + "Reason. " * 80}
    for index, text in asks.items():  # the person speaks after a final answer, before the next call
        messages.insert(index, Msg("user", text))
        messages.insert(index, Msg("assistant", "Done with this part."))
    messages.append(Msg("assistant", "All tests pass."))
    trace = Trace("t", "sys", "[]", tuple(dataclasses.replace(m, source=i) for i, m in enumerate(messages)))
    budget = b.Budget(window=4000)
    keeping, plain = b.SummarizeAll(trace, budget, keep_user_messages=True), b.SummarizeAll(trace, budget)
    kept_steps, plain_steps = views(trace, keeping), views(trace, plain)
    assert sum(s.action == "folded" for s in kept_steps) >= 2
    appended = turns(trace)[0][-1].answer.source
    kept = probes.score(trace, kept_steps[-1].view, appended)
    lost = probes.score(trace, plain_steps[-1].view, appended)
    assert (kept.task_kept, kept.instructions_kept, kept.instructions) == (1, 2, 2)
    assert (lost.task_kept, lost.instructions_kept) == (0, 1)  # only the short request survives
    summary = next(m for m in kept_steps[-1].view if m.summary).content
    assert summary.count(b.USER_MESSAGES_HEADING) == 1  # carried forward, not nested
    quoted = summary.split(b.USER_MESSAGES_HEADING)[1]
    assert [quoted.count(text) for text in asks.values()] == [1, 1]
    assert all(call.output_tokens > 0 for s in kept_steps for call in s.summary_calls)


@pytest.mark.skipif(not (TRACES / "openhands-multi-swe-bench-0.json").exists(), reason="no traces")
def test_every_policy_on_a_real_trace_stays_well_formed_and_bills_consistently() -> None:
    trace = load_trace_file(TRACES / "openhands-multi-swe-bench-0.json")
    budget = b.Budget(window=10000)
    model_calls = sum(m.role == "assistant" for m in trace.messages)
    policies: list[b.Policy] = [
        b.Truncate(trace, budget),
        b.SummarizeAll(trace, budget),
        b.SummarizeAll(trace, budget, keep_user_messages=True),
        b.RollingCondenser(trace, budget),
        b.ToolMasking(trace, budget),
        b.ContextEditing(trace, budget),
    ]
    for policy in policies:
        recording = b.record(trace, policy)
        assert len(recording.calls) == model_calls
        for call in recording.calls:
            assert_well_formed(call.view)
            # A view above the window is the provider's refusal: a failed call, not a billed one.
            assert bool(call.refused) == budget.above_ceiling(policy.estimate(call.view))  # type: ignore[attr-defined]
            if call.refused:  # only when the newest call group alone (a ~20k-character result) is too large
                assert call.view[-1].role == "tool" and b.message_estimate(call.view[-1]) > 4000
        result = bill(trace, recording, Provider(cache_model("deepseek"), BUILT_IN["deepseek-chat"]))
        assert result.turns == model_calls
        assert result.cache_hit_tokens + result.cache_miss_tokens == result.input_tokens
        assert 0 < result.cache_hit_ratio <= result.ideal_cache_hit_ratio
        assert result.refused_calls == sum(bool(c.refused) for c in recording.calls)
        assert result.series_view_tokens.count(0) >= result.refused_calls
        assert result.summarizer_calls == len([s for c in recording.calls for s in c.summary_calls])

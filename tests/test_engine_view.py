"""The pure view engine: rendering, call groups, tail, prune selection and fold planning."""

from __future__ import annotations

import itertools

from ctxfold.engine import estimator
from ctxfold.engine.authorship import TOOLS
from ctxfold.engine.model import Role, SessionConfig, StoredMessage, ToolCall
from ctxfold.engine.view import (
    PRUNE_HEAD_CODE_POINTS,
    PRUNE_TAIL_CODE_POINTS,
    Checkpoint,
    build_view,
    call_groups,
    estimate,
    prune_candidates,
    prune_stub,
    recent_tail,
    split_fold,
    tail_budget,
)

_seq = itertools.count(1)


def msg(
    role: Role, content: str = "", calls: tuple[str, ...] = (), answers: str = "", pinned: bool = False
) -> StoredMessage:
    seq = next(_seq)
    tool_calls = tuple(ToolCall(c, "bash", '{"cmd": "ls"}') for c in calls)
    return StoredMessage(
        id=f"m{seq}",
        seq=seq,
        role=role,
        content=content,
        tokens=estimator.message_tokens(content, tool_calls),
        tool_calls=tool_calls,
        tool_call_id=answers,
        pinned=pinned,
        result_ref=f"tr{seq}" if role is Role.TOOL else "",
    )


def lines(chars: int) -> str:
    """Tool-output-like text (paths and numbers), about four characters per token."""
    text = "".join(f"src/module_{i}/file_{i * 7 % 13}.py:{i} ok\n" for i in range(chars // 20 + 1))
    return text[:chars]


def conversation(turns: int, result_chars: int = 200) -> list[StoredMessage]:
    out = [msg(Role.USER, "Fix the failing test in src/app.py")]
    for i in range(turns):
        out.append(msg(Role.ASSISTANT, f"step {i}", calls=(f"c{i}a", f"c{i}b")))
        out.append(msg(Role.TOOL, f"result {i}a " + lines(result_chars), answers=f"c{i}a"))
        out.append(msg(Role.TOOL, f"result {i}b " + lines(result_chars), answers=f"c{i}b"))
    return out


def test_call_groups_keep_calls_with_their_results() -> None:
    messages = conversation(3)
    groups = call_groups(messages, TOOLS)
    assert [len(g) for g in groups] == [1, 3, 3, 3]
    assert all(g[0].role is Role.ASSISTANT for g in groups[1:])


def test_tail_takes_newest_whole_groups_within_budget() -> None:
    messages = conversation(5)
    one_group = sum(m.tokens + estimator.PER_MESSAGE_TOKENS for m in messages[-3:])
    tail = recent_tail(messages, budget=2 * one_group + 1, pruned={}, mode=TOOLS)
    assert tail == messages[-6:]
    assert recent_tail(messages, budget=one_group - 1, pruned={}, mode=TOOLS) == []


def test_tail_budget_is_the_smallest_of_ratio_cap_and_headroom() -> None:
    config = SessionConfig(context_window=100_000, tail_ratio=0.16)
    assert tail_budget(config, 0, 0) == 16_000
    assert tail_budget(SessionConfig(context_window=1_000_000), 0, 0) == 32_000
    assert tail_budget(config, system_tokens=60_000, tools_tokens=0) == 10_000


def test_prune_stub_keeps_head_and_tail_and_names_the_ref() -> None:
    content = "".join(chr(0x4E00 + i % 500) for i in range(20_000))
    stub = prune_stub(content, "tr_abc")
    assert stub.startswith(content[:PRUNE_HEAD_CODE_POINTS])
    assert stub.endswith(content[-PRUNE_TAIL_CODE_POINTS:])
    assert 'result_ref="tr_abc"' in stub


def test_prune_candidates_are_large_results_outside_the_tail() -> None:
    messages = conversation(4, result_chars=9000)
    tail = messages[-3:]
    candidates = prune_candidates(messages, tail, pruned={messages[2].id: 10}, mode=TOOLS)
    assert messages[2] not in candidates  # already pruned
    assert all(m.role is Role.TOOL and m not in tail for m in candidates)
    assert len(candidates) == 5


def test_no_messages_have_no_prune_candidates() -> None:
    assert prune_candidates([], [], pruned={}, mode=TOOLS) == []


def test_view_renders_pruned_results_and_one_summary() -> None:
    messages = conversation(2, result_chars=9000)
    config = SessionConfig(context_window=50_000, system_prompt="You are careful.")
    checkpoint = Checkpoint("cp1", None, 0, "summary text", 3, ())
    stub_tokens = estimator.count_text(prune_stub(messages[2].content, messages[2].result_ref))
    pruned = {messages[2].id: stub_tokens}
    view = build_view(config, 4, checkpoint, [], messages, pruned)
    assert [v.summary for v in view].count(True) == 1
    assert view[0].role is Role.SYSTEM and view[1].summary
    stub = next(v for v in view if v.pruned)
    assert stub.tokens == stub_tokens and stub.source is messages[2]
    full = build_view(config, 4, checkpoint, [], messages, {})
    assert estimate(view, 0, config, 1.0) < estimate(full, 0, config, 1.0)


def test_fold_plan_keeps_last_user_input_pinned_and_tail_and_never_splits_groups() -> None:
    messages = conversation(6)
    pinned = msg(Role.USER, "Never touch migrations/", pinned=True)
    messages.append(pinned)
    messages += conversation(3)[1:]  # more call groups after the pinned note
    last_user = msg(Role.USER, "Now run the tests")
    messages.append(last_user)
    messages.append(msg(Role.ASSISTANT, "running", calls=("final",)))  # awaits its result
    tail = recent_tail(messages, budget=200, pruned={}, mode=TOOLS)
    plan = split_fold(messages, tail, anchor_end=0, mode=TOOLS)
    kept_ids = {m.id for m in plan.kept}
    assert pinned.id in kept_ids and last_user.id in kept_ids and messages[-1].id in kept_ids
    assert {m.id for m in plan.folded} | kept_ids == {m.id for m in messages}
    assert not kept_ids & {m.id for m in plan.folded}
    for group in call_groups(messages, TOOLS):
        ids = {m.id for m in group}
        assert ids <= kept_ids or not ids & kept_ids


def test_the_opening_system_message_is_kept_and_later_reminders_fold() -> None:
    opening = StoredMessage(id="sys", seq=1, role=Role.SYSTEM, content="You are a coding agent.", tokens=6)
    messages = [opening, *conversation(4)]
    reminder = msg(Role.SYSTEM, "Reminder: keep answers short")
    messages += [reminder, *conversation(4)[1:]]
    plan = split_fold(messages, recent_tail(messages, budget=100, pruned={}, mode=TOOLS), anchor_end=0, mode=TOOLS)
    assert opening in plan.kept
    assert reminder in plan.folded

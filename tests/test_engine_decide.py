"""The maintenance decisions, directly on the pure engine (no database, no server): what `decide`
chooses, why `accept` refuses a candidate, how `plan_pass` bisects the fold input, what `answer`
sends, and the lineage, open-call and folded-index functions the shell relies on."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxfold.engine import artifacts, estimator, folded_index
from ctxfold.engine.answer import RESPONSE_FRAMING_BYTES, Answering, answer, check_response_size
from ctxfold.engine.authorship import TEXT, TOOLS
from ctxfold.engine.briefing import FoldNotes, record_fold
from ctxfold.engine.candidate import Accepted, Rejected, accept, body_budget, summary_failure
from ctxfold.engine.context import AppendRequest, Context, SessionRecord, append_work
from ctxfold.engine.errors import DomainError
from ctxfold.engine.lineage import Segment, live_ranges, ranges_within, segment_holding
from ctxfold.engine.maintenance import (
    INSTRUCTION_TOKENS,
    Action,
    Answer,
    Blocked,
    Decision,
    Fold,
    FoldPass,
    MaintainRequest,
    NotFolded,
    Prune,
    Snapshot,
    Trigger,
    WhileMaintained,
    another_pass,
    decide,
    falls_back,
    offline_stand_in,
    plan_pass,
    unanswerable,
    while_maintained,
)
from ctxfold.engine.model import Author, NewMessage, Role, SessionConfig, StoredMessage, ToolCall
from ctxfold.engine.projection import Projection
from ctxfold.engine.prune import bound_to_fit, prune, prune_room
from ctxfold.engine.state import ContextState, ViewRecord, view_version
from ctxfold.engine.transcript import advance_open_calls, open_calls_at_end
from ctxfold.engine.view import PRUNE_MIN_CODE_POINTS, call_groups, prunable, result_ids, split_fold

_ids = itertools.count(1)
BIG = artifacts.Budget(8192, 8192, 8192)


def text(chars: int, salt: str = "") -> str:
    """Tool-output-like text (paths and numbers), about four characters per token."""
    body = "".join(f"src/{salt}module_{i}/file_{i * 7 % 13}.py:{i} ok\n" for i in range(chars // 20 + 1))
    return body[:chars]


def conversation(result_chars: list[int]) -> list[StoredMessage]:
    """A task, then one assistant call and its result per entry of `result_chars`."""
    messages: list[StoredMessage] = []

    def add(role: Role, content: str, calls: tuple[ToolCall, ...] = (), answers: str = "") -> None:
        seq = len(messages) + 1
        messages.append(
            StoredMessage(
                id=f"m{next(_ids)}",
                seq=seq,
                role=role,
                content=content,
                tokens=estimator.message_tokens(content, calls),
                tool_calls=calls,
                tool_call_id=answers,
                result_ref=f"tr{seq}" if role is Role.TOOL else "",
            )
        )

    add(Role.USER, "Fix the failing test in src/app.py")
    for turn, chars in enumerate(result_chars):
        call = ToolCall(f"call{turn}", "bash", f'{{"command": "pytest -k case{turn}"}}')
        add(Role.ASSISTANT, f"step {turn}", (call,))
        add(Role.TOOL, text(chars, salt=str(turn)), answers=call.id)
    return messages


def projection(messages: list[StoredMessage], window: int = 1_000_000, **config: object) -> Projection:
    return Projection(
        config=SessionConfig(context_window=window, **config),  # type: ignore[arg-type]
        system_tokens=0,
        tools_tokens=0,
        calibration=1.0,
        checkpoint=None,
        kept=(),
        after=tuple(messages),
        pruned={},
    )


def sized(messages: list[StoredMessage], ratio: float) -> Projection:
    """The projection of `messages` in a window they fill to `ratio` (the estimate does not depend on
    the window here: no reserved output, a small opening)."""
    tokens = projection(messages).tokens()
    return projection(messages, window=int(tokens / ratio))


SMALL = [2000] * 30  # ~15k tokens, nothing prunable
LARGE = [PRUNE_MIN_CODE_POINTS * 4] * 12 + [2000] * 2  # old results worth pruning, a small recent tail


def snapshot(projection: Projection, failed_fold_tokens: int = 0) -> Snapshot:
    return Snapshot(projection, projection.tokens(), failed_fold_tokens)


def run_decisions(snap: Snapshot, request: MaintainRequest) -> list[Decision]:
    """Decides, applies each Prune as the driver installs it, and decides again until anything else."""
    decisions: list[Decision] = []
    while True:
        decision = decide(snap, request)
        decisions.append(decision)
        if not isinstance(decision, Prune):
            return decisions
        snap = replace(snap, projection=decision.candidate)


THRESHOLD = MaintainRequest(Trigger.THRESHOLD)
OVERFLOW = MaintainRequest(Trigger.OVERFLOW)
COMPACT = MaintainRequest(Trigger.COMPACT, keep_tokens=0)


@dataclass(frozen=True)
class Case:
    name: str
    results: list[int]
    ratio: float
    request: MaintainRequest
    expected: list[type]
    failed_fold: bool = False  # the memo holds exactly the loaded view's tokens
    must_fold: bool | None = None  # of the final Fold, when it is one


CASES = [
    Case("below the trigger nothing happens", SMALL, 0.5, THRESHOLD, [Answer]),
    Case("at the trigger with nothing to prune it folds", SMALL, 0.9, THRESHOLD, [Fold], must_fold=False),
    Case("above the hard ceiling it must fold", SMALL, 1.3, THRESHOLD, [Fold], must_fold=True),
    Case("an overflow folds below the trigger", SMALL, 0.5, OVERFLOW, [Fold], must_fold=False),
    Case("a compact folds below the trigger", SMALL, 0.3, COMPACT, [Fold], must_fold=True),
    Case("a dry run decides as its compact", SMALL, 0.3, replace(COMPACT, dry_run=True), [Fold], must_fold=True),
    Case("a compact does not prune first", LARGE, 0.9, COMPACT, [Fold], must_fold=True),
    Case("pruning enough answers", LARGE, 0.85, THRESHOLD, [Prune, Answer]),
    Case("pruning not enough folds", LARGE, 5.0, THRESHOLD, [Prune, Fold], must_fold=False),
    Case("pruned but above the ceiling it must fold", LARGE, 8.0, THRESHOLD, [Prune, Fold], must_fold=True),
    Case("a failed fold of the same input blocks", SMALL, 0.9, THRESHOLD, [Blocked], failed_fold=True),
    Case("the memo yields above the ceiling", SMALL, 1.3, THRESHOLD, [Fold], failed_fold=True, must_fold=True),
    Case("the memo yields to an overflow", SMALL, 0.9, OVERFLOW, [Fold], failed_fold=True, must_fold=False),
    Case("the memo answers once a prune is enough", LARGE, 0.85, THRESHOLD, [Prune, Answer], failed_fold=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide(case: Case) -> None:
    view = sized(conversation(case.results), case.ratio)
    decisions = run_decisions(snapshot(view, view.tokens() if case.failed_fold else 0), case.request)
    assert [type(d) for d in decisions] == case.expected
    last = decisions[-1]
    if isinstance(last, Fold):
        assert last.must_fold is case.must_fold
    if isinstance(last, Blocked):
        assert last.tokens == view.tokens()
        assert f"({view.tokens()} tokens) failed" in last.detail


def test_a_view_grown_past_the_failed_fold_is_folded_again() -> None:
    view = sized(conversation(SMALL), 0.9)
    assert isinstance(decide(snapshot(view, view.tokens() - 1), THRESHOLD), Fold)


def test_a_prune_is_only_proposed_when_it_makes_the_view_smaller() -> None:
    view = sized(conversation(LARGE), 0.85)
    prune = decide(snapshot(view), THRESHOLD)
    assert isinstance(prune, Prune)
    in_tail = {m.id for m in view.tail()}
    results = result_ids(view.messages, view.mode)
    large_and_old = {m.id for m in view.messages if prunable(m, results) and m.id not in in_tail}
    assert set(prune.candidate.pruned) == large_and_old
    assert prune.results == len(large_and_old) > 0
    assert prune.candidate.tokens() < view.tokens()


def test_a_prune_that_leaves_no_room_below_the_trigger_is_not_installed_alone() -> None:
    """It would be followed by the next turn's fold: two prefix changes where the fold alone makes one."""
    messages = conversation(LARGE)

    def after_prune(view: Projection) -> int:
        return replace(view, pruned=prune(view)).tokens()

    # A window whose trigger the pruned view passes under, but with less room than prune_room.
    tight = next(
        view
        for window in range(20_000, 200_000, 250)
        if (view := projection(messages, window=window)).tokens() >= view.config.trigger_tokens
        and view.config.trigger_tokens - prune_room(view) <= after_prune(view) < view.config.trigger_tokens
    )
    assert isinstance(decide(snapshot(tight), THRESHOLD), Fold)
    assert isinstance(decide(snapshot(tight), MaintainRequest(Trigger.OVERFLOW)), Prune)
    roomy = sized(messages, 0.85)  # the same prune leaves room: it is installed and nothing folds
    assert after_prune(roomy) < roomy.config.trigger_tokens - prune_room(roomy)
    assert isinstance(decide(snapshot(roomy), THRESHOLD), Prune)


@settings(max_examples=60, deadline=None)
@given(
    results=st.lists(st.integers(100, 40_000), min_size=1, max_size=25),
    ratio=st.floats(0.1, 3.0),
    trigger=st.sampled_from(list(Trigger)),
)
def test_deciding_after_each_prune_ends_and_every_prune_shrinks_the_view(
    results: list[int], ratio: float, trigger: Trigger
) -> None:
    view = sized(conversation(results), ratio)
    decisions = run_decisions(snapshot(view), MaintainRequest(trigger))
    prunes = [d for d in decisions if isinstance(d, Prune)]
    assert len(prunes) <= 1  # the tail only grows as results are pruned, so one prune takes them all
    tokens = [view.tokens()] + [p.candidate.tokens() for p in prunes]
    assert tokens == sorted(tokens, reverse=True) and len(set(tokens)) == len(tokens)
    if trigger is Trigger.COMPACT:
        assert decisions == [Fold(must_fold=True)]


# ---- accept ------------------------------------------------------------------------------------------


def first_pass(view: Projection, window: int = 1_000_000) -> tuple[FoldPass, FoldNotes]:
    plan = plan_pass(view, window)
    assert plan.first is not None
    folded = [v.source for v in plan.first.folded if v.source is not None]
    record = record_fold(
        None, folded_index.FoldedIndex(), view.messages, folded, "tr-index", BIG, view.anchor_end, view.mode
    )
    return plan.first, replace(record.notes, summarizer="extractive")


def test_accept_a_smaller_candidate() -> None:
    view = sized(conversation(SMALL), 0.9)
    fold, notes = first_pass(view)
    outcome = accept(view, fold, notes, "## Goal\nfix the test", "cp-1")
    assert isinstance(outcome, Accepted)
    checkpoint = outcome.checkpoint
    assert (checkpoint.id, checkpoint.parent_id, checkpoint.position_seq) == ("cp-1", None, fold.position_seq)
    assert checkpoint.kept_ids == tuple(m.id for m in fold.kept)
    assert checkpoint.notes is not None and checkpoint.notes.body == "## Goal\nfix the test"
    assert outcome.candidate.tokens() < view.tokens()
    assert [v.summary for v in outcome.candidate.view()].count(True) == 1


def test_accept_refuses_a_body_over_its_budget_before_building_a_candidate() -> None:
    view = sized(conversation(SMALL), 0.9)
    fold, notes = first_pass(view)
    budget = body_budget(notes, view.config)
    outcome = accept(view, fold, notes, text(budget * 8), "cp-1")
    assert outcome == Rejected(f"the summary has more than the {budget} tokens left for it", "SUMMARIZER_FAILED")


def test_accept_refuses_a_candidate_that_is_not_smaller() -> None:
    view = sized(conversation([40] * 6), 0.9)  # a few short results: any real summary is longer
    fold, notes = first_pass(view)
    body = "word " * (body_budget(notes, view.config) // 2)  # within its budget, longer than the view
    outcome = accept(view, fold, notes, body, "cp-1")
    assert isinstance(outcome, Rejected)
    assert (outcome.reason, outcome.not_folded) == ("COMPACT_FAILED", NotFolded.NOT_SMALLER)
    assert f"is not smaller than the view ({view.tokens()})" in outcome.why


@pytest.mark.parametrize(
    ("text", "finish_reason", "failure"),
    [
        ("## Goal\nx", "stop", ""),
        ("## Goal\nx", "length", "the summary was truncated (finish_reason=length)"),
        ("", "stop", "the summary was empty"),
    ],
)
def test_summary_failure(text: str, finish_reason: str, failure: str) -> None:
    assert summary_failure(text, finish_reason) == failure


# ---- plan_pass: the bisection over call groups ---------------------------------------------------------


def read_through(view: Projection, group: list[StoredMessage]) -> int:
    """Tokens of the view up to and including the end of `group`: what a pass folding it reads."""
    shown = view.view()
    end = next(i for i, v in enumerate(shown) if v.source is not None and v.source.id == group[-1].id)
    return sum(v.tokens + estimator.PER_MESSAGE_TOKENS for v in shown[: end + 1])


@settings(max_examples=80, deadline=None)
@given(
    results=st.lists(st.integers(100, 12_000), min_size=2, max_size=30),
    window=st.integers(600, 40_000),
    keep_tokens=st.one_of(st.none(), st.integers(0, 5_000)),
)
def test_a_pass_reads_the_longest_prefix_of_whole_groups_that_fits(
    results: list[int], window: int, keep_tokens: int | None
) -> None:
    view = projection(conversation(results), window=60_000)
    groups = call_groups(
        split_fold(view.messages, view.tail(keep_tokens), view.anchor_end, view.mode).folded, view.mode
    )
    available = window - INSTRUCTION_TOKENS
    try:
        plan = plan_pass(view, window, keep_tokens)
    except DomainError as error:
        assert error.reason == "FOLD_INPUT_TOO_LARGE"
        assert read_through(view, groups[0]) > available  # not even the first group fits
        return
    if not groups:
        assert plan.first is None and plan.passes_planned == 0
        return
    fold = plan.first
    assert fold is not None
    assert fold.input_tokens == read_through(view, fold_groups(groups, fold)[-1]) <= available
    taken = fold_groups(groups, fold)
    assert [v.source.id for v in fold.folded if v.source] == [m.id for g in taken for m in g]  # whole groups
    assert fold.final is (len(taken) == len(groups))
    if fold.final:
        assert (fold.position_seq, plan.passes_planned) == (view.head_seq, 1)
    else:
        assert read_through(view, groups[len(taken)]) > available  # one more group would not fit
        assert fold.position_seq == taken[-1][-1].seq
        assert plan.passes_planned >= 2
    assert all(m.seq <= fold.position_seq for m in fold.kept)


def fold_groups(groups: list[list[StoredMessage]], fold: FoldPass) -> list[list[StoredMessage]]:
    """The oldest groups whose messages `fold` folds, up to the first it does not."""
    folded = {v.source.id for v in fold.folded if v.source is not None}
    return list(itertools.takewhile(lambda group: group[0].id in folded, groups))


# ---- answer ------------------------------------------------------------------------------------------


def answering(view: Projection, state: ContextState, **changes: object) -> Answering:
    base = Answering(view, state, view.view(), view.tokens(), Action.NONE, view.head_seq, None)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_an_append_only_prepare_sends_only_the_new_messages() -> None:
    view = projection(conversation(SMALL))
    count = len(view.view())
    previous = view_version(1, count - 2)
    state = replace(ContextState(fingerprint="f"), views=(ViewRecord(previous, 100),))
    answered = answer(answering(view, state), previous, now=50.0)
    assert answered.delta
    assert answered.messages == view.view()[count - 2 :]
    assert answered.view_version == view_version(1, count)
    assert answered.stable_prefix_messages == count - 2
    assert answered.state.views[-1] == ViewRecord(view_version(1, count), view.raw_tokens())
    assert (answered.state.last_activity, answered.state.telemetry["prepares"]) == (50.0, 1)


@pytest.mark.parametrize(
    ("known", "why"),
    [
        (0, "no known version"),
        (view_version(2, 3), "another generation"),
        (view_version(1, 10_000), "longer than the view"),
    ],
)
def test_a_version_that_is_not_a_prefix_gets_the_whole_view(known: int, why: str) -> None:
    view = projection(conversation(SMALL))
    answered = answer(answering(view, ContextState(fingerprint="f")), known, now=0.0)
    assert not answered.delta, why
    assert answered.messages == view.view()


def test_after_a_prune_the_stable_prefix_is_what_the_two_views_share() -> None:
    before = sized(conversation(LARGE), 0.85)
    prune = decide(snapshot(before), THRESHOLD)
    assert isinstance(prune, Prune)
    state = ContextState(fingerprint="f", generation=2)
    answered = answer(answering(prune.candidate, state, first_view=before.view(), action=Action.PRUNED), 0, 0.0)
    first_pruned = next(i for i, v in enumerate(prune.candidate.view()) if v.pruned)
    assert answered.stable_prefix_messages == first_pruned
    assert answered.view_version == view_version(2, len(prune.candidate.view()))


def test_a_dry_run_answers_its_candidate_without_a_version() -> None:
    view = sized(conversation(SMALL), 0.9)
    fold, notes = first_pass(view)
    outcome = accept(view, fold, notes, "## Goal\nfix the test", "cp-1")
    assert isinstance(outcome, Accepted)
    answered = answer(answering(view, ContextState(fingerprint="f"), candidate=outcome.candidate), 0, 0.0)
    assert (answered.view_version, answered.checkpoint_id, answered.delta) == (0, "", False)
    assert answered.messages == outcome.candidate.view()
    assert answered.candidate_summary == outcome.checkpoint.summary
    assert answered.folded_results_ref == "tr-index"
    # The bookkeeping records the installed view, not the candidate.
    assert answered.state.views[-1].version == view_version(1, len(view.view()))


@pytest.mark.parametrize(("extra_bytes", "too_large"), [(-1, False), (0, False), (1, True)])
def test_a_view_whose_text_cannot_fit_one_response_is_refused(extra_bytes: int, too_large: bool) -> None:
    view = projection(conversation([3000] * 4)).view()
    calls = [c for v in view if v.source is not None for c in v.source.tool_calls]
    size = sum(len(v.content.encode()) for v in view) + sum(len(c.arguments.encode()) for c in calls)
    bound = size + RESPONSE_FRAMING_BYTES - extra_bytes  # the text's size is at the bound's edge
    if not too_large:
        check_response_size(view, bound)
        return
    with pytest.raises(DomainError) as refused:
        check_response_size(view, bound)
    assert refused.value.reason == "RESPONSE_TOO_LARGE"
    assert refused.value.metadata == {"view_bytes": str(size), "max_response_bytes": str(size - 1)}


# ---- lineage, open calls, rolled-forward refs ---------------------------------------------------------


@st.composite
def segment_trees(draw: st.DrawFn) -> tuple[dict[str, Segment], dict[str, int]]:
    """Segments where each child starts at or below its parent's tip, and a tip in some of them."""
    segments = {"s0": Segment("s0", None, 0)}
    tips = {"s0": draw(st.integers(0, 30))}
    for index in range(1, draw(st.integers(1, 8))):
        parent = draw(st.sampled_from(sorted(segments)))
        base = draw(st.integers(segments[parent].base_seq, max(segments[parent].base_seq, tips.get(parent, 0))))
        segments[f"s{index}"] = Segment(f"s{index}", parent, base)
        tips[f"s{index}"] = base + draw(st.integers(0, 10))
    chosen = draw(st.lists(st.sampled_from(sorted(tips)), min_size=1, unique=True))
    return segments, {s: tips[s] for s in chosen}


@settings(max_examples=100, deadline=None)
@given(tree=segment_trees(), window=st.tuples(st.integers(0, 45), st.integers(0, 45)))
def test_live_ranges_hold_seqs_one_to_the_head_once_each_along_the_parent_chain(
    tree: tuple[dict[str, Segment], dict[str, int]], window: tuple[int, int]
) -> None:
    segments, tips = tree
    for head, tip in tips.items():
        chain, current = [], head
        while current is not None:
            chain.append(current)
            current = segments[current].parent_id
        ranges = live_ranges(segments, head, tip)
        held = [seq for r in reversed(ranges) for seq in range(r.lo + 1, r.hi + 1)]
        assert held == list(range(1, tip + 1))  # every seq once, oldest first when reversed
        assert all(r.hi > r.lo for r in ranges)
        assert [r.segment_id for r in ranges] == [s for s in chain if s in {r.segment_id for r in ranges}]
        for seq in range(1, tip + 1):
            owner = segment_holding(ranges, seq)
            assert owner is not None and segments[owner].base_seq < seq
        lo, hi = sorted(window)
        inside = [seq for r in ranges_within(ranges, lo, hi) for seq in range(r.lo + 1, r.hi + 1)]
        assert sorted(inside) == [seq for seq in range(1, tip + 1) if lo < seq <= hi]


@st.composite
def valid_appends(draw: st.DrawFn) -> list[NewMessage]:
    """Turns an agent may append: user text, or an assistant message whose calls are all answered
    (in any order) before anything else, the last turn possibly still waiting for some."""
    messages: list[NewMessage] = []
    for turn in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            messages.append(NewMessage(Role.USER, f"ask {turn}"))
            continue
        calls = tuple(ToolCall(f"t{turn}c{i}", "bash", "{}") for i in range(draw(st.integers(0, 3))))
        messages.append(NewMessage(Role.ASSISTANT, f"act {turn}", calls))
        order = draw(st.permutations([c.id for c in calls]))
        messages += [NewMessage(Role.TOOL, "out", tool_call_id=call_id) for call_id in order]
    if draw(st.booleans()):
        calls = tuple(ToolCall(f"lastc{i}", "bash", "{}") for i in range(draw(st.integers(1, 3))))
        messages.append(NewMessage(Role.ASSISTANT, "last", calls))
        answered = draw(st.lists(st.sampled_from([c.id for c in calls]), unique=True))
        messages += [NewMessage(Role.TOOL, "out", tool_call_id=call_id) for call_id in answered]
    return messages


@settings(max_examples=100, deadline=None)
@given(appends=valid_appends(), cut=st.integers(0, 40))
def test_open_calls_read_back_from_the_transcript_are_those_the_appends_left(
    appends: list[NewMessage], cut: int
) -> None:
    stored = [
        StoredMessage(f"m{i}", i + 1, m.role, m.content, 1, m.tool_calls, m.tool_call_id) for i, m in enumerate(appends)
    ]
    assert open_calls_at_end(stored) == advance_open_calls((), appends)
    # After a rewind to any earlier point the calls still open there are the appends' up to it.
    prefix = appends[: min(cut, len(appends))]
    assert open_calls_at_end(stored[: len(prefix)]) == advance_open_calls((), prefix)


@settings(max_examples=40, deadline=None)
@given(results=st.lists(st.integers(50, 3_000), min_size=6, max_size=20), first=st.integers(1, 4))
def test_a_second_fold_rolls_the_first_folds_refs_forward(results: list[int], first: int) -> None:
    messages = conversation(results)
    folded_once = [m for m in messages[1 : 1 + 2 * first]]
    one = record_fold(None, folded_index.FoldedIndex(), messages, folded_once, "tr-a", BIG, 1, TOOLS)
    stored = folded_index.parse(folded_index.render(one.index))
    assert stored == one.index  # the document reads back as written
    folded_twice = messages[1 + 2 * first : -2]
    two = record_fold(one.notes, stored, messages, folded_twice, "tr-b", BIG, 1, TOOLS)
    refs = [e.result_ref for e in two.index.entries]
    expected = {m.result_ref for m in [*folded_once, *folded_twice] if m.role is Role.TOOL}
    assert sorted(refs) == sorted(expected) and len(refs) == len(set(refs))
    assert two.new_results == len([m for m in folded_twice if m.role is Role.TOOL])
    assert (two.notes.index_ref, two.notes.index_results) == ("tr-b", len(expected))


# ---- the last resort: results bounded to fit ------------------------------------------------------


def parallel_reads(sizes: list[int]) -> list[StoredMessage]:
    """A task, then one assistant message with a call per entry of `sizes` and their results (the
    input the next call must answer: nothing of it can be folded)."""
    calls = tuple(ToolCall(f"read{i}", "Read", f'{{"file_path": "src/f{i}.py"}}') for i in range(len(sizes)))
    base = next(_ids)
    messages = [
        StoredMessage(f"t{base}", 1, Role.USER, "Read the parser", 5, result_ref="trtask"),
        StoredMessage(f"a{base}", 2, Role.ASSISTANT, "", estimator.message_tokens("", calls), calls),
    ]
    for i, chars in enumerate(sizes):
        content = text(chars, salt=f"r{i}")
        messages.append(
            StoredMessage(
                f"r{base}_{i}",
                3 + i,
                Role.TOOL,
                content,
                estimator.count_text(content),
                (),
                f"read{i}",
                result_ref=f"trr{i}",
            )
        )
    return messages


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 30_000), min_size=1, max_size=8), window=st.sampled_from([8000, 16000, 32000]))
def test_bounding_the_pending_results_makes_any_view_of_tool_results_fit(sizes: list[int], window: int) -> None:
    view = projection(parallel_reads(sizes), window=window)
    bound = bound_to_fit(view)
    if view.tokens() <= view.config.hard_limit_tokens:
        assert bound is None
        return
    assert bound is not None
    candidate = bound.candidate
    assert candidate.tokens() <= view.config.hard_limit_tokens
    shown = {v.source.id: v for v in candidate.view() if v.source is not None}
    for message in view.messages:
        if message.id in candidate.bounds:
            # head + tail + a marker naming where all of it is read; never grown
            assert f'ReadToolResult(result_ref="{message.result_ref}")' in shown[message.id].content
            assert shown[message.id].content.startswith(message.content[:100])
            assert shown[message.id].tokens < message.tokens
        else:
            assert shown[message.id].content == message.content
    # the largest first: a result left whole is never larger than one that was bounded
    whole = [m.tokens for m in view.messages if m.role is Role.TOOL and m.id not in candidate.bounds]
    cut = [m.tokens for m in view.messages if m.id in candidate.bounds]
    assert not whole or not cut or max(whole) <= min(cut)


def test_what_cannot_be_bounded_is_not_bounded() -> None:
    """A task too large for the window with small results: bounding cannot help, so it does nothing."""
    task = StoredMessage("big", 1, Role.USER, text(60_000), 15_000, result_ref="trbig")
    view = projection([task, *parallel_reads([300])[1:]], window=8000, disable_task_anchor=True)
    assert view.tokens() > view.config.hard_limit_tokens
    assert bound_to_fit(view) is None


def test_a_text_acting_agents_output_is_bounded_like_a_tool_result_and_the_persons_message_never() -> None:
    """SWE-agent and mini-swe-agent act by a fenced command and get its output as the next user message:
    a fresh output too large for the window is bounded (head + tail + its result_ref); a message the
    caller says the person wrote is not, so the view cannot fit and nothing is bounded."""

    def turn(output_author: Author) -> list[StoredMessage]:
        action = "Let me look.\n```bash\ncat app.py\n```"
        output = text(60_000)
        return [
            StoredMessage("t", 1, Role.USER, "Find the bug in app.py", 6, result_ref="trt"),
            StoredMessage("a", 2, Role.ASSISTANT, action, estimator.count_text(action)),
            StoredMessage(
                "o", 3, Role.USER, output, estimator.count_text(output), result_ref="tro", author=output_author
            ),
        ]

    view = projection(turn(Author.UNSTATED), window=8000)
    assert view.mode == TEXT and view.tokens() > view.config.hard_limit_tokens
    bound = bound_to_fit(view)
    assert bound is not None and set(bound.candidate.bounds) == {"o"}
    assert bound.candidate.tokens() <= view.config.hard_limit_tokens
    shown = bound.candidate.view()[-1].content
    assert shown.startswith(text(60_000)[:100]) and 'ReadToolResult(result_ref="tro")' in shown
    assert bound_to_fit(projection(turn(Author.PERSON), window=8000)) is None


def test_a_text_acting_agents_old_outputs_are_pruned_like_tool_results_and_the_persons_messages_never() -> None:
    """Outside the recent tail, the large outputs of a text-acting agent's commands are pruned to head +
    tail + their result_ref before anything is folded, as tool results are; a long message the
    caller says the person wrote, and one answering a reply that ran no command, are not results."""
    messages: list[StoredMessage] = []

    def add(role: Role, content: str, author: Author = Author.UNSTATED) -> str:
        seq = len(messages) + 1
        ref = f"tr{seq}" if role is Role.USER else ""
        tokens = estimator.count_text(content)
        messages.append(StoredMessage(f"x{seq}", seq, role, content, tokens, result_ref=ref, author=author))
        return messages[-1].id

    add(Role.USER, "Find the bug in app.py")
    outputs = []
    for turn in range(10):
        add(Role.ASSISTANT, f"Looking at part {turn}.\n```bash\nsed -n {turn}00,{turn}99p app.py\n```")
        outputs.append(add(Role.USER, text(PRUNE_MIN_CODE_POINTS * 3, salt=str(turn))))
        if turn == 3:
            add(Role.ASSISTANT, "Which style do you want?")
            add(Role.USER, "Tabs. " + text(PRUNE_MIN_CODE_POINTS * 2, salt="plain"))
            add(Role.ASSISTANT, "Noted.\n```bash\necho noted\n```")
            add(Role.USER, text(PRUNE_MIN_CODE_POINTS * 2, salt="person"), Author.PERSON)
    view = sized(messages, 0.85)
    assert view.mode == TEXT
    decision = decide(snapshot(view), THRESHOLD)
    assert isinstance(decision, Prune)
    in_tail = {m.id for m in view.tail()}
    assert set(decision.candidate.pruned) == set(outputs) - in_tail and in_tail & set(outputs)
    shown = {v.source.id: v.content for v in decision.candidate.view() if v.source is not None}
    assert 'ReadToolResult(result_ref="tr3")' in shown["x3"]


def in_window(view: Projection, share: float, **config: object) -> Projection:
    """`view` in a window it fills to `share`, with background folds at 0.7 and the trigger at 0.8."""
    window = int(view.tokens() / share)
    settings = {"compact_ratio": 0.8, "prefold_ratio": 0.7, **config}
    return replace(view, config=SessionConfig(context_window=window, **settings))  # type: ignore[arg-type]


# ---- what the maintenance driver asks besides `decide` ---------------------------------------------


def test_while_another_call_folds_a_view_that_fits_is_answered_and_one_that_does_not_waits_for_no_summarizer() -> None:
    fits = in_window(projection(conversation(SMALL)), 0.85)
    over = in_window(fits, 1.01)
    off = replace(over, config=replace(over.config, prefold_ratio=0.0))
    assert while_maintained(fits, Trigger.THRESHOLD) is WhileMaintained.ANSWER
    assert while_maintained(over, Trigger.THRESHOLD) is WhileMaintained.STOP_BACKGROUND
    assert while_maintained(fits, Trigger.OVERFLOW) is WhileMaintained.STOP_BACKGROUND
    # Background folds off: the other call's fold is what this one needs, so it takes its turn after it.
    assert while_maintained(off, Trigger.THRESHOLD) is WhileMaintained.WAIT
    assert while_maintained(fits, Trigger.COMPACT) is WhileMaintained.WAIT


def test_a_failed_model_summary_is_made_again_in_process_only_above_the_hard_ceiling() -> None:
    fits = in_window(projection(conversation(SMALL)), 0.85)
    over = in_window(fits, 1.01)
    assert falls_back(over.config, over.tokens(), "llm")
    assert not falls_back(fits.config, fits.tokens(), "llm")
    assert not falls_back(over.config, over.tokens(), "extractive")


def test_an_offline_fold_is_made_in_process_and_says_why_unless_the_configured_summarizer_is() -> None:
    fits = in_window(projection(conversation(SMALL)), 0.85)
    over = in_window(fits, 1.01)
    offline = Fold(must_fold=True, offline=True)
    above = offline_stand_in(offline, over.config, over.tokens(), "llm")
    assert "above the hard ceiling" in above and above.endswith("with extractive at once instead of waiting for llm")
    assert "(refused by the provider)" in offline_stand_in(offline, fits.config, fits.tokens(), "llm")
    assert offline_stand_in(offline, over.config, over.tokens(), "extractive") == ""
    assert offline_stand_in(Fold(must_fold=True), over.config, over.tokens(), "llm") == ""


def test_a_fold_goes_on_pass_after_pass_until_the_last_unless_one_fails_or_one_is_all_it_may_make() -> None:
    view = in_window(projection(conversation(SMALL)), 0.85)
    plan = plan_pass(view, 2_000)
    assert plan.first is not None and not plan.first.final
    assert another_pass(MaintainRequest(), plan.first, committed=True)
    assert not another_pass(MaintainRequest(), plan.first, committed=False)
    assert not another_pass(MaintainRequest(Trigger.OVERFLOW), plan.first, committed=True)
    assert not another_pass(MaintainRequest(Trigger.COMPACT, dry_run=True), plan.first, committed=True)
    whole = plan_pass(view, 1_000_000).first
    assert whole is not None and whole.final and not another_pass(MaintainRequest(), whole, committed=True)


@pytest.mark.parametrize("output_share", [0.0, 0.25])
def test_the_reserved_output_counts_once_so_every_view_below_the_trigger_can_be_answered(output_share: float) -> None:
    """A view's estimate includes its reserved output, and the hard ceiling leaves room for that output
    once. Counted twice, a large max_output_tokens (the Vercel AI SDK asks Anthropic for 64k; the
    gateway reserves up to a quarter of the window) put the ceiling below the trigger, and a view
    between the two failed with CONTEXT_BUDGET_UNSATISFIED, no fold tried."""
    base = projection(conversation(SMALL))
    window = int(base.tokens() / (0.79 - output_share))  # the view, its output reserved, just below the trigger
    output = int(output_share * window)
    view = replace(base, config=SessionConfig(context_window=window, max_output_tokens=output))
    assert view.tokens() < view.config.trigger_tokens
    assert view.input_tokens() <= view.config.hard_limit_tokens
    assert isinstance(decide(snapshot(view), THRESHOLD), Answer)
    assert unanswerable(view, MaintainRequest(), None) is None
    assert bound_to_fit(view) is None
    # The ceiling holds the input: one token of input over it is above.
    over = view.config.hard_limit_tokens + output + 1
    assert view.config.above_ceiling(over) and not view.config.above_ceiling(over - 1)


def test_a_session_that_cannot_be_answered_says_why() -> None:
    fits = in_window(projection(conversation(SMALL)), 0.85)
    over = in_window(fits, 1.01)
    assert unanswerable(fits, MaintainRequest(), None) is None
    assert unanswerable(fits, MaintainRequest(), ("SUMMARIZER_FAILED", "the summarizer failed: 500")) is None
    budget = unanswerable(over, MaintainRequest(), None)
    assert budget is not None and budget.reason == "CONTEXT_BUDGET_UNSATISFIED"
    # Above the ceiling after a failed summary, the failure is the cause the caller can act on.
    failed = unanswerable(over, MaintainRequest(), ("SUMMARIZER_FAILED", "the summarizer failed: 500"))
    assert failed is not None and failed.reason == "SUMMARIZER_FAILED" and "500" in failed.message
    # A fold that made nothing smaller is no summarizer's failure: what the view holds is the cause.
    not_smaller = unanswerable(over, MaintainRequest(), ("COMPACT_FAILED", "the candidate is not smaller"))
    assert not_smaller is not None and not_smaller.reason == "CONTEXT_BUDGET_UNSATISFIED"
    assert "in tokens: messages " in not_smaller.message and not_smaller.metadata["largest_message_seq"]
    compact = unanswerable(fits, MaintainRequest(Trigger.COMPACT), ("NOT_SMALLER", "the summary is not smaller"))
    assert compact is not None and compact.reason == "NOT_SMALLER"
    assert compact.message == "Compact folded nothing: the summary is not smaller"


def test_an_append_goes_through_its_new_messages_unless_it_builds_or_decides_on_the_whole_view() -> None:
    """`append_work` says what `append` costs (the service runs a costly one off the event loop): the new
    messages on a built view below its trigger, every message when the view must be built, answered whole,
    or decided on at its trigger (an AppendMessages answers and decides nothing)."""
    messages = conversation(SMALL)
    below, at_trigger = sized(messages, 0.5), sized(messages, 0.95)
    new = (replace(messages[-1], id="new", seq=0),)

    def work(view: Projection, answer: bool = True, overflow: bool = False, known: int = 7) -> int:
        record = SessionRecord("s", "", "{}", 0, 0, "g", 1, "b", None, (), 1, None, len(messages), 0.0, 0.0)
        request = AppendRequest(new, overflow=overflow, known_view_version=known, answer=answer)
        return append_work(Context(record, view, ContextState("f"), 1), request, len(new), sum(m.tokens for m in new))

    assert work(below) == len(messages) + 1  # the view is not built yet
    below.tokens()
    assert not at_trigger.has_view and below.has_view
    assert work(below) == 1
    assert work(below, known=0) == len(messages) + 1  # answered whole
    assert work(below, known=0, answer=False) == 1
    assert work(below, overflow=True) == len(messages) + 1
    at_trigger.tokens()
    assert work(at_trigger) == len(messages) + 1
    assert work(at_trigger, answer=False) == 1


def test_a_thread_building_one_view_does_not_hold_up_another_projections_view() -> None:
    """A worker builds a long view while the event loop builds a short one: the loop's does not wait for
    the worker's (`functools.cached_property` in Python 3.11 holds one lock per attribute for all
    instances)."""
    building, release = threading.Event(), threading.Event()
    long_view, short_view = projection(conversation(SMALL)), projection(conversation([10]))

    class Slow(tuple[StoredMessage, ...]):
        def __iter__(self) -> Iterator[StoredMessage]:
            building.set()
            release.wait(10)
            return super().__iter__()

    slow = replace(long_view, after=Slow(long_view.after))
    worker = threading.Thread(target=slow.tokens)
    worker.start()
    try:
        assert building.wait(10)
        other = threading.Thread(target=short_view.tokens)
        other.start()
        other.join(5)
        assert not other.is_alive(), "the short view waited for the long one"
        assert short_view.has_view and not slow.has_view
    finally:
        release.set()
        worker.join()
    assert slow.tokens() == long_view.tokens()

"""Background folds on the pure engine: when one is due, when what it prepared still applies, and
that `decide` installs it at the trigger (and only there) instead of folding; the config's default."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ctxfold.engine.background import PreparedFold, applied, covered_digest, may_install_prepared, prefold_due
from ctxfold.engine.candidate import Accepted, FoldDocument, accept
from ctxfold.engine.errors import DomainError
from ctxfold.engine.maintenance import (
    Answer,
    Fold,
    FoldInBackground,
    InstallPrepared,
    MaintainRequest,
    Prune,
    Snapshot,
    Trigger,
    decide,
    plan_pass,
)
from ctxfold.engine.model import ConfigInput, SessionConfig, override_config, resolve_config
from ctxfold.engine.projection import Projection
from ctxfold.engine.prune import prune
from test_engine_decide import LARGE, SMALL, conversation, first_pass, in_window, projection


def prepare(view: Projection) -> PreparedFold:
    """What a background fold of `view` keeps."""
    fold, notes = first_pass(view)
    outcome = accept(view, fold, notes, "## Goal\nfix the test", "cp-bg")
    assert isinstance(outcome, Accepted)
    checkpoint = outcome.checkpoint
    document = FoldDocument("tr-index", fold.folded[-1].source.id if fold.folded[-1].source else "", "index")
    covered = covered_digest(view.messages, checkpoint.position_seq)
    return PreparedFold(checkpoint, document, covered, view.tokens(), outcome.candidate.tokens(), "llm", "", 0.0)


def grown(view: Projection, extra: int) -> Projection:
    """`view` with `extra` more call/result pairs after its messages (same window)."""
    more = conversation([2000] * extra)[1:]  # without its task
    last = view.messages[-1].seq
    renumbered = [replace(m, seq=last + i + 1) for i, m in enumerate(more)]
    return view.extended(renumbered)


@pytest.mark.parametrize(
    ("share", "due"), [(0.5, False), (0.69, False), (0.72, True), (0.79, True), (0.85, True), (1.01, False)]
)
def test_a_background_fold_is_due_from_the_prefold_ratio_up_to_the_hard_ceiling(share: float, due: bool) -> None:
    assert prefold_due(in_window(projection(conversation(SMALL)), share)) is due


def test_no_background_fold_when_a_prune_at_the_trigger_would_do() -> None:
    """Old results worth pruning: the trigger will prune, so no summary is made ahead of it."""
    view = in_window(projection(conversation(LARGE)), 0.75)
    assert prune(view) != dict(view.pruned)
    assert not prefold_due(view)
    # With only small results nothing can be pruned: the fold starts ahead of the trigger.
    assert prefold_due(in_window(projection(conversation(SMALL)), 0.75))


def test_no_background_fold_when_it_is_off() -> None:
    assert not prefold_due(in_window(projection(conversation(SMALL)), 0.75, prefold_ratio=0.0))


def test_a_prepared_fold_applies_to_the_view_it_was_made_from_and_to_that_view_grown() -> None:
    view = in_window(projection(conversation(SMALL)), 0.72)
    prepared = prepare(view)
    same = applied(view, prepared)
    assert same is not None and same.checkpoint == prepared.checkpoint and same.tokens() < view.tokens()
    later = grown(view, 4)
    installed = applied(later, prepared)
    assert installed is not None and installed.checkpoint == prepared.checkpoint
    # Everything after the fold's position is shown after its summary, verbatim.
    newer = [m.id for m in later.messages if m.seq > prepared.checkpoint.position_seq]
    assert [v.source.id for v in installed.view() if v.source is not None][-len(newer) :] == newer


def test_a_prepared_fold_is_stale_once_the_history_it_covers_changed() -> None:
    view = in_window(projection(conversation(SMALL)), 0.72)
    prepared = prepare(view)
    position = prepared.checkpoint.position_seq
    # A rewind below its position, and other messages appended in place of the abandoned ones.
    kept = [m for m in view.messages if m.seq < position - 2]
    rewritten = replace(view, after=tuple(kept)).extended(
        [replace(m, id=f"new-{m.id}") for m in view.messages if m.seq >= position - 2]
    )
    assert applied(rewritten, prepared) is None
    # A rewind below it with nothing appended since.
    assert applied(replace(view, after=tuple(kept)), prepared) is None


def test_a_prepared_fold_is_stale_once_another_checkpoint_is_the_head() -> None:
    view = in_window(projection(conversation(SMALL)), 0.72)
    prepared = prepare(view)
    other = replace(prepared.checkpoint, id="cp-other")
    assert applied(replace(view, checkpoint=other), prepared) is None


def test_decide_installs_a_prepared_fold_at_the_trigger_not_before_and_instead_of_folding() -> None:
    view = in_window(projection(conversation(SMALL)), 0.72)
    prepared = prepare(view)
    below = grown(view, 1)
    assert below.tokens() < below.config.trigger_tokens
    candidate = applied(below, prepared)
    assert decide(Snapshot(below, below.tokens(), 0, candidate), MaintainRequest()) == Answer()
    at = grown(view, 6)
    assert at.tokens() >= at.config.trigger_tokens
    candidate = applied(at, prepared)
    assert candidate is not None
    assert decide(Snapshot(at, at.tokens(), 0, candidate), MaintainRequest()) == InstallPrepared(candidate)
    # Nothing prepared (the turn jumped past the band): the view that fits is answered, folded behind it.
    assert decide(Snapshot(at, at.tokens(), 0, None), MaintainRequest()) == FoldInBackground()
    off = replace(at, config=replace(at.config, prefold_ratio=0.0))
    assert decide(Snapshot(off, off.tokens(), 0, None), MaintainRequest()) == Fold(must_fold=False)
    over = in_window(at, 1.01)
    assert decide(Snapshot(over, over.tokens(), 0, None), MaintainRequest()) == Fold(must_fold=True, offline=True)
    # A Compact folds with its own focus and kept tokens: it does not take the prepared fold.
    compact = MaintainRequest(Trigger.COMPACT)
    assert decide(Snapshot(at, at.tokens(), 0, candidate), compact) == Fold(must_fold=True)
    # An overflow retry takes it whatever the size.
    overflow = MaintainRequest(Trigger.OVERFLOW)
    assert decide(Snapshot(below, below.tokens(), 0, applied(below, prepared)), overflow) == InstallPrepared(
        applied(below, prepared)  # type: ignore[arg-type]
    )


def test_with_background_folds_on_a_view_the_agent_cannot_send_is_folded_offline_at_once() -> None:
    """Above the hard ceiling, or refused by the provider, with nothing prepared: the agent would wait
    for an LLM summary; with background folds on it gets the offline fold instead. Off, or asked by a
    Compact, the configured summarizer folds as before."""
    view = in_window(projection(conversation(SMALL)), 1.01)
    assert view.tokens() > view.config.hard_limit_tokens
    assert decide(Snapshot(view, view.tokens(), 0, None), MaintainRequest()) == Fold(must_fold=True, offline=True)
    overflow = in_window(view, 0.5)
    decision = decide(Snapshot(overflow, overflow.tokens(), 0, None), MaintainRequest(Trigger.OVERFLOW))
    assert decision == Fold(must_fold=False, offline=True)
    off = replace(view, config=replace(view.config, prefold_ratio=0.0))
    assert decide(Snapshot(off, off.tokens(), 0, None), MaintainRequest()) == Fold(must_fold=True)
    assert decide(Snapshot(view, view.tokens(), 0, None), MaintainRequest(Trigger.COMPACT)) == Fold(must_fold=True)


def test_a_prune_that_is_enough_comes_before_a_prepared_fold() -> None:
    view = in_window(projection(conversation(LARGE)), 0.9)
    prepared = prepare(view)
    decision = decide(Snapshot(view, view.tokens(), 0, applied(view, prepared)), MaintainRequest())
    assert isinstance(decision, Prune)


def resolve(**given: object) -> SessionConfig:
    return resolve_config(ConfigInput(**given), frozenset({"extractive", "llm"}), "s-1")  # type: ignore[arg-type]


def test_background_folds_are_on_by_default_for_a_summarizer_that_calls_a_model() -> None:
    assert resolve(context_window=100_000, summarizer="llm").prefold_ratio == pytest.approx(0.75)
    assert resolve(context_window=100_000, summarizer="llm", compact_ratio=0.5).prefold_ratio == pytest.approx(0.45)
    assert resolve(context_window=100_000, summarizer="llm", compact_ratio=0.3).prefold_ratio == pytest.approx(0.25)
    assert resolve(context_window=100_000).prefold_ratio == 0.0
    assert resolve(context_window=100_000, summarizer="llm", prefold_ratio=0.0).prefold_ratio == 0.0
    assert resolve(context_window=100_000, prefold_ratio=0.6).prefold_ratio == 0.6


@pytest.mark.parametrize("ratio", [0.05, 0.8, 0.9, -0.1])
def test_a_prefold_ratio_outside_its_range_is_refused(ratio: float) -> None:
    with pytest.raises(DomainError, match=r"config\.prefold_ratio") as error:
        resolve(context_window=100_000, summarizer="llm", prefold_ratio=ratio)
    assert error.value.reason == "INVALID_CONFIG"


def test_a_fork_keeps_or_overrides_the_prefold_ratio_zero_included() -> None:
    base = resolve(context_window=100_000, summarizer="llm")
    assert override_config(base, ConfigInput()).prefold_ratio == pytest.approx(0.75)
    assert override_config(base, ConfigInput(prefold_ratio=0.0)).prefold_ratio == 0.0
    assert override_config(base, ConfigInput(prefold_ratio=0.5)).prefold_ratio == 0.5


def test_a_fold_made_ahead_folds_the_newest_call_group_unless_it_awaits_results() -> None:
    view = in_window(projection(conversation(SMALL)), 0.72)
    newest = view.messages[-2:]  # the last call and its result
    now = plan_pass(view, 1_000_000, keep_tokens=0)
    ahead = plan_pass(view, 1_000_000, keep_tokens=0, ahead=True)
    assert now.first is not None and ahead.first is not None
    assert {m.id for m in newest} <= {m.id for m in now.first.kept}
    assert not {m.id for m in newest} & {m.id for m in ahead.first.kept}
    # A call still waiting for its result stays, ahead or not: its result must follow it in the view.
    waiting = replace(view, after=view.after[:-1])
    open_ahead = plan_pass(waiting, 1_000_000, keep_tokens=0, ahead=True)
    assert open_ahead.first is not None and waiting.messages[-1].id in {m.id for m in open_ahead.first.kept}


def test_a_prepared_fold_is_read_at_the_trigger_and_on_overflow_only() -> None:
    """A Prepare below the trigger keeps a prepared fold for later; at the trigger or on overflow it may
    install it; a Compact folds what it is asked to; with background folds off none is ever read."""
    config = SessionConfig(context_window=100_000, prefold_ratio=0.6)
    trigger = config.trigger_tokens
    assert not may_install_prepared(config, MaintainRequest(Trigger.THRESHOLD), trigger - 1)
    assert may_install_prepared(config, MaintainRequest(Trigger.THRESHOLD), trigger)
    assert may_install_prepared(config, MaintainRequest(Trigger.OVERFLOW), trigger // 2)
    assert not may_install_prepared(config, MaintainRequest(Trigger.COMPACT), trigger * 2)
    off = SessionConfig(context_window=100_000, prefold_ratio=0.0)
    assert not may_install_prepared(off, MaintainRequest(Trigger.OVERFLOW), trigger * 2)

"""Maintenance decisions, pure: when to act (`decide`) and what one fold pass reads and keeps
(`plan_pass`). What a prune or a bound changes is `engine/prune.py`, a candidate and its install
`engine/candidate.py`, the answer `engine/answer.py`, the projection they work on
`engine/projection.py`. The service loads, runs the summarizer, installs and reports; every choice it
makes on the way is one of these functions."""

from __future__ import annotations

import bisect
import enum
import itertools
from dataclasses import dataclass, replace

from ctxfold.engine import estimator
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.engine.model import IN_PROCESS_SUMMARIZER, SessionConfig, StoredMessage
from ctxfold.engine.projection import Projection, budget_error
from ctxfold.engine.prune import prune, prune_room
from ctxfold.engine.view import ViewMessage, call_groups, group_tokens, split_fold

# Room for the summary instruction (and focus text) appended to a fold request.
INSTRUCTION_TOKENS = 400


class Trigger(enum.Enum):
    """Why a call maintains the session."""

    THRESHOLD = "threshold"  # a Prepare: maintain at or above the trigger
    OVERFLOW = "overflow"  # a Prepare after the provider refused the view: fold one pass whatever the size
    COMPACT = "compact"  # asked to fold now
    BACKGROUND = "background"  # ahead of the trigger: the fold is kept prepared, not installed


@dataclass(frozen=True)
class MaintainRequest:
    trigger: Trigger = Trigger.THRESHOLD
    focus: str = ""  # what the summary should keep in view (Compact)
    # Tokens of recent history kept verbatim: None is the tail budget, 0 none beyond the minimal kept set.
    keep_tokens: int | None = None
    dry_run: bool = False  # make the candidate and answer it without installing it

    @property
    def one_pass(self) -> bool:
        """An overflow retry is answered after one pass: the smaller view is what the agent needs now."""
        return self.trigger is Trigger.OVERFLOW


class Action(enum.Enum):
    NONE = "none"
    PRUNED = "pruned"
    FOLDED = "folded"


class NotFolded(enum.Enum):
    """Why a call that had to fold (or was asked to) folded nothing."""

    UNSPECIFIED = "unspecified"
    NOTHING_OUTSIDE_KEPT_SET = "nothing_outside_kept_set"
    PREVIOUS_FAILURE = "previous_failure"
    NOT_SMALLER = "not_smaller"
    DRY_RUN = "dry_run"
    FOLD_IN_PROGRESS = "fold_in_progress"  # another call (of this server or another) holds the fold lease
    SUMMARIZER_FAILED = "summarizer_failed"  # this call's summary failed; the view still fits, as it is


@dataclass(frozen=True)
class FoldPass:
    """One summarizer call: it reads `prefix` (the view up to its last folded message) and replaces
    `folded` and the previous summary with one new summary."""

    prefix: list[ViewMessage]
    folded: list[ViewMessage]
    kept: list[StoredMessage]  # kept verbatim by the checkpoint this pass commits
    position_seq: int
    final: bool  # this pass folds everything that is to be folded
    input_tokens: int


@dataclass(frozen=True)
class FoldPlan:
    passes_planned: int
    first: FoldPass | None  # None: nothing can be folded


def another_pass(request: MaintainRequest, fold: FoldPass, committed: bool) -> bool:
    """Whether a fold goes on after the pass `fold`: not after a failed pass (what was installed stays),
    a dry run's candidate, an overflow's one pass, or the pass that folds everything to be folded."""
    return committed and not (request.dry_run or request.one_pass or fold.final)


def falls_back(config: SessionConfig, tokens: int, summarizer: str) -> bool:
    """Whether a pass whose summary by `summarizer` failed is made again in-process (`extractive`): only
    where the agent cannot go on without a fold, above the hard ceiling (below it the view is answered
    as it is), and not when the in-process summarizer is the one that failed."""
    return summarizer != IN_PROCESS_SUMMARIZER and config.above_ceiling(tokens)


def offline_stand_in(fold: Fold, config: SessionConfig, tokens: int, summarizer: str) -> str:
    """Why an `offline` fold of a view of `tokens` is made by the in-process summarizer instead of the
    configured `summarizer`; "" when `summarizer` makes it (not offline, or it is the in-process one)."""
    if not fold.offline or summarizer == IN_PROCESS_SUMMARIZER:
        return ""
    ceiling = f"above the hard ceiling of {config.hard_limit_tokens} input tokens"
    sent = f"{tokens} tokens, {ceiling}" if config.above_ceiling(tokens) else "refused by the provider"
    return (
        f"background folds are on and no fold prepared in the background covers this view ({sent}): "
        f"folded with {IN_PROCESS_SUMMARIZER} at once instead of waiting for {summarizer}"
    )


class FoldOutcome(enum.Enum):
    """What one fold came to (the fold span's `ctxfold.fold.outcome`)."""

    INSTALLED = "installed"  # every planned pass installed
    PARTIAL = "partial"  # a pass failed after earlier ones were installed; they stay
    FAILED = "failed"  # the first pass failed: nothing installed
    DRY_RUN = "dry_run"  # the candidate was made and answered, not installed
    PREPARED = "prepared"  # a background fold's candidate, kept to be installed at the trigger


def fold_outcome(installed: int, failed: bool, dry_run: bool) -> FoldOutcome:
    """The outcome of a fold that installed `installed` passes, `failed` when its last pass failed."""
    if dry_run and not failed:
        return FoldOutcome.DRY_RUN
    if failed:
        return FoldOutcome.PARTIAL if installed else FoldOutcome.FAILED
    return FoldOutcome.INSTALLED


def plan_pass(
    projection: Projection, input_window_tokens: int, keep_tokens: int | None = None, ahead: bool = False
) -> FoldPlan:
    """Decides the kept set (system, the opening anchors, the input the next call must answer,
    pinned messages, the recent tail or `keep_tokens` of it) and the longest read that fits the
    summarizer window, at call-group boundaries; `ahead`: for a fold installed later (`split_fold`)."""
    tail = projection.tail(keep_tokens)
    split = split_fold(projection.messages, tail, projection.anchor_end, projection.mode, ahead)
    if not split.folded:
        return FoldPlan(0, None)
    view = projection.view()
    index_of = {v.source.id: i for i, v in enumerate(view) if v.source is not None}
    folded_ids = {m.id for m in split.folded}
    # The fixed part of every pass: tools and instruction; the prefix carries system and summary.
    available = input_window_tokens - projection.tools_tokens - INSTRUCTION_TOKENS
    groups = call_groups(split.folded, projection.mode)
    # A pass reads the view up to the end of its last folded group; cost of reading through group i:
    ends = [index_of[group[-1].id] + 1 for group in groups]
    costs = list(itertools.accumulate(v.tokens + estimator.PER_MESSAGE_TOKENS for v in view))
    fits = bisect.bisect_right([costs[end - 1] for end in ends], available)
    if fits == 0:
        largest = max(group_tokens(g, projection.pruned) for g in groups)
        raise DomainError(
            Kind.FAILED_PRECONDITION,
            "FOLD_INPUT_TOO_LARGE",
            f"a call group of {largest} tokens does not fit the summarizer window of {input_window_tokens} tokens",
            {"group_tokens": largest, "input_window_tokens": input_window_tokens},
        )
    final = fits == len(groups)
    end = ends[fits - 1]
    prefix = view[:end]
    last_folded_seq = groups[fits - 1][-1].seq
    position = projection.head_seq if final else last_folded_seq
    kept = [m for m in split.kept if m.seq <= position]
    folded_view = [v for v in prefix if v.source is not None and v.source.id in folded_ids]
    remaining = sum(group_tokens(g, projection.pruned) for g in groups[fits:])
    # Later passes re-read the system prompt and a summary about as long as the current one; a rough
    # count is enough for progress reports (the plan is redone before every pass).
    summary = projection.checkpoint.summary_tokens if projection.checkpoint else 0
    per_pass = max(available // 4, available - projection.system_tokens - summary, 1)
    passes = 1 + (0 if final else -(-remaining // per_pass))
    prefix_tokens = sum(v.tokens + estimator.PER_MESSAGE_TOKENS for v in prefix)
    return FoldPlan(passes, FoldPass(prefix, folded_view, kept, position, final, prefix_tokens))


def unanswerable(
    projection: Projection, request: MaintainRequest, failure: tuple[str, str] | None
) -> DomainError | None:
    """Why a maintained session cannot be answered, None when it can: a Compact whose fold failed
    (`failure`: its reason and message), or a view still above the hard ceiling (a summarizer's failure,
    when one failed, is the cause the caller can act on; a fold that made nothing smaller is not: what
    the view holds is)."""
    if request.trigger is Trigger.COMPACT and failure is not None:
        reason, message = failure
        return DomainError(Kind.FAILED_PRECONDITION, reason, f"Compact folded nothing: {message}")
    tokens = projection.tokens()
    if projection.config.above_ceiling(tokens):
        summarizer_failure = failure[1] if failure is not None and failure[0] == "SUMMARIZER_FAILED" else ""
        return budget_error(projection, tokens, summarizer_failure)
    return None


# ---- while another call maintains the session --------------------------------------------------------


class WhileMaintained(enum.Enum):
    """What a call does when another call of this process maintains the session (`while_maintained`)."""

    ANSWER = "answer"  # the view still fits: answer it as committed, without waiting for that fold
    WAIT = "wait"  # take the session's turn after that call: its fold may be what this one needs
    STOP_BACKGROUND = "stop_background"  # stop a background fold, then fold offline (`Fold.offline`)


def while_maintained(projection: Projection, trigger: Trigger) -> WhileMaintained:
    """A Prepare whose view fits is answered now, as across replicas; one that cannot be sent (above the
    hard ceiling, or an overflow) waits for its turn, unless background folds are on: then it waits for
    no summarizer, and the background fold it would wait for would not apply after its offline fold.
    A Compact takes its turn."""
    config = projection.config
    if trigger is Trigger.COMPACT:
        return WhileMaintained.WAIT
    if trigger is Trigger.THRESHOLD and not config.above_ceiling(projection.tokens()):
        return WhileMaintained.ANSWER
    return WhileMaintained.STOP_BACKGROUND if config.prefold_tokens else WhileMaintained.WAIT


# ---- what to do next -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What a decision reads: the current projection, the view's tokens when this round loaded it
    (before any install of the round), the failed-fold memo and the projection with the fold prepared
    in the background installed, when one is and still applies (`background.applied`)."""

    projection: Projection
    loaded_tokens: int
    failed_fold_tokens: int
    prepared: Projection | None = None


@dataclass(frozen=True)
class Answer:
    """Nothing (more) to do: answer the current view."""


@dataclass(frozen=True)
class Prune:
    """Install `candidate` (more tool results pruned), then decide again."""

    candidate: Projection
    results: int  # how many results this prune adds


@dataclass(frozen=True)
class Blocked:
    """The same input failed to fold before and the view still fits: it is retried when it grows."""

    tokens: int

    @property
    def detail(self) -> str:
        return f"the last fold of this input ({self.tokens} tokens) failed; it is retried when the view grows"


@dataclass(frozen=True)
class Fold:
    """Fold in passes. `must_fold`: the caller cannot go on without it (a Compact, or a view above the
    hard ceiling), so it waits for another holder's fold instead of answering the current view.
    `offline`: background folds are on and the agent cannot go on with this view (above the hard
    ceiling, or refused by the provider) before a fold prepared for it is ready: it is folded at once
    with the offline summarizer (`extractive`, which calls no provider) instead of waiting for an LLM;
    the next fold's summary merges that briefing as it merges any other."""

    must_fold: bool
    offline: bool = False


@dataclass(frozen=True)
class InstallPrepared:
    """Install the fold prepared in the background (no summarizer call), then decide again."""

    candidate: Projection


@dataclass(frozen=True)
class FoldInBackground:
    """Background folds are on, nothing prepared applies and the view still fits: answer it as it is;
    the fold runs in the background and a later Prepare installs it (the agent never waits for a
    summarizer while its view fits)."""


Decision = Answer | Prune | Blocked | InstallPrepared | FoldInBackground | Fold


def decide(snapshot: Snapshot, request: MaintainRequest) -> Decision:
    """Invariant 2 (docs/architecture.md): below the trigger nothing happens (unless the provider
    overflowed); at or above it, prune first and stop if that is enough — below the trigger with room
    for the next turns (`prune_room`); otherwise fold, unless the same input failed to fold before and
    the view still fits. A fold prepared in the background is installed instead of folding, whenever it
    still applies; with background folds on and none prepared, a view that still fits is answered and
    folded in the background, and one that does not is folded at once offline (`Fold.offline`). A
    Compact folds whatever the size (with its own focus and kept tokens)."""
    projection = snapshot.projection
    config = projection.config
    tokens = projection.tokens()
    if request.trigger is Trigger.COMPACT:
        return Fold(must_fold=True)
    overflow = request.trigger is Trigger.OVERFLOW
    if snapshot.loaded_tokens < config.trigger_tokens and not overflow:
        return Answer()
    pruned = prune(projection)
    if pruned != dict(projection.pruned):
        candidate = replace(projection, pruned=pruned)
        # Strictly smaller, so deciding again after the install ends; below the trigger, only with room
        # for the next turns (`prune_room`): a prune the next turn's fold would follow changes the
        # prefix twice where the fold alone changes it once.
        below = candidate.tokens() < config.trigger_tokens - prune_room(projection)
        if candidate.tokens() < tokens and (overflow or below or candidate.tokens() >= config.trigger_tokens):
            return Prune(candidate, len(pruned) - len(projection.pruned))
    if snapshot.prepared is not None and (overflow or tokens >= config.trigger_tokens):
        return InstallPrepared(snapshot.prepared)
    if not overflow and snapshot.loaded_tokens <= snapshot.failed_fold_tokens and not config.above_ceiling(tokens):
        # A view above the hard ceiling is retried: that is the only way forward.
        return Blocked(snapshot.loaded_tokens) if tokens >= config.trigger_tokens else Answer()
    if tokens < config.trigger_tokens and not overflow:
        return Answer()
    if config.prefold_tokens and not overflow and not config.above_ceiling(tokens):
        return FoldInBackground()
    # Reached with background folds on only above the hard ceiling or on overflow: the agent waits for no summarizer.
    return Fold(must_fold=config.above_ceiling(tokens), offline=config.prefold_tokens > 0)

"""Maintenance decisions, pure: when to act (`decide`), what to prune, what one fold pass reads and
keeps (`plan_pass`), whether a candidate may replace the current view (`accept`), what is installed
(`PruneInstall`, `FoldInstall`) and what a call answers (`answer`). The service loads, runs the
summarizer, installs and reports; every choice it makes on the way is one of these functions."""

from __future__ import annotations

import bisect
import enum
import functools
import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ctxfold.engine import estimator
from ctxfold.engine.authorship import UNDECIDED, session_mode
from ctxfold.engine.briefing import FoldNotes, render_summary
from ctxfold.engine.cache import cache_state, cache_ttl_seconds
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.engine.model import SAFETY_MARGIN_TOKENS, ProviderPayload, Role, SessionConfig, StoredMessage
from ctxfold.engine.state import ContextState, ViewRecord, fingerprint, split_view_version, view_version
from ctxfold.engine.view import (
    Checkpoint,
    ViewMessage,
    bound_stub,
    build_view,
    call_groups,
    group_tokens,
    opening_end,
    prune_candidates,
    prune_stub,
    recent_tail,
    render,
    split_fold,
    tail_budget,
)

# Room for the summary instruction (and focus text) appended to a fold request.
INSTRUCTION_TOKENS = 400
# The least a summarizer is given for its body, however much the engine's sections take.
MIN_BODY_TOKENS = 256


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
    def operation(self) -> str:
        return "compact" if self.trigger is Trigger.COMPACT else "prepare"

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
class Projection:
    """Everything a view is built from; cheap to rebuild after each step."""

    config: SessionConfig
    system_tokens: int
    tools_tokens: int
    calibration: float
    checkpoint: Checkpoint | None
    kept: tuple[StoredMessage, ...]  # the checkpoint's kept messages
    after: tuple[StoredMessage, ...]  # canonical messages after the checkpoint position
    pruned: Mapping[str, int]
    # Results bounded to fit the window: id -> code points kept (each also in `pruned`).
    bounds: Mapping[str, int] = field(default_factory=dict)

    @property
    def messages(self) -> tuple[StoredMessage, ...]:
        """The canonical messages the view renders, in seq order."""
        return self.kept + self.after

    # A projection is immutable, so its view and estimates are computed at most once.
    @functools.cached_property
    def anchor_end(self) -> int:
        """The seq of the last opening anchor: recorded by the checkpoint that first kept it, found
        in the transcript before any fold."""
        checkpoint = self.checkpoint
        if checkpoint is None:
            return opening_end(self.after, self.config)
        if checkpoint.notes is not None:
            return checkpoint.notes.opening_end_seq
        return opening_end(self.kept, self.config)

    @functools.cached_property
    def mode(self) -> str:
        """How the session acts (tool calls or text), carried by the checkpoint for what it folded."""
        notes = self.checkpoint.notes if self.checkpoint is not None else None
        return session_mode(self.messages, notes.mode if notes is not None else UNDECIDED)

    @functools.cached_property
    def _view(self) -> tuple[ViewMessage, ...]:
        return tuple(
            build_view(
                self.config,
                self.system_tokens,
                self.checkpoint,
                self.kept,
                self.after,
                self.pruned,
                self.anchor_end,
                self.bounds,
            )
        )

    def view(self) -> list[ViewMessage]:
        return list(self._view)

    @functools.cached_property
    def _message_tokens(self) -> int:
        return sum(v.tokens for v in self._view)

    def tokens(self) -> int:
        """The calibrated request estimate, reserved output included."""
        return estimator.request_tokens(
            self._message_tokens, len(self._view), self.tools_tokens, self.config.max_output_tokens, self.calibration
        )

    def input_tokens(self) -> int:
        """The calibrated input estimate: `tokens()` without the reserved output."""
        return estimator.request_tokens(self._message_tokens, len(self._view), self.tools_tokens, 0, self.calibration)

    def raw_tokens(self) -> int:
        """The uncalibrated input estimate: what a provider's reported input tokens compare against."""
        return estimator.request_tokens(self._message_tokens, len(self._view), self.tools_tokens, 0)

    def extended(self, appended: Sequence[StoredMessage]) -> Projection:
        """This projection with `appended` (newer than all its messages) after its messages. When they
        render on their own (past the opening anchors, which they leave unchanged) the view and its
        token sum are extended, not rebuilt: the cost is that of the new messages."""
        grown = replace(self, after=(*self.after, *appended))
        if "_view" in self.__dict__ and grown.anchor_end == self.anchor_end:
            tail = tuple(render(m, self.pruned, 0, self.bounds) for m in appended)
            _seed(grown, self._view + tail, self._message_tokens + sum(v.tokens for v in tail))
        return grown

    def recalibrated(self, calibration: float) -> Projection:
        """This projection with another calibration; the view does not depend on it and is kept."""
        changed = replace(self, calibration=calibration)
        if "_view" in self.__dict__:
            _seed(changed, self._view, self._message_tokens)
        return changed

    def tail(self, keep_tokens: int | None = None) -> list[StoredMessage]:
        """The newest call groups kept verbatim: within the tail budget, or `keep_tokens` when given
        (0: none beyond the minimal kept set)."""
        budget = tail_budget(self.config, self.system_tokens, self.tools_tokens) if keep_tokens is None else keep_tokens
        return recent_tail(self.messages, budget, self.pruned, self.mode)

    @property
    def head_seq(self) -> int:
        return self.messages[-1].seq if self.messages else (self.checkpoint.position_seq if self.checkpoint else 0)


def _seed(projection: Projection, view: tuple[ViewMessage, ...], message_tokens: int) -> None:
    """Fills the (write-once) cached view and token sum of a projection just made, before any use."""
    projection.__dict__["_view"] = view
    projection.__dict__["_message_tokens"] = message_tokens


def budget_error(projection: Projection, tokens: int, fold_failure: str = "") -> DomainError:
    """The view does not fit. When a fold of this call failed, that failure is the cause the caller
    can act on (SUMMARIZER_FAILED, with its reason in `summarizer_error`)."""
    config = projection.config
    fits = (
        f"the view needs {tokens} tokens but at most {config.hard_limit_tokens} fit "
        f"(context_window {config.context_window} − max_output_tokens {config.max_output_tokens} − "
        f"{SAFETY_MARGIN_TOKENS})"
    )
    metadata: dict[str, object] = {"estimated_tokens": tokens, "hard_limit_tokens": config.hard_limit_tokens}
    if fold_failure:
        return DomainError(
            Kind.FAILED_PRECONDITION,
            "SUMMARIZER_FAILED",
            f"{fold_failure}; without a summary {fits}",
            {**metadata, "summarizer": config.summarizer, "summarizer_error": fold_failure},
        )
    return DomainError(Kind.FAILED_PRECONDITION, "CONTEXT_BUDGET_UNSATISFIED", fits, metadata)


def check_config_fits(config: SessionConfig, system_tokens: int, tools_tokens: int) -> None:
    """At CreateSession and Fork: a config whose system prompt and tools alone leave no room for a view
    is refused as INVALID_CONFIG, naming the field that is too large."""
    try:
        check_fixed_costs(config, system_tokens, tools_tokens)
    except DomainError as error:
        field_name = "system_prompt" if system_tokens >= tools_tokens else "tools_json"
        raise DomainError(
            Kind.INVALID_ARGUMENT, "INVALID_CONFIG", f"config.{field_name}: {error.message}", {"field": field_name}
        ) from None


def check_fixed_costs(config: SessionConfig, system_tokens: int, tools_tokens: int) -> None:
    """Fails before anything is written when the system prompt, the tools and the reserved output
    alone leave no room for a view."""
    fixed = estimator.request_tokens(system_tokens, 1, tools_tokens, config.max_output_tokens)
    if fixed + SAFETY_MARGIN_TOKENS > config.context_window:
        raise DomainError(
            Kind.FAILED_PRECONDITION,
            "CONTEXT_BUDGET_UNSATISFIED",
            f"system prompt ({system_tokens} tokens), tool schemas ({tools_tokens}) and max_output_tokens "
            f"({config.max_output_tokens}) do not fit a {config.context_window}-token window",
            {"fixed_tokens": fixed, "context_window": config.context_window},
        )


# A prune that stops maintenance must leave this share of the tail budget free below the trigger.
PRUNE_ROOM_SHARE = 0.5


def prune_room(projection: Projection) -> int:
    """Tokens a prune must leave free below the trigger to be installed on its own."""
    return int(PRUNE_ROOM_SHARE * tail_budget(projection.config, projection.system_tokens, projection.tools_tokens))


def prune(projection: Projection) -> dict[str, int]:
    """The pruned set after pruning every large tool result outside the recent tail (new stubs are
    tokenized once here; their counts are persisted with the projection)."""
    pruned = dict(projection.pruned)
    for message in prune_candidates(projection.messages, projection.tail(), projection.pruned):
        pruned[message.id] = estimator.count_text(prune_stub(message.content, message.result_ref))
    return pruned


# A result bounded to fit keeps at least this many code points around its marker.
MIN_BOUND_CODE_POINTS = 400


@dataclass(frozen=True)
class Bound:
    """The last resort when the view is above the hard ceiling and nothing more can be folded: install
    `candidate`, whose largest tool results — those of the input the next call must answer, mostly —
    are shown as head + tail + a marker naming their result_ref."""

    candidate: Projection
    results: int  # how many results this bounds (again)


def _bounded(message: StoredMessage, target_tokens: int) -> tuple[int, int]:
    """(code points kept, tokens) of `message` bounded to about `target_tokens`."""
    per_token = len(message.content) / max(1, message.tokens)
    keep = max(MIN_BOUND_CODE_POINTS, min(len(message.content) - 1, int(target_tokens * per_token)))
    while True:
        tokens = estimator.count_text(bound_stub(message.content, message.result_ref, keep))
        if tokens <= target_tokens or keep == MIN_BOUND_CODE_POINTS:
            return keep, tokens
        keep = max(MIN_BOUND_CODE_POINTS, int(keep * min(0.9, target_tokens / tokens)))


def bound_to_fit(projection: Projection) -> Bound | None:
    """The view's tool results bounded, the largest first, each only as far as the view's excess over
    the hard ceiling needs, until the view fits; None when it fits already, or when even every result
    at its least cannot make it fit (what cannot be bounded — system prompt, tools, the opening, the
    summary, the person's messages — does not fit alone)."""
    config = projection.config
    if projection.tokens() <= config.hard_limit_tokens:
        return None
    pruned, bounds = dict(projection.pruned), dict(projection.bounds)
    candidate = projection
    changed: set[str] = set()
    for _ in range(len(projection.view())):
        excess = candidate.tokens() - config.hard_limit_tokens
        if excess <= 0:
            return Bound(candidate, len(changed))
        # Request tokens count a message's tokens times the calibration.
        excess = int(excess / projection.calibration) + 1
        shrinkable = [
            (v.tokens, v.source)
            for v in candidate.view()
            if v.source is not None
            and v.source.role is Role.TOOL
            and bounds.get(v.source.id, len(v.source.content)) > MIN_BOUND_CODE_POINTS
        ]
        if not shrinkable:
            return None
        shown, message = max(shrinkable, key=lambda item: item[0])
        keep, tokens = _bounded(message, max(1, shown - excess))
        pruned[message.id], bounds[message.id] = tokens, keep
        changed.add(message.id)
        candidate = replace(projection, pruned=dict(pruned), bounds=dict(bounds))
    return Bound(candidate, len(changed)) if candidate.tokens() <= config.hard_limit_tokens else None


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


def _prefix_tokens(view: Sequence[ViewMessage]) -> int:
    return sum(v.tokens + estimator.PER_MESSAGE_TOKENS for v in view)


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
    return FoldPlan(
        passes,
        FoldPass(prefix, folded_view, kept, position, final, _prefix_tokens(prefix)),
    )


def apply_pass(
    projection: Projection, kept: Sequence[StoredMessage], checkpoint: Checkpoint, after: Sequence[StoredMessage]
) -> Projection:
    """The projection once `checkpoint` (keeping `kept` verbatim) is installed; `after` are the
    canonical messages after its position (a suffix of the current messages)."""
    live = {m.id for m in [*kept, *after]}
    return Projection(
        config=projection.config,
        system_tokens=projection.system_tokens,
        tools_tokens=projection.tools_tokens,
        calibration=projection.calibration,
        checkpoint=checkpoint,
        kept=tuple(kept),
        after=tuple(after),
        pruned={k: v for k, v in projection.pruned.items() if k in live},
        bounds={k: v for k, v in projection.bounds.items() if k in live},
    )


def after_position(projection: Projection, position_seq: int) -> list[StoredMessage]:
    return [m for m in projection.after if m.seq > position_seq]


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
    hard ceiling), so it waits for another holder's fold instead of answering the current view."""

    must_fold: bool


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
    for the next turns
    (`prune_room`); otherwise fold, unless the same input failed to fold before and the view still
    fits. A fold prepared in the background is installed instead of folding, whenever it still applies;
    with background folds on and none prepared, a view that still fits is answered and folded in the
    background. A Compact folds whatever the size (with its own focus and kept tokens)."""
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
    if not overflow and snapshot.loaded_tokens <= snapshot.failed_fold_tokens and tokens <= config.hard_limit_tokens:
        # A view above the hard ceiling is retried: that is the only way forward.
        return Blocked(snapshot.loaded_tokens) if tokens >= config.trigger_tokens else Answer()
    if tokens < config.trigger_tokens and not overflow:
        return Answer()
    if config.prefold_tokens and not overflow and tokens <= config.hard_limit_tokens:
        return FoldInBackground()
    return Fold(must_fold=tokens > config.hard_limit_tokens)


# ---- one candidate -----------------------------------------------------------------------------------


def summary_failure(text: str, finish_reason: str, native: bool = False) -> str:
    """Why a summarizer's answer (stripped `text`; `native`: with the provider's compaction item, which
    may come without text) cannot be a summary, or ""."""
    if finish_reason == "length":
        return "the summary was truncated (finish_reason=length)"
    return "" if text or native else "the summary was empty"


def native_note(native: ProviderPayload) -> str:
    """The body of a summary whose narrative is only in the provider's compaction item: says so, so
    that a reader (or an adapter of another provider) knows what it cannot see."""
    return (
        f"[The summary of the conversation so far is the provider's own compaction item ({native.format}) "
        "sent with this message; providers of another family see only the sections of this text.]"
    )


def body_budget(notes: FoldNotes, config: SessionConfig) -> int:
    """The summarizer writes the body; the engine's sections take their share of summary_max_tokens."""
    engine_tokens = estimator.count_text(render_summary(replace(notes, body="")))
    return max(MIN_BODY_TOKENS, config.summary_max_tokens - engine_tokens)


@dataclass(frozen=True)
class Accepted:
    candidate: Projection

    @property
    def checkpoint(self) -> Checkpoint:
        checkpoint = self.candidate.checkpoint
        assert checkpoint is not None  # a fold's candidate always has its checkpoint
        return checkpoint


@dataclass(frozen=True)
class Rejected:
    why: str
    reason: str  # the ErrorInfo reason a Compact that ends with this fails with
    not_folded: NotFolded = NotFolded.UNSPECIFIED


def accept(
    projection: Projection,
    fold: FoldPass,
    notes: FoldNotes,
    body: str,
    checkpoint_id: str,
    native: ProviderPayload | None = None,
) -> Accepted | Rejected:
    """The candidate view after `fold` with the summarizer's `body` (engine sections stripped) in
    `notes` and the provider's `native` compaction item, if the body is within its budget (checked
    before any candidate is built from it) and the candidate is strictly smaller than the current view.
    The native item counts in the summary's tokens; the engine's sections stay beside it."""
    budget = body_budget(notes, projection.config)
    if estimator.count_text(body) > budget:
        return Rejected(f"the summary has more than the {budget} tokens left for it", "SUMMARIZER_FAILED")
    if native is not None and not body:
        body = native_note(native)
    notes = replace(notes, body=body)
    summary = render_summary(notes)
    previous = projection.checkpoint
    checkpoint = Checkpoint(
        id=checkpoint_id,
        parent_id=previous.id if previous else None,
        position_seq=fold.position_seq,
        summary=summary,
        summary_tokens=estimator.count_text(summary) + (native.tokens if native is not None else 0),
        kept_ids=tuple(m.id for m in fold.kept),
        notes=notes,
        native=native,
    )
    candidate = apply_pass(projection, fold.kept, checkpoint, after_position(projection, fold.position_seq))
    before = projection.tokens()
    if candidate.tokens() >= before:
        why = f"the candidate ({candidate.tokens()} tokens) is not smaller than the view ({before})"
        return Rejected(why, "COMPACT_FAILED", NotFolded.NOT_SMALLER)
    return Accepted(candidate)


# ---- what is installed -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FoldDocument:
    """A document a fold writes (the folded-results index), stored and read like a raw tool result.
    It is attached to `message_id`, the last message the fold covers, so it is visible exactly where
    that message is (its session, forks made after it, abandoned branches) and deleted with it."""

    ref: str
    message_id: str
    text: str


@dataclass(frozen=True)
class PruneInstall:
    """A new projection state under the same head checkpoint."""

    state: ContextState


@dataclass(frozen=True)
class FoldInstall:
    """A new head checkpoint, its document and the projection state that goes with it."""

    checkpoint: Checkpoint
    document: FoldDocument
    state: ContextState
    tokens_before: int
    tokens_after: int


Install = PruneInstall | FoldInstall


def _summary_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prune_install(state: ContextState, branch_id: str, checkpoint_id: str | None) -> PruneInstall:
    """`state` (its new pruned set and receipt) stamped for the head checkpoint it stays under."""
    stamped = replace(
        state,
        fingerprint=fingerprint(branch_id, checkpoint_id),
        checkpoint_id=checkpoint_id,
        projection_version=state.projection_version + 1,
    )
    return PruneInstall(stamped)


def fold_install(
    state: ContextState, branch_id: str, accepted: Accepted, document: FoldDocument, tokens_before: int
) -> FoldInstall:
    """`state` (its new pruned set and receipt) stamped for the checkpoint the fold installs."""
    checkpoint = accepted.checkpoint
    stamped = replace(
        state,
        fingerprint=fingerprint(branch_id, checkpoint.id),
        checkpoint_id=checkpoint.id,
        covered_count=checkpoint.position_seq,
        summary_hash=_summary_hash(checkpoint.summary),
        projection_version=state.projection_version + 1,
    )
    return FoldInstall(checkpoint, document, stamped, tokens_before, accepted.candidate.tokens())


# ---- the answer ------------------------------------------------------------------------------------


def _same(a: ViewMessage, b: ViewMessage) -> bool:
    return (a.role, a.content, a.summary, a.source.id if a.source else "") == (
        b.role,
        b.content,
        b.summary,
        b.source.id if b.source else "",
    )


def common_prefix(a: Sequence[ViewMessage], b: Sequence[ViewMessage]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if not _same(x, y):
            break
        count += 1
    return count


def _index_ref(projection: Projection) -> str:
    checkpoint = projection.checkpoint
    return checkpoint.notes.index_ref if checkpoint is not None and checkpoint.notes is not None else ""


@dataclass(frozen=True)
class Answered:
    """What a call answers, and the bookkeeping state to save with it."""

    state: ContextState
    messages: list[ViewMessage]  # the view, only its new messages when `delta`, or a dry run's candidate
    estimated_tokens: int
    estimated_input_tokens: int
    view_version: int  # 0 for a dry run's candidate: not installed, so no usage is observed against it
    view_message_count: int
    stable_prefix_messages: int
    delta: bool
    cache_state: str
    checkpoint_id: str
    folded_results_ref: str
    candidate_summary: str = ""


@dataclass(frozen=True)
class Answering:
    """What the answer is made from: the round's projection and state once maintenance is done."""

    projection: Projection
    state: ContextState
    first_view: Sequence[ViewMessage]  # the view as loaded, before this call's installs
    first_tokens: int
    action: Action
    head_seq: int
    checkpoint_id: str | None
    candidate: Projection | None = None  # a dry run's candidate


def answer(answering: Answering, known_view_version: int, now: float) -> Answered:
    """The view's version (generation and message count), how much of it the previous answer already
    had (the stable prefix, for prompt caching), only the new messages when the client's
    `known_view_version` is a prefix of it, and the bookkeeping: the view record, activity, counters."""
    projection, state = answering.projection, answering.state
    config = projection.config
    view = projection.view()
    hits_observed = state.telemetry.get("cached_input_tokens", 0) > 0
    cache = cache_state(state.last_activity, now, cache_ttl_seconds(config, hits_observed))
    version = view_version(state.generation, len(view))
    previous = state.views[-1] if state.views else None
    if answering.action is not Action.NONE:
        stable = common_prefix(answering.first_view, view)
    elif previous is not None and split_view_version(previous.version)[0] == state.generation:
        stable = min(split_view_version(previous.version)[1], len(view))
    else:
        stable = 0
    estimated = projection.tokens()
    state = replace(  # one replace: this is every Prepare's
        state,
        views=state.views_with(ViewRecord(version, projection.raw_tokens())),
        telemetry=state.counted("prepares"),
        last_activity=now,
        cache_state=cache,
        transcript_version=answering.head_seq,
        checkpoint_id=answering.checkpoint_id,
        covered_count=projection.checkpoint.position_seq if projection.checkpoint else 0,
        prompt_cache_key=config.prompt_cache_key,
        source_tokens=answering.first_tokens,
        projection_tokens=estimated,
    )
    candidate = answering.candidate
    if candidate is not None:
        candidate_view = candidate.view()
        return Answered(
            state=state,
            messages=candidate_view,
            estimated_tokens=candidate.tokens(),
            estimated_input_tokens=candidate.input_tokens(),
            view_version=0,
            view_message_count=len(candidate_view),
            stable_prefix_messages=common_prefix(view, candidate_view),
            delta=False,
            cache_state=cache,
            checkpoint_id="",
            folded_results_ref=_index_ref(candidate),
            candidate_summary=candidate.checkpoint.summary if candidate.checkpoint else "",
        )
    known_generation, known_count = split_view_version(known_view_version)
    delta = known_view_version > 0 and known_generation == state.generation and known_count <= len(view)
    return Answered(
        state=state,
        messages=view[known_count:] if delta else view,
        estimated_tokens=estimated,
        estimated_input_tokens=projection.input_tokens(),
        view_version=version,
        view_message_count=len(view),
        stable_prefix_messages=stable,
        delta=delta,
        cache_state=cache,
        checkpoint_id=answering.checkpoint_id or "",
        folded_results_ref=_index_ref(projection),
    )


# Room in a response for everything but the view's text: ids, framing, the other fields.
RESPONSE_FRAMING_BYTES = 1 << 20


def check_response_size(messages: Sequence[ViewMessage], max_response_bytes: int) -> None:
    """RESPONSE_TOO_LARGE, before anything is sent, when the view's text cannot fit one response."""
    texts = [
        text
        for m in messages
        for text in (
            m.content,
            *((m.source.reasoning_content, *(c.arguments for c in m.source.tool_calls)) if m.source else ()),
        )
    ]
    room = max_response_bytes - RESPONSE_FRAMING_BYTES
    # Characters are counted first: at most 4 bytes each, so only a view near the bound is encoded.
    if sum(map(len, texts)) * 4 <= room:
        return
    size = sum(len(text.encode()) for text in texts)
    if size > room:
        raise DomainError(
            Kind.RESOURCE_EXHAUSTED,
            "RESPONSE_TOO_LARGE",
            f"the view holds {size} bytes of text but one response carries at most {room}: lower the session's "
            "context_window, or send known_view_version to receive only the new messages",
            {"view_bytes": size, "max_response_bytes": room},
        )

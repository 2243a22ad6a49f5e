"""Maintenance decisions, pure: when to act, what to prune, what one fold pass reads and keeps, and
whether a candidate may replace the current view. The service runs the summarizer and installs."""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ctxfold.engine import estimator
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.engine.model import SAFETY_MARGIN_TOKENS, SessionConfig, StoredMessage
from ctxfold.engine.view import (
    Checkpoint,
    ViewMessage,
    build_view,
    call_groups,
    estimate,
    group_tokens,
    opening_end,
    prune_candidates,
    prune_stub,
    recent_tail,
    split_fold,
    tail_budget,
)

# Room for the summary instruction (and focus text) appended to a fold request.
INSTRUCTION_TOKENS = 400


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
    def _view(self) -> tuple[ViewMessage, ...]:
        return tuple(
            build_view(
                self.config, self.system_tokens, self.checkpoint, self.kept, self.after, self.pruned, self.anchor_end
            )
        )

    def view(self) -> list[ViewMessage]:
        return list(self._view)

    @functools.cached_property
    def _tokens(self) -> int:
        return estimate(self._view, self.tools_tokens, self.config, self.calibration)

    def tokens(self) -> int:
        """The calibrated request estimate, reserved output included."""
        return self._tokens

    def raw_tokens(self) -> int:
        """The uncalibrated input estimate: what a provider's reported input tokens compare against."""
        return estimator.request_tokens(sum(v.tokens for v in self._view), len(self._view), self.tools_tokens, 0)

    def tail(self, keep_tokens: int | None = None) -> list[StoredMessage]:
        """The newest call groups kept verbatim: within the tail budget, or `keep_tokens` when given
        (0: none beyond the minimal kept set)."""
        budget = tail_budget(self.config, self.system_tokens, self.tools_tokens) if keep_tokens is None else keep_tokens
        return recent_tail(self.messages, budget, self.pruned)

    @property
    def head_seq(self) -> int:
        return self.messages[-1].seq if self.messages else (self.checkpoint.position_seq if self.checkpoint else 0)


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


def prune(projection: Projection) -> dict[str, int]:
    """The pruned set after pruning every large tool result outside the recent tail (new stubs are
    tokenized once here; their counts are persisted with the projection)."""
    pruned = dict(projection.pruned)
    for message in prune_candidates(projection.messages, projection.tail(), projection.pruned):
        pruned[message.id] = estimator.count_text(prune_stub(message.content, message.result_ref))
    return pruned


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


def _prefix_tokens(view: Sequence[ViewMessage]) -> int:
    return sum(v.tokens + estimator.PER_MESSAGE_TOKENS for v in view)


def plan_pass(projection: Projection, input_window_tokens: int, keep_tokens: int | None = None) -> FoldPlan:
    """Decides the kept set (system, the opening anchors, the input the next call must answer,
    pinned messages, the recent tail or `keep_tokens` of it) and the longest read that fits the
    summarizer window, at call-group boundaries."""
    split = split_fold(projection.messages, projection.tail(keep_tokens), projection.anchor_end)
    if not split.folded:
        return FoldPlan(0, None)
    view = projection.view()
    index_of = {v.source.id: i for i, v in enumerate(view) if v.source is not None}
    folded_ids = {m.id for m in split.folded}
    # The fixed part of every pass: tools and instruction; the prefix carries system and summary.
    available = input_window_tokens - projection.tools_tokens - INSTRUCTION_TOKENS
    groups = call_groups(split.folded)
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
    projection: Projection, fold: FoldPass, checkpoint: Checkpoint, after: Sequence[StoredMessage]
) -> Projection:
    """The projection once `checkpoint` (made from `fold`) is installed; `after` are the canonical
    messages after its position (a suffix of the current messages)."""
    live = {m.id for m in [*fold.kept, *after]}
    return Projection(
        config=projection.config,
        system_tokens=projection.system_tokens,
        tools_tokens=projection.tools_tokens,
        calibration=projection.calibration,
        checkpoint=checkpoint,
        kept=tuple(fold.kept),
        after=tuple(after),
        pruned={k: v for k, v in projection.pruned.items() if k in live},
    )


def after_position(projection: Projection, position_seq: int) -> list[StoredMessage]:
    return [m for m in projection.after if m.seq > position_seq]

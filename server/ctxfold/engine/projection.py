"""The projection a view is built from (`Projection`: the config, the head checkpoint, its kept
messages, the messages after it and the prune projection), what it becomes once a checkpoint is
installed (`apply_pass`), and whether a config or a view fits its window at all."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from ctxfold.engine import estimator
from ctxfold.engine.authorship import UNDECIDED, fenced_chars, session_mode
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.engine.model import SAFETY_MARGIN_TOKENS, SessionConfig, StoredMessage
from ctxfold.engine.view import (
    Checkpoint,
    ViewMessage,
    build_view,
    opening_end,
    recent_tail,
    render,
    tail_budget,
)

T = TypeVar("T")

# A step over a view of fewer messages than this may run on the event loop (`ctxfold.cpu` counts a message's work as
# 1 KiB and moves 64 KiB or more to its pool): only its texts are worth adding up to size the step.
LOOP_VIEW_MESSAGES = 64


class _once(Generic[T]):
    """`functools.cached_property` without its lock: in Python 3.11 that lock is one per attribute for
    all instances, so a worker building one long view (`cpu.run`) would block the event loop's first read
    of any other. Two threads may compute a value at once: it is the same value."""

    def __init__(self, compute: Callable[[Any], T]):
        self.compute = compute
        self.name = compute.__name__

    def __get__(self, instance: object, owner: type | None = None) -> T:
        value = self.compute(instance)
        instance.__dict__[self.name] = value  # found there first from now on: computed once
        return value


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

    @property
    def message_count(self) -> int:
        """How many `messages` there are (without joining them)."""
        return len(self.kept) + len(self.after)

    # A projection is immutable, so its view and estimates are computed at most once.
    @_once
    def anchor_end(self) -> int:
        """The seq of the last opening anchor: recorded by the checkpoint that first kept it, found
        in the transcript before any fold."""
        checkpoint = self.checkpoint
        if checkpoint is None:
            return opening_end(self.after, self.config)
        if checkpoint.notes is not None:
            return checkpoint.notes.opening_end_seq
        return opening_end(self.kept, self.config)

    @property
    def _folded_mode(self) -> str:
        notes = self.checkpoint.notes if self.checkpoint is not None else None
        return notes.mode if notes is not None else UNDECIDED

    @_once
    def mode(self) -> str:
        """How the session acts (tool calls or text), carried by the checkpoint for what it folded."""
        return session_mode(self.messages, self._folded_mode)

    @_once
    def fenced_chars(self) -> int:
        """The characters a step over a view of fewer than `LOOP_VIEW_MESSAGES` messages reads beyond stored counts:
        the assistant texts of a session that may act in text, scanned for fenced commands (`authorship.fenced_chars`).
        0 for a longer view, which is worked on in the pool for its messages alone: adding up 100,000 took 18 ms."""
        return fenced_chars(self.messages, self._folded_mode) if self.message_count < LOOP_VIEW_MESSAGES else 0

    @_once
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

    @property
    def has_view(self) -> bool:
        """Whether the view is built (then an extended projection's costs what is new)."""
        return "_view" in self.__dict__

    @_once
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
        if self.has_view and grown.anchor_end == self.anchor_end:
            tail = tuple(render(m, self.pruned, 0, self.bounds) for m in appended)
            _seed(grown, self._view + tail, self._message_tokens + sum(v.tokens for v in tail))
        return grown

    def recalibrated(self, calibration: float) -> Projection:
        """This projection with another calibration; the view does not depend on it and is kept."""
        changed = replace(self, calibration=calibration)
        if self.has_view:
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


def view_parts(projection: Projection) -> tuple[str, StoredMessage | None]:
    """What a view is made of, the largest part first (what a caller can act on when it does not fit:
    pinned messages, the opening, a message too large on its own), and its largest message."""
    parts: dict[str, list[int]] = {"tool schemas": [projection.tools_tokens, 0]}
    largest: tuple[int, StoredMessage] | None = None
    for shown in projection.view():
        source = shown.source
        if source is None:
            part = "summary" if shown.summary else "system prompt"
        else:
            part = "opening" if source.seq <= projection.anchor_end else "pinned" if source.pinned else "messages"
            largest = (shown.tokens, source) if largest is None or shown.tokens > largest[0] else largest
        counted = parts.setdefault(part, [0, 0])
        counted[0] += shown.tokens
        counted[1] += 1
    listed = ", ".join(
        f"{part} {tokens}" + (f" ({count})" if part in ("opening", "pinned", "messages") else "")
        for part, (tokens, count) in sorted(parts.items(), key=lambda item: -item[1][0])
        if tokens
    )
    if largest is None:
        return listed, None
    tokens, message = largest
    return f"{listed}; the largest message is seq {message.seq} ({message.role.value}, {tokens} tokens)", message


def budget_error(projection: Projection, tokens: int, fold_failure: str = "") -> DomainError:
    """The view (`tokens`: its request estimate) does not fit, and what it is made of. When a fold of this
    call failed, that failure is the cause the caller can act on (SUMMARIZER_FAILED, with its reason in
    `summarizer_error`)."""
    config = projection.config
    needs = tokens - config.max_output_tokens
    parts, largest = view_parts(projection)
    fits = (
        f"the view needs {needs} input tokens but at most {config.hard_limit_tokens} fit "
        f"(context_window {config.context_window} − max_output_tokens {config.max_output_tokens} − "
        f"{SAFETY_MARGIN_TOKENS}); in tokens: {parts}"
    )
    metadata: dict[str, object] = {
        "estimated_tokens": tokens,
        "estimated_input_tokens": needs,
        "hard_limit_tokens": config.hard_limit_tokens,
    }
    if largest is not None:
        metadata["largest_message_seq"] = largest.seq
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

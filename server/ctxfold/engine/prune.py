"""Pruning, pure: which large tool results outside the recent tail become stubs (`prune`), and the last resort
when nothing more can be folded, results bounded until the view fits (`bound_to_fit`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ctxfold.engine import estimator
from ctxfold.engine.model import StoredMessage
from ctxfold.engine.projection import Projection
from ctxfold.engine.view import bound_stub, prune_candidates, prune_stub, result_ids, tail_budget

# A prune that stops maintenance must leave this share of the tail budget free below the trigger.
PRUNE_ROOM_SHARE = 0.5


def prune_room(projection: Projection) -> int:
    """Tokens a prune must leave free below the trigger to be installed on its own."""
    return int(PRUNE_ROOM_SHARE * tail_budget(projection.config, projection.system_tokens, projection.tools_tokens))


def prune(projection: Projection) -> dict[str, int]:
    """The pruned set after pruning every large result outside the recent tail (`prune_candidates`; new
    stubs are tokenized once here; their counts are persisted with the projection)."""
    pruned = dict(projection.pruned)
    for message in prune_candidates(projection.messages, projection.tail(), projection.pruned, projection.mode):
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
    if not config.above_ceiling(projection.tokens()):
        return None
    pruned, bounds = dict(projection.pruned), dict(projection.bounds)
    results = result_ids(projection.messages, projection.mode)
    candidate = projection
    changed: set[str] = set()
    for _ in range(len(projection.view())):
        excess = candidate.input_tokens() - config.hard_limit_tokens
        if excess <= 0:
            return Bound(candidate, len(changed))
        # Request tokens count a message's tokens times the calibration.
        excess = int(excess / projection.calibration) + 1
        shrinkable = [
            (v.tokens, v.source)
            for v in candidate.view()
            if v.source is not None
            and v.source.id in results
            and bounds.get(v.source.id, len(v.source.content)) > MIN_BOUND_CODE_POINTS
        ]
        if not shrinkable:
            return None
        shown, message = max(shrinkable, key=lambda item: item[0])
        keep, tokens = _bounded(message, max(1, shown - excess))
        pruned[message.id], bounds[message.id] = tokens, keep
        changed.add(message.id)
        candidate = replace(projection, pruned=dict(pruned), bounds=dict(bounds))
    return Bound(candidate, len(changed)) if not config.above_ceiling(candidate.tokens()) else None

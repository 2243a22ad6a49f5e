"""Background folds, pure: when a fold starts ahead of the trigger (`prefold_due`), what it keeps
(`PreparedFold`: a checkpoint made, not installed) and whether that checkpoint still applies when the
trigger comes (`applied`). A prepared fold applies while the head checkpoint it builds on is still the
head and every message it covers is still there, unchanged: a rewind, fork or delete below it, or
another fold installed meanwhile, makes it stale, and it is discarded, never installed."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ctxfold.engine.candidate import FoldDocument
from ctxfold.engine.maintenance import MaintainRequest, Trigger
from ctxfold.engine.model import SessionConfig, StoredMessage
from ctxfold.engine.projection import Projection, after_position, apply_pass
from ctxfold.engine.prune import prune, prune_room
from ctxfold.engine.view import Checkpoint


@dataclass(frozen=True)
class PreparedFold:
    """A fold made in the background: its checkpoint (whose parent is the head checkpoint it was made
    over), its folded-results document and what it was made from."""

    checkpoint: Checkpoint
    document: FoldDocument
    covered: str  # `covered_digest` of the messages up to the checkpoint's position when it was made
    tokens_before: int  # the view it was made from
    tokens_after: int  # that view with the checkpoint installed
    summarizer: str
    traceparent: str  # the W3C traceparent of the span of the fold that made it ("" untraced)
    create_time: float


def covered_digest(messages: Sequence[StoredMessage], position_seq: int) -> str:
    """Names the messages (seq and id) up to `position_seq`: equal digests, same covered history."""
    digest = hashlib.sha256()
    for message in messages:
        if message.seq > position_seq:
            break
        digest.update(f"{message.seq}:{message.id};".encode())
    return digest.hexdigest()[:32]


def prefold_due(projection: Projection) -> bool:
    """Whether a background fold should start: the view has reached `prefold_tokens` (at the trigger
    too, when the view jumped past the band and still fits: `FoldInBackground`), and pruning would not
    be enough. A prune at the trigger removes at least what it would remove now, so when pruning now
    leaves `prune_room` below the prefold threshold, the trigger will prune, not fold, and a summary
    made now would be paid for nothing."""
    config = projection.config
    tokens = projection.tokens()
    if not 0 < config.prefold_tokens <= tokens or config.above_ceiling(tokens):
        return False
    pruned = replace(projection, pruned=prune(projection))
    return pruned.tokens() >= config.prefold_tokens - prune_room(projection)


def may_install_prepared(config: SessionConfig, request: MaintainRequest, tokens: int) -> bool:
    """Whether a round may install a prepared fold (and so reads one): with background folds on, a Prepare
    whose view (`tokens` when the round loaded it) reached the trigger, or one on overflow. Below the
    trigger a prepared fold waits; a Compact folds what it is asked to."""
    if config.prefold_tokens == 0:
        return False
    return request.trigger is Trigger.OVERFLOW or (
        request.trigger is Trigger.THRESHOLD and tokens >= config.trigger_tokens
    )


def applied(projection: Projection, prepared: PreparedFold) -> Projection | None:
    """The projection with `prepared` installed, when it still applies and makes the view smaller;
    None when it is stale."""
    checkpoint = prepared.checkpoint
    head = projection.checkpoint
    if checkpoint.parent_id != (head.id if head is not None else None):
        return None
    position = checkpoint.position_seq
    if projection.head_seq < position or covered_digest(projection.messages, position) != prepared.covered:
        return None
    by_id = {m.id: m for m in projection.messages}
    kept = [by_id[i] for i in checkpoint.kept_ids if i in by_id]
    if len(kept) != len(checkpoint.kept_ids):
        return None
    candidate = apply_pass(projection, kept, checkpoint, after_position(projection, position))
    return candidate if candidate.tokens() < projection.tokens() else None

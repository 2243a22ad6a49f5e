"""One fold candidate, pure: whether a summarizer's answer can be a summary (`summary_failure`), the
body's budget, whether the candidate may replace the current view (`accept`) and what is installed
(`PruneInstall`, `FoldInstall`: the state stamped for its checkpoint, the fold's document)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ctxfold.engine import artifacts, estimator
from ctxfold.engine.briefing import FoldNotes, FoldRecord, record_fold, render_summary
from ctxfold.engine.folded_index import FoldedIndex
from ctxfold.engine.maintenance import FoldPass, NotFolded
from ctxfold.engine.model import ProviderPayload, SessionConfig, StoredMessage
from ctxfold.engine.projection import Projection, after_position, apply_pass
from ctxfold.engine.state import ContextState, fingerprint
from ctxfold.engine.view import (
    Checkpoint,
)

# The least a summarizer is given for its body, however much the engine's sections take.
MIN_BODY_TOKENS = 256


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


def record_pass(
    projection: Projection, folded: Sequence[StoredMessage], previous_index: FoldedIndex, index_ref: str
) -> FoldRecord:
    """`record_fold` of a pass folding `folded` out of `projection`: from its head checkpoint's notes and
    `previous_index` (that checkpoint's index, read back), within the config's artifact budget, in the
    session's mode; the new index is stored under `index_ref`."""
    notes = projection.checkpoint.notes if projection.checkpoint else None
    budget = artifacts.budget(projection.config)
    return record_fold(
        notes, previous_index, projection.messages, folded, index_ref, budget, projection.anchor_end, projection.mode
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

"""Transcript lineage: how a session's messages are found in shared, immutable segments.

A segment holds messages with seq > its `base_seq`; for seq <= base_seq the transcript continues in
the parent segment. Fork and Rewind never copy messages: a fork starts a new segment whose parent is
the segment holding the fork point, so history is shared structurally (O(1) per fork). A rewind into
the head segment moves that segment's tail to a new (abandoned) segment and keeps the head, so the
live chain does not grow with rewinds (see Store.rewind and `rewind_splits_head`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ctxfold.engine.errors import failed_precondition, invalid


@dataclass(frozen=True)
class Segment:
    id: str
    parent_id: str | None
    base_seq: int


@dataclass(frozen=True)
class SeqRange:
    """Messages of `segment_id` with lo < seq <= hi."""

    segment_id: str
    lo: int
    hi: int


def live_ranges(segments: Mapping[str, Segment], head_segment_id: str, head_seq: int) -> list[SeqRange]:
    """The segment ranges that make up seqs 1..head_seq, newest first."""
    ranges: list[SeqRange] = []
    hi = head_seq
    current: str | None = head_segment_id
    while current is not None and hi > 0:
        segment = segments[current]
        if hi > segment.base_seq:
            ranges.append(SeqRange(segment.id, segment.base_seq, hi))
        hi = min(hi, segment.base_seq)
        current = segment.parent_id
    return ranges


# A rewind that would push some live branch's chain past this many segments starts a new head segment
# instead (see `rewind_splits_head`).
MAX_LIVE_CHAIN = 6


def rewind_splits_head(head_chain: int, live_branch_depth: int) -> bool:
    """Whether a rewind into the head segment moves the head's tail to a new segment (the session keeps
    its chain of `head_chain` segments) rather than starting a new head segment (its chain grows by one).
    Moving the tail re-parents the branches that start in it onto the new segment, lengthening each of
    their chains by one; the deepest session head among them lies `live_branch_depth` segments below the
    head segment (0: none). Each choice lengthens someone's chain: the tail moves unless that takes a
    live branch past MAX_LIVE_CHAIN, or when the session's own chain is already that long (a new head
    segment would be no shorter). So repeated "fork at the head, rewind below the fork, append" keeps
    every chain within MAX_LIVE_CHAIN whether the rewinds go up or down the transcript."""
    moved_chain = head_chain + live_branch_depth + 1 if live_branch_depth else 0
    return moved_chain <= MAX_LIVE_CHAIN or head_chain >= MAX_LIVE_CHAIN


def ranges_within(ranges: list[SeqRange], lo: int, hi: int) -> list[SeqRange]:
    """The parts of `ranges` that hold seqs in (lo, hi]."""
    out = []
    for r in ranges:
        new_lo, new_hi = max(r.lo, lo), min(r.hi, hi)
        if new_hi > new_lo:
            out.append(SeqRange(r.segment_id, new_lo, new_hi))
    return out


def check_branch_seq(seq: int, head_seq: int) -> None:
    """A new branch (Fork, Rewind) starts at a seq of the transcript 0..`head_seq`: SEQ_OUT_OF_RANGE otherwise."""
    if seq < 0:
        raise invalid("SEQ_OUT_OF_RANGE", f"seq {seq} is negative", seq=seq, head_seq=head_seq)
    if seq > head_seq:
        # The head moves (appends, rewinds), so a seq above it is a matter of state, not of the argument.
        raise failed_precondition(
            "SEQ_OUT_OF_RANGE",
            f"seq {seq} is past the session's head (its transcript is 1..{head_seq})",
            seq=seq,
            head_seq=head_seq,
        )


def segment_holding(ranges: list[SeqRange], seq: int) -> str | None:
    """The segment that holds `seq` on the lineage (None for seq 0: the new branch has no parent)."""
    for r in ranges:
        if r.lo < seq <= r.hi:
            return r.segment_id
    return None


@dataclass(frozen=True)
class CheckpointLink:
    id: str
    parent_id: str | None
    position_seq: int


def checkpoint_at_or_before(chain: Mapping[str, CheckpointLink], head_id: str | None, seq: int) -> str | None:
    """The newest checkpoint on the chain from `head_id` whose position is at or before `seq`: after a
    rewind or fork to `seq`, no summary of a later message may stay visible."""
    current = head_id
    while current is not None:
        link = chain[current]
        if link.position_seq <= seq:
            return link.id
        current = link.parent_id
    return None

"""Transcript lineage: how a session's messages are found in shared, immutable segments.

A segment holds messages with seq > its `base_seq`; for seq <= base_seq the transcript continues in
the parent segment. Fork and Rewind never copy messages: a fork starts a new segment whose parent is
the segment holding the fork point, so history is shared structurally (O(1) per fork). A rewind into
the head segment moves that segment's tail to a new (abandoned) segment and keeps the head, so the
live chain does not grow with rewinds (see Store.rewind)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


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


def history_ranges(segments: Mapping[str, Segment], tips: Mapping[str, int]) -> list[SeqRange]:
    """Every range that was ever part of a session's transcript: from each segment the session wrote
    (`tips`: segment id -> the highest seq in it, or its base when it is empty) down its parents.
    Ranges of one segment reached along several paths are merged."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for segment_id, tip in tips.items():
        for r in live_ranges(segments, segment_id, tip):
            spans.setdefault(r.segment_id, []).append((r.lo, r.hi))
    merged: list[SeqRange] = []
    for segment_id, intervals in spans.items():
        intervals.sort()
        lo, hi = intervals[0]
        for next_lo, next_hi in intervals[1:]:
            if next_lo <= hi:
                hi = max(hi, next_hi)
            else:
                merged.append(SeqRange(segment_id, lo, hi))
                lo, hi = next_lo, next_hi
        merged.append(SeqRange(segment_id, lo, hi))
    return merged


def ranges_within(ranges: list[SeqRange], lo: int, hi: int) -> list[SeqRange]:
    """The parts of `ranges` that hold seqs in (lo, hi]."""
    out = []
    for r in ranges:
        new_lo, new_hi = max(r.lo, lo), min(r.hi, hi)
        if new_hi > new_lo:
            out.append(SeqRange(r.segment_id, new_lo, new_hi))
    return out


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

"""What a Prepare or Compact streams while it maintains a session (the proto's `FoldProgress`), one event a step."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


class FoldStage(enum.Enum):
    PRUNED = "pruned"
    PLANNED = "planned"
    PASS_STARTED = "pass_started"
    SUMMARY_DELTA = "summary_delta"
    PASS_COMMITTED = "pass_committed"
    PASS_FAILED = "pass_failed"
    SUMMARIZER_FALLBACK = "summarizer_fallback"
    RESULTS_BOUNDED = "results_bounded"
    BACKGROUND_STARTED = "background_started"
    PREPARED_INSTALLED = "prepared_installed"
    BACKGROUND_RUNNING = "background_running"


@dataclass(frozen=True)
class FoldProgress:
    stage: FoldStage
    message: str
    pass_index: int = 0
    passes_planned: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    checkpoint_id: str = ""
    summary_delta: str = ""
    summarizer: str = ""


@dataclass(frozen=True)
class AppendStored:
    """A Prepare's first event: its append is stored (what is left may wait for a summarizer). Not sent."""


Emit = Callable[[FoldProgress], Awaitable[None]]


async def no_progress(_: FoldProgress) -> None:
    """The emit of a call nobody listens to (a background fold)."""

"""What each replayed Prepare stands for as requests to a model: the agent's model call over the
view it returned, and the summarizer requests its folds made — a fold's passes, and a background
fold's, billed when a Prepare installs it or as paid for nothing when it is never used."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import replace

from ctxfold.engine import estimator
from ctxfold.replay.metrics import AGENT_KEY, ModelCall, SummaryCall
from ctxfold.replay.options import ReplayError
from ctxfold.replay.trace import Msg, Turn
from ctxfold.summarizers.base import SummaryRequest
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

BACKGROUND_SETTLE_SECONDS = 60.0


def model_call(
    turn: Turn,
    result: pb.PreparedContext,
    progress: Sequence[pb.FoldProgress],
    view: Sequence[Msg],
    new_view: Sequence[Msg],
    appended: Sequence[Msg],
    limit: int,
    background: Background,
    waited: float,
    offline: bool,
) -> ModelCall:
    """The model call a Prepare answered for: its view, what maintenance did and every summary request
    it stands for (its passes'; a background fold's, when installed here or replaced unused). With
    background folds on (`offline`), a pass in the Prepare itself is the offline fold of a view that
    cannot be sent (`Fold.offline`): written by `extractive`, it is no LLM request and no wait."""
    stages = [p.stage for p in progress]
    passes = stages.count(pb.FOLD_STAGE_PASS_STARTED)
    key = result.prompt_cache_key or AGENT_KEY
    summary_calls: list[SummaryCall] = []
    if passes and not offline:
        previous_summary = next((m.content for m in view if m.summary), "")
        instruction = SummaryRequest("", "", "", previous_summary, (), (), limit).instruction()
        committed = stages.count(pb.FOLD_STAGE_PASS_COMMITTED)
        summary_calls = _summary_calls(view, appended, new_view, key, instruction, passes, committed)
    unused = 0
    if pb.FOLD_STAGE_PREPARED_INSTALLED in stages and background.started is not None:
        summary_calls += background.installed(new_view, key, limit)
    if pb.FOLD_STAGE_BACKGROUND_STARTED in stages:
        if background.started is not None:  # the one before was never installed
            summary_calls.append(background.unused(new_view, limit))
            unused += 1
        background.start(new_view, key)
    return ModelCall(
        view=tuple(new_view),
        answer=turn.answer,
        action={pb.ACTION_FOLDED: "folded", pb.ACTION_PRUNED: "pruned"}.get(result.action, "none"),
        key=key,
        summary_calls=tuple(summary_calls),
        prunes=stages.count(pb.FOLD_STAGE_PRUNED) + stages.count(pb.FOLD_STAGE_RESULTS_BOUNDED),
        failed_summaries=stages.count(pb.FOLD_STAGE_PASS_FAILED),
        unused_summaries=unused,
        prepare_seconds=waited,
    )


def _summary_calls(
    previous_view: Sequence[Msg],
    appended: Sequence[Msg],
    new_view: Sequence[Msg],
    key: str,
    instruction: str,
    passes: int,
    committed: int,
) -> list[SummaryCall]:
    """The fold's summarizer request(s) as an LLM would receive them (a cache-safe fork of the
    agent's request): the view before the fold up to its last folded message, then the instruction.
    Several passes in one Prepare are modeled as that one read, plus empty reads for the others."""
    before = [*previous_view, *appended]
    kept = {m.source for m in new_view if m.source >= 0}
    cut = max((i for i, m in enumerate(before) if m.summary or (m.source >= 0 and m.source not in kept)), default=-1)
    output = sum(estimator.count_text(m.content) for m in new_view if m.summary) if committed else 0
    first = SummaryCall(key, (*before[: cut + 1], Msg("user", instruction)), output)
    return [first, *(SummaryCall(key, (), 0) for _ in range(passes - 1))]


class Background:
    """The background fold the replayed session started last, until a Prepare installs it. Its
    summarizer request is modeled like a fold's, from the view it was started over, and billed when it
    is installed, or as paid for nothing when another one starts (it went stale or failed) or the
    replay ends."""

    def __init__(self) -> None:
        self.started: tuple[tuple[Msg, ...], str] | None = None  # (view it folds, cache key)
        self._receipts: set[str] = set()

    def start(self, view: Sequence[Msg], key: str) -> None:
        self.started = (tuple(view), key)

    def installed(self, new_view: Sequence[Msg], key: str, limit: int) -> list[SummaryCall]:
        assert self.started is not None
        view, started_key = self.started
        self.started = None
        previous_summary = next((m.content for m in view if m.summary), "")
        instruction = SummaryRequest("", "", "", previous_summary, (), (), limit).instruction()
        return [
            replace(made, background=True)
            for made in _summary_calls(view, [], new_view, started_key, instruction, 1, 1)
        ]

    def unused(self, latest_view: Sequence[Msg], limit: int) -> SummaryCall:
        """The summary request of a background fold never installed; its summary is assumed as long as
        the newest one shown (half the summary budget before any)."""
        assert self.started is not None
        view, key = self.started
        self.started = None
        shown = [estimator.count_text(m.content) for m in latest_view if m.summary]
        return SummaryCall(key, (*view, Msg("user", "summarize")), shown[0] if shown else limit // 2, background=True)

    async def settled(
        self, stub: pb_grpc.ContextServiceAsyncStub, session_id: str, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        """Waits until the background fold just started has ended (its "prepared" or "failed" receipt):
        the replay stands for an agent whose model call takes longer than the summary."""
        deadline = time.monotonic() + BACKGROUND_SETTLE_SECONDS
        while time.monotonic() < deadline:
            response = await stub.GetContextState(pb.GetContextStateRequest(session_id=session_id), metadata=metadata)
            receipts = json.loads(response.state_json).get("receipts", [])
            ended = {
                r["operation_id"]
                for r in receipts
                if r.get("action") == "background" and r.get("status") in ("prepared", "failed")
            }
            if ended - self._receipts:
                self._receipts |= ended
                return
            await asyncio.sleep(0.01)
        raise ReplayError(f"a background fold did not end within {BACKGROUND_SETTLE_SECONDS:g} s")

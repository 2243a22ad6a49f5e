"""The default summarizer: offline, deterministic, no LLM. It writes the narrative body of the
briefing — what was decided, and the plan the work stands at — from the folded messages themselves.
The standing instructions, the artifact index (files, commands, errors) and the folded-results
index are rendered by the engine around it (`ctxfold.engine.briefing`), so they are not repeated
here.

Across folds the body is anchored and iterative: the previous body's sections are merged with the
new span section by section (decisions appended, the plan replaced), never nested; the oldest
decisions go first when the body outgrows its budget."""

from __future__ import annotations

from ctxfold import cpu
from ctxfold.engine import estimator
from ctxfold.engine.briefing import sections, strip_engine_sections
from ctxfold.engine.model import Role
from ctxfold.summarizers.base import IN_PROCESS_PROVIDER, OnDelta, SummaryRequest, SummaryResult

DECISIONS = "Decisions"
PENDING = "Pending & next step"
NO_PLAN = "No plan was stated in the folded turns: continue from the messages below."
_DECISION_CHARS = 240
_PLAN_CHARS = 600
_MIN_ITEM_CHARS = 40
# The body takes at most this share of max_tokens: every token of it is paid on every later call,
# and the engine's sections need room too.
BODY_SHARE = 0.1


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _render(decisions: list[str], pending: list[str]) -> str:
    parts = []
    if decisions:
        parts.append(f"## {DECISIONS}\n" + "\n".join(f"- {item}" for item in decisions))
    if pending:
        parts.append(f"## {PENDING}\n" + "\n".join(f"- {item}" for item in pending))
    return "\n\n".join(parts)


def briefing(request: SummaryRequest) -> str:
    """The body within BODY_SHARE of `request.max_tokens`: the previous body's decisions followed by
    the new span's (what the agent said it did and why), then the newest stated plan."""
    previous = sections(strip_engine_sections(request.previous_summary))
    decisions = list(previous.get(DECISIONS, []))
    for message in request.folded:
        if message.role is Role.ASSISTANT and message.content.strip():
            item = _clip(message.content, _DECISION_CHARS)
            if not decisions or decisions[-1] != item:
                decisions.append(item)
    last_plan = next(
        (m.content for m in reversed(request.folded) if m.role is Role.ASSISTANT and m.content.strip()), ""
    )
    pending = ["Last stated plan: " + _clip(last_plan, _PLAN_CHARS)] if last_plan else previous.get(PENDING, [])[:1]
    # Never empty (an empty summary is how a failed summarizer looks): the agent resumes from the view.
    pending = pending or [NO_PLAN]
    if request.focus:
        pending.append("Focus: " + _clip(request.focus, _PLAN_CHARS))
    budget = max(1, int(request.max_tokens * BODY_SHARE))
    del decisions[:-budget]  # each is a line of a token or more: no more of the newest can fit
    text = _render(decisions, pending)
    while decisions and estimator.count_text(text) > budget:
        # Drop a batch at a time so a long fold needs few re-counts.
        del decisions[: max(1, len(decisions) // 4)]
        text = _render(decisions, pending)
    return _within(pending, text, request.max_tokens)


def _within(pending: list[str], text: str, max_tokens: int) -> str:
    """The body with the plan clipped, a share at a time, until it is within `max_tokens` (the most a body may take):
    a plan's characters are a quarter of a token each in English, more than one in Chinese."""
    while (tokens := estimator.count_text(text)) > max_tokens and any(len(item) > _MIN_ITEM_CHARS for item in pending):
        share = max_tokens / tokens * 0.9
        pending = [_clip(item, max(_MIN_ITEM_CHARS, int(len(item) * share))) for item in pending]
        text = _render([], pending)  # over max_tokens, the decisions are gone already (they left for its share)
    return text


class ExtractiveSummarizer:
    name = "extractive"
    provider = IN_PROCESS_PROVIDER
    model = "extractive"
    server_address = ""
    server_port = 0

    def __init__(self, input_window_tokens: int = 1_000_000):
        self.input_window_tokens = input_window_tokens

    async def summarize(self, request: SummaryRequest, on_delta: OnDelta | None = None) -> SummaryResult:
        size = len(request.folded) * cpu.MESSAGE_WORK_BYTES + sum(len(m.content) for m in request.folded)
        text = await cpu.run(size, briefing, request)
        if on_delta is not None:
            await on_delta(text)
        return SummaryResult(text=text, finish_reason="stop", input_tokens=0, output_tokens=0)

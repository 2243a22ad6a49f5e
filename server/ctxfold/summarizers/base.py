"""The summarizer protocol: turn the folded part of a view into one durable resume briefing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ctxfold.engine.view import ViewMessage

SECTIONS = (
    "Standing facts & constraints",
    "Goal",
    "Decisions",
    "Files & code",
    "Commands & outcomes",
    "Errors & fixes",
    "Pending & next step",
)

INSTRUCTIONS = (
    "Write a durable resume briefing of the conversation above so that work can continue from it alone. "
    "Use exactly these sections: " + "; ".join(SECTIONS) + ". Keep identifiers, paths, commands and numbers "
    "exactly as written, say where the work stands, and list the result_ref of every tool result you fold so "
    "it can be read back with ReadToolResult."
)


@dataclass(frozen=True)
class SummaryRequest:
    system_prompt: str
    tools_json: str
    prompt_cache_key: str
    previous_summary: str
    folded: Sequence[ViewMessage]
    max_tokens: int
    focus: str = ""


@dataclass(frozen=True)
class SummaryResult:
    text: str
    finish_reason: str  # "stop" when complete; "length" marks a truncated summary, which is rejected
    input_tokens: int = 0
    output_tokens: int = 0


OnDelta = Callable[[str], Awaitable[None]]


class Summarizer(Protocol):
    name: str
    # The largest fold input (tokens) one summary request can read; larger folds run in passes.
    input_window_tokens: int

    async def summarize(self, request: SummaryRequest, on_delta: OnDelta | None = None) -> SummaryResult: ...

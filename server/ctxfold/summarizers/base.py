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


class SummarizerError(Exception):
    """The summarizer could not produce a summary; the message says why."""


@dataclass(frozen=True)
class SummaryRequest:
    """A cache-safe fork of the agent's request: its system prompt, tools and cache key, and the view
    exactly as the agent sends it up to the last folded message (`prefix`, which starts with the
    system message and the previous summary when there are ones); the instruction follows."""

    system_prompt: str
    tools_json: str
    prompt_cache_key: str
    previous_summary: str
    prefix: Sequence[ViewMessage]
    folded: Sequence[ViewMessage]  # the messages of `prefix` this summary replaces
    max_tokens: int
    focus: str = ""
    # The agent sends max_tokens itself (max_output_tokens > 0); a fork that mirrors it sends one too.
    send_max_tokens: bool = True

    def instruction(self) -> str:
        text = INSTRUCTIONS + f" Stay within {self.max_tokens} tokens."
        if self.previous_summary:
            text += " Roll the earlier summary in: keep what still matters from it."
        return text + (f"\n\nFocus: {self.focus}" if self.focus else "")


@dataclass(frozen=True)
class SummaryResult:
    text: str
    finish_reason: str  # "stop" when complete; "length" marks a truncated summary, which is rejected
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    response_model: str = ""  # the model that answered, as the provider names it


OnDelta = Callable[[str], Awaitable[None]]


# The provider of summarizers that run in the server and call no model (extractive).
IN_PROCESS_PROVIDER = "ctxfold"


class Summarizer(Protocol):
    name: str
    provider: str  # for telemetry (gen_ai.provider.name): "openai", "anthropic", IN_PROCESS_PROVIDER
    model: str
    server_address: str  # the provider's host, for telemetry; "" in process
    # The largest fold input (tokens) one summary request can read; larger folds run in passes.
    input_window_tokens: int

    async def summarize(self, request: SummaryRequest, on_delta: OnDelta | None = None) -> SummaryResult: ...

"""The standing instructions of a summary: every message a person wrote that a fold removed, verbatim
and bounded, oldest first (which messages a person wrote is `engine/authorship.py`'s rule), each from
where the person's text starts (after the reminders a harness put before it).

Each shows its first `INSTRUCTION_CHARS` characters; the rest is one ReadToolResult away. All of them
together take at most their budget (a share of the window, `artifacts.budget`): beyond it the oldest
are shown by their head and reference, then the oldest of those are listed in the folded-results
index, counted in the summary. A long interactive session never makes the view too large to answer,
and every message stays readable."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxfold.engine import estimator
from ctxfold.engine.authorship import without_leading_wrappers
from ctxfold.engine.model import StoredMessage

# One instruction shows this many characters verbatim; the rest is one ReadToolResult away.
INSTRUCTION_CHARS = 2000
# An instruction shown by its head (over budget) keeps this many characters of it.
HEAD_CHARS = 200


def quoted(text: str) -> str:
    """A person's text, every line behind "> ": no line of it can read as one the engine writes (a
    section heading, a `[message N]` or `[ctxfold: …]` line), whatever the person typed."""
    return "\n".join("> " + line for line in text.split("\n"))


@dataclass(frozen=True)
class Instruction:
    seq: int
    text: str  # the message's first INSTRUCTION_CHARS characters, verbatim
    result_ref: str  # where all of it is read ("" for messages stored before user messages had refs)
    omitted_chars: int

    def render(self, head: bool = False) -> str:
        """The instruction as the summary shows it; `head`: its first HEAD_CHARS characters only."""
        shown = self.text[:HEAD_CHARS] if head else self.text
        omitted = self.omitted_chars + len(self.text) - len(shown)
        more = ""
        if omitted:
            where = f"ListMessages (seq {self.seq})"
            if self.result_ref:
                where = f'ReadToolResult(result_ref="{self.result_ref}")'
            more = f"\n[ctxfold: {omitted} more characters of this message: {where}]"
        return f"[message {self.seq}]\n{quoted(shown)}{more}"


def instruction(message: StoredMessage) -> Instruction:
    """A person's message as an instruction: what they wrote, from its start or after the harness text before it."""
    text = without_leading_wrappers(message.content)
    shown = text[:INSTRUCTION_CHARS]
    return Instruction(message.seq, shown, message.result_ref, len(text) - len(shown))


@dataclass(frozen=True)
class Shown:
    """Instructions within their budget: `shown` (the first `headed` of them by their head only) and
    the oldest, `listed` apart in the folded-results index."""

    shown: tuple[Instruction, ...]
    headed: int
    listed: tuple[Instruction, ...]


def within_budget(instructions: Sequence[Instruction], budget: int) -> Shown:
    """All verbatim when they fit `budget` tokens; else the oldest by their head, one by one, until they
    fit; then the oldest listed apart, until they fit (the newest always stays shown)."""
    full = [estimator.count_text(i.render()) for i in instructions]
    total = sum(full)
    if total <= budget:
        return Shown(tuple(instructions), 0, ())
    heads = [estimator.count_text(i.render(head=True)) for i in instructions]
    headed = 0
    while headed < len(instructions) and total > budget:
        total += heads[headed] - full[headed]
        headed += 1
    listed = 0
    while listed < len(instructions) - 1 and total > budget:
        total -= heads[listed]
        listed += 1
    return Shown(tuple(instructions[listed:]), headed - listed, tuple(instructions[:listed]))

"""The parts of a summary the engine owns and renders itself, for every summarizer: the person's
standing instructions (verbatim), the artifact index and the reference of the folded-results
index. The summarizer writes only the narrative body between them, so no LLM can drop, rewrite or
invent an instruction or a path.

Which user messages a person wrote is `engine/authorship.py`'s rule: interruption notices, task
notifications, command wrappers, an agent's own compaction summary and the output of text actions
are machine-written and fold like any other message; the person's are carried verbatim."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxfold.engine import artifact_listing, artifacts, folded_index
from ctxfold.engine.artifact_extraction import message_artifacts
from ctxfold.engine.artifacts import Artifact
from ctxfold.engine.authorship import UNDECIDED, author
from ctxfold.engine.folded_index import FoldedIndex
from ctxfold.engine.instructions import Instruction, instruction, within_budget
from ctxfold.engine.model import Author, Role, StoredMessage

HEADER = "[ctxfold summary of earlier conversation]"
INSTRUCTIONS_TITLE = "## Standing instructions (the person's messages, verbatim, oldest first)"
ARTIFACTS_TITLE = "## Artifact index (most recent first)"
INDEX_TITLE = "## Folded tool results"
# Section titles the engine renders; the same titles in a summarizer's text are dropped.
ENGINE_TITLES = ("standing instructions", "standing facts", "artifact index", "folded tool results")
_HEADING = re.compile(r"^#{1,3} +(.+?)\s*$", re.M)


@dataclass(frozen=True)
class FoldNotes:
    """What a checkpoint carries as data besides its summary text: rolled forward fold to fold."""

    instructions: tuple[Instruction, ...] = ()  # oldest first, within the instructions' budget
    headed: int = 0  # the first `headed` of them are shown by their head only
    more_instructions: int = 0  # older ones the budget left to the folded-results index
    artifacts: tuple[Artifact, ...] = ()  # most recent first, within the artifact budget
    # What the artifact budget left to the folded-results index, by category ("paths": 41).
    more_artifacts: dict[str, int] = field(default_factory=dict)
    index_ref: str = ""
    index_results: int = 0
    body: str = ""  # the summarizer's sections
    summarizer: str = ""
    opening_end_seq: int = 0  # the task anchor: the opening messages up to this seq stay verbatim
    mode: str = UNDECIDED  # how the session acts, as far as folded messages show (engine/authorship.py)

    def to_json(self) -> dict[str, object]:
        return {
            "instructions": [i.__dict__ for i in self.instructions],
            "headed": self.headed,
            "more_instructions": self.more_instructions,
            "artifacts": [a.to_json() for a in self.artifacts],
            "more_artifacts": dict(self.more_artifacts),
            "index_ref": self.index_ref,
            "index_results": self.index_results,
            "body": self.body,
            "summarizer": self.summarizer,
            "opening_end_seq": self.opening_end_seq,
            "mode": self.mode,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> FoldNotes:
        return FoldNotes(
            instructions=tuple(Instruction(**i) for i in data.get("instructions", ())),
            headed=int(data.get("headed", 0)),
            more_instructions=int(data.get("more_instructions", 0)),
            artifacts=tuple(Artifact.from_json(a) for a in data.get("artifacts", ())),
            more_artifacts={str(k): int(v) for k, v in (data.get("more_artifacts") or {}).items()},
            index_ref=str(data.get("index_ref", "")),
            index_results=int(data.get("index_results", 0)),
            body=str(data.get("body", "")),
            summarizer=str(data.get("summarizer", "")),
            opening_end_seq=int(data.get("opening_end_seq", 0)),
            mode=str(data.get("mode", UNDECIDED)),
        )


@dataclass(frozen=True)
class FoldRecord:
    """The engine's side of one fold: the notes (the body follows from the summarizer) and the
    folded-results index document to store under `notes.index_ref`."""

    notes: FoldNotes
    index: FoldedIndex
    new_results: int = 0  # results this fold added to the index


def person_messages(messages: Sequence[StoredMessage], folded_ids: set[str], mode: str) -> list[StoredMessage]:
    """The folded user messages a person wrote (`engine/authorship.py`), oldest first."""
    found = []
    for index, message in enumerate(messages):
        previous = messages[index - 1] if index else None
        if message.id in folded_ids and message.role is Role.USER and author(message, previous, mode) is Author.PERSON:
            found.append(message)
    return found


def record_fold(
    previous: FoldNotes | None,
    previous_index: FoldedIndex,
    messages: Sequence[StoredMessage],
    folded: Sequence[StoredMessage],
    index_ref: str,
    budget: artifacts.Budget,
    opening_end_seq: int,
    mode: str,
) -> FoldRecord:
    """The notes and index after folding `folded` (a part of `messages`, the view's canonical
    messages, of a session acting as `mode` says): instructions appended and artifacts merged, each
    kept within its `budget` (what falls out goes to the index, and the summary says how much), every
    folded result indexed."""
    earlier = previous or FoldNotes()
    folded_ids = {m.id for m in folded}
    known = {i.seq for i in (*earlier.instructions, *previous_index.instructions)}
    instructions = within_budget(
        earlier.instructions
        + tuple(instruction(m) for m in person_messages(messages, folded_ids, mode) if m.seq not in known),
        budget.instructions,
    )
    merged = artifact_listing.merge(earlier.artifacts, message_artifacts(folded, mode))
    kept, evicted = artifact_listing.within_budget(merged, budget)
    entries = folded_index.entries_for(folded, messages)
    index = folded_index.extend(previous_index, entries, evicted, instructions.listed)
    listed = {a.key for a in kept}
    notes = FoldNotes(
        instructions=instructions.shown,
        headed=instructions.headed,
        more_instructions=earlier.more_instructions + len(instructions.listed),
        artifacts=tuple(kept),
        more_artifacts=artifact_listing.counts([a for a in index.artifacts if a.key not in listed]),
        index_ref=index_ref,
        index_results=len(index.entries),
        body=earlier.body,
        summarizer=earlier.summarizer,
        opening_end_seq=opening_end_seq,
        mode=mode,
    )
    return FoldRecord(notes, index, len(index.entries) - len(previous_index.entries))


def strip_engine_sections(text: str) -> str:
    """A summarizer's text without the sections the engine renders itself (an LLM that writes its
    own "standing instructions" would rewrite or invent them) and without the summary header."""
    text = text.replace(HEADER, "")
    matches = list(_HEADING.finditer(text))
    if not matches:
        return text.strip()
    parts = [text[: matches[0].start()]]
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        if not match.group(1).lower().startswith(ENGINE_TITLES):
            parts.append(text[match.start() : end])
    return "".join(parts).strip()


def sections(body: str) -> dict[str, list[str]]:
    """A body's `## Title` sections and their `- item` lines (continuation lines join their item)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in body.splitlines():
        heading = _HEADING.match(line)
        if heading:
            current = found.setdefault(heading.group(1), [])
        elif current is not None and line.startswith("- "):
            current.append(line[2:])
        elif current is not None and line.strip() and current:
            current[-1] += " " + line.strip()
    return found


def _more(notes: FoldNotes) -> str:
    """The line naming what the artifact budget left out, and where it is read: nothing leaves silently."""
    if not notes.more_artifacts:
        return ""
    order = (artifacts.PATHS, *artifacts.CATEGORY.values())
    listed = ", ".join(f"{notes.more_artifacts[c]} more {c}" for c in order if notes.more_artifacts.get(c))
    return f'[ctxfold: {listed}, older, are listed in ReadToolResult(result_ref="{notes.index_ref}")]'


def _more_instructions(notes: FoldNotes) -> str:
    return (
        f"[ctxfold: {notes.more_instructions} earlier messages of the person, verbatim, are listed in "
        f'ReadToolResult(result_ref="{notes.index_ref}")]'
    )


def render_summary(notes: FoldNotes) -> str:
    parts = [HEADER]
    if notes.instructions:
        shown = [i.render(head=n < notes.headed) for n, i in enumerate(notes.instructions)]
        if notes.more_instructions:
            shown.insert(0, _more_instructions(notes))
        parts.append(INSTRUCTIONS_TITLE + "\n" + "\n\n".join(shown))
    if notes.body:
        parts.append(notes.body)
    if notes.artifacts or notes.more_artifacts:
        parts.append("\n".join((ARTIFACTS_TITLE, artifact_listing.render(notes.artifacts), _more(notes))).strip())
    if notes.index_ref:
        parts.append(
            f"{INDEX_TITLE}\n{notes.index_results} tool results are no longer shown in full; each is listed "
            f'(result_ref, tool, arguments, size, first line) in ReadToolResult(result_ref="{notes.index_ref}").'
        )
    return "\n\n".join(parts)

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
from ctxfold.engine.model import Author, Role, StoredMessage

HEADER = "[ctxfold summary of earlier conversation]"
INSTRUCTIONS_TITLE = "## Standing instructions (the person's messages, verbatim, oldest first)"
ARTIFACTS_TITLE = "## Artifact index (most recent first)"
INDEX_TITLE = "## Folded tool results"
# Section titles the engine renders; the same titles in a summarizer's text are dropped.
ENGINE_TITLES = ("standing instructions", "standing facts", "artifact index", "folded tool results")
# One instruction shows this many characters verbatim; the rest is one ReadToolResult away.
INSTRUCTION_CHARS = 2000
_HEADING = re.compile(r"^#{1,3} +(.+?)\s*$", re.M)


@dataclass(frozen=True)
class Instruction:
    seq: int
    text: str  # the message's first INSTRUCTION_CHARS characters, verbatim
    result_ref: str  # where all of it is read ("" for messages stored before user messages had refs)
    omitted_chars: int

    def render(self) -> str:
        more = ""
        if self.omitted_chars:
            where = f"ListMessages (seq {self.seq})"
            if self.result_ref:
                where = f'ReadToolResult(result_ref="{self.result_ref}")'
            more = f"\n[ctxfold: {self.omitted_chars} more characters of this message: {where}]"
        return f"[message {self.seq}]\n{quoted(self.text)}{more}"


def quoted(text: str) -> str:
    """A person's text, every line behind "> ": no line of it can read as one the engine writes (a
    section heading, a `[message N]` or `[ctxfold: …]` line), whatever the person typed."""
    return "\n".join("> " + line for line in text.split("\n"))


@dataclass(frozen=True)
class FoldNotes:
    """What a checkpoint carries as data besides its summary text: rolled forward fold to fold."""

    instructions: tuple[Instruction, ...] = ()
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


def instruction(message: StoredMessage) -> Instruction:
    text = message.content
    shown = text[:INSTRUCTION_CHARS]
    return Instruction(message.seq, shown, message.result_ref, len(text) - len(shown))


def record_fold(
    previous: FoldNotes | None,
    previous_index: FoldedIndex,
    messages: Sequence[StoredMessage],
    folded: Sequence[StoredMessage],
    index_ref: str,
    artifact_budget: artifacts.Budget,
    opening_end_seq: int,
    mode: str,
) -> FoldRecord:
    """The notes and index after folding `folded` (a part of `messages`, the view's canonical
    messages, of a session acting as `mode` says): instructions appended, artifacts merged and kept
    within `artifact_budget` (what falls out goes to the index, and the summary says how much),
    every folded result indexed."""
    earlier = previous or FoldNotes()
    folded_ids = {m.id for m in folded}
    known = {i.seq for i in earlier.instructions}
    instructions = earlier.instructions + tuple(
        instruction(m) for m in person_messages(messages, folded_ids, mode) if m.seq not in known
    )
    merged = artifact_listing.merge(earlier.artifacts, message_artifacts(folded, mode))
    kept, evicted = artifact_listing.within_budget(merged, artifact_budget)
    entries = folded_index.entries_for(folded, messages)
    index = folded_index.extend(previous_index, entries, evicted)
    listed = {a.key for a in kept}
    notes = FoldNotes(
        instructions=instructions,
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


def render_summary(notes: FoldNotes) -> str:
    parts = [HEADER]
    if notes.instructions:
        parts.append(INSTRUCTIONS_TITLE + "\n" + "\n\n".join(i.render() for i in notes.instructions))
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

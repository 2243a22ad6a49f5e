"""The artifact index: what the agent touched — files, each marked by what was done to it (edited,
written, run, read, searched), background tasks, errors, URLs and commands with their exit status —
extracted deterministically from tool calls and their results, rolled forward across folds.

This module is the index's model and its budget. Extraction is `artifact_extraction` (tool calls
and messages) and `artifact_scripts` (shell commands, patches, scripts); merging across folds,
fitting the budget and rendering are `artifact_listing`."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ctxfold.engine.model import SessionConfig


class Kind(enum.Enum):
    """Files first, by what was done to them; then the handles a resumed agent needs, then history.
    The budget keeps them in this order."""

    EDITED = "edited"
    WRITTEN = "written"
    RUN = "run"
    READ = "read"
    SEARCHED = "searched"
    TASK = "task"
    ERROR = "error"
    URL = "url"
    COMMAND = "command"


FILE_KINDS = (Kind.EDITED, Kind.WRITTEN, Kind.RUN, Kind.READ, Kind.SEARCHED)
# A file's marks in the index; a file only read is left unmarked.
MARKS = {Kind.EDITED: "E", Kind.WRITTEN: "W", Kind.RUN: "X", Kind.READ: "R", Kind.SEARCHED: "S"}
FILES_LEGEND = "Files by directory (E edited, W written, X run, S searched; unmarked: read)"
# How the count of what did not fit names each category ("41 more paths").
CATEGORY = {Kind.TASK: "tasks", Kind.ERROR: "errors", Kind.URL: "URLs", Kind.COMMAND: "commands"}
PATHS = "paths"
# The artifact index lists files within this share of the context window, and the rest (tasks,
# errors, URLs, commands) within OTHERS_WINDOW_SHARE; what does not fit goes to the folded-results
# index, counted in the view. Each at least ARTIFACT_MIN_TOKENS.
FILES_WINDOW_SHARE = 0.08
OTHERS_WINDOW_SHARE = 0.02
ARTIFACT_MIN_TOKENS = 128
# The standing instructions (engine/instructions.py) take at most this share of the window, and at
# least INSTRUCTIONS_MIN_TOKENS: what is beyond is shortened to heads, then listed in the index.
INSTRUCTIONS_WINDOW_SHARE = 0.25
INSTRUCTIONS_MIN_TOKENS = 512
# All of them take at most this share of what the view holds beside a whole summary body (the hard ceiling less
# summary_max_tokens): at a small window, or beside a large reserved output, their minimums and shares left a fold's
# summary larger than the messages it replaced (a short message takes more tokens as an instruction), and the view
# above its ceiling.
ROOM_SHARE = 0.5


@dataclass(frozen=True)
class Budget:
    """Tokens the engine's sections may take in a summary: the artifact index's files and everything
    else it lists, and the standing instructions."""

    files: int
    others: int
    instructions: int


def budget(config: SessionConfig) -> Budget:
    """The engine's sections' budget: it scales with the window, all of it within ROOM_SHARE of the view's room."""
    window = config.context_window
    wanted = (
        max(ARTIFACT_MIN_TOKENS, int(window * FILES_WINDOW_SHARE)),
        max(ARTIFACT_MIN_TOKENS, int(window * OTHERS_WINDOW_SHARE)),
        max(INSTRUCTIONS_MIN_TOKENS, int(window * INSTRUCTIONS_WINDOW_SHARE)),
    )
    room = max(0, int((config.hard_limit_tokens - config.summary_max_tokens) * ROOM_SHARE))
    scale = min(1.0, room / sum(wanted))
    files, others, instructions = (int(tokens * scale) for tokens in wanted)
    return Budget(files, others, instructions)


@dataclass(frozen=True)
class Artifact:
    kind: Kind  # for a file, its strongest mark
    value: str
    detail: str = ""  # a command's exit status
    marks: frozenset[Kind] = field(default=frozenset())  # a file's: every way it was touched

    @property
    def key(self) -> tuple[str, str]:
        """Identity for deduplication: a file is one artifact however it was touched."""
        return ("file" if self.kind in FILE_KINDS else self.kind.value, self.value)

    @property
    def touched(self) -> frozenset[Kind]:
        return self.marks or frozenset({self.kind})

    @property
    def category(self) -> str:
        return PATHS if self.kind in FILE_KINDS else CATEGORY[self.kind]

    def to_json(self) -> dict[str, str]:
        data = {"kind": self.kind.value, "value": self.value}
        if self.detail:
            data["detail"] = self.detail
        if len(self.touched) > 1:
            data["marks"] = "".join(sorted(MARKS[k] for k in self.touched))
        return data

    @staticmethod
    def from_json(data: dict[str, str]) -> Artifact:
        by_mark = {mark: kind for kind, mark in MARKS.items()}
        marks = frozenset(by_mark[m] for m in data.get("marks", "") if m in by_mark)
        return Artifact(Kind(data["kind"]), data["value"], data.get("detail", ""), marks)

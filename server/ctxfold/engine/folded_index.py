"""The folded-results index: one document listing every tool result the view no longer shows in
full (and every artifact and standing instruction that fell out of the summary's budgets), so that
all of them are reachable from the one reference the summary names, however many folds happened.

Each fold writes a new document: the previous one's entries plus the newly folded results, newest
first, one JSON object per line under a plain-text header. It is stored like a raw tool result and
read (and paged) with ReadToolResult."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ctxfold.engine.artifacts import Artifact
from ctxfold.engine.instructions import Instruction
from ctxfold.engine.model import Role, StoredMessage

_DIGEST = 160
_FIRST_LINE = 160
HEADER = "# ctxfold folded-results index"


@dataclass(frozen=True)
class IndexEntry:
    result_ref: str
    seq: int
    tool: str  # the tool's name; "observation" for a user message answering a text action
    arguments: str  # a digest of the call's arguments: the path or command, clipped
    raw_bytes: int
    first_line: str

    def to_json(self) -> dict[str, object]:
        return {
            "result_ref": self.result_ref,
            "seq": self.seq,
            "tool": self.tool,
            "arguments": self.arguments,
            "raw_bytes": self.raw_bytes,
            "first_line": self.first_line,
        }


@dataclass(frozen=True)
class FoldedIndex:
    entries: tuple[IndexEntry, ...] = ()  # newest first
    artifacts: tuple[Artifact, ...] = ()  # evicted from the summary's artifact budget, newest first
    instructions: tuple[Instruction, ...] = ()  # evicted from the instructions' budget, oldest first

    def refs(self) -> set[str]:
        return {e.result_ref for e in self.entries}


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _digest(arguments: str) -> str:
    """The argument that says what a call did (its path or command), else the arguments clipped."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        for key in ("command", "cmd", "path", "file_path", "pattern", "url", "query", "description"):
            if isinstance(value.get(key), str):
                extra = f" {value['path']}" if key == "command" and isinstance(value.get("path"), str) else ""
                return _clip(value[key] + extra, _DIGEST)
    return _clip(arguments, _DIGEST)


def _first_line(text: str) -> str:
    return _clip(next((line for line in text.splitlines() if line.strip()), ""), _FIRST_LINE)


def entries_for(folded: Sequence[StoredMessage], calls: Sequence[StoredMessage]) -> list[IndexEntry]:
    """Index entries, newest first, of the results among `folded` that can be read back (they have a
    result_ref); `calls` are the messages whose tool calls name them (the fold's span)."""
    invocations = {c.id: (c.name, c.arguments) for m in calls for c in m.tool_calls}
    entries = []
    for message in folded:
        if not message.result_ref or message.role not in (Role.TOOL, Role.USER):
            continue
        unnamed = ("observation" if message.role is Role.USER else "", "")
        tool, arguments = invocations.get(message.tool_call_id, unnamed)
        raw_bytes = message.raw_bytes or len(message.content.encode())
        first_line = _first_line(message.content)
        entries.append(IndexEntry(message.result_ref, message.seq, tool, _digest(arguments), raw_bytes, first_line))
    return entries[::-1]


def extend(
    previous: FoldedIndex,
    entries: Sequence[IndexEntry],
    evicted: Sequence[Artifact],
    instructions: Sequence[Instruction] = (),
) -> FoldedIndex:
    """`previous` with `entries` and `evicted` artifacts in front and `instructions` after its own; a
    result already listed stays once."""
    known = previous.refs()
    fresh = tuple(e for e in entries if e.result_ref not in known)
    seen = {a.key for a in evicted}
    artifacts = tuple(evicted) + tuple(a for a in previous.artifacts if a.key not in seen)
    return FoldedIndex(fresh + previous.entries, artifacts, previous.instructions + tuple(instructions))


def render(index: FoldedIndex) -> str:
    lines = [
        f"{HEADER}: {len(index.entries)} tool results no longer shown in full, newest first; read any of them "
        'with ReadToolResult(result_ref="..."). Then artifacts that no longer fit the summary, and the '
        "person's earlier messages (oldest first; a longer one's whole text in its result_ref)."
    ]
    lines += [json.dumps(e.to_json(), ensure_ascii=False) for e in index.entries]
    lines += [json.dumps({"artifact": a.to_json()}, ensure_ascii=False) for a in index.artifacts]
    lines += [json.dumps({"instruction": i.__dict__}, ensure_ascii=False) for i in index.instructions]
    return "\n".join(lines) + "\n"


def parse(text: str) -> FoldedIndex:
    """The inverse of `render` (a document this module wrote)."""
    entries: list[IndexEntry] = []
    artifacts: list[Artifact] = []
    instructions: list[Instruction] = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        data = json.loads(line)
        if "artifact" in data:
            artifacts.append(Artifact.from_json(data["artifact"]))
        elif "instruction" in data:
            instructions.append(Instruction(**data["instruction"]))
        else:
            entries.append(
                IndexEntry(
                    str(data["result_ref"]),
                    int(data["seq"]),
                    str(data["tool"]),
                    str(data["arguments"]),
                    int(data["raw_bytes"]),
                    str(data["first_line"]),
                )
            )
    return FoldedIndex(tuple(entries), tuple(artifacts), tuple(instructions))

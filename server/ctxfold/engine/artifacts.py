"""The artifact index: what the agent touched, extracted deterministically from tool calls and their
results, rolled forward across folds.

Extraction understands the common agent tools — OpenHands `str_replace_editor` / `execute_bash`,
mini-swe-agent and SWE-agent `bash` (tool calls or actions written as a fenced block in the
assistant text, answered by a user message), Claude Code `Read` / `Edit` / `Write` / `Bash` /
`Task` — and falls back to path-like values of any JSON argument. It never reads summary text: the
index is carried from checkpoint to checkpoint as data."""

from __future__ import annotations

import enum
import json
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ctxfold.engine import estimator
from ctxfold.engine.model import Role, StoredMessage, ToolCall


class Kind(enum.Enum):
    """Listed in the order the budget keeps them: files first (what the work is about), then the
    handles a resumed agent needs, then history."""

    EDITED = "edited"
    WRITTEN = "written"
    READ = "read"
    TASK = "task"
    ERROR = "error"
    URL = "url"
    COMMAND = "command"


_LABELS = {
    Kind.EDITED: "Files edited",
    Kind.WRITTEN: "Files written",
    Kind.READ: "Files read",
    Kind.TASK: "Background tasks / subagents",
    Kind.ERROR: "Errors seen",
    Kind.URL: "URLs",
    Kind.COMMAND: "Commands (exit status)",
}
_FILE_KINDS = (Kind.EDITED, Kind.WRITTEN, Kind.READ)


@dataclass(frozen=True)
class Artifact:
    kind: Kind
    value: str
    detail: str = ""  # a command's exit status

    @property
    def key(self) -> tuple[str, str]:
        """Identity for deduplication: a file is one artifact whether it was read or edited."""
        return ("file" if self.kind in _FILE_KINDS else self.kind.value, self.value)

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind.value, "value": self.value, **({"detail": self.detail} if self.detail else {})}

    @staticmethod
    def from_json(data: dict[str, str]) -> Artifact:
        return Artifact(Kind(data["kind"]), data["value"], data.get("detail", ""))


_MAX_VALUE = 200
_EXTENSIONS = (
    "py|pyi|pyx|js|jsx|mjs|ts|tsx|go|java|kt|rs|c|h|cc|cpp|hpp|cs|rb|php|swift|scala|m|mm|lua|pl|r|jl|ex|exs|"
    "md|rst|txt|json|jsonl|ya?ml|toml|cfg|ini|conf|env|lock|sh|bash|zsh|sql|html?|css|scss|xml|csv|proto|"
    "gradle|mk|cmake|dockerfile|ipynb|pony|patch|diff|log"
)
# A path-like token: with a known extension, or absolute with at least two components.
_PATH = re.compile(
    rf"(?<![\w/.~-])(?:~?/?(?:[\w.@+-]+/)*[\w@+-][\w.@+-]*\.(?:{_EXTENSIONS})(?![\w/])|/(?:[\w.@+-]+/)+[\w.@+-]+)"
)
_URL = re.compile(r"https?://[^\s\"'<>)\]}`]+")
_EXIT = re.compile(r"(?i)(?:<returncode>\s*(-?\d+)\s*</returncode>|exit(?:ed)?(?: with)? (?:code|status)[:= ]*(-?\d+))")
_ERROR_LINE = re.compile(
    r"^\s*(?:\w*(?:Error|Exception)\b[:(]?|Traceback \(most recent|error(?:\[\w+\])?:|ERROR\b|FAILED\b|fatal:|panic:)"
)
_TASK_ID = re.compile(
    r"(?i)\b(?:(?:background|task|shell|bash|agent)[ _-]?id|in (?:the )?background with id)\b[\"':= ]+([\w.-]{4,64})"
)
_FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
_OPEN_FILE = re.compile(r"\((?:Open file|Current file): (/[^)\s]+)\)|\[File: (/[^\]\s]+)")
_PATH_KEYS = ("path", "file_path", "filepath", "filename", "file", "notebook_path", "target_file", "dir", "directory")
_TASK_KEYS = ("bash_id", "shell_id", "task_id", "agent_id", "subagent_id")
_WRITE_COMMANDS = {"touch", "mkdir", "cp", "mv", "tee", "create"}
_EDIT_COMMANDS = {"sed", "perl", "patch", "edit", "insert", "append"}
# str_replace_editor / file-editor sub-commands and what they do to the file.
_EDITOR_KINDS = {
    "view": Kind.READ,
    "create": Kind.WRITTEN,
    "str_replace": Kind.EDITED,
    "insert": Kind.EDITED,
    "undo_edit": Kind.EDITED,
}
_TOOL_KINDS = {
    "read": Kind.READ,
    "notebookread": Kind.READ,
    "glob": Kind.READ,
    "grep": Kind.READ,
    "ls": Kind.READ,
    "edit": Kind.EDITED,
    "multiedit": Kind.EDITED,
    "notebookedit": Kind.EDITED,
    "write": Kind.WRITTEN,
}
_SHELL_TOOLS = {"bash", "execute_bash", "shell", "run_shell_command", "terminal", "run", "exec_command"}


def _clip(text: str, limit: int = _MAX_VALUE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def exit_status(result: str) -> str:
    """The exit status a result reports ("" when it shows none); the last one wins."""
    found = _EXIT.findall(result)
    if not found:
        return ""
    code = next(group for group in found[-1] if group)
    return f"exit {code}"


def error_line(result: str) -> str:
    """The last line of `result` that reads like an error and says which ("" when none does): a
    bare "Traceback (most recent call last):" or "ERROR:" says nothing a resumed agent can use."""
    lines = [
        line
        for line in result.splitlines()
        if _ERROR_LINE.match(line) and not line.strip().startswith("Traceback") and len(line.strip()) > 8
    ]
    return _clip(lines[-1], 160) if lines else ""


def _shell_paths(command: str) -> Iterator[Artifact]:
    """Files a shell command names: written when it is the target of a redirect, `tee`, `touch`,
    `cp`/`mv` (the last operand) or an in-place `sed -i`; read otherwise."""
    try:
        words = shlex.split(command, comments=False, posix=True)
    except ValueError:
        words = command.split()
    program = ""
    previous = ""
    in_place = False
    targets: list[str] = []
    for word in words:
        if word in ("&&", "||", ";", "|"):
            program, in_place = "", False
            previous = word
            continue
        if not program:
            program = word.rsplit("/", 1)[-1]
        if program == "sed" and word.startswith("-i"):
            in_place = True
        for path in _PATH.findall(word):
            if previous in (">", ">>") or word.startswith((">", ">>")):
                yield Artifact(Kind.WRITTEN, path)
            elif program in ("sed", "perl") and in_place:
                yield Artifact(Kind.EDITED, path)
            elif program in _WRITE_COMMANDS:
                targets.append(path)
            else:
                yield Artifact(Kind.READ, path)
        previous = word
    # cp/mv/touch/tee: the last operand is written, the others read.
    for index, path in enumerate(targets):
        last = index == len(targets) - 1
        yield Artifact(Kind.WRITTEN if last or program in ("touch", "mkdir", "tee") else Kind.READ, path)
    # Heredocs and redirections inside one word (cat <<EOF > a.py) are caught by the raw scan.
    for match in re.finditer(r">{1,2}\s*([^\s;&|]+)", command):
        for path in _PATH.findall(match.group(1)):
            yield Artifact(Kind.WRITTEN, path)


def _text_action(command: str, open_file: str) -> Iterator[Artifact]:
    """SWE-agent's editor commands written as text (open, create, edit, goto, search_file, ...)."""
    words = command.split()
    if not words:
        return
    verb = words[0]
    if verb in ("open", "search_file", "find_file", "search_dir", "goto", "scroll_up", "scroll_down"):
        for path in _PATH.findall(" ".join(words[1:])):
            yield Artifact(Kind.READ, path)
        if verb in ("goto", "scroll_up", "scroll_down") and open_file:
            yield Artifact(Kind.READ, open_file)
    elif verb == "create":
        for path in _PATH.findall(" ".join(words[1:2])):
            yield Artifact(Kind.WRITTEN, path)
    elif verb in _EDIT_COMMANDS and open_file and re.match(r"\d+:\d+", words[1] if len(words) > 1 else ""):
        yield Artifact(Kind.EDITED, open_file)
    else:
        yield from _shell_paths(command)


def call_artifacts(call: ToolCall, result: str) -> list[Artifact]:
    """What one tool call touched, from its arguments and (exit status, errors, task ids) its result."""
    args = _arguments(call.arguments)
    name = call.name.lower()
    found: list[Artifact] = []
    command = next((args[key] for key in ("command", "cmd") if isinstance(args.get(key), str)), "")
    editor_kind = _EDITOR_KINDS.get(command) if "path" in args else None
    if editor_kind is not None:
        found.append(Artifact(editor_kind, str(args["path"])))
    elif name in _TOOL_KINDS:
        for key in _PATH_KEYS:
            if isinstance(args.get(key), str) and args[key]:
                found.append(Artifact(_TOOL_KINDS[name], args[key]))
    elif command and (name in _SHELL_TOOLS or "cmd" in name or "bash" in name):
        found.extend(_shell_paths(command))
        found.append(Artifact(Kind.COMMAND, _clip(command), exit_status(result)))
    else:
        for key, value in args.items():
            if isinstance(value, str) and (key in _PATH_KEYS or _PATH.fullmatch(value)):
                found.append(Artifact(Kind.READ, value))
    for key in _TASK_KEYS:
        if isinstance(args.get(key), str) and args[key]:
            found.append(Artifact(Kind.TASK, args[key]))
    found.extend(Artifact(Kind.TASK, task) for task in _TASK_ID.findall(result))
    if name == "task" and isinstance(args.get("description"), str):
        found.append(Artifact(Kind.TASK, _clip(args["description"], 80)))
    found.extend(Artifact(Kind.URL, url) for url in _URL.findall(call.arguments))
    error = error_line(result)
    if error:
        found.append(Artifact(Kind.ERROR, error))
    return [a for a in found if _worth_keeping(a)]


def _worth_keeping(artifact: Artifact) -> bool:
    return bool(artifact.value) and not (artifact.kind in _FILE_KINDS and artifact.value.startswith("/dev/"))


def _last_fence(text: str) -> str:
    blocks = _FENCE.findall(text)
    return blocks[-1].strip() if blocks else ""


def is_text_action(message: StoredMessage) -> bool:
    """An assistant message that acts by writing its command as a fenced block (SWE-agent,
    mini-swe-agent) rather than by a tool call."""
    return message.role is Role.ASSISTANT and not message.tool_calls and bool(_last_fence(message.content))


def message_artifacts(messages: Sequence[StoredMessage]) -> list[Artifact]:
    """Everything `messages` touched, in order. Tool calls pair with their results; a text action
    pairs with the user message that answers it (its observation)."""
    results = {m.tool_call_id: m.content for m in messages if m.role is Role.TOOL}
    found: list[Artifact] = []
    open_file = ""
    for index, message in enumerate(messages):
        for call in message.tool_calls:
            found.extend(call_artifacts(call, results.get(call.id, "")))
        if is_text_action(message):
            following = messages[index + 1] if index + 1 < len(messages) else None
            observation = following.content if following is not None and following.role is Role.USER else ""
            command = _last_fence(message.content)
            found.extend(_text_action(command, open_file))
            first_line = command.splitlines()[0] if command else ""
            found.append(Artifact(Kind.COMMAND, _clip(first_line), exit_status(observation)))
            error = error_line(observation)
            if error:
                found.append(Artifact(Kind.ERROR, error))
        if message.role in (Role.USER, Role.TOOL):
            for groups in _OPEN_FILE.findall(message.content):
                open_file = next(g for g in groups if g)
    return [a for a in found if _worth_keeping(a)]


def _strongest(a: Artifact, b: Artifact) -> Artifact:
    """Of two records of one file, the one saying most: edited > written > read."""
    order = {Kind.EDITED: 0, Kind.WRITTEN: 1, Kind.READ: 2}
    return a if order.get(a.kind, 3) <= order.get(b.kind, 3) else b


def merge(previous: Sequence[Artifact], new: Sequence[Artifact]) -> list[Artifact]:
    """`previous` (most recent first) updated with `new` (oldest first): deduplicated, the most
    recently touched first; a file keeps its strongest kind."""
    merged: dict[tuple[str, str], Artifact] = {a.key: a for a in reversed(previous)}
    for artifact in new:
        known = merged.pop(artifact.key, None)
        # Commands keep their newest exit status; files their strongest kind.
        newest_wins = known is None or artifact.kind is Kind.COMMAND
        merged[artifact.key] = artifact if newest_wins or known is None else _strongest(artifact, known)
    return list(reversed(merged.values()))


def render(artifacts: Sequence[Artifact]) -> str:
    lines = []
    for kind in Kind:
        items = [a for a in artifacts if a.kind is kind]
        if not items:
            continue
        if kind is Kind.COMMAND:
            body = "; ".join(f"`{a.value}`" + (f" → {a.detail}" if a.detail else "") for a in items)
        elif kind is Kind.ERROR:
            body = " | ".join(a.value for a in items)
        else:
            body = ", ".join(a.value for a in items)
        lines.append(f"{_LABELS[kind]}: {body}")
    return "\n".join(lines)


def within_budget(artifacts: Sequence[Artifact], budget_tokens: int) -> tuple[list[Artifact], list[Artifact]]:
    """(kept, evicted): the artifacts whose rendering fits `budget_tokens`, dropping the least
    recent of the least important kind first (commands, then URLs, errors, tasks, files)."""
    ranked = sorted(range(len(artifacts)), key=lambda i: (list(Kind).index(artifacts[i].kind), i))
    keep = len(ranked)
    while keep and estimator.count_text(render([artifacts[i] for i in sorted(ranked[:keep])])) > budget_tokens:
        keep = keep - max(1, (keep - 1) // 8)
    kept_indexes = set(ranked[:keep])
    return (
        [a for i, a in enumerate(artifacts) if i in kept_indexes],
        [a for i, a in enumerate(artifacts) if i not in kept_indexes],
    )

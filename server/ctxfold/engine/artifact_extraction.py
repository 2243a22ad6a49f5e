"""Extraction for the artifact index: what the agent touched, read deterministically from tool calls
and their results.

Extraction understands the common agent tools — OpenHands `str_replace_editor` / `execute_bash`,
mini-swe-agent and SWE-agent `bash` (tool calls or, in a session that acts in text, fenced
commands answered by a user message), Claude Code `Read` / `Edit` / `Write` / `Glob` / `Grep` /
`Bash` / `Task`, Codex CLI `shell` (a command list), `shell_command` / `exec_command`, `read_file`,
`list_dir`, `grep_files` and `apply_patch` — and reads any other call's path-like arguments. A call
whose arguments are a script rather than a JSON object (Codex `exec`, a freeform `apply_patch`) is
read as one (`artifact_scripts`): the files a patch adds, updates, deletes or moves, and the shell
commands and paths the script names. A call's result gives its command's exit status, the errors
it shows and the background tasks it started."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Sequence
from typing import Any

from ctxfold.engine.artifact_scripts import (
    PATCH_BEGIN,
    URL,
    as_path,
    diff_artifacts,
    script_artifacts,
    shell_artifacts,
    without_heredoc_bodies,
    word_paths,
)
from ctxfold.engine.artifacts import Artifact, Kind
from ctxfold.engine.authorship import is_text_action, last_fence
from ctxfold.engine.model import Role, StoredMessage, ToolCall

_MAX_VALUE = 200
_COMMAND_CHARS = 120
_EXIT = re.compile(r"(?i)(?:<returncode>\s*(-?\d+)\s*</returncode>|exit(?:ed)?(?: with)? (?:code|status)[:= ]*(-?\d+))")
_ERROR_LINE = re.compile(
    r"^\s*(?:\w*(?:Error|Exception)\b[:(]?|Traceback \(most recent|error(?:\[\w+\])?:|ERROR\b|FAILED\b|fatal:|panic:)"
)
_TASK_ID = re.compile(
    r"(?i)\b(?:(?:background|task|shell|bash|agent)[ _-]?id|in (?:the )?background with id)\b[\"':= ]+([\w.-]{4,64})"
)
_OPEN_FILE = re.compile(r"\((?:Open file|Current file): (/[^)\s]+)\)|\[File: (/[^\]\s]+)")
# Argument keys that hold paths (any key ending in "path" does too), and keys that hold shell commands.
_PATH_KEYS = frozenset(
    ("file", "filename", "filepath", "target_file", "target_notebook", "dir", "directory", "dir_path", "cwd_path")
)
# Argument keys that hold a unified diff.
_DIFF_KEYS = ("diff", "patch")
_COMMAND_KEYS = ("command", "cmd", "script")
_TASK_KEYS = ("bash_id", "shell_id", "task_id", "agent_id", "subagent_id")
# str_replace_editor / file-editor sub-commands and what they do to the file.
_EDITOR_KINDS = {
    "view": Kind.READ,
    "create": Kind.WRITTEN,
    "str_replace": Kind.EDITED,
    "insert": Kind.EDITED,
    "undo_edit": Kind.EDITED,
}
# Tools (lower-cased names) whose path arguments are touched this way.
_TOOL_KINDS = {
    "read": Kind.READ,
    "read_file": Kind.READ,
    "notebookread": Kind.READ,
    "view": Kind.READ,
    "glob": Kind.SEARCHED,
    "grep": Kind.SEARCHED,
    "grep_files": Kind.SEARCHED,
    "ls": Kind.SEARCHED,
    "list_dir": Kind.SEARCHED,
    "read_many_files": Kind.READ,
    "edit": Kind.EDITED,
    "multiedit": Kind.EDITED,
    "notebookedit": Kind.EDITED,
    "edit_file": Kind.EDITED,
    "edit_notebook": Kind.EDITED,
    "replace": Kind.EDITED,
    "search_replace": Kind.EDITED,
    "delete_file": Kind.EDITED,
    "write": Kind.WRITTEN,
    "write_file": Kind.WRITTEN,
    "create_file": Kind.WRITTEN,
}


def _clip(text: str, limit: int = _MAX_VALUE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arguments(text: str) -> dict[str, Any] | None:
    """A call's arguments as a JSON object, or None when they are not one (a script)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


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


def _command_text(value: Any) -> str:
    """A command argument as one shell command: Codex's `["bash", "-lc", "..."]` is its script."""
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        if len(value) >= 3 and value[-2] in ("-lc", "-c"):
            return str(value[-1])
        return shlex.join(value)
    return value if isinstance(value, str) else ""


def _text_action(command: str, open_file: str) -> Iterator[Artifact]:
    """SWE-agent's editor commands written as text (open, create, edit, goto, search_file, ...)."""
    words = command.split()
    if not words:
        return
    verb = words[0]
    if verb in ("open", "goto", "scroll_up", "scroll_down"):
        for path in word_paths(" ".join(words[1:2])):
            yield Artifact(Kind.READ, path)
        if verb != "open" and open_file:
            yield Artifact(Kind.READ, open_file)
    elif verb in ("search_file", "find_file", "search_dir"):
        for word in words[1:]:
            yield from (Artifact(Kind.SEARCHED, path) for path in word_paths(word))
    elif verb == "create":
        for path in word_paths(" ".join(words[1:2])):
            yield Artifact(Kind.WRITTEN, path)
    elif (
        verb in ("edit", "insert", "append")
        and open_file
        and re.match(r"\d+(:\d+)?$", words[1] if len(words) > 1 else "")
    ):
        yield Artifact(Kind.EDITED, open_file)
    else:
        yield from shell_artifacts(command)


def _is_path_key(key: str) -> bool:
    return key in _PATH_KEYS or key.lower().endswith(("path", "paths"))


def _argument_artifacts(name: str, args: dict[str, Any]) -> Iterator[Artifact]:
    """The files and URLs a call with JSON arguments names (see the module docstring)."""
    command = args.get("command")
    editor_kind = _EDITOR_KINDS.get(command) if isinstance(command, str) and "path" in args else None
    tool_kind = _TOOL_KINDS.get(name)
    for key, value in args.items():
        if editor_kind is not None and key == "path" and isinstance(value, str):
            yield Artifact(editor_kind, value)
        elif key in _COMMAND_KEYS and editor_kind is None:
            text = _command_text(value)
            yield from (script_artifacts(text) if PATCH_BEGIN in text else shell_artifacts(text))
        elif isinstance(value, str) and PATCH_BEGIN in value:
            yield from script_artifacts(value)
        elif isinstance(value, str) and key in _DIFF_KEYS:
            yield from diff_artifacts(value)
        elif isinstance(value, str) and _is_path_key(key) and value.strip():
            path = value.strip().removeprefix("./").rstrip("/") or value.strip()
            yield Artifact(tool_kind or Kind.READ, path)
        elif isinstance(value, str) and key in ("url", "uri"):
            yield from (Artifact(Kind.URL, url) for url in URL.findall(value))
        elif isinstance(value, str) and tool_kind is None and as_path(value) == value.strip().removeprefix("./"):
            yield Artifact(Kind.READ, as_path(value))  # an unknown tool's argument that is exactly a path
        elif isinstance(value, dict):
            yield from _argument_artifacts(name, value)
        elif isinstance(value, list):  # a list of paths (`paths`), of edits, of files to write
            for item in value:
                yield from _argument_artifacts(name, {key: item})


def call_artifacts(call: ToolCall, result: str) -> list[Artifact]:
    """What one tool call touched, from its arguments and (exit status, errors, task ids) its result."""
    name = call.name.lower()
    args = _arguments(call.arguments)
    found: list[Artifact] = []
    command = ""
    if args is None:  # a script (Codex exec, a freeform apply_patch): read as one
        found += script_artifacts(call.arguments)
        command = call.arguments if PATCH_BEGIN not in call.arguments else ""
    else:
        found += _argument_artifacts(name, args)
        if not isinstance(args.get("command"), str) or args["command"] not in _EDITOR_KINDS:
            command = next((_command_text(args[key]) for key in _COMMAND_KEYS if key in args), "")
    if command and PATCH_BEGIN not in command:
        first = without_heredoc_bodies(command).strip()
        found.append(Artifact(Kind.COMMAND, _clip(first, _COMMAND_CHARS), exit_status(result)))
    for key in _TASK_KEYS:
        if args is not None and isinstance(args.get(key), str) and args[key]:
            found.append(Artifact(Kind.TASK, args[key]))
    found.extend(Artifact(Kind.TASK, task) for task in _TASK_ID.findall(result))
    if name == "task" and args is not None and isinstance(args.get("description"), str):
        found.append(Artifact(Kind.TASK, _clip(args["description"], 80)))
    error = error_line(result)
    if error:
        found.append(Artifact(Kind.ERROR, error))
    return _deduplicated(found)


def _deduplicated(found: Sequence[Artifact]) -> list[Artifact]:
    """Worth keeping, each once per call (a URL found twice in one command, a path read and written)."""
    seen: set[tuple[str, str, Kind]] = set()
    out = []
    for artifact in found:
        identity = (*artifact.key, artifact.kind)
        if artifact.value and identity not in seen:
            seen.add(identity)
            out.append(artifact)
    return out


def message_artifacts(messages: Sequence[StoredMessage], mode: str) -> list[Artifact]:
    """Everything `messages` touched, in order. Tool calls pair with their results; in a session that
    acts in text (`mode`) a text action pairs with the user message that answers it."""
    results = {m.tool_call_id: m.content for m in messages if m.role is Role.TOOL}
    found: list[Artifact] = []
    open_file = ""
    for index, message in enumerate(messages):
        for call in message.tool_calls:
            found.extend(call_artifacts(call, results.get(call.id, "")))
        if is_text_action(message, mode):
            following = messages[index + 1] if index + 1 < len(messages) else None
            observation = following.content if following is not None and following.role is Role.USER else ""
            command = last_fence(message.content)
            found.extend(_text_action(command, open_file))
            first_line = command.splitlines()[0] if command else ""
            found.append(Artifact(Kind.COMMAND, _clip(first_line, _COMMAND_CHARS), exit_status(observation)))
            error = error_line(observation)
            if error:
                found.append(Artifact(Kind.ERROR, error))
        if message.role in (Role.USER, Role.TOOL):
            for groups in _OPEN_FILE.findall(message.content):
                open_file = next(g for g in groups if g)
    return found

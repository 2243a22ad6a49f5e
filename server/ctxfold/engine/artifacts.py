"""The artifact index: what the agent touched, extracted deterministically from tool calls and their
results, rolled forward across folds.

Extraction understands the common agent tools — OpenHands `str_replace_editor` / `execute_bash`,
mini-swe-agent and SWE-agent `bash` (tool calls or, in a session that acts in text, fenced
commands answered by a user message), Claude Code `Read` / `Edit` / `Write` / `Glob` / `Grep` /
`Bash` / `Task`, Codex CLI `shell` (a command list), `shell_command` / `exec_command`, `read_file`,
`list_dir`, `grep_files` and `apply_patch` — and reads any other call's path-like arguments. A call
whose arguments are a script rather than a JSON object (Codex `exec`, a freeform `apply_patch`) is
read as one: the files a patch adds, updates, deletes or moves, and the shell commands and paths
the script names.

Paths are indexed as written (relative ones too); URLs are indexed apart. Each file is marked by
what was done to it — edited, written, read, searched, run — and the index lists files grouped by
directory (the directory written once), most recently touched first. It never reads summary text:
the index is carried from checkpoint to checkpoint as data."""

from __future__ import annotations

import enum
import json
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxfold.engine import estimator
from ctxfold.engine.authorship import is_text_action, last_fence
from ctxfold.engine.model import Role, SessionConfig, StoredMessage, ToolCall


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
_LABELS = {
    Kind.TASK: "Background tasks / subagents",
    Kind.ERROR: "Errors seen",
    Kind.URL: "URLs",
    Kind.COMMAND: "Commands (exit status)",
}
# How the count of what did not fit names each category ("41 more paths").
CATEGORY = {Kind.TASK: "tasks", Kind.ERROR: "errors", Kind.URL: "URLs", Kind.COMMAND: "commands"}
PATHS = "paths"
# The artifact index lists files within this share of the context window, and the rest (tasks,
# errors, URLs, commands) within OTHERS_WINDOW_SHARE; what does not fit goes to the folded-results
# index, counted in the view. Each at least ARTIFACT_MIN_TOKENS.
FILES_WINDOW_SHARE = 0.08
OTHERS_WINDOW_SHARE = 0.02
ARTIFACT_MIN_TOKENS = 128


@dataclass(frozen=True)
class Budget:
    """Tokens the artifact index may take in a summary: its files, and everything else."""

    files: int
    others: int


def budget(config: SessionConfig) -> Budget:
    """The artifact index's budget: it scales with the window."""
    window = config.context_window
    return Budget(
        max(ARTIFACT_MIN_TOKENS, int(window * FILES_WINDOW_SHARE)),
        max(ARTIFACT_MIN_TOKENS, int(window * OTHERS_WINDOW_SHARE)),
    )


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


_MAX_VALUE = 200
_COMMAND_CHARS = 120
# fmt: off
_EXTENSIONS = frozenset((
    "py", "pyi", "pyx", "js", "jsx", "mjs", "cjs", "ts", "tsx", "go", "java", "kt", "rs", "c", "h", "cc", "cpp",
    "hpp", "cs", "rb", "php", "swift", "scala", "m", "mm", "lua", "pl", "r", "jl", "ex", "exs", "dart", "vue",
    "svelte", "md", "mdx", "rst", "txt", "json", "jsonl", "yaml", "yml", "toml", "cfg", "ini", "conf", "env", "lock",
    "sh", "bash", "zsh", "fish", "ps1", "bat", "sql", "html", "htm", "css", "scss", "less", "xml", "csv", "tsv",
    "proto", "gradle", "mk", "cmake", "dockerfile", "ipynb", "pony", "patch", "diff", "log", "tf", "hcl", "graphql",
    "gql", "svg", "png", "jpg", "jpeg", "gif", "pdf", "zip", "gz", "tar", "sqlite", "db", "pem", "crt", "key",
    "service", "plist", "mod", "sum", "csproj", "sln", "ui", "qml", "nix", "el", "vim", "zig", "nim", "hs", "ml",
    "erl", "clj", "cljs", "groovy", "yue", "moon",
))
# fmt: on
_PATHISH = re.compile(r"^(?:~|\.{1,2})?/?[\w.+@-]+(?:/[\w.+@-]+)*/?$")
_NOT_PATHS = ("/dev/", "/proc/", "/sys/")
_URL = re.compile(r"https?://[^\s\"'<>)\]}`]+")
_EXIT = re.compile(r"(?i)(?:<returncode>\s*(-?\d+)\s*</returncode>|exit(?:ed)?(?: with)? (?:code|status)[:= ]*(-?\d+))")
_ERROR_LINE = re.compile(
    r"^\s*(?:\w*(?:Error|Exception)\b[:(]?|Traceback \(most recent|error(?:\[\w+\])?:|ERROR\b|FAILED\b|fatal:|panic:)"
)
_TASK_ID = re.compile(
    r"(?i)\b(?:(?:background|task|shell|bash|agent)[ _-]?id|in (?:the )?background with id)\b[\"':= ]+([\w.-]{4,64})"
)
_OPEN_FILE = re.compile(r"\((?:Open file|Current file): (/[^)\s]+)\)|\[File: (/[^\]\s]+)")
# A here-document's body is data (often a whole script), not part of the command.
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1([^\n]*)\n(.*?)(?:^\s*\2\s*$|\Z)", re.S | re.M)
# An apply_patch patch (Codex CLI): its file headers say what happens to each file.
_PATCH_FILE = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+?)\s*$|^\*\*\* Move to: (.+?)\s*$", re.M)
_PATCH_KINDS = {"Add": Kind.WRITTEN, "Update": Kind.EDITED, "Delete": Kind.EDITED}
_PATCH_BEGIN = "*** Begin Patch"
_STRING_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"|\'((?:[^\'\\\n]|\\.)*)\'|`([^`]*)`')
# Argument keys that hold paths (any key ending in "path" does too), and keys that hold shell commands.
_PATH_KEYS = frozenset(
    ("file", "filename", "filepath", "target_file", "notebook_path", "dir", "directory", "dir_path", "cwd_path")
)
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
    "edit": Kind.EDITED,
    "multiedit": Kind.EDITED,
    "notebookedit": Kind.EDITED,
    "write": Kind.WRITTEN,
    "write_file": Kind.WRITTEN,
    "create_file": Kind.WRITTEN,
}
# Shell programs by what they do to the paths they are given.
_WRITERS = {"touch", "mkdir", "tee", "install"}
_COPIERS = {"cp", "mv", "rsync", "ln"}
_REMOVERS = {"rm", "rmdir", "unlink"}
_IN_PLACE = {"sed", "perl"}
_SEARCHERS = {"grep", "egrep", "rg", "ag", "ack", "find", "fd", "ls", "tree", "locate", "du"}
_RUNNERS = {
    "python",
    "python3",
    "python2",
    "pytest",
    "py.test",
    "node",
    "deno",
    "bun",
    "tsx",
    "ts-node",
    "bash",
    "sh",
    "zsh",
    "ruby",
    "go",
    "cargo",
    "java",
    "php",
    "Rscript",
    "julia",
    "make",
    "npm",
    "npx",
    "uv",
    "poetry",
}
_PREFIXES = {"sudo", "time", "env", "nohup", "exec", "timeout", "xargs", "then", "do", "if", "while", "!"}
_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}


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


def as_path(token: str) -> str:
    """`token` as a path, or "": absolute paths (outside /dev, /proc, /sys), `~/` paths, and relative
    ones with a file extension, as written (a leading `./` and trailing `/` dropped)."""
    token = token.strip().strip("'\"`").rstrip(".,:;")
    if token.startswith("./"):
        token = token[2:]
    if not token or "://" in token or "//" in token or not _PATHISH.match(token) or token.startswith(_NOT_PATHS):
        return ""
    if token.startswith(("/", "~/")):
        token = token.rstrip("/")
        return token if len(token) > 1 and token != "~" else ""
    stem = token.rstrip("/").rsplit("/", 1)[-1]
    extension = stem.rsplit(".", 1)[-1].lower() if "." in stem.strip(".") else ""
    return token.rstrip("/") if extension in _EXTENSIONS else ""


def _word_paths(word: str) -> list[str]:
    """The paths in one shell word (`--out=a.txt`, `PATH=/a:/b` hold several)."""
    return [path for piece in re.split(r"[=:,;|&<>()\s]", word) if (path := as_path(piece))]


def _words(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes
        return command.split()


def shell_artifacts(command: str) -> Iterator[Artifact]:
    """The files and URLs a shell command names, each marked by what the command does to it:
    written (a redirect's target, `touch`, `tee`, `mkdir`, the last operand of `cp` / `mv`), edited
    (`sed -i`, `perl -i`, `rm`), run (the operands of an interpreter or test runner, or the program
    itself), searched (`grep`, `find`, `ls`, ...), read otherwise. Here-document bodies are data."""
    for url in _URL.findall(command):
        yield Artifact(Kind.URL, url.rstrip(".,;"))
    command = _URL.sub(" ", _HEREDOC.sub(lambda m: f"<< {m.group(2)}{m.group(3)}\n", command))
    program, previous, in_place = "", "", False
    operands: list[str] = []

    def flush() -> Iterator[Artifact]:
        if program in _COPIERS:
            for index, path in enumerate(operands):
                yield Artifact(Kind.WRITTEN if index == len(operands) - 1 else Kind.READ, path)
            return
        kind = Kind.READ
        if program in _WRITERS:
            kind = Kind.WRITTEN
        elif program in _REMOVERS or (program in _IN_PLACE and in_place):
            kind = Kind.EDITED
        elif program in _RUNNERS:
            kind = Kind.RUN
        elif program in _SEARCHERS:
            kind = Kind.SEARCHED
        for path in operands:
            yield Artifact(kind, path)

    for word in [*_words(command.replace("\n", " ; ")), ";"]:
        if word in _OPERATORS:
            yield from flush()
            program, previous, in_place, operands = "", word, False, []
            continue
        if word in (">", ">>", "<", "2>", "&>", ">|", "<<", "<<<"):
            previous = word
            continue
        if previous in (">", ">>", "&>", ">|"):
            yield from (Artifact(Kind.WRITTEN, path) for path in _word_paths(word))
            previous = word
            continue
        if previous in ("<", "<<", "<<<"):
            if previous == "<":
                yield from (Artifact(Kind.READ, path) for path in _word_paths(word))
            previous = word
            continue
        if not program:
            if word in _PREFIXES or re.match(r"^\w+=", word) or (previous == "timeout" and word.isdigit()):
                previous = word
                continue
            program = word.rsplit("/", 1)[-1]
            if "/" in word and (path := as_path(word)):
                yield Artifact(Kind.RUN, path)  # ./script.sh, /usr/local/bin/tool (a program run)
            previous = word
            continue
        if program in _IN_PLACE and word.startswith("-i"):
            in_place = True
        if not word.startswith("-") or "=" in word:
            operands += _word_paths(word)
        previous = word


def patch_artifacts(patch: str) -> Iterator[Artifact]:
    """The files an apply_patch patch adds (written), updates or deletes (edited) or moves to (written)."""
    for verb, path, moved in _PATCH_FILE.findall(patch):
        if moved:
            yield Artifact(Kind.WRITTEN, moved.strip())
        else:
            yield Artifact(_PATCH_KINDS[verb], path.strip())


def script_artifacts(script: str) -> Iterator[Artifact]:
    """A script's files: a patch's by its headers, the rest as shell commands, line by line; in a script
    of another language (Codex `exec`) its string literals are read as the commands they often are."""
    if _PATCH_BEGIN in script:
        yield from patch_artifacts(script)
        script = re.sub(r"\*\*\* Begin Patch.*?(?:\*\*\* End Patch|\Z)", " ", script, flags=re.S)
    for line in script.splitlines():
        yield from shell_artifacts(line)
    for literal in _STRING_LITERAL.findall(script):
        text = next(part for part in literal if part) if any(literal) else ""
        if " " in text.strip():
            yield from shell_artifacts(text)


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
        for path in _word_paths(" ".join(words[1:2])):
            yield Artifact(Kind.READ, path)
        if verb != "open" and open_file:
            yield Artifact(Kind.READ, open_file)
    elif verb in ("search_file", "find_file", "search_dir"):
        for word in words[1:]:
            yield from (Artifact(Kind.SEARCHED, path) for path in _word_paths(word))
    elif verb == "create":
        for path in _word_paths(" ".join(words[1:2])):
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
    return key in _PATH_KEYS or key.lower().endswith("path")


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
            yield from (script_artifacts(text) if _PATCH_BEGIN in text else shell_artifacts(text))
        elif isinstance(value, str) and _PATCH_BEGIN in value:
            yield from script_artifacts(value)
        elif isinstance(value, str) and _is_path_key(key) and value.strip():
            path = value.strip().removeprefix("./").rstrip("/") or value.strip()
            yield Artifact(tool_kind or Kind.READ, path)
        elif isinstance(value, str) and key in ("url", "uri"):
            yield from (Artifact(Kind.URL, url) for url in _URL.findall(value))
        elif isinstance(value, str) and tool_kind is None and as_path(value) == value.strip().removeprefix("./"):
            yield Artifact(Kind.READ, as_path(value))  # an unknown tool's argument that is exactly a path
        elif isinstance(value, dict):
            yield from _argument_artifacts(name, value)


def call_artifacts(call: ToolCall, result: str) -> list[Artifact]:
    """What one tool call touched, from its arguments and (exit status, errors, task ids) its result."""
    name = call.name.lower()
    args = _arguments(call.arguments)
    found: list[Artifact] = []
    command = ""
    if args is None:  # a script (Codex exec, a freeform apply_patch): read as one
        found += script_artifacts(call.arguments)
        command = call.arguments if _PATCH_BEGIN not in call.arguments else ""
    else:
        found += _argument_artifacts(name, args)
        if not isinstance(args.get("command"), str) or args["command"] not in _EDITOR_KINDS:
            command = next((_command_text(args[key]) for key in _COMMAND_KEYS if key in args), "")
    if command and _PATCH_BEGIN not in command:
        first = _HEREDOC.sub(lambda m: f"<< {m.group(2)}{m.group(3)}\n", command).strip()
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


_STRENGTH = {kind: index for index, kind in enumerate(FILE_KINDS)}


def _joined(a: Artifact, b: Artifact) -> Artifact:
    """Two records of one file: every mark of both, the newest value's spelling."""
    marks = a.touched | b.touched
    return Artifact(min(marks, key=_STRENGTH.__getitem__), a.value, marks=marks if len(marks) > 1 else frozenset())


def merge(previous: Sequence[Artifact], new: Sequence[Artifact]) -> list[Artifact]:
    """`previous` (most recent first) updated with `new` (oldest first): deduplicated, the most
    recently touched first; a file keeps every way it was touched, a command its newest exit status."""
    merged: dict[tuple[str, str], Artifact] = {a.key: a for a in reversed(previous)}
    for artifact in new:
        known = merged.pop(artifact.key, None)
        is_file = artifact.kind in FILE_KINDS
        merged[artifact.key] = _joined(artifact, known) if is_file and known is not None else artifact
    return list(reversed(merged.values()))


def _directory(path: str) -> tuple[str, str]:
    """(directory with its trailing slash, name): `./` for a bare relative name."""
    head, _, name = path.rpartition("/")
    if not head and not path.startswith("/"):
        return "./", name
    return head + "/", name


# A directory prefix is written once (as a root the directories below it are listed under) when it
# is at least this long and saves at least this many characters.
ROOT_MIN_CHARS = 12
_ROOT_MIN_SAVED = 24


def _roots(directories: Sequence[str]) -> dict[str, str]:
    """Each directory's root (or none): prefixes chosen greedily by the characters writing them once
    saves, the longest of equal savings first."""
    candidates: dict[str, list[str]] = {}
    for directory in directories:
        parts = directory.split("/")
        for depth in range(1, len(parts)):
            prefix = "/".join(parts[:depth]) + "/"
            if len(prefix) >= ROOT_MIN_CHARS:
                candidates.setdefault(prefix, []).append(directory)
    root_of: dict[str, str] = {}
    while candidates:
        saved = {p: (len(ds) - 1) * len(p) - 4 for p, ds in candidates.items()}
        best = max(candidates, key=lambda p: (saved[p], len(p)))
        if saved[best] < _ROOT_MIN_SAVED:
            break
        for directory in candidates.pop(best):
            root_of[directory] = best
        candidates = {p: [d for d in ds if d not in root_of] for p, ds in candidates.items()}
        candidates = {p: ds for p, ds in candidates.items() if ds}
    return root_of


def render_files(files: Sequence[Artifact]) -> list[str]:
    """One line per directory, `dir/: name MARKS, name`, the most recently touched first; directories
    sharing a long prefix are listed under it, relative (`root/:` then `  rel/: names`, `./` for the
    root itself)."""
    by_directory: dict[str, list[str]] = {}
    for artifact in files:
        directory, name = _directory(artifact.value)
        marks = "".join(MARKS[k] for k in FILE_KINDS if k in artifact.touched and k is not Kind.READ)
        by_directory.setdefault(directory, []).append(f"{name} {marks}" if marks else name)
    root_of = _roots(list(by_directory))
    lines: list[str] = []
    listed: set[str] = set()
    for directory, names in by_directory.items():
        root = root_of.get(directory)
        if root is None:
            lines.append(f"{directory}: {', '.join(names)}")
        elif root not in listed:
            listed.add(root)
            lines.append(f"{root}:")
            for member in (d for d in by_directory if root_of.get(d) == root):
                relative = member[len(root) :] or "./"
                lines.append(f"  {relative}: {', '.join(by_directory[member])}")
    return lines


def render(artifacts: Sequence[Artifact]) -> str:
    files = [a for a in artifacts if a.kind in FILE_KINDS]
    lines = [FILES_LEGEND + ":", *render_files(files)] if files else []
    for kind in (Kind.TASK, Kind.ERROR, Kind.URL, Kind.COMMAND):
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


def _fitting(artifacts: Sequence[Artifact], limit: int, rank: dict[Kind, int]) -> set[int]:
    """Indexes of `artifacts` whose rendering fits `limit` tokens, the least recent of the lowest
    rank dropped first."""
    ranked = sorted(range(len(artifacts)), key=lambda i: (rank[artifacts[i].kind], i))
    keep = len(ranked)
    while keep and estimator.count_text(render([artifacts[i] for i in sorted(ranked[:keep])])) > limit:
        keep = keep - max(1, (keep - 1) // 8)
    return set(ranked[:keep])


def within_budget(artifacts: Sequence[Artifact], limits: Budget) -> tuple[list[Artifact], list[Artifact]]:
    """(kept, evicted): the files whose listing fits `limits.files`, the least recent dropped first,
    and the other artifacts that fit `limits.others`, commands leaving first, then URLs, errors,
    tasks."""
    files = [i for i, a in enumerate(artifacts) if a.kind in FILE_KINDS]
    others = [i for i, a in enumerate(artifacts) if a.kind not in FILE_KINDS]
    order = [kind for kind in Kind if kind not in FILE_KINDS]
    rank = {kind: 0 if kind in FILE_KINDS else order.index(kind) for kind in Kind}
    kept = {files[i] for i in _fitting([artifacts[i] for i in files], limits.files, rank)}
    kept |= {others[i] for i in _fitting([artifacts[i] for i in others], limits.others, rank)}
    return (
        [a for i, a in enumerate(artifacts) if i in kept],
        [a for i, a in enumerate(artifacts) if i not in kept],
    )


def counts(artifacts: Sequence[Artifact]) -> dict[str, int]:
    """How many of each category `artifacts` holds (paths, commands, URLs, errors, tasks)."""
    found: dict[str, int] = {}
    for artifact in artifacts:
        found[artifact.category] = found.get(artifact.category, 0) + 1
    return found

"""Probes of what a view still holds, pure, computed from the recorded trace and the text of the
view alone (never from a policy's own account of what it kept):

* task kept: the opening user message is in the view verbatim, or its head is and the rest can be
  read through a reference the view names;
* instructions kept: the same for every message a person typed after the first;
* file paths named: of the paths the agent's actions touched, how many the view's text names;
* hidden tool results reachable: of the tool results the view no longer shows in full, how many
  have their `result_ref` in the view or listed in a document whose reference the view names.

"Person-typed" and "tool output" are one classification (`classify`): agents that call tools
through the API return tool output as role `tool`, so there every user message is the person's;
agents that act in text (SWE-agent, mini-swe-agent's text mode) return the output of the command in
an assistant message's fenced block as the next user message, so there a user message that
answers an acting assistant message is tool output."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ctxfold.engine.briefing import quoted
from ctxfold.engine.tool_results import RESULT_REF
from ctxfold.replay.trace import Msg, Trace

# A fenced block in an assistant's text: the action of a text-acting agent (its last block).
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.S)
# A bounded rendering keeps at least this much of a message's head before its marker.
HEAD_CHARS = 160
# Argument keys whose values are paths, and keys whose values are shell commands.
_PATH_KEYS = frozenset({"path", "file_path", "filepath", "filePath", "notebook_path", "filename", "dir", "directory"})
_COMMAND_KEYS = frozenset({"command", "cmd", "script"})
# A relative token counts as a path only with one of these extensions; absolute ones always do.
# fmt: off
_EXTENSIONS = frozenset((
    "py", "pyi", "pyx", "js", "mjs", "cjs", "ts", "tsx", "jsx", "go", "java", "kt", "rs", "c", "h", "cc", "cpp", "hpp",
    "cs", "rb", "php", "swift", "scala", "pony", "sh", "bash", "zsh", "md", "rst", "txt", "json", "jsonl", "yaml",
    "yml", "toml", "cfg", "ini", "lock", "xml", "html", "htm", "css", "scss", "sql", "proto", "patch", "diff", "log",
    "csv",
))
# fmt: on
_PATHISH = re.compile(r"^(?:~|\.{1,2})?/?[\w.+@-]+(?:/[\w.+@-]+)*/?$")
_NOT_PATHS = ("/dev/", "/proc/")
# A here-document's body is data (often a whole script), not part of the command.
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1[^\n]*\n(.*?)(?:^\s*\2\s*$|\Z)", re.S | re.M)


@dataclass(frozen=True)
class Roles:
    """Trace indexes (Msg.source) of person-typed messages and of tool outputs."""

    person: frozenset[int]
    tool_output: frozenset[int]


def acts_in_text(trace: Trace) -> bool:
    """The agent acts through fenced blocks in its text: no assistant message calls a tool."""
    return not any(m.tool_calls for m in trace.messages)


def classify(trace: Trace) -> Roles:
    """Which messages a person typed and which are tool output (see the module docstring)."""
    text_actions = acts_in_text(trace)
    person: set[int] = set()
    tool_output: set[int] = set()
    answering_action = False  # the floor is the environment's: the last assistant message acted
    for message in trace.messages:
        if message.role == "assistant":
            answering_action = text_actions and bool(_FENCE.search(message.content))
        elif message.role == "tool":
            tool_output.add(message.source)
        elif message.role == "user":
            (tool_output if answering_action else person).add(message.source)
    return Roles(frozenset(person), frozenset(tool_output))


def _command_paths(command: str) -> list[str]:
    command = _HEREDOC.sub("", command)
    try:
        words = shlex.split(command, comments=False, posix=True)
    except ValueError:  # unbalanced quotes: fall back to whitespace
        words = command.split()
    out = []
    for word in words:
        for token in re.split(r"[=:,;|&<>()]", word):
            path = _as_path(token)
            if path:
                out.append(path)
    return out


def _as_path(token: str) -> str:
    token = token.strip().strip("'\"`").rstrip(".,")
    if token.startswith("./"):
        token = token[2:]
    if not token or "://" in token or not _PATHISH.match(token) or token.startswith(_NOT_PATHS):
        return ""
    if token.startswith(("/", "~/")):
        return token.rstrip("/") if len(token) > 1 else ""
    stem = token.rstrip("/").rsplit("/", 1)[-1]
    extension = stem.rsplit(".", 1)[-1] if "." in stem.strip(".") else ""
    return token if extension.lower() in _EXTENSIONS else ""


def _argument_paths(arguments: str) -> list[str]:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return _command_paths(arguments)
    out: list[str] = []
    stack = [parsed]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, str) and key in _PATH_KEYS:
                    path = item.strip().removeprefix("./").rstrip("/")
                    if path:
                        out.append(path)
                elif isinstance(item, str) and key in _COMMAND_KEYS:
                    out += _command_paths(item)
                elif isinstance(item, dict | list):
                    stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)
    return out


def text_action(message: Msg) -> str:
    """The command of a text-acting assistant message: its last fenced block, or ""."""
    blocks = _FENCE.findall(message.content)
    return blocks[-1] if blocks else ""


def message_paths(message: Msg, text_actions: bool) -> list[str]:
    """The paths one assistant message's actions touch: path-like arguments of its tool calls
    (`path`, `file_path`, ...), paths in shell commands, and — when the agent acts in text — paths in
    its fenced command (only the command line of an `edit`, whose body is code)."""
    if message.role != "assistant":
        return []
    found = [path for call in message.tool_calls for path in _argument_paths(call.arguments)]
    if text_actions:
        command = text_action(message).lstrip()
        if command.startswith("edit "):
            command = command.splitlines()[0]
        found += _command_paths(command)
    return found


def touched_paths(trace: Trace, upto: int) -> list[str]:
    """The paths the agent's actions among the first `upto` trace messages touched, first touch first."""
    text_actions = acts_in_text(trace)
    seen: dict[str, None] = {}
    for message in trace.messages[:upto]:
        seen.update(dict.fromkeys(message_paths(message, text_actions)))
    return list(seen)


def view_text(view: Iterable[Msg]) -> str:
    """Everything the model reads in a view: contents, reasoning and tool-call arguments."""
    parts: list[str] = []
    for message in view:
        parts += [message.reasoning, message.content]
        parts += [f"{c.name} {c.arguments}" for c in message.tool_calls]
    return "\n".join(p for p in parts if p)


def readable_documents(text: str, documents: Mapping[str, str]) -> str:
    """The documents (reference -> text) whose reference `text` names: what one read reaches."""
    return "\n".join(body for ref, body in documents.items() if ref in text)


def _kept(content: str, text: str, reachable: str) -> bool:
    """Verbatim in the view (as written, or quoted line by line as the summary shows a person's
    message), or its head is in the view and the whole is in a readable document."""
    content = content.strip()
    if content in text or quoted(content) in text:
        return True
    head = content[:HEAD_CHARS]
    return (head in text or quoted(head) in text) and content in reachable


@dataclass(frozen=True)
class ProbeScores:
    task: int  # 1 when the trace has an opening user message
    task_kept: int
    instructions: int  # person-typed messages after the first
    instructions_kept: int
    paths: int
    paths_named: int
    hidden_tool_results: int  # non-empty tool outputs not shown in full in the view
    reachable_tool_results: int


def score(
    trace: Trace,
    view: Sequence[Msg],
    appended: int,
    refs: Mapping[int, str] | None = None,
    documents: Mapping[str, str] | None = None,
) -> ProbeScores:
    """The probes on `view` (the last view sent) over the first `appended` trace messages. `refs`
    maps trace indexes of stored tool results to their result_ref; `documents` are the texts the
    policy serves by reference (ctxfold: read back through ReadToolResult)."""
    text = view_text(view)
    reachable = readable_documents(text, documents or {})
    roles = classify(trace)
    messages = trace.messages[:appended]
    people = [m for m in messages if m.source in roles.person]
    task = [m for m in messages if m.role == "user"][:1]
    instructions = [m for m in people if not task or m.source != task[0].source]
    paths = touched_paths(trace, appended)
    hidden = [
        m for m in messages if m.source in roles.tool_output and m.content.strip() and m.content.strip() not in text
    ]
    ref_of = refs or {}
    return ProbeScores(
        task=len(task),
        task_kept=sum(_kept(m.content, text, reachable) for m in task),
        instructions=len(instructions),
        instructions_kept=sum(_kept(m.content, text, reachable) for m in instructions),
        paths=len(paths),
        paths_named=sum(p in text for p in paths),
        hidden_tool_results=len(hidden),
        reachable_tool_results=sum(
            bool(ref_of.get(m.source)) and (ref_of[m.source] in text or ref_of[m.source] in reachable) for m in hidden
        ),
    )


def refs_named(text: str) -> list[str]:
    """Every result_ref-shaped reference in `text`, first mention first."""
    return list(dict.fromkeys(RESULT_REF.findall(text)))

"""A complete agent loop on ctxfold, with a fake model (canned answers) and a fake tool.

    python -m ctxfold_client.examples.agent_loop --address 127.0.0.1:50051 [--token TOKEN]

One turn: append the user's message and prepare the view (ctxfold folds old history into a summary
when the window fills, streaming progress events), "call the model" with the view as OpenAI Chat
Completions messages, report the provider's usage, run the tools the model asked for and append the
answer with the tool results in the next prepare, until the model answers without tool calls.

The defaults (a 4000-token window, eight tool calls of ~1500 characters each) make ctxfold fold
during the turn; the end-to-end tests run this very code against a real server.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxfold_client import (
    Client,
    FoldProgress,
    PreparedView,
    SessionConfig,
    from_openai_message,
    to_openai_messages,
    tool_result,
    user,
)

SYSTEM_PROMPT = "You are a careful coding agent. Use list_files to look around before you answer."
TASK = "Survey the repository and tell me where the parsers and their tests live."
TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files under a directory, like `ls -l`.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
_WORDS = (
    "parser",
    "lexer",
    "token",
    "scanner",
    "config",
    "loader",
    "cache",
    "index",
    "report",
    "render",
    "schema",
    "adapter",
    "client",
    "server",
    "handler",
    "router",
    "session",
    "buffer",
    "stream",
    "codec",
    "writer",
    "reader",
    "plugin",
    "module",
    "helper",
    "utils",
    "fixture",
)


def list_files(path: str) -> str:
    """The fake tool: about 1500 characters of a varied, deterministic `ls -l` listing."""
    lines: list[str] = []
    size = 0
    index = 0
    while size < 1500:
        digest = hashlib.sha256(f"{path}#{index}".encode()).digest()
        words = [_WORDS[b % len(_WORDS)] for b in digest[:2]]
        name = f"{path}/{words[0]}_{words[1]}_{digest[2] % 100}.py"
        size_bytes = int.from_bytes(digest[3:6], "big") % 99999
        line = f"-rw-r--r-- 1 dev staff {size_bytes:>5} Mar {1 + digest[6] % 28:>2} {name}"
        lines.append(line)
        size += len(line) + 1
        index += 1
    return "\n".join(lines)


TOOLS: Mapping[str, Callable[..., str]] = {"list_files": list_files}


def run_tool(name: str, arguments: str) -> str:
    tool = TOOLS.get(name)
    if tool is None:
        return f"error: no tool named {name!r}"
    return tool(**json.loads(arguments or "{}"))


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int
    finish_reason: str


class FakeModel:
    """Stands in for a Chat Completions call: lists `tool_steps` directories, then answers."""

    def __init__(self, tool_steps: int = 8) -> None:
        self.tool_steps = tool_steps
        self.calls = 0
        self._step = 0

    def complete(self, messages: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], Usage]:
        self.calls += 1
        input_tokens = sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) // 4
        if self._step < self.tool_steps:
            self._step += 1
            path = f"src/pkg_{self._step}"
            reply = {
                "role": "assistant",
                "content": f"Step {self._step}: listing {path}.",
                "tool_calls": [
                    {
                        "id": f"call_{self._step}",
                        "type": "function",
                        "function": {"name": "list_files", "arguments": json.dumps({"path": path})},
                    }
                ],
            }
            return reply, Usage(input_tokens, 24, "tool_calls")
        self._step = 0
        answer = "The parsers live under src/pkg_*/parser_*.py; their tests sit next to them as *_fixture_*.py."
        return {"role": "assistant", "content": answer}, Usage(input_tokens, 32, "stop")


@dataclass
class TurnReport:
    """What one turn did."""

    answer: str
    last_view: PreparedView
    prepares: int = 0
    folds: int = 0
    progress: list[FoldProgress] = field(default_factory=list)
    views: list[PreparedView] = field(default_factory=list)


def run_turn(
    client: Client,
    session_id: str,
    task: str,
    model: FakeModel,
    *,
    on_progress: Callable[[FoldProgress], object] | None = None,
) -> TurnReport:
    """One user turn of the agent loop, until the model answers without tool calls."""
    progress: list[FoldProgress] = []
    views: list[PreparedView] = []

    def record(event: FoldProgress) -> None:
        progress.append(event)
        if on_progress is not None:
            on_progress(event)

    view = client.prepare(session_id, [user(task)], on_progress=record)
    while True:
        views.append(view)
        reply, usage = model.complete(to_openai_messages(view))
        client.observe_usage(
            session_id,
            view,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            finish_reason=usage.finish_reason,
        )
        answer = from_openai_message(reply)
        if not answer.tool_calls:
            client.append_messages(session_id, [answer])
            return TurnReport(
                answer=answer.content,
                last_view=view,
                prepares=len(views),
                folds=sum(v.folded for v in views),
                progress=progress,
                views=views,
            )
        results = [tool_result(call.id, run_tool(call.name, call.arguments)) for call in answer.tool_calls]
        view = client.prepare(session_id, [answer, *results], on_progress=record)


def _print_progress(event: FoldProgress) -> None:
    if event.summary_delta:
        return
    print(
        f"  fold {event.stage.name.lower()}: pass {event.pass_index}/{event.passes_planned} "
        f"tokens {event.tokens_before} -> {event.tokens_after} {event.message}".rstrip()
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default="127.0.0.1:50051", help="the ctxfold server (default: %(default)s)")
    parser.add_argument("--token", default=None, help="bearer token, when the server requires one")
    parser.add_argument("--context-window", type=int, default=4000)
    parser.add_argument("--max-output-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8, help="tool calls the fake model makes")
    args = parser.parse_args(argv)

    with Client(args.address, token=args.token) as client:
        config = SessionConfig(
            context_window=args.context_window,
            max_output_tokens=args.max_output_tokens,
            system_prompt=SYSTEM_PROMPT,
            tools=TOOL_SCHEMAS,
            model="fake-model",
        )
        session = client.create_session(config)
        print(f"session {session.id}")
        report = run_turn(client, session.id, TASK, FakeModel(args.steps), on_progress=_print_progress)
        view = report.last_view
        print(
            f"{report.prepares} prepares, {report.folds} folds, {len(report.progress)} progress events; "
            f"last view: {len(view.messages)} messages, ~{view.estimated_tokens} tokens, "
            f"summary={'yes' if view.summary is not None else 'no'}"
        )
        print(f"answer: {report.answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

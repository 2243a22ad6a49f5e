"""Real recorded agent conversations (tests/data/traces; provenance and licences in its README)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ctxfold.v1 import context_service_pb2 as pb

TRACES_DIR = Path(__file__).resolve().parent / "data" / "traces"
_ROLES = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT, "tool": pb.ROLE_TOOL}


@dataclass(frozen=True)
class Trace:
    name: str
    system_prompt: str
    tools_json: str
    messages: list[pb.Message]


def load_trace(name: str) -> Trace:
    data = json.loads((TRACES_DIR / name).read_text())
    raw = data["messages"]
    system = raw[0]["content"] if raw and raw[0]["role"] == "system" else ""
    messages = []
    for m in raw[1:] if system else raw:
        messages.append(
            pb.Message(
                role=_ROLES[m["role"]],
                content=m.get("content") or "",
                tool_call_id=m.get("tool_call_id") or "",
                reasoning_content=m.get("reasoning_content") or "",
                tool_calls=[
                    pb.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                    for c in m.get("tool_calls") or []
                ],
            )
        )
    return Trace(name, system, json.dumps(data.get("tools") or []), messages)


def turns(trace: Trace) -> list[list[pb.Message]]:
    """The messages an agent appends before each model call: everything up to the next assistant
    message (the model's answer, appended with the following Prepare)."""
    batches: list[list[pb.Message]] = []
    current: list[pb.Message] = []
    for message in trace.messages:
        if message.role == pb.ROLE_ASSISTANT and current:
            batches.append(current)
            current = []
        current.append(message)
    if current:
        batches.append(current)
    return batches


# The traces tool_output() cuts from: a fixed set, so that adding a trace changes no test's text.
CORPUS = (
    "mini-swe-agent-django-11910.json",
    "openhands-django-11149.json",
    "openhands-multi-swe-bench-0.json",
    "openhands-multi-swe-bench-1.json",
    "openhands-multi-swe-bench-2.json",
    "swe-agent-pydicom-1458.json",
)


@functools.cache
def _tool_output_corpus() -> str:
    outputs = []
    for path in (TRACES_DIR / name for name in CORPUS):
        outputs += [m.get("content") or "" for m in json.loads(path.read_text())["messages"] if m["role"] == "tool"]
    return "\n".join(o for o in outputs if o)


def tool_output(seed: int, chars: int) -> str:
    """`chars` characters of real recorded tool output (source listings, test runs, greps), starting at
    a place chosen by `seed`: realistic text for tool results of a chosen size."""
    corpus = _tool_output_corpus()
    start = (seed * 7919) % (len(corpus) - chars)
    return corpus[start : start + chars]

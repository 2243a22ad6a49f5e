"""A real open-source agent, run unmodified through the gateway: an OpenAI Agents SDK agent (PyPI
`openai-agents`) on its Chat Completions model, with the fake upstream scripting its model from a
recorded OpenHands run (tests/data/traces) and its tools answering with the recorded outputs. At a
small window the replay folds several times; after the first fold the upstream never receives more
than the trigger, and every message the agent sent is in the canonical transcript."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from agents import Agent, FunctionTool, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from agents.tool_context import ToolContext

from ctxfold.engine import estimator
from fake_upstream import CHAT, Call, Reply
from gateway_fixtures import Stack, make_stack

TRACE = Path(__file__).resolve().parent / "data" / "traces" / "openhands-django-11149.json"
WINDOW = 16_000
TRIGGER = int(WINDOW * 0.8)


@pytest.fixture(scope="module")
async def agent_stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async for running in make_stack(tmp_path_factory.mktemp("agent")):
        yield running


def request_tokens(body: dict[str, Any]) -> int:
    """The upstream request's messages as ctxfold's estimator counts a view (tools and output aside)."""
    total = 0
    for message in body["messages"]:
        calls = message.get("tool_calls") or []
        text = message.get("content") if isinstance(message.get("content"), str) else ""
        total += estimator.PER_MESSAGE_TOKENS + estimator.count_text(text or "")
        for call in calls:
            total += estimator.PER_TOOL_CALL_TOKENS + estimator.count_text(call["function"]["arguments"])
    return total


def recorded_calls(answer: dict[str, Any]) -> tuple[Call, ...]:
    return tuple(Call(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in answer["tool_calls"])


async def test_an_agents_sdk_agent_replays_a_real_run_through_several_folds(agent_stack: Stack) -> None:
    set_tracing_disabled(True)  # the SDK would send its traces to OpenAI
    trace = json.loads(TRACE.read_text())
    system, task, *rest = trace["messages"]
    answers = [m for m in rest if m["role"] == "assistant"]
    outputs = {m["tool_call_id"]: m["content"] for m in rest if m["role"] == "tool"}
    agent_stack.upstream.reply(
        CHAT,
        *[Reply(text=a.get("content") or "", calls=recorded_calls(a)) for a in answers],
        Reply(text="The fix is in place."),
    )

    async def recorded_output(context: ToolContext[Any], arguments: str) -> str:
        return outputs.get(context.tool_call_id, "(no output recorded)")

    tools = [
        FunctionTool(
            name=t["function"]["name"],
            description=t["function"].get("description", ""),
            params_json_schema=t["function"].get("parameters", {"type": "object"}),
            on_invoke_tool=recorded_output,
            strict_json_schema=False,
        )
        for t in trace["tools"]
    ]
    client = openai.AsyncOpenAI(
        base_url=f"{agent_stack.url}/v1", api_key="sk-agents",
        default_headers={"x-ctxfold-context-window": str(WINDOW)}, max_retries=0,
    )  # fmt: skip
    agent = Agent(
        name="openhands-replay",
        instructions=system["content"],
        model=OpenAIChatCompletionsModel(model="gpt-4.1", openai_client=client),
        tools=tools,
    )
    result = await Runner.run(agent, task["content"], max_turns=len(answers) + 5)
    assert result.final_output == "The fix is in place."

    requests = [s.body for s in agent_stack.upstream.seen if s.path == CHAT]
    assert len(requests) == len(answers) + 1
    sizes = [request_tokens(body) for body in requests]
    first_fold = next(i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1])
    assert all(size <= TRIGGER for size in sizes[first_fold:]), sizes
    sessions = [s async for s in agent_stack.ctxfold.list_sessions()]
    assert len(sessions) == 1
    checkpoints = [c async for c in agent_stack.ctxfold.list_checkpoints(sessions[0].id)]
    assert len(checkpoints) >= 2, "the replay should fold several times"
    transcript = await agent_stack.transcript(sessions[0].id)
    # the agent's whole history: the task, then each recorded call and its result, none missing or twice
    assert [m.content for m in transcript[:2]] == [system["content"], task["content"]]
    assert [c.id for m in transcript for c in m.tool_calls] == [c["id"] for a in answers for c in a["tool_calls"]]
    assert [m.tool_call_id for m in transcript if m.tool_call_id] == [c["id"] for a in answers for c in a["tool_calls"]]
    assert len(transcript) == 2 + 2 * len(answers)

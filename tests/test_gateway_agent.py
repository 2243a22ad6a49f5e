"""A real open-source agent, run unmodified through the gateway: an OpenAI Agents SDK agent (PyPI
`openai-agents`) on its Chat Completions model and on its Responses model, with the fake upstream
scripting its model from a recorded OpenHands run (tests/data/traces) and its tools answering with
the recorded outputs. At a small window the replay folds several times; after the first fold the
upstream never receives more than the trigger, and every message the agent sent is in the canonical
transcript."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.tool_context import ToolContext

from ctxfold.engine import estimator
from fake_upstream import CHAT, RESPONSES, Call, Reply
from gateway_fixtures import Stack, make_stack, openai_agent

TRACE = Path(__file__).resolve().parent / "data" / "traces" / "openhands-django-11149.json"
WINDOW = 16_000
TRIGGER = int(WINDOW * 0.8)


def request_tokens(body: dict[str, Any]) -> int:
    """The upstream request's history as ctxfold's estimator counts a view (tools and output aside):
    its text, the arguments of its calls, and the per-message framing."""
    history = body.get("messages") or [{"content": body.get("instructions")}, *body["input"]]
    total = 0
    for item in history:
        texts = [item.get("content"), item.get("output"), item.get("arguments")]
        texts += [c["function"]["arguments"] for c in item.get("tool_calls") or []]
        total += estimator.PER_MESSAGE_TOKENS + sum(estimator.count_text(t) for t in texts if isinstance(t, str))
    return total


def recorded_calls(answer: dict[str, Any]) -> tuple[Call, ...]:
    return tuple(Call(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in answer["tool_calls"])


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_an_agents_sdk_agent_replays_a_real_run_through_several_folds(tmp_path: Path, api: str) -> None:
    async for agent_stack in make_stack(tmp_path):
        await replay_through_the_gateway(agent_stack, api)


async def replay_through_the_gateway(agent_stack: Stack, api: str) -> None:
    set_tracing_disabled(True)  # the SDK would send its traces to OpenAI
    trace = json.loads(TRACE.read_text())
    system, task, *rest = trace["messages"]
    answers = [m for m in rest if m["role"] == "assistant"]
    outputs = {m["tool_call_id"]: m["content"] for m in rest if m["role"] == "tool"}
    path = CHAT if api == "chat_completions" else RESPONSES
    agent_stack.upstream.reply(
        path,
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
    client = openai_agent(agent_stack.url, api_key="sk-agents", window=WINDOW)
    agent = Agent(
        name="openhands-replay",
        instructions=system["content"],
        model=OpenAIChatCompletionsModel(model="gpt-4.1", openai_client=client)
        if api == "chat_completions"
        else OpenAIResponsesModel(model="gpt-4.1", openai_client=client),
        tools=tools,
    )
    result = await Runner.run(agent, task["content"], max_turns=len(answers) + 5)
    assert result.final_output == "The fix is in place."

    requests = [s.body for s in agent_stack.upstream.seen if s.path == path]
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

"""An agent of random habits through the gateway, over many turns at a small window: it calls tools (one
or two at a time), answers in text, streams or not, edits an earlier message, compacts its own history,
sends a request twice at once. After every turn the session's live transcript is exactly the history the
agent sent, the model's calls of ctxfold's read tool never reach it, and after the first fold no view
above the trigger goes upstream (ctxfold's estimate, `x-ctxfold-view-tokens`). Its tool results stay
below a third of the window: a fold keeps the input the next call must answer whole (SPEC, Prepare 5),
so results larger than what the trigger leaves may keep a view between the trigger and the ceiling."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from typing import Any

import aiohttp
import pytest

from fake_upstream import CHAT, Call, Reply
from gateway_fixtures import Stack, stack

__all__ = ["stack"]

Json = dict[str, Any]
WINDOW = 6000
TRIGGER = int(WINDOW * 0.8)


def model_reply(rng: random.Random) -> Reply:
    number = rng.randint(1, 10**9)
    chance = rng.random()
    if chance < 0.4:
        return Reply(text="", calls=(Call(f"call_{number}", "bash", json.dumps({"cmd": f"ls {number}"})),))
    if chance < 0.5:
        return Reply(text="", calls=(Call(f"call_{number}a", "bash", "{}"), Call(f"call_{number}b", "bash", "{}")))
    return Reply(text=f"answer {number}")


def paired(history: list[Json]) -> list[Json]:
    """`history` with every tool call answered and every result after its call: what is left when an
    agent drops messages (its own compaction) and keeps its requests valid."""
    while True:
        answered = {m["tool_call_id"] for m in history if m["role"] == "tool"}
        kept = [
            {**m, "content": m.get("content") or "..."} | {"tool_calls": []}
            if m["role"] == "assistant" and any(c["id"] not in answered for c in m.get("tool_calls", []))
            else m
            for m in history
        ]
        kept = [{k: v for k, v in m.items() if v != []} for m in kept]
        calls = {c["id"] for m in kept if m["role"] == "assistant" for c in m.get("tool_calls", [])}
        kept = [m for m in kept if m["role"] != "tool" or m["tool_call_id"] in calls]
        if kept == history:
            return kept
        history = kept


def next_request(rng: random.Random, history: list[Json]) -> list[Json]:
    """The history as the agent sends it this turn: as it is, with an earlier message edited, or with a
    middle part replaced by its own summary."""
    sent = copy.deepcopy(history)
    habit = rng.random()
    if habit < 0.07 and len(sent) > 3:
        index = rng.randrange(1, len(sent))
        if sent[index]["role"] in ("user", "tool"):
            sent[index]["content"] += " (edited)"
    elif habit < 0.12 and len(sent) > 5:
        start = rng.randrange(2, len(sent) - 3)
        summary = {"role": "user", "content": "Summary of the earlier work: the tests were listed."}
        sent = paired([*sent[:start], summary, *sent[start + 3 :]])
    return sent


async def answer_of(response: aiohttp.ClientResponse, streamed: bool) -> Json:
    """The model's message as the agent reads it (a stream's deltas joined)."""
    if not streamed:
        message: Json = (await response.json())["choices"][0]["message"]
        return {k: v for k, v in message.items() if v is not None}
    content, calls = "", {}
    for line in (await response.text()).splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            delta = choice.get("delta", {})
            content += delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    part["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = part.get("id") or call["id"]
                call["function"]["name"] += part.get("function", {}).get("name") or ""
                call["function"]["arguments"] += part.get("function", {}).get("arguments") or ""
    message = {"role": "assistant", **({"content": content} if content else {})}
    return message | ({"tool_calls": [calls[i] for i in sorted(calls)]} if calls else {})


@pytest.mark.parametrize("seed", [1, 2])
async def test_a_random_agent_keeps_its_history_whole_and_the_upstream_under_the_trigger(
    stack: Stack, seed: int
) -> None:
    rng = random.Random(seed)
    stack.upstream.reply(CHAT, *[lambda _body: model_reply(rng)] * 400)
    history: list[Json] = [{"role": "system", "content": "You are a careful coding agent."},
                           {"role": "user", "content": "Find the failing test."}]  # fmt: skip
    headers = {"Authorization": "Bearer sk-test", "x-ctxfold-session": f"random-{seed}",
               "x-ctxfold-context-window": str(WINDOW)}  # fmt: skip
    folded = False
    try:
        async with aiohttp.ClientSession() as http:
            for turn in range(50):
                sent = next_request(rng, history)
                body = {"model": "gpt-4.1", "messages": sent, "stream": rng.random() < 0.4}
                copies = 2 if rng.random() < 0.08 else 1
                answers = await asyncio.gather(
                    *(http.post(f"{stack.url}{CHAT}", data=json.dumps(body), headers=headers) for _ in range(copies))
                )
                assert [a.status for a in answers] == [200] * copies, turn
                answer = answers[0]
                message = await answer_of(answer, body["stream"])
                for other in answers:
                    other.release()
                assert all(c["function"]["name"] != "read_tool_result" for c in message.get("tool_calls", []))
                folded = folded or answer.headers["x-ctxfold-action"] == "folded"
                if folded:
                    assert int(answer.headers["x-ctxfold-view-tokens"]) <= TRIGGER, turn
                live = await stack.transcript(answer.headers["x-ctxfold-session"])
                assert [(m.role.name.lower(), m.content) for m in live] == [
                    (m["role"], m.get("content") or "") for m in sent
                ], turn
                history = [*sent, message]
                for call in message.get("tool_calls", []):
                    lines = rng.choice([3, 40, 100])
                    output = "\n".join(f"{turn}:{n} output line of {call['id']}" for n in range(lines))
                    history.append({"role": "tool", "tool_call_id": call["id"], "content": output})
                if not message.get("tool_calls"):
                    history.append({"role": "user", "content": f"Next step {turn}."})
    finally:
        stack.upstream.script.pop(CHAT, None)
    assert folded

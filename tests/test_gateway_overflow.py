"""When the provider refuses the gateway's view as too long (its count above ctxfold's estimate), the
gateway asks for a smaller one (Prepare with `overflow`: one prune or fold whatever the view's size)
and sends the request once more; the agent sees the answer, not the refusal. A refusal that cannot
be helped, and every other error, reach the agent unchanged."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from ctxfold.engine import estimator
from ctxfold.gateway.formats import stated_input_tokens
from ctxfold.gateway.formats.anthropic_messages import AnthropicMessages
from ctxfold.gateway.formats.openai_chat import OpenAIChat
from ctxfold.gateway.formats.openai_responses import OpenAIResponses
from fake_upstream import CHAT, MESSAGES, Call, Reply
from gateway_fixtures import Stack, anthropic_agent, openai_agent, stack

__all__ = ["stack"]

WINDOW = 8000
# The provider counts more than ctxfold estimates: it refuses requests of more than this many bytes,
# where the fold trigger (80 % of the window) lets 12-15 kB of these build logs through.
REFUSED_ABOVE_BYTES = 9_000
OPENAI_TOO_LONG = orjson.dumps(
    {
        "error": {
            "message": "This model's maximum context length is 8000 tokens. However, your messages resulted in "
            "8113 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
)
ANTHROPIC_TOO_LONG = orjson.dumps(
    {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "prompt is too long: 8113 tokens > 8000 maximum"},
    }
)


class Provider:
    """The fake upstream's model: a tool call per turn, refusing any request larger than `limit` bytes."""

    def __init__(self, refusal: bytes, limit: int = REFUSED_ABOVE_BYTES):
        self.refusal, self.limit = refusal, limit
        self.sizes: list[tuple[int, bool]] = []  # (bytes, refused) of each request

    def __call__(self, body: dict[str, Any]) -> Reply:
        size = len(orjson.dumps(body))
        refused = size > self.limit
        self.sizes.append((size, refused))
        if refused:
            return Reply(status=400, error_body=self.refusal)
        return Reply(text="", calls=(Call(f"call_{len(self.sizes)}", "bash", '{"cmd": "cat build.log"}'),))


@contextlib.contextmanager
def scripted(stack: Stack, path: str, *replies: Reply | Callable[[dict[str, Any]], Reply]) -> Iterator[None]:
    """The upstream answers `path` with `replies`, for this test only."""
    stack.upstream.reply(path, *replies)
    try:
        yield
    finally:
        stack.upstream.script.pop(path, None)


def build_log(turn: int) -> str:
    return "\n".join(f"{turn}:{line} compiled module_{line}.c in {line % 7}.{line % 10}s" for line in range(60))


async def chat_turns(
    stack: Stack, session: str, turns: int, stream: bool
) -> tuple[list[tuple[int, str]], str, list[dict[str, Any]]]:
    """An agent on the official openai SDK: each turn runs the model's tool call and sends its output.
    (status, x-ctxfold-action) of each call, the session's id and the last call's history."""
    agent = openai_agent(stack.url, session, window=WINDOW)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful build agent."},
        {"role": "user", "content": "Find why the build is slow."},
    ]
    seen: list[tuple[int, str]] = []
    for turn in range(turns):
        kwargs: dict[str, Any] = {"model": "gpt-4.1", "messages": history, "tools": tools}
        if stream:
            async with agent.chat.completions.with_streaming_response.create(stream=True, **kwargs) as raw:
                calls = [
                    call.id
                    async for chunk in await raw.parse()
                    for choice in chunk.choices
                    for call in choice.delta.tool_calls or []
                    if call.id
                ]
                seen.append((raw.status_code, raw.headers["x-ctxfold-action"]))
                session_id = raw.headers["x-ctxfold-session"]
        else:
            raw = await agent.chat.completions.with_raw_response.create(**kwargs)
            calls = [call.id for call in raw.parse().choices[0].message.tool_calls or []]
            seen.append((raw.status_code, raw.headers["x-ctxfold-action"]))
            session_id = raw.headers["x-ctxfold-session"]
        sent = list(history)
        call_id = calls[0]
        function = {"name": "bash", "arguments": '{"cmd": "cat build.log"}'}
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        history.append({"role": "tool", "tool_call_id": call_id, "content": build_log(turn)})
    return seen, session_id, sent


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_view_the_provider_refuses_as_too_long_is_folded_and_sent_once_more(stack: Stack, stream: bool) -> None:
    provider = Provider(OPENAI_TOO_LONG)
    with scripted(stack, CHAT, *[provider] * 40):
        seen, session_id, sent = await chat_turns(stack, f"refused-{stream}", 14, stream)
    refused = [i for i, (_, was_refused) in enumerate(provider.sizes) if was_refused]
    assert refused, "the provider never refused: the test no longer reaches its case"
    assert all(status == 200 for status, _ in seen), seen  # the agent never saw a refusal
    for index in refused:  # each refusal was followed by the same call with a smaller view, accepted
        size, _ = provider.sizes[index]
        retried_size, retried_refused = provider.sizes[index + 1]
        assert not retried_refused and retried_size < size
    assert len(provider.sizes) == len(seen) + len(refused)  # one retry per refusal, no more
    assert all(seen[i - refused.index(i)][1] != "none" for i in refused)  # the answer says what made room
    transcript = await stack.transcript(session_id)  # every message the agent sent, none rewritten
    assert [(m.role.name.lower(), m.content) for m in transcript] == [(m["role"], m.get("content") or "") for m in sent]


async def test_a_refusal_no_smaller_view_can_help_reaches_the_agent_unchanged(stack: Stack) -> None:
    provider = Provider(OPENAI_TOO_LONG, limit=100)  # refuses everything: nothing ctxfold does is enough
    agent = openai_agent(stack.url, "always-refused")
    messages = [{"role": "user", "content": "hello " * 300}]
    with scripted(stack, CHAT, *[provider] * 4), pytest.raises(openai.BadRequestError) as raised:
        await agent.chat.completions.create(model="gpt-4.1", messages=messages)  # type: ignore[arg-type]
    assert raised.value.response.content == OPENAI_TOO_LONG
    assert len(provider.sizes) == 1  # a lone message: nothing to fold, so the same view is not sent again


async def test_other_refusals_pass_through_with_one_upstream_call(stack: Stack) -> None:
    invalid = orjson.dumps(
        {
            "error": {
                "message": "Invalid 'tools[0]'",
                "type": "invalid_request_error",
                "param": "tools",
                "code": "invalid_value",
            }
        }
    )
    calls: list[int] = []

    def refuse(body: dict[str, Any]) -> Reply:
        calls.append(1)
        return Reply(status=400, error_body=invalid)

    agent = openai_agent(stack.url, "other-refusal")
    with scripted(stack, CHAT, refuse, refuse), pytest.raises(openai.BadRequestError) as raised:
        await agent.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.response.content == invalid and calls == [1]


async def anthropic_turns(stack: Stack, session: str, turns: int) -> list[str]:
    """An agent on the official anthropic SDK, streaming: x-ctxfold-action of each call."""
    agent = anthropic_agent(stack.url, session, window=WINDOW)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find why the build is slow."}]
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    actions = []
    for turn in range(turns):
        async with agent.messages.stream(model="claude-sonnet-4-6", max_tokens=1024, system="You are careful.",
                                         messages=messages, tools=tools) as stream:  # type: ignore[arg-type]  # fmt: skip
            final = await stream.get_final_message()
            actions.append(stream.response.headers["x-ctxfold-action"])
        use = next(block for block in final.content if block.type == "tool_use")
        messages.append({"role": "assistant", "content": [block.model_dump() for block in final.content]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                      "content": build_log(turn)}]})  # fmt: skip
    return actions


async def test_an_anthropic_stream_refused_as_too_long_is_folded_and_sent_once_more(stack: Stack) -> None:
    provider = Provider(ANTHROPIC_TOO_LONG)
    with scripted(stack, MESSAGES, *[provider] * 40):
        actions = await anthropic_turns(stack, "refused-anthropic", 14)
    refused = [i for i, (_, was_refused) in enumerate(provider.sizes) if was_refused]
    assert refused and all(not provider.sizes[i + 1][1] for i in refused)
    assert len(provider.sizes) == len(actions) + len(refused)
    assert all(actions[i - refused.index(i)] != "none" for i in refused)  # the answer says what made room


REFUSALS: list[tuple[Callable[[int, bytes], bool], int, bytes, bool]] = [
    (OpenAIChat().refused_as_too_long, 400, OPENAI_TOO_LONG, True),
    (
        OpenAIResponses().refused_as_too_long,
        400,
        orjson.dumps(
            {
                "error": {
                    "message": "Your input exceeds the context window of this model. Please adjust your input.",
                    "type": "invalid_request_error",
                    "param": "input",
                    "code": "context_length_exceeded",
                }
            }
        ),
        True,
    ),
    # vLLM and other OpenAI-compatible servers: the message, no code.
    (
        OpenAIChat().refused_as_too_long,
        400,
        orjson.dumps(
            {
                "object": "error",
                "error": {
                    "message": "This model's maximum context length is 4096 tokens. However, you requested 5000.",
                    "type": "BadRequestError",
                    "code": 400,
                },
            }
        ),
        True,
    ),
    (AnthropicMessages().refused_as_too_long, 400, ANTHROPIC_TOO_LONG, True),
    (OpenAIChat().refused_as_too_long, 429, OPENAI_TOO_LONG, False),
    (
        OpenAIChat().refused_as_too_long,
        400,
        orjson.dumps({"error": {"message": "Invalid 'tools'", "code": "invalid_value"}}),
        False,
    ),
    (
        AnthropicMessages().refused_as_too_long,
        400,
        orjson.dumps(
            {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: must be positive"}}
        ),
        False,
    ),
    (AnthropicMessages().refused_as_too_long, 400, b"<html>bad gateway</html>", False),
]


@pytest.mark.parametrize(("refused_as_too_long", "status", "payload", "expected"), REFUSALS)
def test_each_providers_refusal_as_too_long_is_recognized_and_nothing_else(
    refused_as_too_long: Callable[[int, bytes], bool], status: int, payload: bytes, expected: bool
) -> None:
    assert refused_as_too_long(status, payload) is expected


def error_message(message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error"}})


@pytest.mark.parametrize(
    ("payload", "tokens"),
    [
        (OPENAI_TOO_LONG, 8113),
        (ANTHROPIC_TOO_LONG, 8113),
        # vLLM and LiteLLM count the completion too: the messages' part is the prompt.
        (
            error_message(
                "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
                "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages."
            ),
            4000,
        ),
        (error_message("Your input exceeds the context window of this model."), 0),  # no count stated
        (error_message("prompt is too long: 99999999999 tokens > 200000 maximum"), 0),  # not a count
        (b"<html>bad gateway</html>", 0),
    ],
)
def test_the_count_a_refusal_states_is_read_when_it_states_one(payload: bytes, tokens: int) -> None:
    assert stated_input_tokens(payload) == tokens


async def test_the_count_a_refusal_states_calibrates_the_session(stack: Stack) -> None:
    """The provider's count of a view it refused is reported as its usage of that view before the
    smaller view is made: the session's estimates follow the provider's count from then on."""
    content = "\n".join(f"step {n}: compiled module_{n}.c" for n in range(200))
    stated = estimator.count_text(content) * 3 // 2  # the provider counts half as much again

    def refused(_body: dict[str, Any]) -> Reply:
        return Reply(status=400, error_body=error_message(f"prompt is too long: {stated} tokens > 1000 maximum"))

    agent = anthropic_agent(stack.url, "stated-count")
    with scripted(stack, MESSAGES, refused), pytest.raises(anthropic.BadRequestError) as raised:
        await agent.messages.create(
            model="claude-sonnet-4-6", max_tokens=100, messages=[{"role": "user", "content": content}]
        )
    assert raised.value.status_code == 400  # a lone message: nothing to fold, the refusal reaches the agent
    session_id = raised.value.response.headers["x-ctxfold-session"]
    state = await stack.ctxfold.get_context_state(session_id)
    assert state["telemetry"]["observations"] == 1 and state["telemetry"]["input_tokens"] == stated
    assert 1.1 < state["calibration"] < 1.5  # moved toward the provider's ratio (~1.5)

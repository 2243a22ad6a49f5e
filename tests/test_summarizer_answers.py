"""A provider answering 200 with something that is not its API's shape (not JSON, another shape, a bad
stream event) fails the fold pass with a message naming the provider and what was wrong, never a
Python internal; nothing is installed. Both SDK summarizers, against the fake provider over HTTP."""

from __future__ import annotations

import pytest

from builders import prepare, user
from ctxfold.v1 import context_service_pb2 as pb
from test_summarizers import ANTHROPIC_TOOLS, Env, agent_session, env, module_env, provider, stages, tool_turn

__all__ = ["env", "module_env", "provider"]  # the fixtures, imported for the tests below

# (summarizer, behaviour) -> what the PASS_FAILED message says.
EXPECTED = {
    ("fake", "not_json"): "openai: the answer is not an event stream but text/plain: it starts b'upstream proxy",
    ("fake", "wrong_shape"): "openai: a chat completion chunk is malformed: choices: Input should be a valid array",
    ("fake", "bad_event"): "openai: a chat completion chunk is malformed: choices.0.delta.content: Input should be "
    "a valid string",
    ("fake_plain", "not_json"): "openai: the chat completion is malformed: its JSON: Invalid JSON",
    ("fake_plain", "wrong_shape"): "openai: the chat completion is malformed: choices: Input should be a valid array",
    ("fake_plain", "bad_event"): "openai: the chat completion is malformed: choices.0.message.content: Input should "
    "be a valid string",
    ("fake_anthropic", "not_json"): "anthropic: the answer is not an event stream but text/plain",
    ("fake_anthropic", "wrong_shape"): "anthropic: a message_start event is malformed: message.content: Field required",
    ("fake_anthropic", "bad_event"): "anthropic: a content_block_delta event is malformed: delta.TextDelta.text: "
    "Input should be a valid string",
}
PYTHON_INTERNALS = ("object has no attribute", "object is not", "list index", "KeyError", "TypeError", "Traceback")


@pytest.mark.parametrize(("summarizer", "behaviour"), sorted(EXPECTED))
async def test_a_malformed_answer_fails_the_pass_with_a_clear_message(
    env: Env, summarizer: str, behaviour: str
) -> None:
    stub, fake = env.stub, env.fake
    tools = {"tools_json": ANTHROPIC_TOOLS} if summarizer == "fake_anthropic" else {}
    session = await agent_session(stub, context_window=10000, compact_ratio=0.5, summarizer=summarizer, **tools)
    fake.script(behaviour)
    await prepare(stub, session.id, user("Make every case pass."))
    for index in range(1, 60):
        outcome = await prepare(stub, session.id, *tool_turn(index, 300))
        progress, result = outcome.progress, outcome.result
        if fake.requests:
            break
    assert [r.behaviour for r in fake.requests] == [behaviour]
    failed = stages(progress, pb.FOLD_STAGE_PASS_FAILED)
    assert len(failed) == 1 and EXPECTED[summarizer, behaviour] in failed[0].message, failed
    assert not any(internal in failed[0].message for internal in PYTHON_INTERNALS), failed[0].message
    assert result.action == pb.ACTION_NONE and result.checkpoint_id == ""

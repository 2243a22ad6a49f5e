"""The LLM summarizers end to end: a real ctxfold server (SQLite and PostgreSQL) folds through the
official `openai` and `anthropic` SDKs against a real local HTTP server speaking their protocols
(tests/fake_provider.py), which records the exact requests and plays scripted failures."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from sqlalchemy import select

from builders import append, compact, create_session, prepare, user
from conftest import fresh_database, settings_for
from ctxfold.engine.briefing import strip_engine_sections
from ctxfold.engine.estimator import PER_MESSAGE_TOKENS, count_text
from ctxfold.server import RunningServer, start
from ctxfold.service.run import Hooks
from ctxfold.store import schema
from ctxfold.summarizers.base import MAX_BYTES_PER_TOKEN
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import SECTIONS, FakeProvider, Recorded
from rpc_errors import expect_error

Stub = pb_grpc.ContextServiceStub

KEY_ENV = "CTXFOLD_TEST_FAKE_OPENAI_KEY"
KEY = "sk-fake-openai-0123456789"
ANTHROPIC_KEY_ENV = "CTXFOLD_TEST_FAKE_ANTHROPIC_KEY"
ANTHROPIC_KEY = "sk-ant-fake-9876543210"
CLIENT_TIMEOUT = 2.0  # seconds; the fake's "timeout" answers after 3 × that
DEADLINE = 1.5  # seconds: the whole of one "fake_deadline" call

SYSTEM = "You are a careful coding agent working in /srv/app. Run the tests before claiming success."
OPENAI_TOOLS = json.dumps(
    [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": "Run a shell command and return its output.",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            },
        },
    ]
)
ANTHROPIC_TOOLS = json.dumps(
    [
        {
            "name": "run",
            "description": "Run a shell command and return its output.",
            "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        }
    ]
)
ROLE_NAMES = {pb.ROLE_SYSTEM: "system", pb.ROLE_USER: "user", pb.ROLE_ASSISTANT: "assistant", pb.ROLE_TOOL: "tool"}
_WORDS = (
    "the test case file line value error module import class function return data result check build run "
    "output input path config server client query table index cache token model request response status "
    "number string list map key field record event state update delete create read write open close start"
)
VOCABULARY = _WORDS.split()


def briefed(answer: str, messages: Sequence[Any]) -> bool:
    """Whether the one summary of `messages` holds the summarizer's `answer` (less the sections the
    engine renders itself), between the engine's own sections."""
    (summary,) = [m for m in messages if (m.summary if hasattr(m, "summary") else False)] or [None]
    return summary is not None and strip_engine_sections(answer) in summary.content


# ---- the server under test ---------------------------------------------------------------------


@dataclass
class Env:
    stub: Stub
    running: RunningServer
    hooks: Hooks
    fake: FakeProvider


def summarizer_specs(fake: FakeProvider) -> dict[str, dict[str, Any]]:
    common = {"model": "m-fake", "timeout_seconds": CLIENT_TIMEOUT, "max_retries": 0}
    return {
        "fake": {"type": "openai", "base_url": fake.base_url, "api_key_env": KEY_ENV, **common},
        "fake_small": {
            "type": "openai",
            "base_url": fake.base_url,
            "api_key_env": KEY_ENV,
            "input_window_tokens": 3000,
            **common,
        },
        "fake_plain": {"type": "openai", "base_url": fake.base_url, "api_key_env": KEY_ENV, "stream": False, **common},
        "fake_deadline": {
            "type": "openai",
            "base_url": fake.base_url,
            "api_key_env": KEY_ENV,
            "deadline_seconds": DEADLINE,
            **common,
        },
        "fake_anthropic": {
            "type": "anthropic",
            "base_url": fake.anthropic_base_url,
            "api_key_env": ANTHROPIC_KEY_ENV,
            **common,
        },
    }


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(timeout_sleep=3 * CLIENT_TIMEOUT) as fake:
        yield fake


@pytest.fixture(scope="module")
async def module_env(
    backend: str, provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    url = await fresh_database(backend, tmp_path_factory.mktemp(f"summarizers-{backend}"))
    hooks = Hooks()
    with pytest.MonkeyPatch.context() as patch:  # the keys are read when the summarizers are built
        patch.setenv(KEY_ENV, KEY)
        patch.setenv(ANTHROPIC_KEY_ENV, ANTHROPIC_KEY)
        running = await start(settings_for(url, summarizers=json.dumps(summarizer_specs(provider))), hooks=hooks)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield Env(pb_grpc.ContextServiceStub(channel), running, hooks, provider)
    finally:
        await running.stop(grace=1.0)


@pytest.fixture
def env(module_env: Env) -> Iterator[Env]:
    module_env.fake.reset()
    module_env.hooks.before_install = None
    yield module_env
    module_env.fake.release()  # never leave an answer stalled for the next test
    module_env.hooks.before_install = None


# ---- messages ----------------------------------------------------------------------------------


def words(count: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(VOCABULARY) for _ in range(count))


def tool_turn(index: int, result_words: int, result: str = "") -> list[pb.Message]:
    """One call group: an assistant message with a tool call and its result."""
    call_id = f"call_{index:03d}"
    return [
        pb.Message(
            role=pb.ROLE_ASSISTANT,
            content=f"Step {index}: checking case_{index}.",
            tool_calls=[pb.ToolCall(id=call_id, name="run", arguments=json.dumps({"cmd": f"pytest -k case_{index}"}))],
        ),
        pb.Message(
            role=pb.ROLE_TOOL,
            tool_call_id=call_id,
            content=result or f"$ pytest -k case_{index}\n" + words(result_words, seed=index),
        ),
    ]


# ---- calls -------------------------------------------------------------------------------------


async def agent_session(stub: Stub, **config: Any) -> pb.Session:
    """A session of the agent these tests play: its system prompt, its tools and a cache key unless
    `config` says otherwise."""
    config.setdefault("system_prompt", SYSTEM)
    config.setdefault("tools_json", OPENAI_TOOLS)
    config.setdefault("prompt_cache_key", f"pck-{uuid.uuid4().hex[:12]}")
    # These tests are about the fold a Prepare makes itself; test_background_folds.py covers the others.
    config.setdefault("prefold_ratio", 0.0)
    return await create_session(stub, **config)


async def session_checkpoint(stub: Stub, session_id: str) -> str:
    return (await stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session.checkpoint_id


async def last_receipt(stub: Stub, session_id: str) -> dict[str, Any]:
    state = json.loads((await stub.GetContextState(pb.GetContextStateRequest(session_id=session_id))).state_json)
    receipt = state["last_receipt"]
    assert isinstance(receipt, dict)
    return receipt


async def parent_of(env: Env, checkpoint_id: str) -> str | None:
    cp = schema.checkpoints.c
    async with env.running.store.engine.connect() as conn:
        parent = (await conn.execute(select(cp.parent_id).where(cp.id == checkpoint_id))).scalar_one()
    return str(parent) if parent is not None else None


async def until(predicate: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def stages(progress: Sequence[pb.FoldProgress], stage: int) -> list[pb.FoldProgress]:
    return [p for p in progress if p.stage == stage]


def deltas(progress: Sequence[pb.FoldProgress], pass_index: int | None = None) -> str:
    return "".join(
        p.summary_delta
        for p in stages(progress, pb.FOLD_STAGE_SUMMARY_DELTA)
        if pass_index is None or p.pass_index == pass_index
    )


def summaries(view: Sequence[pb.Message]) -> list[pb.Message]:
    return [m for m in view if m.summary]


def as_openai(message: pb.Message) -> dict[str, Any]:
    """A view message the way an agent sends it to Chat Completions (role/content/calls/call id)."""
    out: dict[str, Any] = {"role": ROLE_NAMES[message.role], "content": message.content}
    if message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


def received(message: dict[str, Any]) -> dict[str, Any]:
    return {k: message[k] for k in ("role", "content", "tool_calls", "tool_call_id") if k in message}


async def run_until_fold(
    stub: Stub, session_id: str, first: Sequence[pb.Message], result_words: int, limit: int = 60
) -> tuple[list[pb.Message], list[pb.Message], list[pb.FoldProgress], pb.PreparedContext]:
    """Drives an agent loop (one call group per Prepare) until a Prepare folds. Returns the view of
    the Prepare before, what the folding Prepare appended, its progress and its result."""
    result = (await prepare(stub, session_id, *first)).result
    for index in range(1, limit):
        previous = list(result.messages)
        turn = tool_turn(index, result_words)
        outcome = await prepare(stub, session_id, *turn)
        progress, result = outcome.progress, outcome.result
        if result.action == pb.ACTION_FOLDED:
            return previous, turn, progress, result
        assert result.estimated_tokens < result.trigger_tokens
    raise AssertionError("no fold happened")


# ---- 1. the exact request --------------------------------------------------------------------


@pytest.mark.parametrize("max_output_tokens", [0, 600])
async def test_openai_fold_request_is_a_cache_safe_fork_of_the_agent_view(env: Env, max_output_tokens: int) -> None:
    stub, fake = env.stub, env.fake
    session = await agent_session(
        stub,
        context_window=8000,
        summarizer="fake",
        max_output_tokens=max_output_tokens,
        summary_max_tokens=1000,
        tool_content_max_bytes=4096,
    )
    # The first result is longer than tool_content_max_bytes: its view content names its result_ref.
    first = [user("Make case_1 to case_9 pass."), *tool_turn(0, 0, result="$ cat big.log\n" + words(1500, seed=99))]
    previous, appended, progress, result = await run_until_fold(stub, session.id, first, result_words=300)

    assert len(fake.requests) == 1
    request = fake.requests[0]
    body = request.body
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert body["model"] == "m-fake"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["tools"] == json.loads(OPENAI_TOOLS)
    assert body["tool_choice"] == "none"
    assert body["prompt_cache_key"] == session.config.prompt_cache_key == result.prompt_cache_key
    if max_output_tokens > 0:
        # summary_max_tokens less what the engine's own sections (artifacts, index reference) take.
        assert 256 <= body["max_tokens"] < 1000
    else:
        assert "max_tokens" not in body

    messages = body["messages"]
    replayed, instruction = messages[:-1], messages[-1]
    assert messages[0] == {"role": "system", "content": SYSTEM}
    # The replayed messages are the view the agent got from the previous Prepare, up to the last
    # folded message: a prefix of it, byte for byte.
    assert 2 < len(replayed) <= len(previous)
    assert [received(m) for m in replayed] == [as_openai(m) for m in previous[: len(replayed)]]
    assert instruction["role"] == "user"
    for section in SECTIONS:
        assert section in instruction["content"]

    # The view after the fold: system, the task anchor, the summary, then what was not folded.
    view = list(result.messages)
    assert view[0].role == pb.ROLE_SYSTEM and view[0].content == SYSTEM
    assert view[1].role == pb.ROLE_USER and view[1].content == "Make case_1 to case_9 pass."
    assert [m.summary for m in view].count(True) == 1 and view[2].summary
    assert briefed(request.answer, view)
    kept_ids = [m.id for m in view[3:]]
    after_prefix = [m.id for m in [*previous, *result.appended][len(replayed) :]]
    assert after_prefix and kept_ids[-len(after_prefix) :] == after_prefix
    assert len(appended) == len(result.appended)
    # The replayed prefix ended at the last folded message: only the anchored request was kept from it.
    assert view[3 : len(view) - len(after_prefix)] == []
    # The truncated result's ref was seen by the summarizer and is in the folded-results index.
    truncated = next(m for m in previous if m.truncated)
    assert truncated.result_ref in replayed[3]["content"]
    assert result.folded_results_ref in view[2].content
    index = await stub.ReadToolResult(
        pb.ReadToolResultRequest(session_id=session.id, result_ref=result.folded_results_ref)
    )
    assert truncated.result_ref in index.data

    # Streaming: the deltas, in order, are the summarizer's text.
    assert len(stages(progress, pb.FOLD_STAGE_SUMMARY_DELTA)) > 1
    assert deltas(progress) == request.answer
    committed = stages(progress, pb.FOLD_STAGE_PASS_COMMITTED)
    assert len(committed) == 1
    assert committed[0].checkpoint_id == result.checkpoint_id == await session_checkpoint(stub, session.id)
    assert (await last_receipt(stub, session.id))["status"] == "applied"


async def test_second_fold_rolls_the_previous_summary_in(env: Env) -> None:
    stub, fake = env.stub, env.fake
    session = await agent_session(stub, context_window=8000, summarizer="fake", summary_max_tokens=1000)
    _, _, _, first = await run_until_fold(stub, session.id, [user("Make every case pass.")], result_words=300)
    first_summary = first.messages[2].content
    previous = list(first.messages)
    for index in range(100, 160):
        result = (await prepare(stub, session.id, *tool_turn(index, 300))).result
        if result.action == pb.ACTION_FOLDED:
            break
        previous = list(result.messages)
    else:
        raise AssertionError("no second fold")
    assert len(fake.requests) == 2
    replayed = fake.requests[1].messages[:-1]
    assert replayed[:3] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Make every case pass."},
        {"role": "user", "content": first_summary},
    ]
    assert [received(m) for m in replayed] == [as_openai(m) for m in previous[: len(replayed)]]
    assert "update them section by section" in fake.requests[1].messages[-1]["content"]
    assert len(summaries(result.messages)) == 1
    assert briefed(fake.requests[1].answer, result.messages)
    # Anchored, not nested: the earlier summary's header and body appear once, not inside the new body.
    assert result.messages[2].content.count("[ctxfold summary of earlier conversation]") == 1
    assert await parent_of(env, result.checkpoint_id) == first.checkpoint_id


async def test_openai_without_streaming_tools_or_cache_key(env: Env) -> None:
    """`stream: false`, a session without tools and with a derived prompt cache key."""
    stub, fake = env.stub, env.fake
    session = await agent_session(
        stub, context_window=8000, summarizer="fake_plain", summary_max_tokens=1000, tools_json="", prompt_cache_key=""
    )
    _, _, progress, result = await run_until_fold(stub, session.id, [user("Make every case pass.")], 300)
    assert len(fake.requests) == 1
    body = fake.requests[0].body
    assert not body.get("stream")
    assert "tools" not in body and "tool_choice" not in body
    assert body["prompt_cache_key"] == result.prompt_cache_key == f"ctxfold-{session.id}"
    assert not stages(progress, pb.FOLD_STAGE_SUMMARY_DELTA)
    assert briefed(fake.requests[0].answer, result.messages)


# ---- 2. scripted failures ----------------------------------------------------------------------

FAILURES = {
    "error500": "500",
    "stall": "timed out",  # a stream that stops midway, past the client's read timeout
    "cut": "incomplete",  # a stream that ends early but cleanly: no finish reason, half a summary
    "timeout": "timed out",
    "truncated": "truncated",
    "empty": "empty",
    "not_smaller": "not smaller",
    "huge": "reading stopped",  # read only up to what summary_max_tokens allows
    "trickle": "deadline",  # keep-alives every 0.5 s never trip the read timeout; the call's deadline ends it
    "not_json": "the chat completion is malformed",
}
# The summarizer each failure is played to ("fake" unless named here).
SUMMARIZER_FOR = {"trickle": "fake_deadline", "not_json": "fake_plain"}


@pytest.mark.parametrize("behaviour", sorted(FAILURES))
async def test_failed_summary_installs_nothing_and_is_not_retried_until_the_view_grows(
    env: Env, behaviour: str
) -> None:
    stub, fake = env.stub, env.fake
    # A low trigger leaves room below the hard ceiling; a large summary_max_tokens lets a
    # not-smaller "summary" fail as not smaller rather than as too long.
    session = await agent_session(
        stub,
        context_window=10000,
        compact_ratio=0.5,
        summarizer=SUMMARIZER_FOR.get(behaviour, "fake"),
        summary_max_tokens=4700,
        tail_ratio=0.16,  # a tail the fold keeps, so that the folded part is shorter than that budget
    )
    fake.script(behaviour)
    result = (await prepare(stub, session.id, user("Make every case pass."))).result
    for index in range(1, 60):
        outcome = await prepare(stub, session.id, *tool_turn(index, 300))
        progress, result = outcome.progress, outcome.result
        if fake.requests:
            break
    assert len(fake.requests) == 1 and fake.requests[0].behaviour == behaviour

    # Prepare still answers: the view fits the hard ceiling, nothing was installed.
    assert result.trigger_tokens <= result.estimated_tokens <= result.hard_limit_tokens
    assert result.action == pb.ACTION_NONE
    assert result.checkpoint_id == "" == await session_checkpoint(stub, session.id)
    assert not summaries(result.messages)
    failed = stages(progress, pb.FOLD_STAGE_PASS_FAILED)
    assert len(failed) == 1 and FAILURES[behaviour] in failed[0].message, failed
    assert len(deltas(progress).encode()) <= 4700 * MAX_BYTES_PER_TOKEN  # streamed at most the output bound
    assert not stages(progress, pb.FOLD_STAGE_PASS_COMMITTED)
    receipt = await last_receipt(stub, session.id)
    assert (receipt["status"], receipt["action"]) == ("failed", "summary")
    view = list(result.messages)

    # The same input is not summarized again.
    outcome = await prepare(stub, session.id)
    progress, again = outcome.progress, outcome.result
    assert len(fake.requests) == 1
    assert not stages(progress, pb.FOLD_STAGE_PASS_STARTED)
    assert list(again.messages) == view
    assert again.checkpoint_id == ""

    # Once the view grows, it is retried (and now succeeds).
    outcome = await prepare(stub, session.id, user("Also keep the public API unchanged."))
    progress, grown = outcome.progress, outcome.result
    assert len(fake.requests) == 2
    assert grown.action == pb.ACTION_FOLDED
    assert grown.checkpoint_id and grown.checkpoint_id == await session_checkpoint(stub, session.id)
    assert briefed(fake.requests[1].answer, grown.messages)
    assert grown.estimated_tokens < grown.trigger_tokens
    assert (await last_receipt(stub, session.id))["status"] == "applied"


@pytest.mark.parametrize("behaviour", sorted(FAILURES))
async def test_failed_summary_above_the_hard_ceiling_falls_back_to_extractive(env: Env, behaviour: str) -> None:
    stub, fake = env.stub, env.fake
    session = await agent_session(
        stub,
        context_window=10000,
        compact_ratio=0.5,
        max_output_tokens=500,
        summarizer=SUMMARIZER_FOR.get(behaviour, "fake"),
        summary_max_tokens=4000,
    )
    # Appended without Prepare: the view is now larger than the whole window.
    await append(stub, session.id, user("Make every case pass."))
    for index in range(1, 13):
        await append(stub, session.id, *tool_turn(index, 900))
    fake.script(behaviour)
    outcome = await prepare(stub, session.id)
    progress, result = outcome.progress, outcome.result
    assert len(fake.requests) == 1
    # The agent is not stuck: the pass was folded by the extractive summarizer, and says so.
    (fallback,) = stages(progress, pb.FOLD_STAGE_SUMMARIZER_FALLBACK)
    summarizer = SUMMARIZER_FOR.get(behaviour, "fake")
    assert fallback.summarizer == "extractive" and f"{summarizer} failed" in fallback.message
    # (A not-smaller "summary" this large exceeds the tokens left for it before it is compared.)
    assert FAILURES[behaviour] in fallback.message or "tokens left for it" in fallback.message
    assert result.action == pb.ACTION_FOLDED
    assert result.estimated_tokens <= result.hard_limit_tokens
    assert result.checkpoint_id == await session_checkpoint(stub, session.id) != ""
    receipt = await last_receipt(stub, session.id)
    assert receipt["status"] == "applied" and "folded with extractive" in receipt["reason"]
    (committed,) = stages(progress, pb.FOLD_STAGE_PASS_COMMITTED)
    assert committed.summarizer == "extractive"


async def test_failed_summary_below_the_hard_ceiling_does_not_fall_back(env: Env) -> None:
    stub, fake = env.stub, env.fake
    session = await agent_session(stub, context_window=10000, compact_ratio=0.5, summarizer="fake")
    fake.script("error500")
    await prepare(stub, session.id, user("Make every case pass."))
    for index in range(1, 60):
        outcome = await prepare(stub, session.id, *tool_turn(index, 300))
        progress, result = outcome.progress, outcome.result
        if fake.requests:
            break
    assert result.estimated_tokens <= result.hard_limit_tokens
    assert not stages(progress, pb.FOLD_STAGE_SUMMARIZER_FALLBACK)
    assert result.action == pb.ACTION_NONE and stages(progress, pb.FOLD_STAGE_PASS_FAILED)


async def test_a_failed_prepare_keeps_its_append_names_its_seqs_and_a_retry_with_the_request_id_adds_nothing(
    env: Env,
) -> None:
    """The rule for a Prepare that fails after appending: the appended messages are canonical, the
    error's metadata names their seqs, and a retry with the same request_id appends nothing again.
    (Here the new input alone is larger than the hard ceiling, so no summarizer can make it fit.)"""
    stub = env.stub
    session = await agent_session(stub, context_window=10000, compact_ratio=0.5, max_output_tokens=500)
    await append(stub, session.id, user("Make every case pass."))
    for index in range(1, 4):
        await append(stub, session.id, *tool_turn(index, 900))
    head = (await stub.GetSession(pb.GetSessionRequest(session_id=session.id))).session.head_seq
    more = [user("Here is the whole log, read it all: " + "the build step failed again. " * 1800)]
    for _attempt in range(2):
        await expect_error(
            prepare(stub, session.id, *more, request_id="turn-4"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "CONTEXT_BUDGET_UNSATISFIED",
            {"appended_first_seq": str(head + 1), "appended_last_seq": str(head + 1), "appended_count": "1"},
        )
        listed = await stub.ListMessages(pb.ListMessagesRequest(session_id=session.id, page_size=1000))
        assert len(listed.messages) == head + 1  # the retry appended nothing


# ---- 3. passes -----------------------------------------------------------------------------------


async def passes_session(stub: Stub, groups: int) -> pb.Session:
    """A 32k window with a 16k trigger whose fold input is far larger than the 3000-token
    summarizer window ("fake_small"): every group is ~1000 tokens."""
    session = await agent_session(stub, context_window=32000, compact_ratio=0.5, summarizer="fake_small")
    await append(stub, session.id, user("Make every case pass."))
    for start_index in range(1, groups + 1, 8):
        batch = [m for i in range(start_index, min(groups + 1, start_index + 8)) for m in tool_turn(i, 950)]
        await append(stub, session.id, *batch)
    return session


@pytest.mark.parametrize(
    ("behaviour", "reason"), [("error500", "SUMMARIZER_FAILED"), ("not_smaller", "COMPACT_FAILED")]
)
async def test_a_failed_compact_is_an_error_and_installs_nothing(env: Env, behaviour: str, reason: str) -> None:
    stub, fake = env.stub, env.fake
    session = await agent_session(stub, context_window=32000, summarizer="fake", summary_max_tokens=4000)
    await append(stub, session.id, user("Make every case pass."))
    for index in range(1, 6):
        await append(stub, session.id, *tool_turn(index, 300))
    fake.script(behaviour)

    async def drain() -> None:
        async for _event in stub.Compact(pb.CompactRequest(session_id=session.id)):
            pass

    await expect_error(drain(), grpc.StatusCode.FAILED_PRECONDITION, reason)
    assert await session_checkpoint(stub, session.id) == ""
    assert (await last_receipt(stub, session.id))["status"] == "failed"


def request_tokens(request: Recorded) -> int:
    """What a summary request reads, as ctxfold estimates it (tools, messages, framing)."""
    body = request.body
    texts = [json.dumps(body.get("tools") or [])] if body.get("tools") else []
    for message in request.messages:
        texts.append(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            texts.append(call["function"]["name"] + call["function"]["arguments"])
    return sum(count_text(t) + PER_MESSAGE_TOKENS for t in texts)


@pytest.mark.parametrize("kill", ["error500", "close", "down"])
async def test_passes_commit_one_by_one_and_a_killed_summarizer_resumes_from_the_last(env: Env, kill: str) -> None:
    stub, fake = env.stub, env.fake
    session = await passes_session(stub, groups=26)
    if kill == "error500":
        fake.script("ok", "ok", then="error500")
    else:
        installs = 0

        async def kill_after_pass_2(_session_id: str) -> None:
            nonlocal installs
            installs += 1
            if installs == 2:
                fake.kill(kill)

        env.hooks.before_install = kill_after_pass_2

    outcome = await prepare(stub, session.id)
    progress, result = outcome.progress, outcome.result
    planned = stages(progress, pb.FOLD_STAGE_PLANNED)
    assert len(planned) == 1 and planned[0].passes_planned > 2
    committed = stages(progress, pb.FOLD_STAGE_PASS_COMMITTED)
    assert [p.pass_index for p in committed] == [1, 2]
    first_id, second_id = (p.checkpoint_id for p in committed)
    assert first_id and second_id and first_id != second_id
    assert await parent_of(env, first_id) is None
    assert await parent_of(env, second_id) == first_id
    failed = stages(progress, pb.FOLD_STAGE_PASS_FAILED)
    assert [p.pass_index for p in failed] == [3]
    assert len(fake.requests) == (2 if kill == "down" else 3)
    # Passes 1–2 stay committed.
    assert result.checkpoint_id == second_id == await session_checkpoint(stub, session.id)
    assert result.action == pb.ACTION_FOLDED
    assert len(summaries(result.messages)) == 1
    assert briefed(fake.requests[1].answer, result.messages)
    assert (await last_receipt(stub, session.id))["status"] == "failed"

    env.hooks.before_install = None
    fake.revive()
    fake.script()  # every later request: "ok"
    before = len(fake.requests)
    # Not retried on the same input; once the view grows, continued from pass 2's checkpoint.
    same = (await prepare(stub, session.id)).result
    assert len(fake.requests) == before and same.checkpoint_id == second_id
    outcome = await prepare(stub, session.id, user("Continue."))
    progress, result = outcome.progress, outcome.result
    resumed = fake.requests[before]
    assert resumed.messages[0] == {"role": "system", "content": SYSTEM}
    assert resumed.messages[1] == {"role": "user", "content": "Make every case pass."}
    assert strip_engine_sections(fake.requests[1].answer) in resumed.messages[2]["content"]
    committed = stages(progress, pb.FOLD_STAGE_PASS_COMMITTED)
    assert len(committed) >= 2
    assert not stages(progress, pb.FOLD_STAGE_PASS_FAILED)
    parent = second_id
    for event in committed:
        assert await parent_of(env, event.checkpoint_id) == parent
        parent = event.checkpoint_id
    assert result.checkpoint_id == parent == await session_checkpoint(stub, session.id)
    assert result.estimated_tokens < result.trigger_tokens
    assert len(summaries(result.messages)) == 1
    assert briefed(fake.requests[-1].answer, result.messages)
    assert (await last_receipt(stub, session.id))["status"] == "applied"

    # Every pass read the previous pass's summary (rolling), and no request exceeded the window.
    answered = [r for r in fake.requests if r.behaviour == "ok"]
    assert len(answered) == 2 + len(committed)
    for earlier, later in itertools.pairwise(answered):
        assert strip_engine_sections(earlier.answer) in later.messages[2]["content"]
    for request in answered:
        assert request_tokens(request) <= 3000


async def test_compact_runs_all_passes_with_the_focus(env: Env) -> None:
    stub, fake = env.stub, env.fake
    session = await passes_session(stub, groups=12)  # below the trigger: only Compact folds
    result = (await prepare(stub, session.id)).result
    assert result.action == pb.ACTION_NONE and not fake.requests
    outcome = await compact(stub, session.id, focus="Keep the public API of app.core stable.")
    progress, result = outcome.progress, outcome.result
    committed = stages(progress, pb.FOLD_STAGE_PASS_COMMITTED)
    assert len(committed) == len(fake.requests) >= 3
    for index, event in enumerate(committed, start=1):
        assert event.pass_index == index
        assert deltas(progress, index) == fake.requests[index - 1].answer
        assert event.tokens_after < event.tokens_before
        instruction = fake.requests[index - 1].messages[-1]["content"]
        assert instruction.endswith("Focus: Keep the public API of app.core stable.")
    assert result.checkpoint_id == committed[-1].checkpoint_id == await session_checkpoint(stub, session.id)


# ---- 4. anthropic --------------------------------------------------------------------------------


def anthropic_blocks(view: Sequence[pb.Message]) -> list[dict[str, Any]]:
    """The blocks an Anthropic agent sends for a view (system excluded), flattened in order."""
    blocks: list[dict[str, Any]] = []
    for message in view:
        if message.role == pb.ROLE_SYSTEM:
            continue
        if message.role == pb.ROLE_TOOL:
            blocks.append({"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content})
            continue
        if message.content:
            blocks.append({"type": "text", "text": message.content})
        for call in message.tool_calls:
            blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)})
    return blocks


async def test_anthropic_fold_through_the_messages_api(env: Env) -> None:
    stub, fake = env.stub, env.fake
    session = await agent_session(
        stub,
        context_window=8000,
        summarizer="fake_anthropic",
        tools_json=ANTHROPIC_TOOLS,
        summary_max_tokens=1000,
        tail_ratio=0.16,  # a tail of whole call groups is kept, so the replay stops before the view's end
    )
    previous, _, progress, result = await run_until_fold(stub, session.id, [user("Make every case pass.")], 300)
    assert len(fake.requests) == 1
    request = fake.requests[0]
    body = request.body
    assert request.path == "/v1/messages"
    assert KEY_ENV not in json.dumps(request.headers)
    assert ANTHROPIC_KEY in (request.headers.get("x-api-key"), request.headers.get("authorization", "")[7:])
    assert "anthropic-version" in request.headers
    assert body["model"] == "m-fake" and body["stream"] is True
    assert 256 <= body["max_tokens"] < 1000  # summary_max_tokens less the engine's sections
    assert body["system"] == [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    assert body["tools"] == json.loads(ANTHROPIC_TOOLS)
    assert body["tool_choice"] == {"type": "none"}

    messages = body["messages"]
    assert messages[0]["role"] == "user"
    assert all(a["role"] != b["role"] for a, b in itertools.pairwise(messages))
    blocks = [block for m in messages for block in m["content"]]
    instruction, replayed = blocks[-1], blocks[:-1]
    assert instruction["type"] == "text"
    for section in SECTIONS:
        assert section in instruction["text"]
    # One cache breakpoint on the last replayed block (besides the system prompt's).
    assert replayed[-1]["cache_control"] == {"type": "ephemeral"}
    assert not any("cache_control" in b for b in replayed[:-1]) and "cache_control" not in instruction
    plain = [{k: v for k, v in b.items() if k != "cache_control"} for b in replayed]
    expected = anthropic_blocks(previous)
    assert plain == expected[: len(plain)] and len(plain) < len(expected)
    # Tool uses and their results stay together in what was replayed.
    uses = {b["id"] for b in plain if b["type"] == "tool_use"}
    assert uses == {b["tool_use_id"] for b in plain if b["type"] == "tool_result"}

    assert briefed(request.answer, result.messages)
    assert deltas(progress) == request.answer
    assert result.checkpoint_id == await session_checkpoint(stub, session.id)


@pytest.mark.parametrize("behaviour", ["truncated", "cut", "empty", "error500"])
async def test_anthropic_failure_is_not_installed(env: Env, behaviour: str) -> None:
    stub, fake = env.stub, env.fake
    session = await agent_session(
        stub, context_window=10000, compact_ratio=0.5, summarizer="fake_anthropic", tools_json=ANTHROPIC_TOOLS
    )
    fake.script(behaviour)
    result = (await prepare(stub, session.id, user("Make every case pass."))).result
    for index in range(1, 60):
        outcome = await prepare(stub, session.id, *tool_turn(index, 300))
        progress, result = outcome.progress, outcome.result
        if fake.requests:
            break
    failed = stages(progress, pb.FOLD_STAGE_PASS_FAILED)
    assert len(failed) == 1 and FAILURES[behaviour] in failed[0].message, failed
    assert result.checkpoint_id == "" == await session_checkpoint(stub, session.id)
    assert (await last_receipt(stub, session.id))["status"] == "failed"


# ---- 5. overflow ---------------------------------------------------------------------------------


async def test_overflow_below_the_trigger_prunes_once_and_summarizes_once(env: Env) -> None:
    stub, fake = env.stub, env.fake
    session = await agent_session(stub, context_window=16000, summarizer="fake_small")
    big = [
        *tool_turn(1, 0, result="$ cat log\n" + words(1700, seed=1)),
        *tool_turn(2, 0, result="$ cat log\n" + words(1700, seed=2)),
    ]
    assert all(len(m.content) > 8192 for m in big[1::2])
    small = [m for i in range(3, 17) for m in tool_turn(i, 400)]
    before = (await prepare(stub, session.id, user("Make every case pass."), *big, *small)).result
    assert before.action == pb.ACTION_NONE and before.estimated_tokens < before.trigger_tokens

    outcome = await prepare(stub, session.id, overflow=True)
    progress, result = outcome.progress, outcome.result
    assert len(stages(progress, pb.FOLD_STAGE_PRUNED)) == 1
    planned = stages(progress, pb.FOLD_STAGE_PLANNED)
    assert len(planned) == 1 and planned[0].passes_planned == 1
    assert len(stages(progress, pb.FOLD_STAGE_PASS_STARTED)) == 1
    assert len(stages(progress, pb.FOLD_STAGE_PASS_COMMITTED)) == 1
    assert len(fake.requests) == 1
    assert result.action == pb.ACTION_FOLDED
    assert result.estimated_tokens < before.estimated_tokens
    assert len(summaries(result.messages)) == 1
    # The pruned result was replayed as its stub, whose ref the summary lists.
    ref = next(m for m in before.messages if m.tool_call_id == "call_001").result_ref
    assert ref in fake.requests[0].answer

    # The fold input was larger than the summarizer window: a Compact finds more to fold.
    progress = (await compact(stub, session.id)).progress
    assert stages(progress, pb.FOLD_STAGE_PASS_COMMITTED)


# ---- 6. cancellation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "pass_index"),
    [("summary", 1), ("summary", 2), ("install", 1), ("install", 2)],
    ids=["summary-pass1", "summary-pass2", "install-pass1", "install-pass2"],
)
async def test_cancelling_mid_fold_leaves_no_half_state(env: Env, where: str, pass_index: int) -> None:
    """The client cancels while pass `pass_index` waits for the summarizer's answer (streamed in
    part) or right before its checkpoint would be installed."""
    stub, fake = env.stub, env.fake
    session = await passes_session(stub, groups=20)
    holding = asyncio.Event()
    if where == "summary":
        fake.script(*(["ok"] * (pass_index - 1)), "stall")
    else:
        installs = 0

        async def hold(_session_id: str) -> None:
            nonlocal installs
            installs += 1
            if installs == pass_index:
                holding.set()
                await asyncio.Event().wait()  # until cancelled

        env.hooks.before_install = hold

    call = stub.Prepare(pb.PrepareRequest(session_id=session.id))
    committed: list[str] = []

    async def read() -> None:
        async for response in call:
            event = response.progress
            if event.stage == pb.FOLD_STAGE_PASS_COMMITTED:
                committed.append(event.checkpoint_id)
            if event.stage == pb.FOLD_STAGE_SUMMARY_DELTA and event.pass_index == pass_index and where == "summary":
                holding.set()

    reader = asyncio.create_task(read())
    await asyncio.wait_for(holding.wait(), timeout=10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert len(committed) == pass_index - 1
    if where == "summary":
        stalled = fake.requests[pass_index - 1]
        assert stalled.behaviour == "stall"
        # The server gave up its summarizer call when the client went away.
        await until(lambda: stalled.disconnected)
        fake.release()
    else:
        assert len(fake.requests) == pass_index
    env.hooks.before_install = None
    # The server learns of the cancel asynchronously: until the cancelled call has unwound, a Prepare
    # whose view fits answers it as committed instead of waiting (by design), so wait for that first.
    await until(lambda: not env.running.maintenance.maintaining(session.id))

    expected = committed[-1] if committed else ""
    assert await session_checkpoint(stub, session.id) == expected
    state = json.loads((await stub.GetContextState(pb.GetContextStateRequest(session_id=session.id))).state_json)
    assert (state["checkpoint_id"] or "") == expected

    # The next Prepare works: it folds from where the committed passes left off.
    before = len(fake.requests)
    outcome = await prepare(stub, session.id)
    progress, result = outcome.progress, outcome.result
    assert result.action == pb.ACTION_FOLDED
    assert result.estimated_tokens < result.trigger_tokens
    assert len(summaries(result.messages)) == 1
    resumed = fake.requests[before].messages
    assert resumed[1]["content"] == "Make every case pass."
    if committed:
        assert strip_engine_sections(fake.requests[0].answer) in resumed[2]["content"]
    events = stages(progress, pb.FOLD_STAGE_PASS_COMMITTED)
    assert await parent_of(env, events[0].checkpoint_id) == (expected or None)
    assert result.checkpoint_id == events[-1].checkpoint_id == await session_checkpoint(stub, session.id)


async def test_progress_reaches_the_client_as_it_happens(env: Env) -> None:
    """While a pass's install is held, the client already has every event the pass emitted before
    it: none waits for the next one (the result alone goes out with the status)."""
    stub = env.stub
    session = await passes_session(stub, groups=20)
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold(_session_id: str) -> None:
        holding.set()
        await release.wait()

    env.hooks.before_install = hold
    seen: list[pb.FoldProgress] = []

    async def read() -> None:
        async for response in stub.Prepare(pb.PrepareRequest(session_id=session.id)):
            if response.WhichOneof("event") == "progress":
                seen.append(response.progress)

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(holding.wait(), timeout=10)
        await asyncio.sleep(0.5)  # what was written has long arrived by then
        at_hold = list(seen)
    finally:
        env.hooks.before_install = None
        release.set()
    await asyncio.wait_for(reader, timeout=30)
    first_commit = next(i for i, e in enumerate(seen) if e.stage == pb.FOLD_STAGE_PASS_COMMITTED)
    assert at_hold == seen[:first_commit]
    assert stages(at_hold, pb.FOLD_STAGE_PASS_STARTED) and stages(at_hold, pb.FOLD_STAGE_SUMMARY_DELTA)

"""Native compaction end to end: a summarizer with `"compaction": "native"` asks the provider's own
compaction (the fake provider speaks OpenAI's `/v1/responses/compact` and Anthropic's
`compact_20260112` edit as documented); the provider's item becomes the checkpoint's summary and
every later view carries it byte for byte beside the engine's sections; an "unsupported" answer falls
back to the application summary and says so, with nothing lost."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from builders import Outcome, call, create_session, prepare, result, user
from conftest import fresh_database, settings_for
from ctxfold.engine.errors import ConfigError
from ctxfold.server import RunningServer, start
from ctxfold.summarizers.registry import build_summarizers
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import FakeProvider
from test_prepare import state
from traces import tool_output


@dataclass
class Native:
    fake: FakeProvider
    running: RunningServer
    stub: pb_grpc.ContextServiceStub


@pytest.fixture
async def native(backend: str, tmp_path: Path) -> AsyncIterator[Native]:
    with FakeProvider() as fake:
        common = {"max_retries": 0, "compaction": "native", "model": "m"}
        specs = {
            "openai_native": {"type": "openai", "base_url": fake.base_url, **common},
            "anthropic_native": {"type": "anthropic", "base_url": fake.anthropic_base_url, **common},
        }
        running = await start(settings_for(await fresh_database(backend, tmp_path), summarizers=json.dumps(specs)))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield Native(fake, running, pb_grpc.ContextServiceStub(channel))
        await running.stop(grace=1.0)


async def grow_to_fold(stub: pb_grpc.ContextServiceStub, session_id: str, chars: int) -> Outcome:
    """Call/result turns until a Prepare folds."""
    await prepare(stub, session_id, user("Find out why the nightly build is slow"))
    for turn in range(200):
        outcome = await prepare(stub, session_id, call(f"c{turn}"), result(f"c{turn}", tool_output(turn, chars)))
        if outcome.result.action == pb.ACTION_FOLDED:
            return outcome
    raise AssertionError("never folded")


def summary_of(outcome: Outcome) -> pb.Message:
    [summary] = [m for m in outcome.result.messages if m.summary]
    return summary


async def test_openai_responses_compaction_item_is_the_summary_and_every_later_view_carries_it(
    native: Native,
) -> None:
    stub, fake = native.stub, native.fake
    session = await create_session(stub, context_window=12_000, summarizer="openai_native", prefold_ratio=0.0)
    folded = await grow_to_fold(stub, session.id, 2000)
    [compact] = [r for r in fake.requests if r.path.endswith("/responses/compact")]
    assert not [r for r in fake.requests if r.path.endswith("/chat/completions")]
    kinds = {item.get("type", "message") for item in compact.body["input"]}
    assert {"message", "function_call", "function_call_output"} <= kinds
    summary = summary_of(folded)
    assert summary.provider_payload.format == "openai_responses"
    item = json.loads(summary.provider_payload.json)
    assert item["type"] == "compaction" and item["encrypted_content"] == compact.answer
    # The engine's parts stay beside it, readable by any provider; the text says the narrative is the item.
    assert "compaction item (openai_responses)" in summary.content
    assert folded.result.folded_results_ref and folded.result.folded_results_ref in summary.content
    # Every later view carries the same item, byte for byte, and the checkpoint keeps it.
    later = await prepare(stub, session.id, call("later"), result("later", "ok"))
    assert summary_of(later).provider_payload.json == summary.provider_payload.json
    checkpoints = await stub.ListCheckpoints(pb.ListCheckpointsRequest(session_id=session.id))
    assert checkpoints.checkpoints[0].id == folded.result.checkpoint_id


async def test_an_unsupported_openai_compaction_falls_back_to_the_summary_and_says_so(native: Native) -> None:
    stub, fake = native.stub, native.fake
    fake.script("unsupported")
    session = await create_session(stub, context_window=12_000, summarizer="openai_native", prefold_ratio=0.0)
    folded = await grow_to_fold(stub, session.id, 2000)
    assert [r.path.rsplit("/", 2)[-2:] for r in fake.requests] == [["responses", "compact"], ["chat", "completions"]]
    [fallback] = [p for p in folded.progress if p.stage == pb.FOLD_STAGE_SUMMARIZER_FALLBACK]
    assert "native compaction unsupported" in fallback.message and "400" in fallback.message
    summary = summary_of(folded)
    assert not summary.HasField("provider_payload")
    assert fake.requests[-1].answer.splitlines()[0] in summary.content  # the application summary
    receipts = (await state(stub, session.id))["receipts"]
    assert isinstance(receipts, list)
    assert "native compaction unsupported" in receipts[-1]["reason"] and receipts[-1]["status"] == "applied"


async def test_anthropic_compaction_block_is_the_summary_text_and_is_carried_verbatim(native: Native) -> None:
    stub, fake = native.stub, native.fake
    session = await create_session(stub, context_window=90_000, summarizer="anthropic_native", prefold_ratio=0.0)
    folded = await grow_to_fold(stub, session.id, 8000)
    [compact] = [r for r in fake.requests if isinstance(r.body, dict) and "context_management" in r.body]
    assert "compact-2026-01-12" in compact.headers.get("anthropic-beta", "")
    [edit] = compact.body["context_management"]["edits"]
    assert edit["type"] == "compact_20260112" and edit["pause_after_compaction"] is True
    summary = summary_of(folded)
    assert summary.provider_payload.format == "anthropic_messages"
    block = json.loads(summary.provider_payload.json)
    assert block["type"] == "compaction" and block["content"] == compact.answer
    assert block["signature"].startswith("sig_")
    # The block's text is the summary's body, between the engine's sections.
    assert compact.answer.splitlines()[0] in summary.content


@pytest.mark.parametrize("behaviour", ["unsupported", "no_compaction"])
async def test_an_anthropic_compaction_that_cannot_be_made_falls_back_with_nothing_lost(
    native: Native, behaviour: str
) -> None:
    stub, fake = native.stub, native.fake
    fake.script(behaviour)
    session = await create_session(stub, context_window=90_000, summarizer="anthropic_native", prefold_ratio=0.0)
    folded = await grow_to_fold(stub, session.id, 8000)
    assert len(fake.requests) == 2 and not fake.requests[-1].body.get("context_management")
    assert pb.FOLD_STAGE_SUMMARIZER_FALLBACK in [p.stage for p in folded.progress]
    assert not summary_of(folded).HasField("provider_payload")
    # Nothing lost: every message after the fold's position is there, the folded ones are in the index.
    assert folded.result.folded_results_ref


async def test_below_anthropics_trigger_minimum_no_compaction_is_asked(native: Native) -> None:
    stub, fake = native.stub, native.fake
    session = await create_session(stub, context_window=12_000, summarizer="anthropic_native", prefold_ratio=0.0)
    folded = await grow_to_fold(stub, session.id, 2000)
    assert [r.body.get("context_management") for r in fake.requests] == [None]
    [fallback] = [p for p in folded.progress if p.stage == pb.FOLD_STAGE_SUMMARIZER_FALLBACK]
    assert "50000-token minimum" in fallback.message


def test_an_unknown_compaction_mode_is_a_configuration_error() -> None:
    spec = {"x": {"type": "openai", "model": "m", "compaction": "magic"}}
    with pytest.raises(ConfigError, match=r"summarizers\.x: compaction must be one of summary, native, got 'magic'"):
        build_summarizers(json.dumps(spec))

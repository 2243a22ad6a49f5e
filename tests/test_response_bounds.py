"""Answers are bounded before they are built: a ListMessages page stops at a byte bound whatever
page_size asks (the rest follows with next_page_token), and a view that cannot fit one response is
refused as RESPONSE_TOO_LARGE with a reason instead of gRPC's reasonless RESOURCE_EXHAUSTED."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from conftest import fresh_database, settings_for
from ctxfold.api import convert
from ctxfold.api.servicer import _result_bytes
from ctxfold.engine.answer import PreparedContext
from ctxfold.engine.maintenance import Action
from ctxfold.engine.model import Role, StoredMessage, ToolCall
from ctxfold.engine.state import ContextState
from ctxfold.engine.view import ViewMessage
from ctxfold.server import start
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import expect_error

MiB = 1 << 20
SEND_LIMIT = 4 * MiB
ROLES = (pb.ROLE_USER, pb.ROLE_ASSISTANT)


@pytest.fixture
async def small_responses(backend: str, tmp_path: Path) -> AsyncIterator[pb_grpc.ContextServiceStub]:
    settings = settings_for(
        await fresh_database(backend, tmp_path), max_send_message_bytes=SEND_LIMIT, max_message_bytes=MiB
    )
    running = await start(settings)
    options = [("grpc.max_receive_message_length", 64 * MiB), ("grpc.max_send_message_length", 64 * MiB)]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}", options=options) as channel:
            yield pb_grpc.ContextServiceStub(channel)
    finally:
        await running.stop(grace=1.0)


async def large_session(stub: pb_grpc.ContextServiceStub) -> tuple[str, list[str]]:
    """16 messages of 300,000 characters, the person and the agent taking turns (so only the first is
    the opening task anchor, which is bounded): 4.8 MB, more than one response carries."""
    config = pb.SessionConfig(context_window=50_000_000)
    session_id = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
    contents = [f"message {i}: " + "lorem ipsum dolor " * 16_666 for i in range(16)]
    for i, content in enumerate(contents):
        await stub.AppendMessages(
            pb.AppendMessagesRequest(session_id=session_id, messages=[pb.Message(role=ROLES[i % 2], content=content)])
        )
    return session_id, contents


async def test_list_messages_pages_are_bounded_by_bytes(small_responses: pb_grpc.ContextServiceStub) -> None:
    stub = small_responses
    session_id, contents = await large_session(stub)
    pages: list[list[pb.Message]] = []
    token = ""
    while True:
        page = await stub.ListMessages(pb.ListMessagesRequest(session_id=session_id, page_size=1000, page_token=token))
        pages.append(list(page.messages))
        assert page.ByteSize() <= SEND_LIMIT
        token = page.next_page_token
        if not token:
            break
    assert len(pages) > 1 and all(pages)
    assert [m.content for page in pages for m in page] == contents
    assert [m.seq for page in pages for m in page] == list(range(1, 17))


async def test_a_view_too_large_for_one_response_is_refused_with_a_reason(
    small_responses: pb_grpc.ContextServiceStub,
) -> None:
    stub = small_responses
    session_id, _ = await large_session(stub)
    info = await expect_error(
        anext(aiter(stub.Prepare(pb.PrepareRequest(session_id=session_id)))),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "RESPONSE_TOO_LARGE",
    )
    assert int(info.metadata["view_bytes"]) > int(info.metadata["max_response_bytes"])


async def test_a_view_whose_provider_payloads_do_not_fit_one_response_is_refused_with_a_reason(
    small_responses: pb_grpc.ContextServiceStub,
) -> None:
    """Payloads (a gateway's images, kept verbatim) go out with their messages: they count toward the bound."""
    stub = small_responses
    config = pb.SessionConfig(context_window=50_000_000)
    session_id = (await stub.CreateSession(pb.CreateSessionRequest(config=config))).session.id
    image = '{"type": "image", "source": {"data": "' + "A" * 900_000 + '"}}'
    for i in range(6):
        payload = pb.ProviderPayload(format="anthropic_messages", json=image, tokens=1_600)
        message = pb.Message(role=ROLES[i % 2], content=f"screenshot {i}", provider_payload=payload)
        await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session_id, messages=[message]))
    info = await expect_error(
        anext(aiter(stub.Prepare(pb.PrepareRequest(session_id=session_id)))),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "RESPONSE_TOO_LARGE",
    )
    assert int(info.metadata["view_bytes"]) > 6 * 900_000


@pytest.mark.parametrize("response_type", [pb.PrepareResponse, pb.CompactResponse])
def test_a_result_serialized_one_message_at_a_time_is_the_result_built_whole(
    response_type: type[pb.PrepareResponse] | type[pb.CompactResponse],
) -> None:
    """Prepare and Compact results are serialized message by message (no single call copies the whole
    view); their bytes decode to exactly the response built whole: every message in order, every other
    field, with a length that takes several bytes to write."""
    stored = [
        StoredMessage(
            id=f"m{i}", seq=i + 1, role=Role.USER if i % 2 else Role.ASSISTANT, content="x" * (i * 70_000), tokens=i
        )
        for i in range(4)
    ]
    calls = (ToolCall(id="c1", name="bash", arguments='{"cmd": "ls"}'),)
    stored.append(StoredMessage(id="m9", seq=9, role=Role.ASSISTANT, content="", tokens=3, tool_calls=calls))
    prepared = PreparedContext(
        state=ContextState(fingerprint="f"),
        messages=[
            ViewMessage(Role.SYSTEM, "be brief", 2),
            *(ViewMessage(m.role, m.content, m.tokens, m) for m in stored),
        ],
        estimated_tokens=1234,
        view_version=7,
        action=Action.FOLDED,
        cache_state="cold",
        prompt_cache_key="key",
        checkpoint_id="cp1",
        stable_prefix_messages=2,
        delta=False,
        view_message_count=6,
        trigger_tokens=900,
        hard_limit_tokens=1000,
        appended=tuple(stored[-2:]),
        candidate_summary="summary",
        folded_results_ref="ref",
        estimated_input_tokens=1200,
    )
    whole = response_type(result=convert.prepared_pb(prepared))
    parsed = response_type.FromString(_result_bytes(response_type, prepared))
    assert parsed == whole and len(whole.result.messages) == 6 and len(whole.result.appended) == 2

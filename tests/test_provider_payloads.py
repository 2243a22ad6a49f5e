"""The two extensions the gateway needs, through the real server on both stores: a message's provider
payload (stored verbatim, listed and rendered in views, counted in estimates, never in summaries) and
sessions named by a key (CreateSession with `session_key` is idempotent within a tenant)."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from builders import create_session, prepare
from ctxfold.engine.estimator import message_tokens
from ctxfold.server import RunningServer
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import expect_error

Stub = pb_grpc.ContextServiceStub
WINDOW = 16000  # of every session here

THINKING = json.dumps(
    [
        {"type": "thinking", "thinking": "Look at the test first.", "signature": "EqQBCkgIAhABGAIiQL+/sig=="},
        {"type": "text", "text": "I will read it."},
    ]
)


def payload(json_text: str = THINKING, tokens: int = 0) -> pb.ProviderPayload:
    return pb.ProviderPayload(format="anthropic_messages", json=json_text, fingerprint="fp-1", tokens=tokens)


async def test_a_payload_is_stored_verbatim_and_listed(stub: Stub) -> None:
    session = await create_session(stub, context_window=WINDOW)
    message = pb.Message(role=pb.ROLE_ASSISTANT, content="I will read it.", provider_payload=payload())
    await stub.AppendMessages(
        pb.AppendMessagesRequest(session_id=session.id, messages=[pb.Message(role=pb.ROLE_USER, content="hi"), message])
    )
    listed = (await stub.ListMessages(pb.ListMessagesRequest(session_id=session.id))).messages
    assert not listed[0].HasField("provider_payload")
    assert listed[1].provider_payload == payload()


async def test_a_view_carries_the_payload_of_the_message_it_renders(stub: Stub) -> None:
    session = await create_session(stub, context_window=WINDOW)
    appended = [
        pb.Message(role=pb.ROLE_USER, content="hi"),
        pb.Message(role=pb.ROLE_ASSISTANT, content="I will read it.", provider_payload=payload()),
    ]
    view = (await prepare(stub, session.id, *appended)).result.messages
    assert view[1].provider_payload.json == THINKING


async def test_payload_tokens_are_added_to_the_message_estimate(stub: Stub) -> None:
    session = await create_session(stub, context_window=WINDOW)
    with_image = pb.Message(
        role=pb.ROLE_USER, content="[image: image/png, 1280x800]", provider_payload=payload("[]", 1229)
    )
    stored = (
        await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=[with_image]))
    ).messages[0]
    assert stored.tokens == message_tokens("[image: image/png, 1280x800]") + 1229


async def test_a_message_with_only_a_payload_is_not_empty(stub: Stub) -> None:
    """An assistant turn holding only a redacted thinking block has no text, but it is a message."""
    session = await create_session(stub, context_window=WINDOW)
    redacted = pb.Message(
        role=pb.ROLE_ASSISTANT, provider_payload=payload('[{"type": "redacted_thinking", "data": "EmwKAhgB"}]')
    )
    await stub.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session.id, messages=[pb.Message(role=pb.ROLE_USER, content="hi"), redacted]
        )
    )


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (pb.ProviderPayload(format="", json="[]"), "format"),
        (pb.ProviderPayload(format="x" * 65, json="[]"), "format"),
        (pb.ProviderPayload(format="openai_chat", fingerprint="f" * 129), "fingerprint"),
        (pb.ProviderPayload(format="openai_chat", tokens=-1), "tokens"),
    ],
)
async def test_a_malformed_payload_is_refused_with_its_field(stub: Stub, bad: pb.ProviderPayload, why: str) -> None:
    session = await create_session(stub, context_window=WINDOW)
    message = pb.Message(role=pb.ROLE_USER, content="hi", provider_payload=bad)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=[message]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"provider_payload.{why}" in (caught.value.details() or "")


async def test_a_session_key_names_one_session(stub: Stub) -> None:
    first = await create_session(stub, context_window=WINDOW, session_key="agent-7/conversation-1")
    again = await create_session(stub, context_window=64000, session_key="agent-7/conversation-1")
    other = await create_session(stub, context_window=WINDOW, session_key="agent-7/conversation-2")
    assert again.id == first.id
    assert again.config.context_window == WINDOW  # the existing session, unchanged
    assert other.id != first.id


async def test_concurrent_creates_of_one_key_give_one_session(stub: Stub) -> None:
    sessions = await asyncio.gather(
        *(create_session(stub, context_window=WINDOW, session_key="raced-key") for _ in range(6))
    )
    assert len({s.id for s in sessions}) == 1


async def test_a_create_that_loses_the_race_for_its_key_answers_the_winners_session(
    stub: Stub, server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two creates of one key, both past the lookup: the second's insert loses, and it answers the session
    the first made, with that session's config, not the one it asked for."""
    first = await create_session(stub, context_window=WINDOW, session_key="lost-race")

    async def not_yet_there(tenant: str, session_id: str) -> None:
        return None  # as a lookup made before the winner's insert sees it

    monkeypatch.setattr(server.store, "find_session", not_yet_there)
    second = await create_session(stub, context_window=64000, session_key="lost-race")
    assert second.id == first.id
    assert second.config.context_window == WINDOW


async def test_a_deleted_keyed_session_is_created_anew(stub: Stub) -> None:
    first = await create_session(stub, context_window=WINDOW, session_key="short-lived")
    await stub.AppendMessages(
        pb.AppendMessagesRequest(session_id=first.id, messages=[pb.Message(role=pb.ROLE_USER, content="hi")])
    )
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=first.id))
    second = await create_session(stub, context_window=WINDOW, session_key="short-lived")
    assert second.id == first.id
    assert second.head_seq == 0


async def test_a_too_long_session_key_is_refused(stub: Stub) -> None:
    await expect_error(
        stub.CreateSession(
            pb.CreateSessionRequest(config=pb.SessionConfig(context_window=WINDOW), session_key="k" * 513)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        {"field": "session_key"},
    )

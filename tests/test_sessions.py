"""Sessions and the canonical transcript through the real server, on SQLite and PostgreSQL:
create/get/list/delete, append (atomic, ordered, idempotent, safe under concurrency) and listing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from builders import append, create_session, user
from conftest import fresh_database, settings_for
from ctxfold.engine.estimator import message_tokens
from ctxfold.engine.model import ToolCall
from ctxfold.server import RunningServer, start
from ctxfold.store.rows import CHUNK_BYTES
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import expect_error

Stub = pb_grpc.ContextServiceStub


class Fresh:
    """A server on a database of its own, for tests that count every session or row."""

    def __init__(self, running: RunningServer, stub: Stub):
        self.running = running
        self.stub = stub


@pytest.fixture
async def fresh(backend: str, tmp_path: Path) -> AsyncIterator[Fresh]:
    running = await start(settings_for(await fresh_database(backend, tmp_path)))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield Fresh(running, pb_grpc.ContextServiceStub(channel))
    finally:
        await running.stop(grace=0.5)


async def list_all(stub: Stub, session_id: str, page_size: int = 0) -> list[pb.Message]:
    messages: list[pb.Message] = []
    token = ""
    while True:
        page = await stub.ListMessages(
            pb.ListMessagesRequest(session_id=session_id, page_size=page_size, page_token=token)
        )
        if page_size:
            assert len(page.messages) <= page_size
        messages.extend(page.messages)
        token = page.next_page_token
        if not token:
            return messages


def conversation() -> list[pb.Message]:
    """A small agent turn with every kind of field set somewhere."""
    return [
        pb.Message(role=pb.ROLE_SYSTEM, content="You are a coding agent. 你是编程助手。"),
        pb.Message(role=pb.ROLE_USER, content="Fix the failing test 🧪", name="alice", pinned=True),
        pb.Message(
            role=pb.ROLE_ASSISTANT,
            content="Looking at the test first.",
            reasoning_content="The failure is probably in the parser.",
            tool_calls=[
                pb.ToolCall(id="call_1", name="read_file", arguments='{"path": "tests/test_parser.py"}'),
                pb.ToolCall(id="call_2", name="bash", arguments='{"cmd": "pytest -x -q"}'),
            ],
        ),
        pb.Message(role=pb.ROLE_TOOL, tool_call_id="call_2", content="1 failed: AssertionError 断言失败"),
        pb.Message(role=pb.ROLE_TOOL, tool_call_id="call_1", content="def test_parse():\n    assert parse('x') == 1\n"),
        pb.Message(role=pb.ROLE_ASSISTANT, content="The parser drops the last token; fixing it. <|endoftext|>"),
        pb.Message(role=pb.ROLE_USER, content="👍"),
    ]


def same_fields(stored: pb.Message, sent: pb.Message) -> None:
    """The stored message is the sent one, plus output-only fields."""
    for name in ("role", "content", "tool_call_id", "reasoning_content", "pinned", "name"):
        assert getattr(stored, name) == getattr(sent, name), name
    assert list(stored.tool_calls) == list(sent.tool_calls)


# ---- sessions ----------------------------------------------------------------------------------


async def test_create_fills_defaults(stub: Stub) -> None:
    session = await create_session(stub)
    assert session.id.startswith("s_")
    config = session.config
    assert config.context_window == 128_000
    assert config.compact_ratio == pytest.approx(0.80)
    assert config.tail_ratio == pytest.approx(0.08)
    assert config.tool_content_max_bytes == 32768
    assert config.summary_max_tokens == 8192
    assert config.summarizer == "extractive"
    assert config.prompt_cache_key
    assert session.head_seq == 0
    assert not session.checkpoint_id
    assert session.create_time.ToNanoseconds() > 0
    assert session.update_time.ToNanoseconds() >= session.create_time.ToNanoseconds()


async def test_derived_prompt_cache_keys_are_stable_and_distinct(stub: Stub) -> None:
    first, second = await create_session(stub), await create_session(stub)
    assert first.config.prompt_cache_key != second.config.prompt_cache_key
    again = (await stub.GetSession(pb.GetSessionRequest(session_id=first.id))).session
    assert again.config.prompt_cache_key == first.config.prompt_cache_key


async def test_create_keeps_given_values(stub: Stub) -> None:
    tools = '[{"type": "function", "function": {"name": "bash", "parameters": {}}}]'
    session = await create_session(
        stub,
        context_window=200_000,
        compact_ratio=0.7,
        tail_ratio=0.25,
        max_output_tokens=8000,
        summary_max_tokens=4000,
        tool_content_max_bytes=8192,
        system_prompt="系统提示 🤖",
        tools_json=tools,
        cache_ttl_seconds=300,
        prompt_cache_key="my-agent-42",
        model="gpt-x",
    )
    got = (await stub.GetSession(pb.GetSessionRequest(session_id=session.id))).session
    assert got == session
    config = got.config
    assert (config.context_window, config.compact_ratio, config.tail_ratio) == (200_000, 0.7, 0.25)
    assert (config.max_output_tokens, config.summary_max_tokens, config.tool_content_max_bytes) == (8000, 4000, 8192)
    assert (config.system_prompt, config.tools_json, config.cache_ttl_seconds) == ("系统提示 🤖", tools, 300)
    assert (config.prompt_cache_key, config.model) == ("my-agent-42", "gpt-x")


async def test_small_windows_get_a_summary_budget_that_fits(stub: Stub) -> None:
    session = await create_session(stub, context_window=4000)
    config = session.config
    assert 0 < config.summary_max_tokens <= config.compact_ratio * config.context_window - 256


async def test_get_returns_what_create_returned(stub: Stub) -> None:
    session = await create_session(stub, system_prompt="hi")
    assert (await stub.GetSession(pb.GetSessionRequest(session_id=session.id))).session == session


async def test_list_pages_newest_first_without_duplicates(fresh: Fresh) -> None:
    created = [(await create_session(fresh.stub, system_prompt=f"agent {i}")).id for i in range(25)]
    seen: list[pb.Session] = []
    token, sizes = "", []
    while True:
        page = await fresh.stub.ListSessions(pb.ListSessionsRequest(page_size=7, page_token=token))
        sizes.append(len(page.sessions))
        seen.extend(page.sessions)
        token = page.next_page_token
        if not token:
            break
    assert sizes == [7, 7, 7, 4]
    assert [s.id for s in seen] == created[::-1]
    times = [s.create_time.ToNanoseconds() for s in seen]
    assert times == sorted(times, reverse=True)
    # One page with the default size holds them all, in the same order.
    everything = await fresh.stub.ListSessions(pb.ListSessionsRequest())
    assert [s.id for s in everything.sessions] == created[::-1]
    assert not everything.next_page_token
    # A page size equal to the count ends without a token to an empty page.
    exact = await fresh.stub.ListSessions(pb.ListSessionsRequest(page_size=25))
    assert len(exact.sessions) == 25
    assert not exact.next_page_token


async def test_list_of_an_empty_store_is_empty(fresh: Fresh) -> None:
    page = await fresh.stub.ListSessions(pb.ListSessionsRequest(page_size=5))
    assert list(page.sessions) == []
    assert not page.next_page_token


async def test_paging_survives_deletes_between_pages(fresh: Fresh) -> None:
    created = [(await create_session(fresh.stub)).id for _ in range(10)]
    first = await fresh.stub.ListSessions(pb.ListSessionsRequest(page_size=4))
    assert [s.id for s in first.sessions] == created[:5:-1]
    # Deleting the last session of the page the token points after does not break the next page.
    await fresh.stub.DeleteSession(pb.DeleteSessionRequest(session_id=created[6]))
    second = await fresh.stub.ListSessions(pb.ListSessionsRequest(page_size=4, page_token=first.next_page_token))
    assert [s.id for s in second.sessions] == created[5:1:-1]


async def test_delete_then_get_is_not_found(stub: Stub) -> None:
    session = await create_session(stub)
    await append(stub, session.id, *conversation())
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=session.id))
    not_found = (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND", {"session_id": session.id})
    await expect_error(stub.GetSession(pb.GetSessionRequest(session_id=session.id)), *not_found)
    await expect_error(stub.DeleteSession(pb.DeleteSessionRequest(session_id=session.id)), *not_found)
    await expect_error(stub.ListMessages(pb.ListMessagesRequest(session_id=session.id)), *not_found)
    await expect_error(append(stub, session.id, user("hello?")), *not_found)
    await expect_error(
        stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session.id, tool_call_id="call_1")), *not_found
    )


async def test_delete_removes_every_row(fresh: Fresh) -> None:
    stub, store = fresh.stub, fresh.running.store
    big = "日志行 log line 😀\n" * 5000  # above 32 KiB: a compressed raw result is stored
    sessions = []
    for index in range(3):
        session = await create_session(stub)
        sessions.append(session.id)
        await append(stub, session.id, *conversation(), request_id=f"turn-{index}")
        await append(
            stub,
            session.id,
            pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="call_big", name="bash", arguments="{}")]),
            pb.Message(role=pb.ROLE_TOOL, tool_call_id="call_big", content=big),
        )
    counts = await store.row_counts()
    assert counts["sessions"] == 3
    assert counts["messages"] == 3 * (len(conversation()) + 2)
    # One row per tool result and per user message (readable by reference), per session.
    readable = sum(m.role in (pb.ROLE_TOOL, pb.ROLE_USER) for m in conversation()) + 1
    assert counts["tool_results"] == 3 * readable
    # The big result is stored in independently compressed chunks; only it is that large.
    chunks = -(-len(big.encode()) // CHUNK_BYTES)
    assert chunks > 1
    assert counts["tool_result_chunks"] == 3 * chunks
    assert counts["append_requests"] == 3
    assert counts["segments"] >= 3

    keep = await list_all(stub, sessions[2])
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=sessions[0]))
    after_one = await store.row_counts()
    assert after_one["sessions"] == 2
    assert after_one["messages"] == 2 * (len(conversation()) + 2)
    assert after_one["tool_results"] == 2 * readable
    assert after_one["tool_result_chunks"] == 2 * chunks
    assert after_one["append_requests"] == 2
    # The others are untouched, raw results included.
    assert await list_all(stub, sessions[2]) == keep
    ref = keep[-1].result_ref
    page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=sessions[2], result_ref=ref))
    assert page.total_bytes == len(big.encode())

    for session_id in sessions[1:]:
        await stub.DeleteSession(pb.DeleteSessionRequest(session_id=session_id))
    counts = await store.row_counts()
    assert counts, "row_counts lists the tables"
    assert all(count == 0 for count in counts.values()), counts


# ---- the transcript ----------------------------------------------------------------------------


async def test_append_returns_ids_and_contiguous_seqs(stub: Stub) -> None:
    session = await create_session(stub)
    sent = conversation()
    first = await append(stub, session.id, *sent[:3])
    assert [m.seq for m in first.messages] == [1, 2, 3]
    assert first.session.head_seq == 3
    second = await append(stub, session.id, *sent[3:])
    assert [m.seq for m in second.messages] == list(range(4, len(sent) + 1))
    assert second.session.head_seq == len(sent)
    stored = [*first.messages, *second.messages]
    ids = [m.id for m in stored]
    assert all(ids) and len(set(ids)) == len(ids)
    for message, original in zip(stored, sent, strict=True):
        same_fields(message, original)
        assert message.create_time.ToNanoseconds() > 0
    got = (await stub.GetSession(pb.GetSessionRequest(session_id=session.id))).session
    assert got.head_seq == len(sent)
    assert got.update_time.ToNanoseconds() >= got.create_time.ToNanoseconds()


async def test_an_empty_append_changes_nothing(stub: Stub) -> None:
    session = await create_session(stub)
    await append(stub, session.id, user("one"))
    response = await append(stub, session.id)
    assert list(response.messages) == []
    assert response.session.head_seq == 1
    assert len(await list_all(stub, session.id)) == 1


@pytest.mark.parametrize("page_size", [0, 1, 2, 3, 7, 100])
async def test_list_messages_returns_the_transcript_unchanged(stub: Stub, page_size: int) -> None:
    session = await create_session(stub)
    stored: list[pb.Message] = []
    for _ in range(3):
        stored.extend((await append(stub, session.id, *conversation())).messages)
    listed = await list_all(stub, session.id, page_size)
    assert listed == stored  # every field, create_time included
    assert [m.seq for m in listed] == list(range(1, len(stored) + 1))
    for message, original in zip(listed, conversation() * 3, strict=True):
        same_fields(message, original)


async def test_list_messages_of_an_empty_session(stub: Stub) -> None:
    session = await create_session(stub)
    page = await stub.ListMessages(pb.ListMessagesRequest(session_id=session.id, page_size=3))
    assert list(page.messages) == []
    assert not page.next_page_token


async def test_a_retried_append_with_the_same_request_id_lands_once(stub: Stub) -> None:
    session = await create_session(stub)
    await append(stub, session.id, user("before"))
    batch = conversation()[1:5]
    first = await append(stub, session.id, *batch, request_id="req-1")
    retry = await append(stub, session.id, *batch, request_id="req-1")
    assert [m.id for m in retry.messages] == [m.id for m in first.messages]
    assert [m.seq for m in retry.messages] == [2, 3, 4, 5]
    assert list(retry.messages) == list(first.messages)
    assert retry.session.head_seq == first.session.head_seq == 5
    assert len(await list_all(stub, session.id)) == 5
    # A new request id appends again; the old one still answers with its first result.
    nxt = await append(stub, session.id, user("after"), request_id="req-2")
    assert [m.seq for m in nxt.messages] == [6]
    again = await append(stub, session.id, *batch, request_id="req-1")
    assert [m.id for m in again.messages] == [m.id for m in first.messages]
    assert len(await list_all(stub, session.id)) == 6


async def test_request_ids_are_scoped_to_their_session(stub: Stub) -> None:
    one, two = await create_session(stub), await create_session(stub)
    a = await append(stub, one.id, user("x"), request_id="same")
    b = await append(stub, two.id, user("x"), request_id="same")
    assert a.messages[0].id != b.messages[0].id
    assert (a.session.head_seq, b.session.head_seq) == (1, 1)


async def test_concurrent_appends_all_land_in_order(stub: Stub) -> None:
    session = await create_session(stub)
    count = 20
    responses = await asyncio.gather(*(append(stub, session.id, user(f"message {i}")) for i in range(count)))
    seqs = sorted(r.messages[0].seq for r in responses)
    assert seqs == list(range(1, count + 1))
    listed = await list_all(stub, session.id)
    assert [m.seq for m in listed] == list(range(1, count + 1))
    assert sorted(m.content for m in listed) == sorted(f"message {i}" for i in range(count))
    by_id = {r.messages[0].id: r.messages[0] for r in responses}
    assert {m.id: m for m in listed} == by_id
    head = (await stub.GetSession(pb.GetSessionRequest(session_id=session.id))).session.head_seq
    assert head == count


async def test_concurrent_batches_stay_contiguous(stub: Stub) -> None:
    session = await create_session(stub)
    responses = await asyncio.gather(
        *(append(stub, session.id, *(user(f"batch {b} item {i}") for i in range(3))) for b in range(8))
    )
    for response in responses:
        seqs = [m.seq for m in response.messages]
        assert seqs == list(range(seqs[0], seqs[0] + 3))
        batch = response.messages[0].content.split()[1]
        assert [m.content for m in response.messages] == [f"batch {batch} item {i}" for i in range(3)]
    assert sorted(m.seq for r in responses for m in r.messages) == list(range(1, 25))


async def test_concurrent_retries_of_one_request_land_once(stub: Stub) -> None:
    session = await create_session(stub)
    responses = await asyncio.gather(
        *(append(stub, session.id, user("once"), user("twice?"), request_id="dup") for _ in range(10))
    )
    ids = {tuple(m.id for m in r.messages) for r in responses}
    assert len(ids) == 1
    listed = await list_all(stub, session.id)
    assert [m.content for m in listed] == ["once", "twice?"]


async def test_each_message_stores_its_token_count(stub: Stub) -> None:
    session = await create_session(stub)
    stored = list((await append(stub, session.id, *conversation())).messages)
    big = "数据 data 🚀 " * 8000
    stored.extend(
        (
            await append(
                stub,
                session.id,
                pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c9", name="cat", arguments="{}")]),
                pb.Message(role=pb.ROLE_TOOL, tool_call_id="c9", content=big),
            )
        ).messages
    )
    assert stored[-1].truncated
    for message in [*stored, *await list_all(stub, session.id)]:
        calls = [ToolCall(c.id, c.name, c.arguments) for c in message.tool_calls]
        # Counted on what the provider sees: the bounded content of a truncated tool result.
        expected = message_tokens(message.content, calls, message.reasoning_content, message.name)
        assert message.tokens == expected > 0
    # The truncated result is counted on its bounded text, far less than the raw text would cost.
    assert stored[-1].tokens < message_tokens(big) / 2

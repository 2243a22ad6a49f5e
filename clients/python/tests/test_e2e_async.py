"""End-to-end tests of `AsyncClient` against a real ctxfold server (see conftest.py)."""

from __future__ import annotations

import hashlib
import threading

import grpc
import pytest

from conftest import Server
from ctxfold_client import (
    Action,
    AsyncClient,
    CtxfoldError,
    ErrorReason,
    FoldProgress,
    FoldStage,
    SessionConfig,
    Usage,
    View,
    assistant,
    tool_call,
    tool_result,
    user,
)
from ctxfold_client import _core as core
from ctxfold_client._gen import context_service_pb2 as pb
from helpers import FOLDING_CONFIG, ROOMY_CONFIG, multibyte_text, tool_pair


async def test_async_lifecycle_and_iterators(server: Server) -> None:
    async with AsyncClient(server.address) as client:
        session = await client.create_session(SessionConfig(context_window=16_000))
        await client.append_messages(session.id, [user(f"m{i}") for i in range(5)])
        contents = [m.content async for m in client.list_messages(session.id, page_size=2)]
        assert contents == [f"m{i}" for i in range(5)]
        ids = [s.id async for s in client.list_sessions(page_size=2)]
        assert session.id in ids
        fork = await client.fork(session.id, at_seq=3)
        assert [m.content async for m in client.list_messages(fork.id)] == ["m0", "m1", "m2"]
        rewound = await client.rewind(session.id, 2)
        assert rewound.head_seq == 2
        state = await client.get_context_state(session.id)
        assert state["schema_version"] == 3
        await client.delete_session(session.id)
        with pytest.raises(CtxfoldError) as raised:
            await client.get_session(session.id)
        assert raised.value.code is grpc.StatusCode.NOT_FOUND
        assert raised.value.reason == ErrorReason.SESSION_NOT_FOUND
        assert raised.value.metadata["session_id"] == session.id


async def test_async_prepare_events_fold_and_deltas(server: Server) -> None:
    async with AsyncClient(server.address) as client, AsyncClient(server.address, view_cache_size=0) as whole:
        session = await client.create_session(FOLDING_CONFIG)
        view = await client.prepare(session.id, [user("survey the tree")])
        events: list[FoldProgress] = []
        views: list[View] = []
        for index in range(8):
            async for event in client.prepare_events(session.id, tool_pair(index)):
                if isinstance(event, View):
                    views.append(event)
                else:
                    events.append(event)
            reference = await whole.prepare(session.id)
            assert views[-1].messages == reference.messages  # the deltas were applied right
        assert any(v.action is Action.FOLDED for v in views)
        stages = [e.stage for e in events]
        assert FoldStage.PLANNED in stages
        assert FoldStage.PASS_COMMITTED in stages
        assert stages.index(FoldStage.PLANNED) < stages.index(FoldStage.PASS_COMMITTED)
        assert all(e.summary_delta for e in events if e.stage is FoldStage.SUMMARY_DELTA)
        assert view.view_version != views[-1].view_version


async def test_async_prepare_with_async_callback_and_compact(server: Server) -> None:
    async with AsyncClient(server.address) as client:
        session = await client.create_session(FOLDING_CONFIG)
        await client.append_messages(session.id, [user("go"), *tool_pair(1), *tool_pair(2)])
        seen: list[FoldProgress] = []

        async def on_progress(event: FoldProgress) -> None:
            seen.append(event)

        compacted = await client.compact(session.id, focus="file names", on_progress=on_progress)
        assert compacted.action is Action.FOLDED
        assert any(e.stage is FoldStage.PASS_COMMITTED for e in seen)
        view = await client.prepare(session.id, [user("what did you find?")], on_progress=seen.append)
        assert view.summary is not None
        usage = await client.observe_usage(
            session.id, view, Usage(input_tokens=view.estimated_input_tokens, output_tokens=5)
        )
        assert usage.calibration > 0


async def test_async_read_tool_result(server: Server) -> None:
    async with AsyncClient(server.address) as client:
        session = await client.create_session(ROOMY_CONFIG)
        raw = multibyte_text(50_000)
        await client.append_messages(
            session.id,
            [user("read"), assistant(tool_calls=[tool_call("big", "cat", {})]), tool_result("big", raw)],
        )
        whole = await client.read_tool_result(session.id, tool_call_id="big", page_bytes=10_000)
        assert whole.raw == raw.encode()
        assert whole.sha256 == hashlib.sha256(raw.encode()).hexdigest()
        pages = [p async for p in client.tool_result_pages(session.id, result_ref=whole.result_ref)]
        assert "".join(p.data for p in pages) == raw


async def test_async_edit_and_retry(server: Server) -> None:
    async with AsyncClient(server.address) as client:
        session = await client.create_session(ROOMY_CONFIG)
        question, answer = await client.append_messages(session.id, [user("2+2?"), assistant("5")])
        retried = await client.retry(session.id, answer)
        assert [m.content for m in retried.messages] == ["2+2?"]
        await client.append_messages(session.id, [assistant("4")])
        edited = await client.edit(session.id, question, user("3+3?"))
        assert edited.seq == question.seq
        assert [m.content async for m in client.list_messages(session.id)] == ["3+3?"]


async def test_async_tools_dispatcher_and_checkpoints_fork(server: Server) -> None:
    async with AsyncClient(server.address) as client:
        session = await client.create_session(SessionConfig(context_window=64_000, tool_content_max_bytes=8192))
        stored = await client.append_messages(
            session.id,
            [user("log?"), assistant(tool_calls=[tool_call("c", "cat", {})]), tool_result("c", "line\n" * 5000)],
        )
        answer = await client.dispatch_tool_call(session.id, "read_tool_result", {"result_ref": stored[-1].result_ref})
        assert answer is not None and answer.endswith("offset 16384 for more]")
        assert await client.dispatch_tool_call(session.id, "cat", "{}") is None
        assert await client.dispatch_tool_call(session.id, "context_budget", "{}") == (
            "error: no context prepared by this client yet"
        )
        view = await client.prepare(session.id)
        budget = await client.dispatch_tool_call(session.id, "context_budget", "{}")
        assert budget is not None and f'"estimated_tokens":{view.estimated_tokens},' in budget
        fork = await client.fork(session.id, at_head=True)
        assert fork.forked_at_seq == 3


async def test_async_a_large_view_is_made_in_a_thread(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Making a view's messages takes ~10 µs each: the asyncio client makes those of a result of more
    than `LARGE_RESULT_MESSAGES` in a thread, so the caller's event loop goes on meanwhile."""
    on_loop: list[bool] = []
    feed = core.FoldStream.feed

    def recorded(stream: core.FoldStream, item: pb.PrepareResponse) -> object:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return feed(stream, item)

    monkeypatch.setattr(core.FoldStream, "feed", recorded)
    async with AsyncClient(server.address, view_cache_size=0) as client:
        session = await client.create_session(ROOMY_CONFIG)
        await client.append_messages(session.id, [user(f"m{i}") for i in range(core.LARGE_RESULT_MESSAGES // 2)])
        at_most = await client.prepare(session.id, [user(f"n{i}") for i in range(core.LARGE_RESULT_MESSAGES // 2)])
        above = await client.prepare(session.id, [user("one more")])
    large = core.LARGE_RESULT_MESSAGES
    assert [len(view.messages) for view in (at_most, above)] == [large, large + 1]
    assert above.messages[:-1] == at_most.messages
    assert on_loop == [True, False]

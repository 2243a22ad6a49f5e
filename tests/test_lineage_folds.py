"""Fork, Rewind, edit and retry over checkpoint chains, with folds (issue: lineage)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from builders import call, compact, create_session, prepare, result, user
from conftest import fresh_database, settings_for
from ctxfold.engine.tool_results import RESULT_REF
from ctxfold.server import RunningServer, start
from ctxfold.service.run import Hooks
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_prepare import state, transcript
from traces import tool_output

WINDOW = 6_000


async def fold_turns(stub: pb_grpc.ContextServiceStub, session_id: str, start_index: int, folds: int) -> int:
    """Tool-call turns until `folds` more folds happened; returns the next turn index."""
    index = start_index
    done = 0
    while done < folds:
        outcome = await prepare(stub, session_id, call(f"c{index}"), result(f"c{index}", tool_output(index, 1500)))
        done += outcome.result.action == pb.ACTION_FOLDED
        index += 1
        assert index < start_index + 200, "no fold happened"
    return index


async def head(stub: pb_grpc.ContextServiceStub, session_id: str) -> pb.Session:
    return (await stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session


def view_key(messages: list[pb.Message]) -> list[tuple[object, ...]]:
    return [(m.role, m.content, m.id, m.summary, m.pruned) for m in messages]


async def test_edit_after_a_fold_drops_the_summary_that_covered_the_edited_message(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    session = await create_session(stub, context_window=WINDOW)
    await prepare(stub, session.id, user("First task: list the files"))
    index = await fold_turns(stub, session.id, 0, 1)
    first_checkpoint = (await head(stub, session.id)).checkpoint_id
    edited = (await prepare(stub, session.id, user("Second task: EDIT-ME"))).result.appended[0]
    await fold_turns(stub, session.id, index, 1)
    before = await head(stub, session.id)
    assert before.checkpoint_id != first_checkpoint
    # Edit = rewind to just before the message, then append the new version.
    rewound = (await stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=edited.seq - 1))).session
    assert rewound.checkpoint_id == first_checkpoint and rewound.head_seq == edited.seq - 1
    outcome = await prepare(stub, session.id, user("Second task, edited"))
    contents = [m.content for m in outcome.result.messages]
    assert all("EDIT-ME" not in c for c in contents) and contents[-1] == "Second task, edited"
    assert outcome.result.checkpoint_id == first_checkpoint
    everything = (
        await stub.ListMessages(pb.ListMessagesRequest(session_id=session.id, page_size=1000, include_abandoned=True))
    ).messages
    old = [m for m in everything if m.id == edited.id]
    assert old and old[0].abandoned and old[0].content == "Second task: EDIT-ME"


async def test_retry_inside_a_covered_turn_rewinds_the_checkpoint(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=WINDOW)
    await prepare(stub, session.id, user("Do the thing"))
    answer = (await prepare(stub, session.id, pb.Message(role=pb.ROLE_ASSISTANT, content="ANSWER-V1"))).result.appended[
        0
    ]
    await prepare(stub, session.id, user("go on"))
    await fold_turns(stub, session.id, 0, 1)
    covered = await head(stub, session.id)
    assert covered.checkpoint_id
    # Retry = rewind to just before the assistant answer, then Prepare again.
    rewound = (await stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=answer.seq - 1))).session
    assert rewound.checkpoint_id == ""
    outcome = await prepare(stub, session.id)
    assert all("ANSWER-V1" not in m.content for m in outcome.result.messages)
    assert outcome.result.messages[-1].content == "Do the thing"


async def test_fork_after_three_folds_reuses_them_and_stays_independent(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=WINDOW)
    await prepare(stub, session.id, user("Long audit"))
    index = await fold_turns(stub, session.id, 0, 3)
    source_view = (await prepare(stub, session.id)).result
    source_head = await head(stub, session.id)
    fork = (await stub.Fork(pb.ForkRequest(session_id=session.id))).session
    assert fork.checkpoint_id == source_head.checkpoint_id
    first = await prepare(stub, fork.id)
    assert first.result.action == pb.ACTION_NONE and not first.progress
    assert view_key(list(first.result.messages)) == view_key(list(source_view.messages))
    summary = next(m for m in first.result.messages if m.summary)
    refs = RESULT_REF.findall(summary.content)
    assert refs
    for ref in refs:
        page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=fork.id, result_ref=ref, limit=64))
        assert page.total_bytes > 0
    await prepare(stub, fork.id, user("fork-only work"))
    for i in range(4):
        await prepare(stub, fork.id, call(f"f{i}"), result(f"f{i}", tool_output(1000 + i, 1500)))
    folded = await compact(stub, fork.id)
    assert folded.result.action == pb.ACTION_FOLDED
    assert (await head(stub, session.id)).checkpoint_id == source_head.checkpoint_id
    after = (await prepare(stub, session.id)).result
    assert view_key(list(after.messages)) == view_key(list(source_view.messages))
    assert (await fold_turns(stub, session.id, index, 1)) > index


async def test_fork_before_the_newest_checkpoint_uses_an_ancestor(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=WINDOW)
    await prepare(stub, session.id, user("audit"))
    index = await fold_turns(stub, session.id, 0, 1)
    first = await head(stub, session.id)
    await fold_turns(stub, session.id, index, 1)
    second = await head(stub, session.id)
    assert second.checkpoint_id != first.checkpoint_id
    middle = (await stub.Fork(pb.ForkRequest(session_id=session.id, at_seq=second.head_seq - 1))).session
    position = (await state(stub, session.id))["covered_count"]
    assert isinstance(position, int)
    expected = first.checkpoint_id if second.head_seq - 1 < position else second.checkpoint_id
    assert middle.checkpoint_id == expected
    early = (await stub.Fork(pb.ForkRequest(session_id=session.id, at_seq=2))).session
    assert early.checkpoint_id == ""
    view = (await prepare(stub, early.id)).result
    assert not any(m.summary for m in view.messages) and len(view.messages) == 2


@pytest.fixture
async def paused(
    backend: str, tmp_path: Path
) -> AsyncIterator[tuple[pb_grpc.ContextServiceStub, asyncio.Event, asyncio.Event]]:
    """A server whose folds stop between summary and install until the test lets them go."""
    reached, release = asyncio.Event(), asyncio.Event()

    async def before_install(_session_id: str) -> None:
        reached.set()
        await release.wait()

    running: RunningServer = await start(
        settings_for(await fresh_database(backend, tmp_path)), hooks=Hooks(before_install=before_install)
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield pb_grpc.ContextServiceStub(channel), reached, release
    release.set()
    await running.stop(grace=1.0)


async def test_rewind_during_a_fold_rejects_the_stale_install(
    paused: tuple[pb_grpc.ContextServiceStub, asyncio.Event, asyncio.Event],
) -> None:
    stub, reached, release = paused
    session = await create_session(stub, context_window=WINDOW)
    await prepare(stub, session.id, user("audit"))
    for i in range(30):
        await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id, messages=[call(f"c{i}"), result(f"c{i}", tool_output(i, 1500))]
            )
        )
    folding = asyncio.create_task(compact(stub, session.id))
    await asyncio.wait_for(reached.wait(), 10)
    rewound = (await stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=5))).session
    assert rewound.checkpoint_id == ""
    release.set()
    outcome = await asyncio.wait_for(folding, 20)
    after = await head(stub, session.id)
    assert after.head_seq == 5
    if after.checkpoint_id:
        # The retried fold ran on the rewound transcript: its position lies within the head.
        covered = (await state(stub, session.id))["covered_count"]
        assert isinstance(covered, int) and covered <= after.head_seq
    stages = [p.stage for p in outcome.progress]
    assert pb.FOLD_STAGE_PASS_FAILED in stages  # the stale candidate was discarded


async def test_concurrent_rewinds_leave_one_consistent_result(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=100_000)
    await prepare(stub, session.id, *[user(f"m{i}") for i in range(10)])
    results = await asyncio.gather(
        stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=7)),
        stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=3)),
        return_exceptions=True,
    )
    final = await head(stub, session.id)
    assert final.head_seq in (3, 7)
    live = await transcript(stub, session.id)
    assert [m.content for m in live] == [f"m{i}" for i in range(final.head_seq)]
    for r in results:
        assert not isinstance(r, BaseException) or (
            isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.FAILED_PRECONDITION
        )


async def test_fork_during_a_fold_takes_what_is_committed(
    paused: tuple[pb_grpc.ContextServiceStub, asyncio.Event, asyncio.Event],
) -> None:
    stub, reached, release = paused
    session = await create_session(stub, context_window=WINDOW)
    await prepare(stub, session.id, user("audit"))
    for i in range(30):
        await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id, messages=[call(f"c{i}"), result(f"c{i}", tool_output(i, 1500))]
            )
        )
    folding = asyncio.create_task(compact(stub, session.id))
    await asyncio.wait_for(reached.wait(), 10)
    fork = (await stub.Fork(pb.ForkRequest(session_id=session.id))).session
    assert fork.checkpoint_id == ""  # the fold has not installed anything yet
    release.set()
    outcome = await asyncio.wait_for(folding, 20)
    assert outcome.result.action == pb.ACTION_FOLDED  # a fork does not make the source's fold stale
    assert (await head(stub, fork.id)).checkpoint_id == ""
    # The fork is above its trigger too and folds on its own chain; the source's fold stays its own.
    view = (await prepare(stub, fork.id)).result
    assert view.estimated_tokens <= view.hard_limit_tokens
    fork_head, source_head = await head(stub, fork.id), await head(stub, session.id)
    assert source_head.checkpoint_id == outcome.result.checkpoint_id
    assert fork_head.checkpoint_id not in ("", source_head.checkpoint_id)


async def test_rewound_and_deleted_checkpoints_leave_no_rows(backend: str, tmp_path: Path) -> None:
    running = await start(settings_for(await fresh_database(backend, tmp_path)))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ContextServiceStub(channel)
            session = await create_session(stub, context_window=WINDOW)
            await prepare(stub, session.id, user("audit"))
            index = await fold_turns(stub, session.id, 0, 2)
            assert (await running.store.row_counts())["checkpoints"] >= 2
            fork = (await stub.Fork(pb.ForkRequest(session_id=session.id))).session
            await stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=1))
            kept_for_fork = (await running.store.row_counts())["checkpoints"]
            assert kept_for_fork >= 2  # the fork still stands on them
            await stub.DeleteSession(pb.DeleteSessionRequest(session_id=fork.id))
            assert (await running.store.row_counts())["checkpoints"] == 0
            await fold_turns(stub, session.id, index, 1)
            await stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=1))
            assert (await running.store.row_counts())["checkpoints"] == 0  # nobody else used them
            await stub.DeleteSession(pb.DeleteSessionRequest(session_id=session.id))
            counts = await running.store.row_counts()
            assert all(count == 0 for count in counts.values()), counts
    finally:
        await running.stop(grace=1.0)

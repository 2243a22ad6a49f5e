"""ListCheckpoints and GetCheckpoint: a session's checkpoint chain with its summaries, abandoned
branches, paging and NOT_FOUND for checkpoints the session cannot reach; on both stores."""

from __future__ import annotations

import grpc

from builders import create_session, prepare, user
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import expect_error
from test_lineage_folds import WINDOW, fold_turns, head


async def checkpoints(
    stub: pb_grpc.ContextServiceStub, session_id: str, include_abandoned: bool = False, page_size: int = 0
) -> list[pb.Checkpoint]:
    """Every page of ListCheckpoints, in order."""
    listed: list[pb.Checkpoint] = []
    token = ""
    while True:
        page = await stub.ListCheckpoints(
            pb.ListCheckpointsRequest(
                session_id=session_id, page_size=page_size, page_token=token, include_abandoned=include_abandoned
            )
        )
        listed += page.checkpoints
        token = page.next_page_token
        if not token:
            return listed


async def test_the_chain_is_listed_newest_first_with_each_summary(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=WINDOW)
    assert await checkpoints(stub, session.id) == []
    await prepare(stub, session.id, user("Audit the repository"))
    await fold_turns(stub, session.id, 0, 3)
    chain = await checkpoints(stub, session.id)
    assert len(chain) >= 3
    assert chain[0].id == (await head(stub, session.id)).checkpoint_id
    # Each checkpoint folds its parent: the listing walks the chain to its root.
    assert [c.parent_id for c in chain] == [c.id for c in chain[1:]] + [""]
    assert [c.position_seq for c in chain] == sorted((c.position_seq for c in chain), reverse=True)
    view = (await prepare(stub, session.id)).result
    assert chain[0].summary in [m.content for m in view.messages if m.summary]
    # Each checkpoint names the summarizer that wrote it and its folded-results index, readable as any result.
    assert all(c.summarizer == "extractive" and c.folded_results_ref for c in chain)
    assert chain[0].folded_results_ref == view.folded_results_ref
    index = await stub.ReadToolResult(
        pb.ReadToolResultRequest(session_id=session.id, result_ref=chain[0].folded_results_ref)
    )
    assert index.total_bytes > 0 and index.data
    assert all(c.summary and c.summary_tokens > 0 and c.on_head_chain for c in chain)
    assert all(c.create_time.seconds > 0 for c in chain)
    # Paging returns the same chain one checkpoint at a time.
    assert await checkpoints(stub, session.id, page_size=1) == chain
    got = await stub.GetCheckpoint(pb.GetCheckpointRequest(session_id=session.id, checkpoint_id=chain[-1].id))
    assert got.checkpoint == chain[-1]


async def test_abandoned_checkpoints_are_listed_only_when_asked(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=WINDOW)
    await prepare(stub, session.id, user("Long audit"))
    await fold_turns(stub, session.id, 0, 2)
    before = await checkpoints(stub, session.id)
    # A fork keeps the newest checkpoint alive; rewinding before it abandons it in the source.
    fork = (await stub.Fork(pb.ForkRequest(session_id=session.id))).session
    await stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=before[-1].position_seq))
    live = await checkpoints(stub, session.id)
    assert [c.id for c in live] == [before[-1].id]
    everything = await checkpoints(stub, session.id, include_abandoned=True)
    assert {c.id for c in everything} == {c.id for c in before}
    assert {c.id for c in everything if not c.on_head_chain} == {c.id for c in before[:-1]}
    abandoned = await stub.GetCheckpoint(pb.GetCheckpointRequest(session_id=session.id, checkpoint_id=before[0].id))
    assert not abandoned.checkpoint.on_head_chain and abandoned.checkpoint.summary == before[0].summary
    # In the fork the same checkpoint is its head.
    in_fork = await stub.GetCheckpoint(pb.GetCheckpointRequest(session_id=fork.id, checkpoint_id=before[0].id))
    assert in_fork.checkpoint.on_head_chain


async def test_a_rewind_deletes_the_checkpoints_it_leaves_behind_and_keeps_every_message(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    """A checkpoint is derived data (a summary of messages that stay readable): with no fork building
    on it, one a Rewind leaves behind is deleted, not listed, and not found by id; the messages it
    summarized stay listable as abandoned."""
    session = await create_session(stub, context_window=WINDOW)
    await prepare(stub, session.id, user("Long audit"))
    await fold_turns(stub, session.id, 0, 2)
    before = await checkpoints(stub, session.id)
    await stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=before[-1].position_seq))
    everything = await checkpoints(stub, session.id, include_abandoned=True)
    assert [c.id for c in everything] == [before[-1].id]
    await expect_error(
        stub.GetCheckpoint(pb.GetCheckpointRequest(session_id=session.id, checkpoint_id=before[0].id)),
        grpc.StatusCode.NOT_FOUND,
        "CHECKPOINT_NOT_FOUND",
    )
    listed = await stub.ListMessages(pb.ListMessagesRequest(session_id=session.id, include_abandoned=True))
    assert [m for m in listed.messages if m.abandoned], "the rewound messages stay readable"


async def test_a_checkpoint_of_another_session_is_not_found(stub: pb_grpc.ContextServiceStub) -> None:
    folded = await create_session(stub, context_window=WINDOW)
    await prepare(stub, folded.id, user("Audit"))
    await fold_turns(stub, folded.id, 0, 1)
    foreign = (await head(stub, folded.id)).checkpoint_id
    other = await create_session(stub, context_window=WINDOW)
    for checkpoint_id in (foreign, "k_unknown", ""):
        await expect_error(
            stub.GetCheckpoint(pb.GetCheckpointRequest(session_id=other.id, checkpoint_id=checkpoint_id)),
            grpc.StatusCode.NOT_FOUND,
            "CHECKPOINT_NOT_FOUND",
        )
    await expect_error(
        stub.ListCheckpoints(pb.ListCheckpointsRequest(session_id="s_missing")),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )


async def test_page_size_and_token_are_checked(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=WINDOW)
    await expect_error(
        stub.ListCheckpoints(pb.ListCheckpointsRequest(session_id=session.id, page_size=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_SIZE",
    )
    sessions_token = (await stub.ListSessions(pb.ListSessionsRequest(page_size=1))).next_page_token
    await expect_error(
        stub.ListCheckpoints(pb.ListCheckpointsRequest(session_id=session.id, page_token=sessions_token or "x")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )

"""The hot path's write (`store/hot_write.py`), on both stores: concurrent appends stay apart, so a
stale one writes nothing and the others all commit, whole, with their raw results; a repeated request
id writes nothing; a caller that gives up does not stop the writer; deleting or rewinding a session
drops this process's cached entry."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import replace

import pytest

from ctxfold.engine.model import NewMessage, Role, SessionConfig, ToolCall
from ctxfold.server import RunningServer
from ctxfold.service.transcript import message_rows
from ctxfold.store import StaleSession
from ctxfold.store.rows import MessageRow, SessionRecord
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_prepare import create, prepare, transcript, user

TENANT = "default"
CONFIG = SessionConfig(context_window=200_000)
RAW = bytes(range(256)) * 1024  # a 256 KiB tool result: stored in several chunks


def turn(index: int) -> list[MessageRow]:
    """An assistant's tool call, its (large) result and a user message."""
    call_id = f"call-{index}"
    return message_rows(
        [
            NewMessage(Role.ASSISTANT, f"step {index}", tool_calls=(ToolCall(call_id, "bash", "{}"),)),
            NewMessage(Role.TOOL, RAW.hex() + str(index), tool_call_id=call_id),
            NewMessage(Role.USER, f"go on after {index}"),
        ],
        CONFIG,
    )


async def started_session(stub: pb_grpc.ContextServiceStub, server: RunningServer) -> tuple[SessionRecord, int]:
    session = await create(stub, context_window=CONFIG.context_window)
    await prepare(stub, session.id, user("start"))
    record = await server.store.get_session(TENANT, session.id)
    _, revision = await server.store.read_state(record)
    return record, revision


async def append(
    server: RunningServer, record: SessionRecord, rows: list[MessageRow], revision: int, request_id: str = ""
) -> int:
    # Every turn answers its own tool call: nothing is left open.
    return await server.store.append_answered(record, rows, request_id, (), "{}", revision, time.time())


async def test_concurrent_appends_stay_apart(server: RunningServer, stub: pb_grpc.ContextServiceStub) -> None:
    started = [await started_session(stub, server) for _ in range(8)]
    plans = []
    for i, (record, revision) in enumerate(started):
        # 2: someone appended since the session was read; 5: someone wrote its state since.
        seen = replace(record, version=record.version - 1) if i == 2 else record
        plans.append(append(server, seen, turn(i), revision - 1 if i == 5 else revision))
    outcomes = await asyncio.gather(*plans, return_exceptions=True)

    assert [isinstance(o, StaleSession) for o in outcomes] == [i in (2, 5) for i in range(8)]
    for i, (record, revision) in enumerate(started):
        stored = await transcript(stub, record.id)
        after = await server.store.get_session(TENANT, record.id)
        _, now_revision = await server.store.read_state(after)
        if i in (2, 5):
            assert [m.content for m in stored] == ["start"]
            assert (after.version, after.head_seq, now_revision) == (record.version, record.head_seq, revision)
            continue
        assert outcomes[i] == revision + 1 == now_revision
        assert [m.seq for m in stored] == [1, 2, 3, 4]
        assert (after.version, after.head_seq) == (record.version + 1, 4)
        ref = stored[2].result_ref
        whole = await server.store.read_raw_result(after, ref)
        assert whole.data == (RAW.hex() + str(i)).encode()
        assert whole.sha256 == hashlib.sha256(whole.data).hexdigest()


async def test_a_bookkeeping_write_without_messages_checks_the_session(
    server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    record, revision = await started_session(stub, server)
    with pytest.raises(StaleSession):
        await append(server, replace(record, branch_id="another-branch"), [], revision)
    assert (await server.store.read_state(record))[1] == revision
    assert await append(server, record, [], revision) == revision + 1


async def test_a_repeated_request_id_writes_nothing(server: RunningServer, stub: pb_grpc.ContextServiceStub) -> None:
    record, revision = await started_session(stub, server)
    await append(server, record, turn(0), revision, request_id="req-1")
    after = await server.store.get_session(TENANT, record.id)
    with pytest.raises(StaleSession):
        await append(server, after, turn(1), revision + 1, request_id="req-1")
    again = await server.store.get_session(TENANT, record.id)
    assert (again.version, again.head_seq) == (after.version, after.head_seq)
    assert len(await transcript(stub, record.id)) == 4


async def test_a_caller_that_gives_up_does_not_stop_the_writer(
    server: RunningServer, stub: pb_grpc.ContextServiceStub
) -> None:
    (first, first_revision), (second, second_revision) = [await started_session(stub, server) for _ in range(2)]
    abandoned = asyncio.ensure_future(append(server, first, turn(0), first_revision))
    kept = asyncio.ensure_future(append(server, second, turn(1), second_revision))
    await asyncio.sleep(0)
    abandoned.cancel()
    assert await kept == second_revision + 1
    assert len(await transcript(stub, second.id)) == 4
    # The abandoned append committed all of itself or nothing, and the session takes the next one.
    stored = len(await transcript(stub, first.id))
    assert stored in (1, 4)
    current = await server.store.get_session(TENANT, first.id)
    _, revision = await server.store.read_state(current)
    await append(server, current, turn(2), revision)
    assert len(await transcript(stub, first.id)) == stored + 3


async def test_delete_and_rewind_drop_the_cached_entry(server: RunningServer, stub: pb_grpc.ContextServiceStub) -> None:
    rewound = await create(stub, context_window=CONFIG.context_window)
    deleted = await create(stub, context_window=CONFIG.context_window)
    for session in (rewound, deleted):
        await prepare(stub, session.id, user("one"), pb.Message(role=pb.ROLE_ASSISTANT, content="two"))
        assert server.hot_state.get(TENANT, session.id) is not None
    cached = server.hot_state.bytes

    await stub.Rewind(pb.RewindRequest(session_id=rewound.id, to_seq=1))
    assert server.hot_state.get(TENANT, rewound.id) is None
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=deleted.id))
    assert server.hot_state.get(TENANT, deleted.id) is None
    assert server.hot_state.bytes < cached

"""A property test: random sequences of append / prepare / compact / fork / rewind / delete on several
sessions, checking the invariants of SPEC §1 after every step against a simple in-memory model."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import call, compact, prepare, result, user
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_prepare import assert_view_well_formed, transcript
from traces import tool_output


@dataclass
class ModelSession:
    id: str
    live: list[tuple[int, str]] = field(default_factory=list)  # (role, content) in seq order
    abandoned: list[tuple[int, str]] = field(default_factory=list)

    def branch_point(self, n: int) -> int:
        """A position in 0..len(live) that does not leave a tool call waiting for its result."""
        at = n % (len(self.live) + 1)
        return at - 1 if at and self.live[at - 1][0] == pb.ROLE_ASSISTANT else at


Op = tuple[str, int, int]
ops = st.lists(
    st.tuples(
        st.sampled_from(["user", "tools", "prepare", "compact", "fork", "rewind", "delete"]),
        st.integers(0, 3),  # which session
        st.integers(0, 10_000),  # size / position / seed
    ),
    min_size=5,
    max_size=25,
)


async def check(stub: pb_grpc.ContextServiceStub, model: ModelSession) -> None:
    live = await transcript(stub, model.id)
    assert [(m.role, m.content) for m in live] == model.live
    assert [m.seq for m in live] == list(range(1, len(live) + 1))
    everything = (
        await stub.ListMessages(pb.ListMessagesRequest(session_id=model.id, page_size=1000, include_abandoned=True))
    ).messages
    assert sorted((m.role, m.content) for m in everything if m.abandoned) == sorted(model.abandoned)


async def check_view(stub: pb_grpc.ContextServiceStub, model: ModelSession, view: pb.PreparedContext) -> None:
    messages = list(view.messages)
    assert_view_well_formed(messages)
    assert view.estimated_tokens <= view.hard_limit_tokens
    canonical = {m.id: m for m in await transcript(stub, model.id)}
    for m in messages:
        if m.id:
            source = canonical[m.id]  # every rendered message is live canonical
            if not m.pruned:
                assert m.content == source.content
            else:
                assert m.result_ref in m.content
    if model.live and messages:
        assert messages[-1].content == model.live[-1][1] or model.live[-1][0] == pb.ROLE_TOOL


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=ops)
async def test_random_operations_keep_every_invariant(stub: pb_grpc.ContextServiceStub, sequence: list[Op]) -> None:
    config = pb.SessionConfig(context_window=5000, max_output_tokens=200)
    sessions: list[ModelSession] = []
    created = await stub.CreateSession(pb.CreateSessionRequest(config=config))
    sessions.append(ModelSession(created.session.id))
    deleted: list[str] = []
    counter = 0
    for name, which, n in sequence:
        if not sessions:
            created = await stub.CreateSession(pb.CreateSessionRequest(config=config))
            sessions.append(ModelSession(created.session.id))
        model = sessions[which % len(sessions)]
        counter += 1
        if name == "user":
            text = f"user {counter}: {tool_output(n, 40)}"
            await stub.AppendMessages(pb.AppendMessagesRequest(session_id=model.id, messages=[user(text)]))
            model.live.append((pb.ROLE_USER, text))
        elif name == "tools":
            call_id = f"c{counter}"
            output = tool_output(n, 200 + n % 3000)
            await stub.AppendMessages(
                pb.AppendMessagesRequest(session_id=model.id, messages=[call(call_id), result(call_id, output)])
            )
            model.live += [(pb.ROLE_ASSISTANT, ""), (pb.ROLE_TOOL, output)]
        elif name == "prepare":
            await check_view(stub, model, (await prepare(stub, model.id)).result)
        elif name == "compact":
            try:
                compacted = (await compact(stub, model.id)).result
            except grpc.aio.AioRpcError as exc:
                # A view too small to shrink: a failed Compact is an error and changes nothing.
                assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "not smaller" in (exc.details() or "")
                compacted = (await prepare(stub, model.id)).result
            await check_view(stub, model, compacted)
        elif name == "fork":
            at = model.branch_point(n)
            if at == 0:
                continue  # at_seq 0 means "the head"
            fork = (await stub.Fork(pb.ForkRequest(session_id=model.id, at_seq=at))).session
            kept = model.live[:at]
            sessions.append(ModelSession(fork.id, live=list(kept)))
            await check_view(stub, sessions[-1], (await prepare(stub, fork.id)).result)
        elif name == "rewind":
            to = model.branch_point(n)
            await stub.Rewind(pb.RewindRequest(session_id=model.id, to_seq=to))
            model.abandoned += model.live[to:]
            model.live = model.live[:to]
        elif name == "delete":
            await stub.DeleteSession(pb.DeleteSessionRequest(session_id=model.id))
            deleted.append(model.id)
            sessions.remove(model)
        for other in sessions:
            await check(stub, other)
        for gone in deleted:
            try:
                await stub.GetSession(pb.GetSessionRequest(session_id=gone))
                raise AssertionError("deleted session still readable")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND
    for model in sessions:
        await stub.DeleteSession(pb.DeleteSessionRequest(session_id=model.id))

"""Sessions' cached contexts: a server answers from its cached view of a session only while nobody else
wrote it (compare-and-swap on the session's version and branch and the state's revision); its cache is
bounded by bytes; and what it answers is what a server without the cache answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from builders import assistant, call, create_session, prepare, result, user
from conftest import fresh_database, settings_for, started_replicas, stubs_for
from ctxfold.engine import estimator
from ctxfold.engine.context import AppendRequest, AppendStep, Context, SessionRecord, append, observe
from ctxfold.engine.estimator import LARGE_TEXT_CHARS
from ctxfold.engine.model import NewMessage, Role, SessionConfig, StoredMessage, ToolCall, Usage
from ctxfold.engine.projection import LOOP_VIEW_MESSAGES, Projection
from ctxfold.engine.state import (
    ContextState,
    Receipt,
    ReceiptAction,
    ReceiptStatus,
    ViewRecord,
    load_state,
    view_version,
)
from ctxfold.engine.transcript import AppendLimits
from ctxfold.server import RunningServer, start
from ctxfold.service.contexts import SESSION_OVERHEAD_BYTES, Contexts, message_bytes
from ctxfold.store import state as state_store
from ctxfold.store.rows import state_document
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from test_prepare import transcript

TENANT = "default"  # of a server without a tokens file


@dataclass
class Replica:
    running: RunningServer
    stub: pb_grpc.ContextServiceStub

    async def version(self, session_id: str) -> int:
        return (await self.running.store.get_session(TENANT, session_id)).version

    def cached_version(self, session_id: str) -> int:
        """The session version this replica's cache holds (0: none); peeks without counting a lookup."""
        entry = self.running.contexts._entries.get((TENANT, session_id))
        return entry.context.session.version if entry else 0


@pytest.fixture
async def two_servers(backend: str, tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    """Two servers on one database (PostgreSQL, or one SQLite file), as two replicas."""
    url = await fresh_database(backend, tmp_path)
    async with started_replicas(url) as servers, stubs_for([s.port for s in servers]) as stubs:
        first, second = (Replica(s, stub) for s, stub in zip(servers, stubs, strict=True))
        yield first, second


def context_reads(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The session ids of the contexts `server` reads from its store from now on, in order."""
    reads: list[str] = []
    load_context = server.store.load_context

    async def counted(tenant: str, session_id: str):  # type: ignore[no-untyped-def]
        reads.append(session_id)
        return await load_context(tenant, session_id)

    monkeypatch.setattr(server.store, "load_context", counted)
    return reads


def contents(messages: object) -> list[str]:
    return [m.content for m in messages if m.role != pb.ROLE_SYSTEM]  # type: ignore[attr-defined]


async def test_append_by_another_replica_between_two_prepares_is_in_the_next_view(
    two_servers: tuple[Replica, Replica],
) -> None:
    a, b = two_servers
    session = await create_session(a.stub, context_window=200_000, system_prompt="You are a careful agent.")
    await prepare(a.stub, session.id, user("Investigate the flaky test"))
    last = (await prepare(a.stub, session.id, call("c0", text="look"), result("c0", "log line"))).result
    assert a.cached_version(session.id) == await a.version(session.id)  # A's next Prepare could use its cache

    await prepare(b.stub, session.id, user("from B, by Prepare"))
    await b.stub.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session.id, messages=[call("c1", text="B acts"), result("c1", "B's output")]
        )
    )
    assert a.cached_version(session.id) < await a.version(session.id)

    answer = (await prepare(a.stub, session.id, user("A again"), known_view_version=last.view_version)).result
    stored = [m.content for m in await transcript(a.stub, session.id)]
    assert stored == [
        "Investigate the flaky test",
        "look",
        "log line",
        "from B, by Prepare",
        "B acts",
        "B's output",
        "A again",
    ]
    assert answer.delta and contents(answer.messages) == stored[3:]
    assert answer.view_message_count == len(stored) + 1  # and the system prompt
    full = (await prepare(a.stub, session.id)).result
    assert contents(full.messages) == stored
    assert a.cached_version(session.id) == await a.version(session.id)


async def test_rewind_by_another_replica_is_never_answered_from_the_cache(two_servers: tuple[Replica, Replica]) -> None:
    a, b = two_servers
    session = await create_session(a.stub, context_window=200_000)
    for i in range(3):
        await prepare(a.stub, session.id, user(f"turn {i}"), pb.Message(role=pb.ROLE_ASSISTANT, content=f"answer {i}"))
    await b.stub.Rewind(pb.RewindRequest(session_id=session.id, to_seq=2))
    answer = (await prepare(a.stub, session.id, user("after the rewind"))).result
    assert contents(answer.messages) == ["turn 0", "answer 0", "after the rewind"]
    assert [m.content for m in await transcript(a.stub, session.id)] == contents(answer.messages)


async def test_hot_answers_equal_a_cold_load(two_servers: tuple[Replica, Replica]) -> None:
    """A runs every call on its hot state (usage observed between them); B, which never saw the
    session, loads it from the database: both answer the same view, version and estimate."""
    a, b = two_servers
    session = await create_session(a.stub, context_window=100_000, system_prompt="system")
    await prepare(a.stub, session.id, user("task " * 50))
    for i in range(6):
        answer = (
            await prepare(a.stub, session.id, call(f"c{i}", text="run"), result(f"c{i}", f"output {i} " * 40))
        ).result
        await a.stub.ObserveUsage(
            pb.ObserveUsageRequest(
                session_id=session.id, view_version=answer.view_version, input_tokens=answer.estimated_tokens
            )
        )
    assert a.cached_version(session.id) == await a.version(session.id)
    hot = (await prepare(a.stub, session.id)).result
    cold = (await prepare(b.stub, session.id)).result
    assert (hot.view_version, hot.estimated_tokens, hot.view_message_count) == (
        cold.view_version,
        cold.estimated_tokens,
        cold.view_message_count,
    )
    assert [(m.role, m.content) for m in hot.messages] == [(m.role, m.content) for m in cold.messages]


async def test_a_view_of_more_messages_than_a_partition_is_read_whole_and_in_order(
    two_servers: tuple[Replica, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store reads a view's messages a partition at a time, so the event loop is free between them (a
    long session's view held it 120-140 ms read at once): B's cold load of a view many partitions long
    answers what A's hot state does."""
    monkeypatch.setattr(state_store, "PARTITION_ROWS", 3)
    a, b = two_servers
    session = await create_session(a.stub, context_window=100_000, system_prompt="system")
    turns = [message for n in range(10) for message in (user(f"question {n}"), assistant(f"answer {n}"))]
    hot = (await prepare(a.stub, session.id, *turns)).result
    cold = (await prepare(b.stub, session.id)).result
    expected = [text for n in range(10) for text in (f"question {n}", f"answer {n}")]
    assert contents(cold.messages) == contents(hot.messages) == expected
    assert [m.seq for m in cold.messages[1:]] == list(range(1, 21))


async def test_a_repeated_request_id_appends_once_on_the_hot_path(two_servers: tuple[Replica, Replica]) -> None:
    a, _ = two_servers
    session = await create_session(a.stub, context_window=200_000)
    await prepare(a.stub, session.id, user("start"))
    first = (await prepare(a.stub, session.id, user("once"), request_id="r-1")).result
    again = (await prepare(a.stub, session.id, user("once"), request_id="r-1")).result
    assert [m.content for m in await transcript(a.stub, session.id)] == ["start", "once"]
    assert [m.id for m in again.appended] == [m.id for m in first.appended]
    assert again.view_version == first.view_version


# ---- the cache itself --------------------------------------------------------------------------

CONFIG = SessionConfig(context_window=200_000)


def message(seq: int, role: Role, content: str, *calls: ToolCall) -> StoredMessage:
    return StoredMessage(
        id=f"m{seq}",
        seq=seq,
        role=role,
        content=content,
        tokens=len(content) // 4 + 1,
        tool_calls=calls,
        tool_call_id="",
        reasoning_content="",
        pinned=False,
        name="",
        result_ref="",
        raw_bytes=0,
        truncated=False,
        create_time=0.0,
    )


def projection(*messages: StoredMessage) -> Projection:
    return Projection(CONFIG, 10, 0, 1.0, None, (), messages, {})


def entry(session_id: str, version: int, text_bytes: int) -> Context:
    record = SessionRecord(session_id, "", "{}", 10, 0, "g", 1, "b", None, (), version, None, 0, 0.0, 0.0)
    return Context(record, projection(message(1, Role.USER, "x" * text_bytes)), ContextState("f"), 1)


def keep(contexts: Contexts, context: Context) -> None:
    """What a write that left `context` does to the cache."""
    contexts.written(context.session, context)


def cache(max_bytes: int = 1 << 30) -> Contexts:
    return Contexts(store=None, limits=None, max_bytes=max_bytes)  # type: ignore[arg-type]  # written, cached: no store


def test_cache_is_bounded_by_bytes_and_evicts_the_least_recently_used() -> None:
    one = SESSION_OVERHEAD_BYTES + message_bytes([message(1, Role.USER, "x" * 10_000)])
    contexts = cache(max_bytes=3 * one)
    for name in ("s1", "s2", "s3"):
        keep(contexts, entry(name, 1, 10_000))
    assert len(contexts) == 3 and contexts.bytes == 3 * one
    assert contexts.cached("", "s1") is not None  # s1 is now the most recently used
    keep(contexts, entry("s4", 1, 10_000))
    assert contexts.cached("", "s2") is None and len(contexts) == 3 and contexts.bytes == 3 * one
    assert all(contexts.cached("", name) is not None for name in ("s1", "s3", "s4"))
    keep(contexts, entry("big", 1, 4 * one))  # larger than the whole bound: not kept, nothing evicted for it
    assert contexts.cached("", "big") is None and len(contexts) == 3
    contexts.written(entry("s3", 1, 0).session, None)
    assert contexts.cached("", "s3") is None and contexts.bytes == 2 * one


def test_cache_keeps_the_newer_context_of_a_session() -> None:
    contexts = cache()
    keep(contexts, entry("s", 5, 10))
    keep(contexts, entry("s", 4, 10))  # a call that finished later with an older context
    found = contexts.cached("", "s")
    assert found is not None and found.session.version == 5
    assert contexts.bytes == SESSION_OVERHEAD_BYTES + message_bytes(found.projection.messages)


def test_a_grown_entry_grows_by_the_appended_messages_only() -> None:
    contexts = cache()
    start = entry("s", 1, 100)
    keep(contexts, start)
    before = contexts.bytes
    appended = [message(2, Role.ASSISTANT, "y" * 500)]
    grown = replace(start, session=replace(start.session, version=2), projection=start.projection.extended(appended))
    contexts.written(grown.session, grown, grown_by=appended)
    assert contexts.bytes == before + message_bytes(appended)


@pytest.mark.parametrize("state_stored", [True, False])
def test_an_append_writes_its_bookkeeping_and_knows_the_context_after_it(state_stored: bool) -> None:
    """An append's answer writes the bookkeeping fields over a stored state, the whole state over a new or
    rebuilt one; the context after it carries the new revision, or is unknown when the write was skipped."""
    start = replace(entry("s", 1, 100), state_stored=state_stored)
    step = append(start, 5.0, AppendRequest((message(2, Role.ASSISTANT, "ok"),)))
    assert step.answered is not None
    document, whole = step.bookkeeping() or ("", False)
    assert whole is not state_stored
    assert document == (step.answered.state.bookkeeping_json() if state_stored else step.answered.state.to_json())
    after = step.written(7)
    assert after is not None and after.revision == 7 and after.state_stored and after.state == step.answered.state
    assert after.session.head_seq == start.session.head_seq + 1
    assert step.written(0) is None  # the bookkeeping was skipped: the state is not known here
    silent = append(start, 5.0, AppendRequest((message(2, Role.ASSISTANT, "ok"),), answer=False))
    assert silent.bookkeeping() is None
    unchanged = silent.written(0)
    assert unchanged is not None and unchanged.revision == start.revision and unchanged.state == start.state


def test_an_append_step_makes_its_messages_once_and_counts_only_large_texts_apart() -> None:
    """An append's step checks and makes its messages (ids given, token counts, raw results to keep) on the
    first context, and a retry on a fresher one appends the same stored forms without counting again; only
    a text of `LARGE_TEXT_CHARS` or more goes to the caller's counter (the server's counting process)."""
    large = "word " * (LARGE_TEXT_CHARS // 5 + 1)
    new = [NewMessage(Role.USER, large), NewMessage(Role.ASSISTANT, "", tool_calls=(ToolCall("c", "cat", "{}"),))]
    new.append(NewMessage(Role.TOOL, "done", tool_call_id="c"))
    counted: list[int] = []

    def count_large(text: str) -> int:
        counted.append(len(text))
        return estimator.count_text(text)

    ids = [(f"m{i}", f"tr_{i}") for i in range(3)]
    step = AppendStep(new, ids, AppendLimits(1 << 20, 1 << 20), AppendRequest((), answer=False), count_large)
    start = entry("s", 1, 100)
    first = step(start, 5.0)
    assert counted == [len(large)]
    assert [m.id for m in first.messages] == ["m0", "m1", "m2"] and [m.seq for m in first.messages] == [2, 3, 4]
    # A user message and a tool result keep their raw text under a ref; the assistant's has none.
    assert [m.result_ref for m in first.messages] == ["tr_0", "", "tr_2"]
    assert [(r.ref, r.inline) for r in first.results] == [("tr_0", True), ("tr_2", True)]
    fresher = replace(start, session=replace(start.session, version=3, head_seq=5))
    retried = step(fresher, 6.0)
    assert counted == [len(large)]  # not counted again
    assert [m.seq for m in retried.messages] == [6, 7, 8] and retried.messages[0].tokens == first.messages[0].tokens
    # Made: no text left to go through, but the raw results its write encodes again.
    assert step.work(fresher)[1] == len(large.encode()) + len("done")


def test_an_append_deciding_on_the_view_counts_the_texts_it_scans_for_fenced_commands() -> None:
    """At its trigger an append decides on the whole view: in a session that may act in text that reads every
    assistant text for fenced commands, so the step's size counts them; once the session calls tools it reads none."""
    reply = "x" * 100_000 + "\n```\nls\n```"
    record = SessionRecord("s", "", "{}", 10, 0, "g", 3, "b", None, (), 1, None, 0, 0.0, 0.0)
    texts = projection(message(1, Role.USER, "task"), message(2, Role.ASSISTANT, reply), message(3, Role.USER, "ok"))
    new = [NewMessage(Role.USER, "next")]
    step = AppendStep(new, [("m4", "tr_4")], AppendLimits(1 << 20, 1 << 20), AppendRequest((), overflow=True))
    assert step.work(Context(record, texts, ContextState("f"), 1)) == (4, len("next") + len(reply))
    called = message(2, Role.ASSISTANT, reply, ToolCall("c", "cat", "{}"))
    tools = projection(message(1, Role.USER, "task"), called, message(3, Role.TOOL, "ok"))
    assert step.work(Context(record, tools, ContextState("f"), 1)) == (4, len("next"))
    # A view of LOOP_VIEW_MESSAGES or more is worked on in the pool for its messages alone: its texts are not added up.
    long = [message(seq, Role.ASSISTANT if seq % 2 else Role.USER, reply) for seq in range(1, LOOP_VIEW_MESSAGES + 1)]
    assert step.work(Context(record, projection(*long), ContextState("f"), 1)) == (LOOP_VIEW_MESSAGES + 1, len("next"))


def test_observed_usage_recalibrates_the_context_and_records_the_views_estimate() -> None:
    """ObserveUsage's step: the state's calibration moves toward the reported ratio, the projection counts
    with it (its view unchanged), and the usage is recorded with the estimate of the view it reports on."""
    start = append(entry("s", 1, 100), 5.0, AppendRequest((message(2, Role.ASSISTANT, "ok"),)))
    assert start.answered is not None
    context = start.written(3)
    assert context is not None
    view = context.state.views[-1]
    usage = Usage(view.version, 0, view.estimated_tokens * 2, 0, 10, "stop")
    step = observe(context, usage)
    assert step.accepted and step.usage == replace(usage, estimated_tokens=view.estimated_tokens)
    calibration = step.context.state.calibration
    assert 1.0 < calibration < 2.0 and step.context.projection.calibration == calibration
    assert step.context.projection.view() == context.projection.view()
    assert step.context.projection.tokens() > context.projection.tokens()
    unknown = observe(context, replace(usage, view_version=view.version + 99))
    assert not unknown.accepted and unknown.usage.estimated_tokens == 0
    assert unknown.context.state.calibration == context.state.calibration


# ---- the extended projection is the rebuilt one ---------------------------------------------------


@pytest.mark.parametrize(
    ("before", "appended"),
    [
        # past the opening: extended
        (
            [message(1, Role.USER, "task"), message(2, Role.ASSISTANT, "ok")],
            [message(3, Role.USER, "more"), message(4, Role.ASSISTANT, "done")],
        ),
        # the opening grows (a second user message before any answer): rebuilt
        ([message(1, Role.USER, "task")], [message(2, Role.USER, "and also"), message(3, Role.ASSISTANT, "ok")]),
        # from nothing
        ([], [message(1, Role.USER, "task " * 3000)]),
        # tool calls and results
        (
            [message(1, Role.USER, "task"), message(2, Role.ASSISTANT, "", ToolCall("c1", "sh", "{}"))],
            [message(3, Role.TOOL, "out " * 5000), message(4, Role.ASSISTANT, "next")],
        ),
    ],
)
def test_extended_projection_equals_the_rebuilt_one(before: list[StoredMessage], appended: list[StoredMessage]) -> None:
    cached = projection(*before)
    cached.view()  # computed, as a cached entry's view is
    extended = cached.extended(appended)
    rebuilt = projection(*before, *appended)
    assert extended.view() == rebuilt.view()
    assert (extended.tokens(), extended.raw_tokens()) == (rebuilt.tokens(), rebuilt.raw_tokens())
    recalibrated = extended.recalibrated(1.5)
    assert recalibrated.view() == rebuilt.view()
    assert recalibrated.tokens() == projection(*before, *appended).recalibrated(1.5).tokens()
    assert recalibrated.tokens() > rebuilt.tokens()


# ---- the bookkeeping is stored on its own ---------------------------------------------------------


def test_bookkeeping_laid_over_the_stored_state_is_the_new_state() -> None:
    stored = ContextState(
        fingerprint="f",
        pruned={"m1": 40},
        receipts=(Receipt("op", ReceiptStatus.APPLIED, ReceiptAction.PRUNE, 900, 300, "threshold", 1.0),),
        telemetry={"prune_applied": 1, "prepares": 3},
        views=(ViewRecord(view_version(1, 4), 120),),
    )
    answered = replace(
        stored,
        views=stored.views_with(ViewRecord(view_version(1, 6), 180)),
        transcript_version=6,
        last_activity=42.0,
        cache_state="warm",
        projection_tokens=900,
    ).count("prepares")
    row = SimpleNamespace(_mapping={"state_json": stored.to_json(), "bookkeeping_json": answered.bookkeeping_json()})
    document = state_document(row)
    assert json.loads(document) == json.loads(answered.to_json())
    assert load_state(document, "f") == (answered, "")
    assert len(answered.bookkeeping_json()) < len(answered.to_json())


@pytest.mark.parametrize("base", ["{not json", "[1]", ""])
def test_bookkeeping_over_a_document_that_is_no_state_leaves_it_for_the_reader_to_reject(base: str) -> None:
    row = SimpleNamespace(_mapping={"state_json": base, "bookkeeping_json": ContextState("f").bookkeeping_json()})
    assert state_document(row) == base


@pytest.mark.parametrize("hot_state_max_bytes", [0, 256 << 20])
async def test_an_append_only_prepare_reads_the_context_at_most_once(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hot_state_max_bytes: int
) -> None:
    """Without the cache (or on a miss) the config and the append share one read of the context; with
    it, a cached session reads none; either way a Prepare looks the cache up once."""
    url = await fresh_database(backend, tmp_path)
    running = await start(replace(settings_for(url), hot_state_max_bytes=hot_state_max_bytes))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        stub = pb_grpc.ContextServiceStub(channel)
        session = await create_session(stub)
        reads = context_reads(running, monkeypatch)
        lookups: list[str] = []
        cached = running.contexts.cached

        def looked_up(tenant: str, session_id: str) -> Context | None:
            lookups.append(session_id)
            return cached(tenant, session_id)

        monkeypatch.setattr(running.contexts, "cached", looked_up)
        await prepare(stub, session.id, user("first"))
        assert len(reads) == 1 and len(lookups) == 1
        await prepare(stub, session.id, user("second"))
        assert len(reads) == (2 if hot_state_max_bytes == 0 else 1)
        assert len(lookups) == 2  # one cache lookup per Prepare (the metric counts each once)
    finally:
        await channel.close()
        await running.stop(grace=0.5)


async def test_a_refused_append_reads_the_store_again_only_for_a_precondition(
    stub: pb_grpc.ContextServiceStub, server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append refused by a precondition of the session (a tool result no call waits for) may have been
    refused by a cached context that is behind: it is decided again on the store's. A message that is
    wrong in itself is refused without another read."""
    session = await create_session(stub)
    await prepare(stub, session.id, user("task"))
    reads = context_reads(server, monkeypatch)
    malformed = pb.Message(role=pb.ROLE_TOOL, content="out")  # no tool_call_id
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=[malformed]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reads == []
    with pytest.raises(grpc.aio.AioRpcError) as unexpected:
        await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=[result("c9", "out")]))
    assert unexpected.value.code() == grpc.StatusCode.FAILED_PRECONDITION and reads == [session.id]


async def test_a_receipt_written_apart_from_a_call_moves_the_cached_context_with_it(
    stub: pb_grpc.ContextServiceStub, server: RunningServer
) -> None:
    """A background fold's receipt is a state write of its own: the cached context takes it, so the next
    append's bookkeeping is written over it rather than skipped."""
    session = await create_session(stub)
    await prepare(stub, session.id, user("go"))
    cached = server.contexts.cached(TENANT, session.id)
    assert cached is not None
    receipt = Receipt("r1", ReceiptStatus.DISCARDED, ReceiptAction.BACKGROUND, 10, 10, "stopped", 1.0)
    await server.maintenance.states.add_receipt(cached.session, receipt)
    after = server.contexts.cached(TENANT, session.id)
    assert after is not None and after.revision == cached.revision + 1 and after.state.last_receipt == receipt
    await prepare(stub, session.id, user("more"))
    _, revision = await server.maintenance.states.read(after.session)
    grown = server.contexts.cached(TENANT, session.id)
    assert grown is not None and grown.revision == revision == after.revision + 1  # not skipped
    assert grown.state.last_receipt == receipt


async def test_usage_is_one_write_from_the_cached_context_and_no_observation_is_lost(
    two_servers: tuple[Replica, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ObserveUsage on a cached session opens no transaction of the store's own (it reads nothing): it writes
    the observed state and the usage row together, the append's one write, over the cached state's
    revision, and the cache follows. When another replica observed in between, the stale write is refused
    and made again on the store's context: every observation is counted once, with one row each."""
    a, b = two_servers
    session = await create_session(a.stub, context_window=100_000)
    answer = (await prepare(a.stub, session.id, user("task " * 200))).result
    before = a.running.contexts.cached(TENANT, session.id)
    assert before is not None
    transactions: list[str] = []
    store = a.running.store
    for name in ("_read", "_write"):
        opened = getattr(store, name)
        monkeypatch.setattr(store, name, lambda opened=opened, name=name: (transactions.append(name), opened())[1])

    async def observe(replica: Replica) -> pb.ObserveUsageResponse:
        request = pb.ObserveUsageRequest(
            session_id=session.id, view_version=answer.view_version, input_tokens=answer.estimated_tokens * 11 // 10
        )
        response: pb.ObserveUsageResponse = await replica.stub.ObserveUsage(request)
        return response

    first = await observe(a)
    assert transactions == [] and first.calibration_accepted and first.calibration > 1.0
    cached = a.running.contexts.cached(TENANT, session.id)
    assert cached is not None and cached.revision == before.revision + 1
    assert cached.state.calibration == first.calibration == cached.projection.calibration
    await observe(b)  # a's cached state is now a revision behind
    third = await observe(a)
    assert transactions == ["_read"]  # the refused write read the store's context once
    state, _ = await a.running.maintenance.states.read(cached.session)
    assert state.telemetry["observations"] == 3 and state.calibration == third.calibration
    assert (await store.row_counts())["usage_observations"] == 3


async def test_usage_reports_and_appends_of_one_session_take_turns_in_a_process(
    stub: pb_grpc.ContextServiceStub, server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Usage reports racing a session's Prepares on one server start from the context the write before
    left: none loses its swap and reads the store again, and every report and message is kept. (On
    PostgreSQL, whose writes yield to the loop, the race is there without the turn; SQLite's inline
    commits rarely interleave.)"""
    session = await create_session(stub, context_window=100_000)
    answer = (await prepare(stub, session.id, user("task " * 200))).result
    reads = context_reads(server, monkeypatch)
    report = pb.ObserveUsageRequest(
        session_id=session.id, view_version=answer.view_version, input_tokens=answer.estimated_tokens
    )
    calls = [stub.ObserveUsage(report) for _ in range(6)]
    calls += [prepare(stub, session.id, user(f"step {i}")) for i in range(6)]
    await asyncio.gather(*calls)
    assert reads == []
    cached = server.contexts.cached(TENANT, session.id)
    assert cached is not None
    state, _ = await server.maintenance.states.read(cached.session)
    assert state.telemetry["observations"] == 6 and cached.session.head_seq == 7

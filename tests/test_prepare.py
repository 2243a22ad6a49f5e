"""Prepare, Compact, ObserveUsage and GetContextState against a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import update

from builders import append, assistant, call, compact, create_session, prepare, result, user
from conftest import fresh_database, settings_for
from ctxfold.server import RunningServer, start
from ctxfold.store import schema
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import error_info, expect_error
from traces import load_trace, tool_output, turns


async def transcript(stub: pb_grpc.ContextServiceStub, session_id: str) -> list[pb.Message]:
    out: list[pb.Message] = []
    token = ""
    while True:
        page = await stub.ListMessages(pb.ListMessagesRequest(session_id=session_id, page_size=1000, page_token=token))
        out += page.messages
        token = page.next_page_token
        if not token:
            return out


async def state(stub: pb_grpc.ContextServiceStub, session_id: str) -> dict[str, object]:
    response = await stub.GetContextState(pb.GetContextStateRequest(session_id=session_id))
    return json.loads(response.state_json)  # type: ignore[no-any-return]


def assert_view_well_formed(messages: list[pb.Message]) -> None:
    """At most one summary; every tool result follows its call; every call has its results (except
    in the last assistant message, which may still await them)."""
    assert sum(m.summary for m in messages) <= 1
    waiting: set[str] = set()
    for index, m in enumerate(messages):
        if m.role == pb.ROLE_TOOL:
            assert m.tool_call_id in waiting, f"tool result {m.tool_call_id} without its call"
            waiting.discard(m.tool_call_id)
        else:
            last_assistant = m.role == pb.ROLE_ASSISTANT and all(
                later.role == pb.ROLE_TOOL for later in messages[index + 1 :]
            )
            assert not waiting or last_assistant, f"calls {waiting} without results"
            if m.role == pb.ROLE_ASSISTANT:
                waiting = {c.id for c in m.tool_calls}


def rendered(message: pb.Message) -> tuple[object, ...]:
    return (message.role, message.content, message.id, message.summary, message.pruned)


@pytest.fixture
async def isolated(
    backend: str, tmp_path: Path
) -> AsyncIterator[tuple[RunningServer, pb_grpc.ContextServiceStub, str]]:
    url = await fresh_database(backend, tmp_path)
    running = await start(settings_for(url))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield running, pb_grpc.ContextServiceStub(channel), url
    await running.stop(grace=1.0)


async def test_below_trigger_views_extend_byte_for_byte_across_a_restart(
    isolated: tuple[RunningServer, pb_grpc.ContextServiceStub, str],
) -> None:
    running, stub, url = isolated
    session = await create_session(stub, context_window=200_000, system_prompt="You are a careful engineer.")
    previous: list[pb.Message] = []
    for turn in range(12):
        outcome = await prepare(stub, session.id, user(f"request {turn}"), call(f"c{turn}"), result(f"c{turn}", "ok"))
        view = list(outcome.result.messages)
        assert outcome.result.action == pb.ACTION_NONE and not outcome.progress
        assert [rendered(m) for m in view[: len(previous)]] == [rendered(m) for m in previous]
        assert outcome.result.stable_prefix_messages == len(previous)
        assert view[0].role == pb.ROLE_SYSTEM and view[0].content == "You are a careful engineer."
        previous = view
    await running.stop(grace=1.0)
    restarted = await start(settings_for(url))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{restarted.port}") as channel:
            stub2 = pb_grpc.ContextServiceStub(channel)
            outcome = await prepare(stub2, session.id, user("after the restart"))
            assert outcome.result.action == pb.ACTION_NONE
            assert outcome.result.stable_prefix_messages == len(previous)
            assert [rendered(m) for m in outcome.result.messages[: len(previous)]] == [rendered(m) for m in previous]
            assert (await state(stub2, session.id))["receipts"] == []
    finally:
        await restarted.stop(grace=1.0)


async def test_a_large_max_output_never_refuses_a_view_below_the_trigger(stub: pb_grpc.ContextServiceStub) -> None:
    """max_output_tokens a quarter of the window (what the gateway reserves for the Vercel AI SDK's
    Anthropic default of 64k), and pinned notes no fold can remove: the view sits between the hard
    ceiling and the trigger. With the output reserved twice that band was above the ceiling, and a
    Prepare there failed with CONTEXT_BUDGET_UNSATISFIED though the provider would take the view; now
    every Prepare answers, folding when due."""
    session = await create_session(stub, context_window=16_000, max_output_tokens=4_000, prefold_ratio=0.7)
    lines = "\n".join(f"note {n}: module_{n} owns table_{n * 31 % 97}" for n in range(660))
    notes = user(f"Keep these notes in view:\n{lines}")
    notes.pinned = True  # kept whole by every fold, so that a fold leaves the view in the band
    await prepare(stub, session.id, user("List every part, one call each."))
    await prepare(stub, session.id, assistant("Noted, go on?"), notes)
    answered: list[tuple[int, int]] = []
    for turn in range(40):
        output = "\n".join(f"part{turn}/file_{n}.py: {n * 7919 % 10007}" for n in range(60))
        outcome = await prepare(stub, session.id, call(f"c{turn}", "bash", '{"cmd": "ls"}'), result(f"c{turn}", output))
        answered.append((outcome.result.estimated_tokens, outcome.result.action))
        assert outcome.result.estimated_input_tokens <= outcome.result.hard_limit_tokens
    hard, trigger = outcome.result.hard_limit_tokens, outcome.result.trigger_tokens
    # Estimates (the output reserved) between the ceiling and the trigger are what failed before.
    assert any(hard < tokens < trigger for tokens, _ in answered)
    assert any(action == pb.ACTION_FOLDED for _, action in answered)


async def test_an_overflow_prepare_of_an_empty_session_answers_that_nothing_was_folded(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    """The provider refused a view of the system prompt alone (a gateway's first request): the overflow
    Prepare has no message to prune or fold and says so (it was an INTERNAL error)."""
    session = await create_session(stub, context_window=8_000, system_prompt="You are an agent.")
    outcome = await prepare(stub, session.id, overflow=True)
    assert outcome.result.action == pb.ACTION_NONE
    assert outcome.result.not_folded_reason != pb.NOT_FOLDED_REASON_UNSPECIFIED
    assert [m.role for m in outcome.result.messages] == [pb.ROLE_SYSTEM]


async def test_large_results_are_pruned_once_and_read_back_in_full(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=30_000, compact_ratio=0.5)
    texts = {f"c{i}": tool_output(i, 10_000) for i in range(8)}
    outcomes = [await prepare(stub, session.id, user("Audit the repository"))]
    for call_id, text in texts.items():
        outcomes.append(await prepare(stub, session.id, call(call_id), result(call_id, text)))
    actions = [o.result.action for o in outcomes]
    assert actions.count(pb.ACTION_PRUNED) == 1 and pb.ACTION_FOLDED not in actions
    pruned_at = actions.index(pb.ACTION_PRUNED)
    assert [p.stage for p in outcomes[pruned_at].progress] == [pb.FOLD_STAGE_PRUNED]
    final = outcomes[-1].result
    assert final.estimated_tokens < final.trigger_tokens
    stubs = [m for m in final.messages if m.pruned]
    assert stubs and all(f'result_ref="{m.result_ref}"' in m.content for m in stubs)
    assert not any(m.summary for m in final.messages)
    canonical = await transcript(stub, session.id)
    assert [m.content for m in canonical if m.role == pb.ROLE_TOOL] == list(texts.values())
    for m in stubs:
        page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session.id, result_ref=m.result_ref))
        assert page.complete and page.data == texts[m.tool_call_id]


async def test_a_sentinel_only_in_a_raw_result_never_reaches_a_view(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=60_000)
    raw = tool_output(1, 30_000) + "\nSENTINEL-7f3a9c\n" + tool_output(2, 30_000)
    views = [await prepare(stub, session.id, user("go"), call("big"), result("big", raw))]
    for turn in range(6):
        views.append(await prepare(stub, session.id, call(f"c{turn}"), result(f"c{turn}", tool_output(turn, 3000))))
    await compact(stub, session.id)
    views.append(await prepare(stub, session.id, user("status?")))
    for outcome in views:
        assert all("SENTINEL-7f3a9c" not in m.content for m in outcome.result.messages)
    page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session.id, tool_call_id="big", offset=0))
    data = page.data
    while not page.complete:
        page = await stub.ReadToolResult(
            pb.ReadToolResultRequest(session_id=session.id, result_ref=page.result_ref, offset=page.next_offset)
        )
        data += page.data
    assert "SENTINEL-7f3a9c" in data and data == raw


async def test_trace_replay_folds_several_times_and_keeps_every_invariant(stub: pb_grpc.ContextServiceStub) -> None:
    trace = load_trace("openhands-django-11149.json")
    session = await create_session(
        stub,
        context_window=16_000,
        system_prompt=trace.system_prompt,
        tools_json=trace.tools_json,
        max_output_tokens=1000,
    )
    folds = 0
    summaries_seen: set[str] = set()
    for batch in turns(trace):
        outcome = await prepare(stub, session.id, *batch)
        r = outcome.result
        assert_view_well_formed(list(r.messages))
        if r.action != pb.ACTION_NONE:
            assert r.estimated_tokens < r.trigger_tokens
        assert r.estimated_tokens <= r.hard_limit_tokens
        if r.action == pb.ACTION_FOLDED:
            folds += 1
            stages = [p.stage for p in outcome.progress]
            assert pb.FOLD_STAGE_PLANNED in stages and pb.FOLD_STAGE_PASS_COMMITTED in stages
            committed = [p for p in outcome.progress if p.stage == pb.FOLD_STAGE_PASS_COMMITTED]
            assert committed[-1].checkpoint_id == r.checkpoint_id
            assert all(p.tokens_after < p.tokens_before for p in committed)
        summaries_seen.update(m.content for m in r.messages if m.summary)
    assert folds >= 3
    assert len(summaries_seen) >= 3
    canonical = await transcript(stub, session.id)
    assert [(m.role, m.content, m.tool_call_id) for m in canonical] == [
        (m.role, m.content, m.tool_call_id) for m in trace.messages
    ]


async def test_the_newest_summary_rolls_the_previous_one_in(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=8_000, max_output_tokens=500)
    await prepare(stub, session.id, user("GOAL-ALPHA: migrate the billing module"))
    for i in range(40):
        outcome = await prepare(stub, session.id, call(f"c{i}"), result(f"c{i}", tool_output(i, 1200)))
    summaries = [m for m in outcome.result.messages if m.summary]
    assert len(summaries) == 1
    s = await state(stub, session.id)
    assert s["telemetry"]["summary_applied"] >= 2  # type: ignore[index]
    assert "GOAL-ALPHA" in summaries[0].content or any("GOAL-ALPHA" in m.content for m in outcome.result.messages)


async def test_delta_views_carry_only_new_messages(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=100_000)
    first = (await prepare(stub, session.id, user("one"))).result
    second = (
        await prepare(stub, session.id, call("c1"), result("c1", "ok"), known_view_version=first.view_version)
    ).result
    assert second.delta and second.view_message_count == first.view_message_count + 2
    assert [m.content for m in second.messages] == ["", "ok"]
    unknown = (await prepare(stub, session.id, user("two"), known_view_version=12345)).result
    assert not unknown.delta and len(unknown.messages) == unknown.view_message_count
    full = (await prepare(stub, session.id)).result
    stale = (await prepare(stub, session.id, known_view_version=full.view_version + 10)).result
    assert not stale.delta


async def test_a_view_of_a_deleted_session_is_no_base_for_the_session_created_again_under_its_key(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    """The session created again has the same id: a client still holding a view of the deleted one (an SDK's view
    cache, the gateway's) gets the new session's whole view, not a delta on top of another transcript."""
    first = await create_session(stub, session_key="created again", context_window=100_000)
    await prepare(stub, first.id, user("the first task"))
    held = (await prepare(stub, first.id, assistant("done"), user("thanks"))).result
    await stub.DeleteSession(pb.DeleteSessionRequest(session_id=first.id))
    again = await create_session(stub, session_key="created again", context_window=100_000)
    assert again.id == first.id
    await prepare(stub, again.id, user("another task"))
    answered = await prepare(stub, again.id, assistant("ok"), user("go on"), known_view_version=held.view_version)
    answer = answered.result
    assert not answer.delta
    assert [m.content for m in answer.messages] == ["another task", "ok", "go on"]


async def test_compact_folds_below_the_trigger_without_pruning(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=100_000)
    await prepare(stub, session.id, user("Refactor the parser"))
    for i in range(12):
        await prepare(stub, session.id, call(f"c{i}"), result(f"c{i}", tool_output(i, 9000)))
    before = (await prepare(stub, session.id)).result
    assert before.estimated_tokens < before.trigger_tokens
    outcome = await compact(stub, session.id, focus="keep the parser decisions")
    assert outcome.result.action == pb.ACTION_FOLDED
    assert pb.FOLD_STAGE_PRUNED not in [p.stage for p in outcome.progress]
    assert not any(m.pruned for m in outcome.result.messages)
    summary = next(m for m in outcome.result.messages if m.summary)
    assert "keep the parser decisions" in summary.content
    assert outcome.result.estimated_tokens < before.estimated_tokens
    session_after = (await stub.GetSession(pb.GetSessionRequest(session_id=session.id))).session
    assert session_after.checkpoint_id == outcome.result.checkpoint_id


async def test_window_too_small_for_fixed_costs_is_refused_at_creation(stub: pb_grpc.ContextServiceStub) -> None:
    """Tools (or a system prompt) that leave no room for a view are a bad config, said at CreateSession,
    not at the first Prepare."""
    tools = json.dumps(
        [{"type": "function", "function": {"name": f"tool_{i}", "description": "x " * 200}} for i in range(20)]
    )
    listed = await stub.ListSessions(pb.ListSessionsRequest(page_size=1000))
    await expect_error(
        create_session(stub, context_window=2_000, tools_json=tools),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_CONFIG",
        {"field": "tools_json"},
    )
    assert await stub.ListSessions(pb.ListSessionsRequest(page_size=1000)) == listed


async def overwrite_state(running: RunningServer, session_id: str, state_json: str) -> None:
    """Writes a context state as is, straight into the database, as a bug or a bad restore might. It
    bumps the revision like every state write, so a server's hot state of the session is stale."""
    table = schema.context_states
    async with running.store.engine.begin() as conn:
        await conn.execute(
            update(table)
            .where(table.c.session_id == session_id)
            .values(state_json=state_json, revision=table.c.revision + 1)
        )


async def test_corrupt_context_state_is_rebuilt(
    isolated: tuple[RunningServer, pb_grpc.ContextServiceStub, str],
) -> None:
    running, stub, _ = isolated
    session = await create_session(stub, context_window=30_000, compact_ratio=0.5)
    await prepare(stub, session.id, user("go"))
    for i in range(8):
        last = await prepare(stub, session.id, call(f"c{i}"), result(f"c{i}", tool_output(i, 10_000)))
    assert any(m.pruned for m in last.result.messages)
    good = await state(stub, session.id)
    for corrupt in ("{not json", json.dumps({"schema_version": 99}), json.dumps({**good, "fingerprint": "x"})):
        await overwrite_state(running, session.id, corrupt)
        outcome = await prepare(stub, session.id, user("still there?"))
        assert outcome.result.messages[-1].content == "still there?"
        assert outcome.result.estimated_tokens <= outcome.result.hard_limit_tokens
        assert_view_well_formed(list(outcome.result.messages))
        rebuilt = await state(stub, session.id)
        assert rebuilt["schema_version"] == 3
        assert rebuilt["telemetry"]["state_rebuilds"] >= 1  # type: ignore[index]


async def test_the_input_estimate_leaves_out_the_reserved_output(stub: pb_grpc.ContextServiceStub) -> None:
    """`estimated_input_tokens` is the request without max_output_tokens: reported back as the input a
    provider billed (an agent loop whose provider gives no usage), it leaves the calibration at 1."""
    session = await create_session(stub, context_window=50_000, max_output_tokens=4000)
    view = (await prepare(stub, session.id, user("hello " * 200))).result
    assert view.estimated_input_tokens == view.estimated_tokens - 4000 > 200
    observed = await stub.ObserveUsage(
        pb.ObserveUsageRequest(
            session_id=session.id, view_version=view.view_version, input_tokens=view.estimated_input_tokens
        )
    )
    assert observed.calibration_accepted and observed.calibration == 1.0


async def test_observe_usage_calibrates_within_bounds_and_never_maintains(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=50_000, model="claude-sonnet-4")
    first = (await prepare(stub, session.id, user("hello " * 200))).result
    assert first.cache_state == pb.CACHE_STATE_UNKNOWN
    raw = (await state(stub, session.id))["views"][-1]["estimated_tokens"]  # type: ignore[index]
    accepted = await stub.ObserveUsage(
        pb.ObserveUsageRequest(
            session_id=session.id,
            view_version=first.view_version,
            input_tokens=int(raw * 1.2),
            cached_input_tokens=0,
            output_tokens=20,
            finish_reason="stop",
        )
    )
    assert accepted.calibration_accepted and 1.0 < accepted.calibration < 1.2
    absurd = await stub.ObserveUsage(
        pb.ObserveUsageRequest(session_id=session.id, view_version=first.view_version, input_tokens=raw * 50)
    )
    assert not absurd.calibration_accepted and absurd.calibration == accepted.calibration
    second = (await prepare(stub, session.id, pb.Message(role=pb.ROLE_ASSISTANT, content="hi"))).result
    assert second.cache_state == pb.CACHE_STATE_WARM
    assert second.action == pb.ACTION_NONE
    assert second.estimated_tokens > first.estimated_tokens * 1.05
    s = await state(stub, session.id)
    assert s["telemetry"]["observations"] == 2  # type: ignore[index]
    await expect_error(
        stub.ObserveUsage(pb.ObserveUsageRequest(session_id=session.id, input_tokens=10, cached_input_tokens=11)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_USAGE",
    )


async def test_concurrent_prepares_install_one_checkpoint_per_fold(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=12_000)
    await prepare(stub, session.id, user("Investigate the flaky test"))
    for i in range(12):
        await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id, messages=[call(f"c{i}"), result(f"c{i}", tool_output(i, 4000))]
            )
        )
    outcomes = await asyncio.gather(
        prepare(stub, session.id, user("first")),
        prepare(stub, session.id, user("second")),
    )
    for outcome in outcomes:
        assert outcome.result.estimated_tokens <= outcome.result.hard_limit_tokens
        assert_view_well_formed(list(outcome.result.messages))
    contents = [m.content for m in await transcript(stub, session.id)]
    assert "first" in contents and "second" in contents
    s = await state(stub, session.id)
    assert s["telemetry"]["summary_applied"] == 1  # type: ignore[index]
    head = (await stub.GetSession(pb.GetSessionRequest(session_id=session.id))).session
    assert head.checkpoint_id and all(o.result.checkpoint_id in ("", head.checkpoint_id) for o in outcomes)


async def test_a_cold_resume_below_the_trigger_returns_the_view_unchanged(stub: pb_grpc.ContextServiceStub) -> None:
    session = await create_session(stub, context_window=50_000, cache_ttl_seconds=1)
    first = (await prepare(stub, session.id, user("hello"), call("c1"), result("c1", tool_output(1, 9000)))).result
    warm = (await prepare(stub, session.id)).result
    assert warm.cache_state == pb.CACHE_STATE_WARM
    await asyncio.sleep(1.2)
    cold = (await prepare(stub, session.id)).result
    assert cold.cache_state == pb.CACHE_STATE_COLD
    assert cold.action == pb.ACTION_NONE and cold.stable_prefix_messages == len(first.messages)
    assert [rendered(m) for m in cold.messages] == [rendered(m) for m in first.messages]


async def test_a_fresh_turn_of_large_results_is_bounded_to_fit_not_refused(stub: pb_grpc.ContextServiceStub) -> None:
    """Eight parallel reads whose results together are larger than the window (none large enough to be
    pruned): they are the input the
    next call must answer, so nothing folds them; the largest are shown as head + tail + a marker
    naming their result_ref until the view fits, and the progress stream and the receipt say so."""
    session = await create_session(stub, context_window=12000)
    calls = [
        pb.ToolCall(id=f"r{i}", name="Read", arguments=json.dumps({"file_path": f"src/f{i}.py"})) for i in range(8)
    ]
    outputs = [tool_output(i, 7500) for i in range(8)]  # each below the prune size
    turn = [
        user("Read the parser files and explain them."),
        pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=calls),
        *(result(f"r{i}", outputs[i]) for i in range(8)),
    ]
    outcome = await prepare(stub, session.id, *turn)
    view = outcome.result
    assert view.estimated_tokens <= view.hard_limit_tokens
    assert view.action == pb.ACTION_PRUNED
    assert [p.stage for p in outcome.progress][-1] == pb.FOLD_STAGE_RESULTS_BOUNDED
    assert_view_well_formed(list(view.messages))
    bounded = [m for m in view.messages if m.role == pb.ROLE_TOOL and m.pruned]
    assert bounded
    for message in bounded:
        assert f'ReadToolResult(result_ref="{message.result_ref}")' in message.content
        page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session.id, result_ref=message.result_ref))
        assert page.data in outputs  # the whole result is one read away
    receipt = (await state(stub, session.id))["last_receipt"]
    assert isinstance(receipt, dict) and "bounded" in str(receipt["reason"])
    # The next turn folds them away like any other results: the view keeps fitting.
    follow = await prepare(stub, session.id, pb.Message(role=pb.ROLE_ASSISTANT, content="They parse."), user("thanks"))
    assert follow.result.action == pb.ACTION_FOLDED
    assert follow.result.estimated_tokens <= follow.result.hard_limit_tokens


async def test_a_long_interactive_session_keeps_answering_and_every_decision_readable(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    """Hundreds of decisions typed by the person outgrow a small window: the summary's standing
    instructions stay within their share of it (the oldest by their head, then listed in the
    folded-results index), so Prepare keeps answering, and every decision is one read away."""
    session = await create_session(stub, context_window=8000)
    said = []
    for n in range(0, 600, 100):
        turn = []
        for k in range(n, n + 100):
            turn += [user(f"decision {k}: name the module parser_{k} and keep its API"), assistant(f"done {k}")]
        said += turn
        outcome = await prepare(stub, session.id, *turn)
        assert outcome.result.estimated_tokens <= outcome.result.hard_limit_tokens
    view = outcome.result.messages
    summary = next(m.content for m in view if m.summary)
    document = re.search(
        r'earlier messages of the person, verbatim, are listed in ReadToolResult\(result_ref="(\w+)"\)', summary
    )
    assert document is not None
    readable = summary
    offset, complete = 0, False
    while not complete:
        page = await stub.ReadToolResult(
            pb.ReadToolResultRequest(session_id=session.id, result_ref=document.group(1), offset=offset)
        )
        readable += page.data
        offset, complete = page.next_offset, page.complete
    shown = "\n".join(m.content for m in view)
    assert all(m.content in readable or m.content in shown for m in said if m.role == pb.ROLE_USER)


async def test_many_messages_before_the_first_answer_fold_past_the_opening(stub: pb_grpc.ContextServiceStub) -> None:
    """A session that takes in many user messages before its first answer (a channel bot) keeps its
    first few as the opening anchors and folds the rest like any later message: Prepare answers within
    the window, and every message is still in the transcript. (All of them were anchors, which no fold
    shrinks: every Prepare failed with CONTEXT_BUDGET_UNSATISFIED.)"""
    session = await create_session(stub, context_window=32000)
    channel = [user(f"[#general] alice: message {n} " + "lorem ipsum dolor " * 20) for n in range(1500)]
    for first in range(0, len(channel), 500):
        await append(stub, session.id, *channel[first : first + 500])
    outcome = await prepare(stub, session.id, user("@bot what did the channel decide?"))
    view = outcome.result
    assert view.action == pb.ACTION_FOLDED
    assert view.estimated_tokens <= view.hard_limit_tokens
    summaries = [n for n, m in enumerate(view.messages) if m.summary]
    assert len(summaries) == 1
    opening = [m.content for m in view.messages[: summaries[0]]]  # the anchors, before the summary
    assert opening == [m.content for m in channel[: len(opening)]] and 1 <= len(opening) <= 8
    assert [m.content for m in (await transcript(stub, session.id))[:1500]] == [m.content for m in channel]
    answered = await prepare(stub, session.id, assistant("They decided to ship on Friday."), user("thanks"))
    assert answered.result.action == pb.ACTION_NONE


async def test_a_view_that_cannot_fit_says_what_it_is_made_of(stub: pb_grpc.ContextServiceStub) -> None:
    """More pinned than the window holds: nothing can be folded, and the error names the part to act
    on (the pinned messages, the largest part first) and the largest message's seq."""
    session = await create_session(stub, context_window=16000)
    await append(stub, session.id, user("Keep these notes."), assistant("ok"))
    notes = [pb.Message(role=pb.ROLE_USER, content=f"note {n}: " + "keep this in view " * 60, pinned=True)
             for n in range(100)]  # fmt: skip
    notes[7] = pb.Message(role=pb.ROLE_USER, content="the longest note: " + "keep this in view " * 120, pinned=True)
    await append(stub, session.id, *notes)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await prepare(stub, session.id, assistant("noted"), user("go on"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(refused.value)
    assert info.reason == "CONTEXT_BUDGET_UNSATISFIED"  # the fold tried made nothing smaller: no summarizer failed
    assert info.metadata["largest_message_seq"] == "10"
    assert int(info.metadata["estimated_input_tokens"]) > int(info.metadata["hard_limit_tokens"])
    details = refused.value.details() or ""
    assert "; in tokens: pinned " in details and " (100), " in details
    assert "the largest message is seq 10 (user, " in details


async def test_the_callers_author_decides_whose_messages_become_standing_instructions(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    """Left unset, the rules decide (a task notification is machine text); set, the caller decides."""
    session = await create_session(stub, context_window=16000)
    notice = "<task-notification><task-id>b7</task-id><status>completed</status></task-notification>"
    said = [
        user("Port the parser to Rust."),
        pb.Message(role=pb.ROLE_ASSISTANT, content="Starting. " + tool_output(1, 3000)),
        user(notice),
        pb.Message(role=pb.ROLE_ASSISTANT, content="Noted. " + tool_output(2, 3000)),
        pb.Message(role=pb.ROLE_USER, content="[Request interrupted by user]", author=pb.AUTHOR_PERSON),
        pb.Message(role=pb.ROLE_ASSISTANT, content="Stopped. " + tool_output(3, 3000)),
        pb.Message(role=pb.ROLE_USER, content="Keep the old API.", author=pb.AUTHOR_MACHINE),
        pb.Message(role=pb.ROLE_ASSISTANT, content="Ok. " + tool_output(4, 3000)),
        user("Also add benchmarks."),
        pb.Message(role=pb.ROLE_ASSISTANT, content="Will do."),
    ]
    appended = (await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=said))).messages
    assert [m.author for m in appended][4:7:2] == [pb.AUTHOR_PERSON, pb.AUTHOR_MACHINE]
    listed = (await stub.ListMessages(pb.ListMessagesRequest(session_id=session.id))).messages
    assert [m.author for m in listed] == [m.author for m in said]
    view = (await compact(stub, session.id)).result.messages
    summary = next(m.content for m in view if m.summary)
    instructions = summary.split("## Standing instructions", 1)[1].split("\n## ", 1)[0]
    assert "[Request interrupted by user]" in instructions
    assert "task-notification" not in instructions and "Keep the old API." not in instructions
    assert view[-2].content == "Also add benchmarks."  # the input the next call answers stays verbatim


async def test_every_check_of_one_request_names_its_messages_by_the_requests_field(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    """Prepare's messages are `append[i]` in every error (the NUL check, the message checks, the
    tool-call protocol); AppendMessages' are `messages[i]`."""
    session = await create_session(stub)

    async def details(call: object) -> str:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call  # type: ignore[misc]
        return caught.value.details() or ""

    no_id = pb.Message(role=pb.ROLE_TOOL, content="x")
    assert (await details(prepare(stub, session.id, no_id))).startswith("append[0]: ")
    assert (await details(prepare(stub, session.id, result("nobody", "x")))).startswith("append[0]: ")
    assert "append[0].content" in await details(prepare(stub, session.id, user("a\x00b")))
    appended = stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=[no_id]))
    assert (await details(appended)).startswith("messages[0]: ")

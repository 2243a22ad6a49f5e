"""What folds keep, end to end: recorded agent traces replayed turn by turn through Prepare (SQLite
and PostgreSQL) at small windows, then the view is checked against facts taken from the trace
itself — not from ctxfold's own bookkeeping: the task is there verbatim after the system prompt,
every message the person wrote is there verbatim, the file paths the tool calls named are named
(verbatim or in the artifact index's directory listing),
and every tool result the view no longer shows in full is one ReadToolResult away."""

from __future__ import annotations

import json
import re

import grpc
import pytest

from builders import compact, create_session, prepare, user
from ctxfold.engine.model import MIN_CONTEXT_WINDOW
from ctxfold.engine.tool_results import RESULT_REF
from ctxfold.replay.probes import listed_paths
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import expect_error
from traces import Trace, load_trace, turns

# A path as a person would name one: a relative or absolute path with a file extension.
PROBE_PATH = re.compile(r"(?<![\w/.-])(?:/?[\w.-]+/)*[\w-]+\.(?:py|c|h|pony|txt|cfg|toml|json|md|sh)\b")


async def read_all(stub: pb_grpc.ContextServiceStub, session_id: str, ref: str) -> str:
    parts, offset = [], 0
    while True:
        page = await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session_id, result_ref=ref, offset=offset))
        parts.append(page.data)
        if page.complete:
            return "".join(parts)
        offset = page.next_offset


def touched_paths(trace: Trace) -> set[str]:
    """Paths named by tool-call arguments (and by text actions written in fenced blocks)."""
    found: set[str] = set()
    for message in trace.messages:
        for call in message.tool_calls:
            arguments = json.loads(call.arguments or "{}")
            for value in arguments.values() if isinstance(arguments, dict) else ():
                if isinstance(value, str) and len(value) < 2000:
                    found.update(p for p in PROBE_PATH.findall(value) if not p.startswith("/dev/"))
        if message.role == pb.ROLE_ASSISTANT and not message.tool_calls:
            for block in re.findall(r"```[^\n]*\n(.*?)```", message.content, re.S):
                found.update(PROBE_PATH.findall(block.splitlines()[0] if block else ""))
    return found


async def replay(
    stub: pb_grpc.ContextServiceStub, trace: Trace, window: int
) -> tuple[pb.Session, list[pb.Message], int]:
    session = await create_session(
        stub, context_window=window, system_prompt=trace.system_prompt, tools_json=trace.tools_json
    )
    appended: list[pb.Message] = []
    folds = 0
    for batch in turns(trace):
        outcome = await prepare(stub, session.id, *batch)
        appended += outcome.result.appended
        folds += outcome.result.action == pb.ACTION_FOLDED
        view = outcome.result.messages
        # The task stays right after the system prompt in every view: verbatim, or (too large for
        # the anchor) its head and tail around a marker naming where all of it is read.
        task = appended[0]
        assert view[0].role == pb.ROLE_SYSTEM
        assert view[1].content == task.content or (
            view[1].pruned and view[1].content.startswith(task.content[:2000]) and task.result_ref in view[1].content
        )
    return session, appended, folds


# (trace, window, folds at least): windows small enough for folds of each trace.
REPLAYS = [
    ("mini-swe-agent-django-11910.json", 16000, 4),
    ("mini-swe-agent-django-11910.json", 32000, 2),
    ("openhands-django-11149.json", 16000, 2),
    ("swe-agent-pydicom-1458.json", 8000, 1),
]


@pytest.mark.parametrize(("name", "window", "min_folds"), REPLAYS)
async def test_after_many_folds_the_view_keeps_task_instructions_paths_and_every_result(
    stub: pb_grpc.ContextServiceStub, name: str, window: int, min_folds: int
) -> None:
    trace = load_trace(name)
    session, appended, folds = await replay(stub, trace, window)
    assert folds >= min_folds, folds
    outcome = await prepare(stub, session.id)
    view = list(outcome.result.messages)
    text = "\n".join(m.content for m in view)
    (summary,) = [m for m in view if m.summary]
    assert summary.content.count("[ctxfold summary of earlier conversation]") == 1

    # Every user message that is not an agent observation, verbatim (the trace's own rule: the
    # observation of a text action follows an assistant message without tool calls).
    observations = {
        m.id
        for i, m in enumerate(appended)
        if m.role == pb.ROLE_USER and i and appended[i - 1].role == pb.ROLE_ASSISTANT and not appended[i - 1].tool_calls
    }
    people = [m for m in appended if m.role == pb.ROLE_USER and m.id not in observations]
    assert people and all(m.content[:2000] in text for m in people)

    paths = touched_paths(trace)
    listed = listed_paths(text)  # the artifact index names files by directory
    named = {p for p in paths if p in text or p in listed}
    assert len(named) >= 0.9 * len(paths), sorted(paths - named)

    # Every tool result (or text-action observation) not shown in full is reachable: its ref is in
    # the view or in the index.
    index = await read_all(stub, session.id, outcome.result.folded_results_ref)
    assert outcome.result.folded_results_ref in summary.content
    reachable = set(RESULT_REF.findall(text)) | set(RESULT_REF.findall(index))
    shown = {m.id for m in view if not m.pruned}
    hidden = [m for m in appended if (m.role == pb.ROLE_TOOL or m.id in observations) and m.id not in shown]
    assert hidden and all(m.result_ref in reachable for m in hidden)
    # The index document names each result with what produced it.
    entry = json.loads(next(line for line in index.splitlines() if line.startswith("{")))
    assert {"result_ref", "tool", "arguments", "raw_bytes", "first_line"} <= set(entry)


async def test_the_stable_prefix_survives_folds(stub: pb_grpc.ContextServiceStub) -> None:
    trace = load_trace("openhands-django-11149.json")
    session = await create_session(
        stub, context_window=16000, system_prompt=trace.system_prompt, tools_json=trace.tools_json
    )
    for batch in turns(trace):
        outcome = await prepare(stub, session.id, *batch)
        if outcome.result.action == pb.ACTION_FOLDED:
            # System prompt and task anchor are identical across the fold (the provider cache keeps them).
            assert outcome.result.stable_prefix_messages >= 2


async def test_a_foreign_index_ref_is_not_found(stub: pb_grpc.ContextServiceStub) -> None:
    trace = load_trace("openhands-django-11149.json")
    session, _, _ = await replay(stub, trace, 16000)
    ref = (await prepare(stub, session.id)).result.folded_results_ref
    other = await create_session(stub, context_window=16000)
    await expect_error(
        stub.ReadToolResult(pb.ReadToolResultRequest(session_id=other.id, result_ref=ref)),
        grpc.StatusCode.NOT_FOUND,
        "RESULT_REF_NOT_FOUND",
    )


async def replayed_session(stub: pb_grpc.ContextServiceStub, window: int, batches: int) -> pb.Session:
    trace = load_trace("openhands-django-11149.json")
    session = await create_session(
        stub, context_window=window, system_prompt=trace.system_prompt, tools_json=trace.tools_json
    )
    for batch in turns(trace)[:batches]:
        await prepare(stub, session.id, *batch)
    return session


async def test_compact_folds_everything_outside_the_minimal_kept_set(stub: pb_grpc.ContextServiceStub) -> None:
    session = await replayed_session(stub, 200_000, 30)  # far below the trigger
    before = (await prepare(stub, session.id)).result
    assert before.action == pb.ACTION_NONE
    result = (await compact(stub, session.id)).result
    assert result.action == pb.ACTION_FOLDED and result.not_folded_reason == pb.NOT_FOLDED_REASON_UNSPECIFIED
    view = list(result.messages)
    # System, the task, the summary, then only the newest call group (an assistant call and its result).
    assert [m.role for m in view[:2]] == [pb.ROLE_SYSTEM, pb.ROLE_USER] and view[2].summary
    assert [m.role for m in view[3:]] == [pb.ROLE_ASSISTANT, pb.ROLE_TOOL]
    assert result.folded_results_ref and result.estimated_tokens < before.estimated_tokens / 3


async def test_compact_keeps_the_requested_tokens_verbatim(stub: pb_grpc.ContextServiceStub) -> None:
    session = await replayed_session(stub, 200_000, 30)
    minimal = (await compact(stub, session.id, dry_run=True)).result
    kept = (await compact(stub, session.id, keep_tokens=4000)).result
    assert kept.action == pb.ACTION_FOLDED
    verbatim = sum(m.tokens for m in kept.messages[3:])
    assert len(kept.messages) > len(minimal.messages) and verbatim <= 4000 + max(m.tokens for m in kept.messages[3:])


async def test_compact_dry_run_installs_nothing(stub: pb_grpc.ContextServiceStub) -> None:
    session = await replayed_session(stub, 200_000, 30)
    before = (await prepare(stub, session.id)).result
    dry = (await compact(stub, session.id, dry_run=True)).result
    assert dry.not_folded_reason == pb.NOT_FOLDED_REASON_DRY_RUN and "dry run" in dry.not_folded_detail
    assert dry.action == pb.ACTION_NONE and dry.checkpoint_id == "" and dry.view_version == 0
    assert dry.candidate_summary and [m.content for m in dry.messages if m.summary] == [dry.candidate_summary]
    assert dry.estimated_tokens < before.estimated_tokens
    after = (await prepare(stub, session.id)).result
    assert (await stub.GetSession(pb.GetSessionRequest(session_id=session.id))).session.checkpoint_id == ""
    assert list(after.messages) == list(before.messages)
    # The candidate's index was not stored either.
    await expect_error(
        stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session.id, result_ref=dry.folded_results_ref)),
        grpc.StatusCode.NOT_FOUND,
        "RESULT_REF_NOT_FOUND",
    )


async def test_compact_with_nothing_to_fold_says_why(stub: pb_grpc.ContextServiceStub) -> None:
    session = await replayed_session(stub, 200_000, 2)  # the task and one call group
    result = (await compact(stub, session.id)).result
    assert result.action == pb.ACTION_NONE
    assert result.not_folded_reason == pb.NOT_FOLDED_REASON_NOTHING_OUTSIDE_KEPT_SET
    assert "kept set" in result.not_folded_detail
    await expect_error(
        stub.Compact(pb.CompactRequest(session_id=session.id, keep_tokens=-1)).read(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        {"field": "keep_tokens"},
    )


async def test_a_session_of_the_persons_short_messages_folds_at_the_smallest_window(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    """A short message takes more tokens as a standing instruction than as a message: the engine's sections keep
    within what the view holds beside a summary, so folding them makes the view smaller and every Prepare answers
    (at the smallest window their minimums took the view above its ceiling, every Prepare failing from then on)."""
    session = await create_session(stub, context_window=MIN_CONTEXT_WINDOW, max_output_tokens=64)
    said = [f"[{i}] yes, go on" for i in range(150)]
    folds = 0
    for text in said:
        folds += (await prepare(stub, session.id, user(text))).result.action == pb.ACTION_FOLDED
    result = (await prepare(stub, session.id)).result
    assert folds >= 2
    view = "\n".join(m.content for m in result.messages)
    index = await read_all(stub, session.id, result.folded_results_ref)
    assert all(text in view or json.dumps(text) in index for text in said)  # an anchor, an instruction, listed

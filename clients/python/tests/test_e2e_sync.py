"""End-to-end tests of the blocking `Client` against a real ctxfold server (see conftest.py)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from conformance import FIXTURE_DIR
from conftest import Server
from ctxfold_client import (
    Action,
    Client,
    ContextState,
    CtxfoldError,
    ErrorReason,
    FoldProgress,
    FoldStage,
    Role,
    SessionConfig,
    Usage,
    View,
    assistant,
    system,
    tool_call,
    tool_result,
    user,
)
from helpers import FOLDING_CONFIG, ROOMY_CONFIG, TOOL_SCHEMAS, multibyte_text, tool_pair

CLIENT_DIR = Path(__file__).resolve().parent.parent


def test_session_lifecycle(client: Client) -> None:
    config = SessionConfig(
        context_window=32_000, max_output_tokens=1024, system_prompt="Be brief.", tools=TOOL_SCHEMAS, model="m-1"
    )
    session = client.create_session(config)
    assert session.id
    assert session.head_seq == 0
    fetched = client.get_session(session.id)
    assert fetched.id == session.id
    assert fetched.config.context_window == 32_000
    assert fetched.config.compact_ratio == pytest.approx(0.80)  # the server's default, filled in
    assert fetched.config.prefold_ratio == 0.0  # the extractive summarizer answers at once: off
    ahead = client.create_session(config.replace(summarizer="extractive", prefold_ratio=0.5))
    assert ahead.config.prefold_ratio == pytest.approx(0.5)
    assert fetched.config.system_prompt == "Be brief."
    assert fetched.config.tools_json == session.config.tools_json

    appended = client.append_messages(session.id, [user("one"), assistant("two"), user("three"), assistant("four")])
    assert [m.seq for m in appended] == [1, 2, 3, 4]
    assert all(m.id for m in appended)
    assert client.get_session(session.id).head_seq == 4

    listed = list(client.list_messages(session.id, page_size=3))  # two pages
    assert [m.content for m in listed] == ["one", "two", "three", "four"]

    ids = [s.id for s in client.list_sessions(page_size=1)]
    assert session.id in ids
    assert len(ids) == len(set(ids))

    fork = client.fork(session.id, at_seq=2, config=SessionConfig(max_output_tokens=2048))
    head_fork = client.fork(session.id, at_head=True)
    assert head_fork.forked_at_seq == 4
    assert fork.id != session.id
    assert fork.forked_from_session_id == session.id
    assert fork.forked_at_seq == 2
    assert fork.config.max_output_tokens == 2048
    assert fork.config.context_window == 32_000
    assert [m.content for m in client.list_messages(fork.id)] == ["one", "two"]

    view = client.prepare(session.id)
    assert view.action is Action.NONE
    assert view.messages[0].role is Role.SYSTEM
    state: ContextState = client.get_context_state(session.id)
    assert state["schema_version"] == 3
    assert state["views"][-1]["version"] == view.view_version

    client.delete_session(session.id)
    with pytest.raises(CtxfoldError) as raised:
        client.get_session(session.id)
    assert raised.value.reason == ErrorReason.SESSION_NOT_FOUND
    assert [m.content for m in client.list_messages(fork.id)] == ["one", "two"]  # the fork survives
    client.delete_session(fork.id)
    client.delete_session(head_fork.id)


def test_error_is_mapped_with_reason_and_metadata(client: Client) -> None:
    with pytest.raises(CtxfoldError) as raised:
        client.get_session("s_does_not_exist")
    error = raised.value
    assert isinstance(error, Exception)
    assert error.code is grpc.StatusCode.NOT_FOUND
    assert error.reason == ErrorReason.SESSION_NOT_FOUND
    assert error.domain == "ctxfold.dev"
    assert error.metadata.get("session_id") == "s_does_not_exist"
    assert error.status is not None
    assert isinstance(error.__cause__, grpc.RpcError)
    assert "SESSION_NOT_FOUND" in str(error)


def test_more_error_reasons(client: Client) -> None:
    with pytest.raises(CtxfoldError) as raised:
        client.create_session(SessionConfig(context_window=4000, compact_ratio=2.0))
    assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.reason == ErrorReason.INVALID_CONFIG

    session = client.create_session(ROOMY_CONFIG)
    client.append_messages(session.id, [user("go"), assistant(tool_calls=[tool_call("c1", "list_files", {"p": 1})])])
    with pytest.raises(CtxfoldError) as raised:
        client.append_messages(session.id, [user("are you done?")])
    assert raised.value.reason == ErrorReason.TOOL_RESULTS_PENDING
    with pytest.raises(CtxfoldError) as raised:
        client.prepare(session.id, [user("still waiting")])
    assert raised.value.reason == ErrorReason.TOOL_RESULTS_PENDING
    client.append_messages(session.id, [tool_result("c1", "done")])


def test_the_readme_agent_loop_replays_the_recorded_trace(server: Server) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctxfold_client.examples.agent_loop",
            str(FIXTURE_DIR / "agent_trace.json"),
            server.address,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "fold FOLD_STAGE_PASS_COMMITTED" in done.stdout
    summary = done.stdout.strip().splitlines()[-1]
    calls, folds, reads = (int(summary.split(word)[0].split()[-1]) for word in (" model calls", " folds", " read_"))
    assert calls > 30
    assert folds >= 1
    assert reads >= 1


def test_the_readme_shows_the_agent_loop_example() -> None:
    readme = (CLIENT_DIR / "README.md").read_text(encoding="utf-8")
    example = (CLIENT_DIR / "src" / "ctxfold_client" / "examples" / "agent_loop.py").read_text(encoding="utf-8")
    block = readme.split("<!-- agent-loop -->\n```python\n", 1)[1].split("```", 1)[0]
    assert block == example, "README.md shows a different agent loop than examples/agent_loop.py"


def test_delta_views_are_applied(server: Server, client: Client) -> None:
    session = client.create_session(ROOMY_CONFIG.replace(system_prompt="Delta test."))
    with Client(server.address, view_cache_size=0) as whole:
        first = client.prepare(session.id, [user("hello")])
        second = client.prepare(session.id, [assistant("hi"), user("next")])  # a delta on the wire
        assert second.stable_prefix_messages >= len(first.messages)
        assert second.messages[: len(first.messages)] == first.messages
        reference = whole.prepare(session.id)
        assert second.messages == reference.messages
        assert reference.view_version == second.view_version

        # Another client rewinds and writes a different branch: this client's known view is stale
        # and must not be extended by a delta.
        whole.rewind(session.id, 1)
        whole.append_messages(session.id, [assistant("a different answer")])
        third = client.prepare(session.id, [user("after the rewind")])
        assert [m.content for m in third.messages[1:]] == ["hello", "a different answer", "after the rewind"]
        assert third.messages == whole.prepare(session.id).messages


def test_read_tool_result_round_trip(client: Client) -> None:
    session = client.create_session(ROOMY_CONFIG)
    raw = multibyte_text(80_000)
    raw_bytes = raw.encode()
    assert len(raw_bytes) > 32 * 1024
    stored = client.append_messages(
        session.id,
        [
            user("dump the log"),
            assistant(tool_calls=[tool_call("call_big", "read_log", {"path": "app.log"})]),
            tool_result("call_big", raw),
        ],
    )[-1]
    assert stored.truncated
    assert stored.raw_bytes == len(raw_bytes)
    assert stored.result_ref

    view = client.prepare(session.id)
    shown = next(m for m in view.messages if m.tool_call_id == "call_big")
    assert stored.result_ref in shown.content  # the marker names the ref
    assert len(shown.content.encode()) < len(raw_bytes)

    whole = client.read_tool_result(session.id, tool_call_id="call_big")
    assert whole.text == raw
    assert whole.raw == raw_bytes
    assert whole.sha256 == hashlib.sha256(raw_bytes).hexdigest()
    assert whole.total_bytes == len(raw_bytes)
    assert whole.result_ref == stored.result_ref
    assert len(list(client.tool_result_pages(session.id, result_ref=stored.result_ref))) >= 4  # 16 KiB pages

    small = client.read_tool_result(session.id, result_ref=stored.result_ref, page_bytes=4099)
    assert small.raw == raw_bytes

    pages = list(client.tool_result_pages(session.id, result_ref=stored.result_ref, page_bytes=24_576))
    assert pages[-1].complete
    assert "".join(p.data for p in pages).encode() == raw_bytes
    assert all(p.next_offset - p.offset <= 24_576 for p in pages)

    tail_start = len(raw[: len(raw) // 2].encode())
    tail = "".join(
        p.data for p in client.tool_result_pages(session.id, result_ref=stored.result_ref, offset=tail_start)
    )
    assert tail.encode() == raw_bytes[tail_start:]

    with pytest.raises(CtxfoldError) as raised:
        list(
            client.tool_result_pages(
                session.id, result_ref=stored.result_ref, offset=raw_bytes.index("漢".encode()) + 1
            )
        )
    assert raised.value.reason == ErrorReason.OFFSET_NOT_CHAR_BOUNDARY


def test_edit_helper(client: Client) -> None:
    session = client.create_session(ROOMY_CONFIG)
    first = client.append_messages(session.id, [user("What is 2+2?"), assistant("5")])
    client.append_messages(session.id, [user("Are you sure?")])
    new = client.edit(session.id, first[0], user("What is 2+3?"))
    assert new.seq == 1
    assert new.content == "What is 2+3?"
    assert [m.content for m in client.list_messages(session.id)] == ["What is 2+3?"]
    everything = list(client.list_messages(session.id, include_abandoned=True))
    assert {m.content for m in everything if m.abandoned} == {"What is 2+2?", "5", "Are you sure?"}
    view = client.prepare(session.id, [assistant("5")])
    assert [m.content for m in view.messages] == ["What is 2+3?", "5"]
    edited = client.edit(session.id, 2, assistant("Five."))
    assert edited.seq == 2
    assert [m.content for m in client.prepare(session.id).messages] == ["What is 2+3?", "Five."]


def test_retry_helper(client: Client) -> None:
    session = client.create_session(ROOMY_CONFIG.replace(system_prompt="Answer in one word."))
    before = client.prepare(session.id, [user("Capital of France?")])
    answer = client.append_messages(session.id, [assistant("Lyon")])[0]
    client.prepare(session.id, [user("Sure?")])
    seen: list[FoldProgress] = []
    again = client.retry(session.id, answer, on_progress=seen.append)
    assert isinstance(again, View)
    assert again.messages == before.messages
    assert again.messages[-1].content == "Capital of France?"
    fixed = client.append_messages(session.id, [assistant("Paris")])[0]
    assert fixed.seq == answer.seq
    assert [m.content for m in client.list_messages(session.id)] == ["Capital of France?", "Paris"]


def test_compact_observe_usage_and_idempotent_append(client: Client) -> None:
    session = client.create_session(FOLDING_CONFIG)
    client.append_messages(session.id, [system("Pinned rule: never delete files.", pinned=True), user("start")])
    for index in range(3):
        client.append_messages(session.id, tool_pair(index, "compact"))
    view = client.prepare(session.id)
    assert view.estimated_input_tokens == view.estimated_tokens - FOLDING_CONFIG.max_output_tokens
    usage = client.observe_usage(session.id, view, Usage(input_tokens=view.estimated_input_tokens, output_tokens=10))
    assert usage.calibration_accepted and usage.calibration == 1.0  # the input alone: nothing to correct

    events: list[FoldProgress] = []
    compacted = client.compact(session.id, focus="keep the file names", on_progress=events.append)
    assert compacted.action is Action.FOLDED
    assert compacted.summary is not None
    assert any(e.stage is FoldStage.PASS_COMMITTED for e in events)
    assert any("Pinned rule" in m.content for m in compacted.messages)

    again = client.append_messages(session.id, [user("once")], request_id="req-1")
    repeat = client.append_messages(session.id, [user("once")], request_id="req-1")
    assert [m.id for m in again] == [m.id for m in repeat]


def test_prepare_events_iterator_and_early_stop(client: Client) -> None:
    session = client.create_session(FOLDING_CONFIG)
    client.append_messages(session.id, [user("go")])
    kinds: list[str] = []
    for index in range(8):
        for event in client.prepare_events(session.id, tool_pair(index)):
            kinds.append("result" if isinstance(event, View) else event.stage.name)
    assert kinds.count("result") == 8
    assert "PASS_COMMITTED" in kinds

    events = client.prepare_events(session.id, [user("and now?")])
    last = list(events)[-1]
    assert isinstance(last, View)
    stopped = client.prepare_events(session.id)
    next(stopped)
    stopped.close()  # cancels the call; the client stays usable
    assert client.get_session(session.id).id == session.id


def test_overflow_folds_below_the_trigger(client: Client) -> None:
    session = client.create_session(FOLDING_CONFIG)
    client.append_messages(session.id, [user("go"), *tool_pair(1), *tool_pair(2), *tool_pair(3)])
    below = client.prepare(session.id)
    assert below.action is Action.NONE
    assert below.estimated_tokens < below.trigger_tokens
    after = client.prepare(session.id, overflow=True, traceparent=f"00-{'3' * 32}-{'4' * 16}-01")
    assert after.action is Action.FOLDED
    assert after.estimated_tokens < below.estimated_tokens

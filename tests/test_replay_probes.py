"""The replay probes: who typed what (one rule for every agent shape, checked on all six recorded
traces), which paths an agent's actions touched, and the four scores of a view, on tiny synthetic
traces whose answers are known; then the probes of a real replay through a real server."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import grpc
import pytest

from conftest import settings_for
from ctxfold.engine.model import ToolCall
from ctxfold.replay import probes
from ctxfold.replay.options import Options, load_trace_file
from ctxfold.replay.rpc import read_documents
from ctxfold.replay.runner import replay_through
from ctxfold.replay.trace import Msg, Trace
from ctxfold.server import start
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

TRACES = Path(__file__).resolve().parent / "data" / "traces"
needs_traces = pytest.mark.skipif(not (TRACES / "swe-agent-pydicom-1458.json").exists(), reason="no traces")


def trace_of(*messages: Msg) -> Trace:
    return Trace("t", "sys", "[]", tuple(dataclasses.replace(m, source=i) for i, m in enumerate(messages)))


def call(id_: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(id_, name, json.dumps(arguments))


# ---- who typed what ---------------------------------------------------------------------------------


@needs_traces
@pytest.mark.parametrize(
    ("name", "person", "tool_outputs"),
    [
        # Tool calling: output is role tool, so every user message is the person's but for harness text
        # (OpenHands' "Added workspace context"; its tool-call validation errors count as the person's:
        # counted, kept cheaply).
        ("mini-swe-agent-django-11910.json", {0}, 137),
        ("openhands-django-11149.json", {0}, 49),
        ("openhands-multi-swe-bench-0.json", {0}, 22),
        ("openhands-multi-swe-bench-1.json", {0, 26}, 32),
        ("openhands-multi-swe-bench-2.json", {0, 52}, 49),
        # Text actions: the demonstration and the issue come before any action; every later user
        # message answers a fenced command and is its output.
        ("swe-agent-pydicom-1458.json", {0, 1}, 11),
    ],
)
def test_person_typed_and_tool_output_on_every_recorded_trace(name: str, person: set[int], tool_outputs: int) -> None:
    trace = load_trace_file(TRACES / name)
    roles = probes.classify(trace)
    assert set(roles.person) == person
    assert len(roles.tool_output) == tool_outputs
    assert not roles.person & roles.tool_output
    users = {m.source for m in trace.messages if m.role == "user"}
    assert users <= roles.person | roles.tool_output | roles.machine and roles.machine <= users


def test_harness_text_is_machine_written_and_quoting_it_as_the_persons_is_counted() -> None:
    trace = trace_of(
        Msg("user", "Fix the bug"),
        Msg("assistant", "", tool_calls=(call("c1", "Read", file_path="/repo/src/a.py"),)),
        Msg("tool", "code", tool_call_id="c1"),
        Msg("user", "[Request interrupted by user for tool use]"),
        Msg("user", "<task-notification><task-id>b1</task-id></task-notification>"),
        Msg("user", "Use the other parser."),
        Msg("assistant", "ok"),
    )
    roles = probes.classify(trace)
    assert (set(roles.person), set(roles.machine)) == ({0, 5}, {3, 4})
    quoting = Msg("user", "## Standing instructions\n[Request interrupted by user for tool use]", summary=True)
    assert probes.score(trace, [quoting], 6).machine_quoted == 1
    assert probes.score(trace, [Msg("user", "Use the other parser.", summary=True)], 6).machine_quoted == 0


def test_a_directory_listing_names_its_files() -> None:
    text = "Files by directory (...):\n/repo/src/: a.py E, b.py\n./: notes.md W\nCommands: `ls`"
    assert probes.listed_paths(text) == {"/repo/src/a.py", "/repo/src/b.py", "notes.md"}
    under_a_root = "/repo/x/:\n  ./: a.py E, b c.md\n  src/: d.py\n/other/: e.py\n  f/: g.py"
    assert probes.listed_paths(under_a_root) == {"/repo/x/a.py", "/repo/x/b c.md", "/repo/x/src/d.py", "/other/e.py"}
    trace = trace_of(
        Msg("user", "go"),
        Msg("assistant", "", tool_calls=(call("c1", "Read", file_path="/repo/src/b.py"),)),
        Msg("tool", "x", tool_call_id="c1"),
        Msg("assistant", "", tool_calls=(call("c2", "Write", file_path="notes.md"),)),
        Msg("tool", "y", tool_call_id="c2"),
    )
    assert probes.score(trace, [Msg("user", text, summary=True)], 5).paths_named == 2


def test_hostile_commands_are_read_in_linear_time() -> None:
    """A recorded trace is any file a user replays: a command of a long hyphenated run, an unterminated
    here-document or a long quoted word took seconds to hours to read for paths (each scan from every start)."""
    started = time.perf_counter()
    hostile = ("a-" * 50_000, "cat <<" + "a" * 200_000, "echo '" + "word " * 200_000 + "'")
    calls = tuple(call(f"c{n}", "bash", command="cat out.txt " + command) for n, command in enumerate(hostile))
    assert probes.message_paths(Msg("assistant", "", tool_calls=calls), text_actions=False) == ["out.txt"] * 3
    assert time.perf_counter() - started < 5  # seconds to hours each before
    assert probes.message_paths(
        Msg("assistant", "", tool_calls=(call("u", "bash", command="curl https://x.org/a.py > b.py"),)), False
    ) == ["b.py"]


def test_in_a_text_action_trace_a_reply_to_an_assistant_that_did_not_act_is_the_persons() -> None:
    trace = trace_of(
        Msg("user", "Fix the bug"),
        Msg("assistant", "Looking.\n```\nopen app/x.py\n```"),
        Msg("user", "[File: app/x.py]"),  # the output of `open`
        Msg("assistant", "Should I also update the docs?"),  # no action: the floor goes to the person
        Msg("user", "Yes, and keep the changelog short"),
        Msg("assistant", "```\nsubmit\n```"),
    )
    roles = probes.classify(trace)
    assert (set(roles.person), set(roles.tool_output)) == ({0, 4}, {2})


def test_with_tool_calls_a_reply_after_an_answer_with_a_code_block_is_still_the_persons() -> None:
    # A chat agent's answer often ends in a code block; the person's reply to it is no tool output.
    trace = trace_of(
        Msg("user", "Fix the bug"),
        Msg("assistant", "", tool_calls=(call("a", "Read", file_path="app/x.py"),)),
        Msg("tool", "def f(): ...", tool_call_id="a"),
        Msg("assistant", "Here is the fix:\n```python\ndef f(): return 1\n```"),
        Msg("user", "Good, now add a test for it"),
        Msg("assistant", "Done."),
    )
    roles = probes.classify(trace)
    assert (set(roles.person), set(roles.tool_output)) == ({0, 4}, {2})


# ---- touched paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool_call", "expected"),
    [
        (call("a", "str_replace_editor", command="view", path="/workspace/src/cli.pony"), ["/workspace/src/cli.pony"]),
        (call("a", "Read", file_path="/home/me/app/main.go"), ["/home/me/app/main.go"]),
        (call("a", "Edit", file_path="pkg/a.py", old_string="x", new_string="y"), ["pkg/a.py"]),
        (call("a", "Write", file_path="./notes.md", content="see /etc/hosts"), ["notes.md"]),
        (call("a", "execute_bash", command="cd /testbed && python -m pytest tests/test_x.py -q 2>/dev/null"),
         ["/testbed", "tests/test_x.py"]),
        # A here-document's body is a script, not paths; the file it writes is one.
        (call("a", "bash", command="cat > t.py << 'EOF'\nimport django.conf\nopen('a/b.py')\nEOF\npython t.py"),
         ["t.py"]),
        (call("a", "bash", command="curl -s https://example.com/x.json | grep -n 'a/b' README"), []),
        (call("a", "Bash", command="sed -n '1,40p' src/lib/match.c"), ["src/lib/match.c"]),
        (call("a", "Bash", command="curl -s http://localhost:8081/openapi.json > api.json"), ["api.json"]),
        (call("a", "shell", command=["bash", "-lc", "cat src/a.rs"]), ["src/a.rs"]),
        (call("a", "grep_files", pattern="x", path="/repo/src"), ["/repo/src"]),
        (ToolCall("a", "apply_patch", "*** Begin Patch\n*** Update File: src/b.rs\n@@\n-x\n+y\n*** End Patch"),
         ["src/b.rs"]),
    ],
)  # fmt: skip
def test_touched_paths_from_tool_call_arguments(tool_call: ToolCall, expected: list[str]) -> None:
    trace = trace_of(Msg("user", "go"), Msg("assistant", "", tool_calls=(tool_call,)))
    assert probes.touched_paths(trace, 2) == expected


def test_touched_paths_from_text_actions_skip_an_edit_body() -> None:
    trace = trace_of(
        Msg("user", "go"),
        Msg("assistant", "Open it.\n```\nopen pydicom/handlers/numpy_handler.py\n```"),
        Msg("user", "[File: ...]"),
        Msg("assistant", "```\nedit 10:12\n    x = load('data/other.py')\nend_of_edit\n```"),
        Msg("user", "ok"),
        Msg("assistant", "```\ncreate reproduce.py\n```"),
    )
    assert probes.touched_paths(trace, 6) == ["pydicom/handlers/numpy_handler.py", "reproduce.py"]
    assert probes.touched_paths(trace, 3) == ["pydicom/handlers/numpy_handler.py"]  # only what was appended


# ---- the scores of a view ---------------------------------------------------------------------------

TASK = "Fix the failing test in app/models.py. " + "Context line. " * 40  # longer than HEAD_CHARS
INSTRUCTION = "Do not touch the migrations; run only tests/test_models.py"
RESULT_A = "alpha output " * 30
RESULT_B = "beta output " * 30
CONVERSATION = trace_of(
    Msg("user", TASK),
    Msg("assistant", "", tool_calls=(call("a", "Read", file_path="app/models.py"),)),
    Msg("tool", RESULT_A, tool_call_id="a"),
    Msg("assistant", "Found it."),
    Msg("user", INSTRUCTION),
    Msg("assistant", "", tool_calls=(call("b", "Bash", command="pytest tests/test_models.py"),)),
    Msg("tool", RESULT_B, tool_call_id="b"),
    Msg("assistant", "Done."),
)
REFS = {2: "tr_aaaaaaaaaaaaaaaa", 6: "tr_bbbbbbbbbbbbbbbb"}
INDEX = "tr_iiiiiiiiiiiiiiii"
ALL = probes.ProbeScores(1, 1, 1, 1, 2, 2, 0, 0)


def summary(text: str) -> Msg:
    return Msg("user", text, summary=True)


@pytest.mark.parametrize(
    ("view", "documents", "expected"),
    [
        ("everything", {}, ALL),
        # The view lost the task, the instruction, both results and one path.
        ("summary only", {}, probes.ProbeScores(1, 0, 1, 0, 2, 1, 2, 0)),
        # A bounded task (head + reference) that the service serves counts; one it does not, does not.
        ("bounded task", {INDEX: TASK}, probes.ProbeScores(1, 1, 1, 1, 2, 2, 0, 0)),
        ("bounded task", {}, probes.ProbeScores(1, 0, 1, 1, 2, 2, 0, 0)),
        ("task reference, no head", {INDEX: TASK}, probes.ProbeScores(1, 0, 1, 1, 2, 2, 0, 0)),
        # Hidden results: one by its own ref in a stub, the other only through an index the view names.
        ("stub and index", {INDEX: f"{REFS[6]} Bash pytest 360 bytes"}, probes.ProbeScores(1, 1, 1, 1, 2, 2, 2, 2)),
        ("stub and index", {}, probes.ProbeScores(1, 1, 1, 1, 2, 2, 2, 1)),
        # An index whose reference the view does not name reaches nothing.
        ("stub, index not named", {INDEX: REFS[6]}, probes.ProbeScores(1, 1, 1, 1, 2, 2, 2, 1)),
    ],
)
def test_scores_of_a_view(view: str, documents: dict[str, str], expected: probes.ProbeScores) -> None:
    messages = CONVERSATION.messages
    stub_a = Msg("tool", f"[pruned: ReadToolResult(result_ref={REFS[2]})]", tool_call_id="a", source=2)
    views = {
        "everything": [Msg("system", "sys"), *messages],
        "summary only": [summary("Earlier: the agent read app/models.py."), messages[7]],
        "bounded task": [Msg("user", TASK[:200] + f" [rest: {INDEX}]"), *messages[1:]],
        "task reference, no head": [Msg("user", f"[task: {INDEX}]"), *messages[1:]],
        "stub and index": [
            messages[0], messages[1], stub_a, summary(f"{INSTRUCTION}\nfolded results: {INDEX}"), messages[5],
        ],
        "stub, index not named": [messages[0], messages[1], stub_a, summary(INSTRUCTION), messages[5]],
    }  # fmt: skip
    assert probes.score(CONVERSATION, views[view], 8, REFS, documents) == expected


def test_only_what_was_appended_is_scored() -> None:
    # Before the instruction and the second call were appended, there is nothing of them to keep.
    assert probes.score(CONVERSATION, [summary("nothing")], 3, REFS) == probes.ProbeScores(1, 0, 0, 0, 1, 0, 1, 0)


def test_a_result_shown_in_full_is_not_hidden_wherever_it_is() -> None:
    quoted = summary(f"{TASK}\n{INSTRUCTION}\nthe second run printed: {RESULT_B}\napp/models.py tests/test_models.py")
    assert probes.score(CONVERSATION, [quoted], 8, REFS) == probes.ProbeScores(1, 1, 1, 1, 2, 2, 1, 0)


# ---- through a real server --------------------------------------------------------------------------


async def test_documents_are_what_the_service_serves_for_the_references_a_view_names(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    session = (await stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(context_window=32000)))).session
    big = "".join(f"line {i:05d}\n" for i in range(3000))  # 33 KB: three pages
    appended = await stub.AppendMessages(
        pb.AppendMessagesRequest(
            session_id=session.id,
            messages=[
                pb.Message(role=pb.ROLE_USER, content="go"),
                pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c", name="cat", arguments="{}")]),
                pb.Message(role=pb.ROLE_TOOL, tool_call_id="c", content=big),
            ],
        )
    )
    ref = appended.messages[2].result_ref
    unknown = "tr_zzzzzzzzzzzzzzzz"  # not served: left out, not an error
    view = [Msg("user", f"index: {ref}; stale: {unknown}")]
    assert await read_documents(stub, session.id, view, trace_of(Msg("user", "go")), {}, ()) == {ref: big}
    # A tool result's own reference is not a document: it is scored as that result.
    tool_trace = trace_of(Msg("user", "go"), Msg("assistant", "", tool_calls=(call("c", "cat"),)), Msg("tool", big))
    assert await read_documents(stub, session.id, view, tool_trace, {2: ref}, ()) == {}
    # Another session's reference is NOT_FOUND in this one: nothing is read.
    other = (await stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(context_window=32000)))).session
    assert await read_documents(stub, other.id, view, trace_of(Msg("user", "go")), {}, ()) == {}


@needs_traces
async def test_ctxfold_replay_probes_on_a_real_trace(tmp_path: Path) -> None:
    running = await start(settings_for(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ContextServiceStub(channel)
            trace = load_trace_file(TRACES / "openhands-multi-swe-bench-0.json")
            result, recording = await replay_through(stub, trace, Options(window=8000))
    finally:
        await running.stop(grace=1.0)
    assert result.folds > 0
    final = recording.calls[-1].view
    scores = probes.score(trace, final, recording.appended, recording.refs, recording.documents)
    assert (result.task_kept, result.instructions_kept, result.paths_named) == (
        scores.task_kept,
        scores.instructions_kept,
        scores.paths_named,
    )
    assert (result.dropped_tool_results, result.recoverable_tool_results) == (
        scores.hidden_tool_results,
        scores.reachable_tool_results,
    )
    # The trace's own facts, independent of what ctxfold did.
    assert (result.instructions, result.paths) == (0, len(probes.touched_paths(trace, recording.appended))) == (0, 9)
    assert 0 < result.dropped_tool_results <= 22 and 0 <= result.recoverable_tool_results <= result.dropped_tool_results
    text = probes.view_text(final)
    assert all(ref in text and body for ref, body in recording.documents.items())


async def test_a_refused_prepare_is_a_failed_call_of_that_turn_and_the_replay_goes_on(
    stub: pb_grpc.ContextServiceStub,
) -> None:
    """A message from the person larger than the window cannot be bounded: that Prepare is refused.
    The bench counts it as the policy's failure at that turn (billed nothing) and goes on with the
    next turns, whose views name the results the refused turn appended."""
    huge = "Here is the whole log, read it all: " + "the build step failed again. " * 2500
    trace = trace_of(
        Msg("user", "Fix the build."),
        Msg("assistant", "", tool_calls=(call("c1", "bash", command="make"),)),
        Msg("tool", "make: *** [all] Error 2", tool_call_id="c1"),
        Msg("assistant", "The build fails."),
        Msg("user", huge),
        Msg("assistant", "I will read it."),
        Msg("user", "Just rerun make."),
        Msg("assistant", "", tool_calls=(call("c2", "bash", command="make"),)),
    )
    result, recording = await replay_through(stub, trace, Options(window=4000))
    assert [bool(c.refused) for c in recording.calls] == [False, False, True, False]
    assert recording.calls[2].refused.startswith("FAILED_PRECONDITION")
    assert result.refused_calls == 1 and result.turns == 4
    assert result.series_actions[2] == "refused" and result.series_view_tokens[2] == 0
    assert recording.refs[2]  # the refs of every stored result are known, whatever turn stored them
    assert recording.calls[-1].view  # the agent went on after the refused turn

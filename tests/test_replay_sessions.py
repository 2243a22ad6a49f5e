"""Native session logs as replayable traces (`ctxfold.replay.sessions`): the records of each format
that become messages and those that are bookkeeping, an assistant message joined from its blocks,
tool results kept right after their calls, and `parse_trace` reading a session log as it is."""

from __future__ import annotations

import json

import pytest

from ctxfold.replay import sessions
from ctxfold.replay.trace import parse_trace


def lines(*records: dict[str, object]) -> str:
    return "\n".join(json.dumps(r) for r in records) + "\n"


def user(content: object, **extra: object) -> dict[str, object]:
    return {"type": "user", "sessionId": "s", "message": {"role": "user", "content": content}, **extra}


def assistant(message_id: str, *blocks: dict[str, object], **extra: object) -> dict[str, object]:
    message = {"id": message_id, "role": "assistant", "content": list(blocks)}
    return {"type": "assistant", "sessionId": "s", "message": message, **extra}


def tool_use(call_id: str, name: str, **arguments: object) -> dict[str, object]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def tool_result(call_id: str, content: object) -> dict[str, object]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content}


CLAUDE_CODE = lines(
    {"type": "file-history-snapshot", "messageId": "x", "snapshot": {}},
    user("Fix the parser."),
    # One model answer written as one record per block: thinking, text, two parallel tool uses.
    assistant("msg_1", {"type": "thinking", "thinking": "Read both files."}),
    assistant("msg_1", {"type": "text", "text": "Reading."}),
    assistant("msg_1", tool_use("t1", "Read", file_path="/repo/a.py")),
    assistant("msg_1", tool_use("t2", "Read", file_path="/repo/b.py")),
    user([tool_result("t1", "a")]),
    # A reminder the harness sends while a result still waits is held until the results are in.
    user("<system-reminder>A file changed.</system-reminder>", isMeta=True),
    user([tool_result("t2", [{"type": "text", "text": "b"}, {"type": "image", "source": {}}])]),
    {"type": "system", "subtype": "stop_hook_summary", "content": "hooks ran"},
    assistant("msg_2", tool_use("t3", "Bash", command="pytest")),
    # An interrupted call: its result and the notice in one record.
    user([tool_result("t3", "Interrupted"), {"type": "text", "text": "[Request interrupted by user for tool use]"}]),
    assistant("msg_side", {"type": "text", "text": "a subagent's message"}, isSidechain=True),
    {"type": "system", "subtype": "compact_boundary", "content": "Conversation compacted"},
    user(
        "This session is being continued from a previous conversation that ran out of context.", isCompactSummary=True
    ),
    assistant("msg_3", tool_use("t4", "Edit", file_path="/repo/a.py", old_string="x", new_string="y")),
    # t4 has no recorded result, and the person speaks next.
    user("stop, use the other parser"),
    assistant("msg_4", {"type": "text", "text": "Switching."}),
)


def test_a_claude_code_session() -> None:
    document = sessions.convert("s.jsonl", CLAUDE_CODE)
    assert document["format"] == sessions.CLAUDE_CODE
    roles = [(m["role"], m.get("content", "")[:30]) for m in document["messages"]]
    assert roles == [
        ("user", "Fix the parser."),
        ("assistant", "Reading."),
        ("tool", "a"),
        ("tool", "b\n[image]"),
        ("user", "<system-reminder>A file change"),
        ("assistant", ""),
        ("tool", "Interrupted"),
        ("user", "[Request interrupted by user f"),
        ("user", "This session is being continue"),
        ("assistant", ""),
        ("tool", sessions.NO_RESULT[:30]),
        ("user", "stop, use the other parser"),
        ("assistant", "Switching."),
    ]
    first = document["messages"][1]
    assert first["reasoning_content"] == "Read both files."
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["Read", "Read"]
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"file_path": "/repo/a.py"}
    trace = parse_trace("s.jsonl", CLAUDE_CODE)  # `ctxfold replay` takes the log as it is
    assert len(trace.messages) == len(document["messages"])


def item(**payload: object) -> dict[str, object]:
    return {"type": "response_item", "payload": payload}


def said(role: str, text: str) -> dict[str, object]:
    kind = "output_text" if role == "assistant" else "input_text"
    return item(type="message", role=role, content=[{"type": kind, "text": text}])


PATCH = "*** Begin Patch\n*** Update File: src/a.rs\n*** End Patch"
CODEX = lines(
    {"type": "session_meta", "payload": {"id": "x", "cwd": "/repo", "instructions": "Be brief."}},
    said("developer", "<permissions>"),
    said("user", "<environment_context>\n</environment_context>"),
    said("user", "Rename the flag."),
    {"type": "turn_context", "payload": {"cwd": "/repo"}},
    item(type="reasoning", summary=[{"type": "summary_text", "text": "Find it first."}], encrypted_content="..."),
    item(
        type="function_call", name="shell", arguments=json.dumps({"command": ["bash", "-lc", "rg flag"]}), call_id="c1"
    ),
    item(type="function_call_output", call_id="c1", output=json.dumps({"output": "src/a.rs:3", "metadata": {}})),
    {"type": "event_msg", "payload": {"type": "token_count"}},
    item(type="custom_tool_call", name="apply_patch", input=PATCH, call_id="c2"),
    item(type="custom_tool_call_output", call_id="c2", output="Success."),
    said("assistant", "Renamed."),
)


def test_a_codex_cli_rollout() -> None:
    document = sessions.convert("rollout.jsonl", CODEX)
    messages = document["messages"]
    assert [(m["role"], m["content"][:20]) for m in messages] == [
        ("system", "Be brief."),
        ("system", "<permissions>"),
        ("user", "<environment_context"),
        ("user", "Rename the flag."),
        ("assistant", ""),
        ("tool", "src/a.rs:3"),
        ("assistant", ""),
        ("tool", "Success."),
        ("assistant", "Renamed."),
    ]
    assert messages[4]["reasoning_content"] == "Find it first."
    assert messages[6]["tool_calls"][0]["function"]["arguments"].startswith("*** Begin Patch")  # the raw input


CCTRACE = """<?xml version="1.0" ?>
<claude-session xmlns="https://claude.ai/session-export/v1" export-version="1.0">
  <messages>
    <message uuid="" timestamp=""><event-type>summary</event-type></message>
    <message uuid="u1"><event-type>user</event-type>
      <content><text>Find the logs.</text></content></message>
    <message uuid="a1"><event-type>assistant</event-type><request-id>r1</request-id>
      <content><thinking>Search.</thinking></content></message>
    <message uuid="a2"><event-type>assistant</event-type><request-id>r1</request-id>
      <content><tool-use id="t1" name="Bash"><input>{"command": "ls ~/.claude"}</input></tool-use></content></message>
    <message uuid="u2"><event-type>user</event-type>
      <content><tool-result tool-use-id="t1">projects</tool-result></content></message>
  </messages>
</claude-session>
"""


def test_a_cctrace_xml_export() -> None:
    messages = sessions.convert("conversation_full.xml", CCTRACE)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["reasoning_content"] == "Search." and messages[1]["tool_calls"][0]["id"] == "t1"
    assert messages[2] == {"role": "tool", "tool_call_id": "t1", "content": "projects"}


def test_what_is_no_session_log() -> None:
    assert sessions.detect('{"messages": []}') == ""
    with pytest.raises(sessions.SessionFormatError):
        sessions.convert("x.json", '{"role": "user", "content": "hi"}\n')

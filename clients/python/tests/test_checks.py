"""Without a server: the argument checks (clients/README.md, "Argument checks"), the JSON this SDK
writes ("JSON the SDKs write") and the tools of a provider request."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from ctxfold_client import (
    CLIENT_DOMAIN,
    Action,
    CtxfoldError,
    ErrorReason,
    Message,
    Role,
    SessionConfig,
    View,
    _json,
    adapters,
    assistant,
    pb,
    tool_call,
    tool_definitions,
    tool_result,
    user,
)
from ctxfold_client import _core as core


def _refused(reason: ErrorReason, call: Any, *args: Any, **kwargs: Any) -> CtxfoldError:
    with pytest.raises(CtxfoldError) as raised:
        call(*args, **kwargs)
    error = raised.value
    assert (error.code, error.reason, error.domain) == (grpc.StatusCode.INVALID_ARGUMENT, reason, CLIENT_DOMAIN)
    return error


# ---- the JSON this SDK writes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "written"),
    [
        (1.0, "1"),
        (0.5, "0.5"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (1.5e-6, "0.0000015"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e16, "10000000000000000"),
        (-2.5, "-2.5"),
        (0.1 + 0.2, "0.30000000000000004"),
        (5e-324, "5e-324"),
        (-0.0, "0"),
    ],
)
def test_numbers_are_written_as_javascript_writes_them(number: float, written: str) -> None:
    assert _json.dumps(number) == written


def test_json_keeps_key_order_and_escapes_only_what_json_needs() -> None:
    value = {"z": 1, "a": ["<&'=>", "é🙂\u2028", 'q"\\', "\n\t\x01\x7f"], "n": None, "t": True, "big": 2**70}
    assert _json.dumps(value) == (
        '{"z":1,"a":["<&\'=>","é🙂\u2028","q\\"\\\\","\\n\\t\\u0001\x7f"],"n":null,"t":true,"big":1180591620717411303424}'
    )
    assert _json.dumps(json.loads('"\\ud83d"')) == '"\\ud83d"'  # a lone surrogate, as JSON.stringify
    assert _json.normalized('{ "b" : 1.0, "a" : "\\u003c" }') == '{"b":1,"a":"<"}'


def test_tools_are_sent_in_the_one_form() -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "<é>", "parameters": {"minimum": 1.0}}}]
    written = '[{"type":"function","function":{"name":"f","description":"<é>","parameters":{"minimum":1}}}]'
    assert SessionConfig(tools=tools).tools_json == written
    assert SessionConfig(tools=json.dumps(tools, indent=2)).to_proto().tools_json == written
    assert tool_call("c1", "f", {"b": 1.0, "a": "<"}).arguments == '{"b":1,"a":"<"}'
    error = _refused(ErrorReason.INVALID_CONFIG, SessionConfig(tools="[{").to_proto)
    assert error.metadata["field"] == "tools_json"


# ---- argument checks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("context_window", -5),
        ("compact_ratio", 0.99),
        ("compact_ratio", 0.2),
        ("tail_ratio", 0.6),
        ("tail_ratio", -0.1),
        ("max_output_tokens", -1),
        ("summary_max_tokens", -1),
        ("cache_ttl_seconds", -1),
        ("tool_content_max_bytes", 100),
        ("tool_content_max_bytes", 2_000_000),
        ("prefold_ratio", 0.05),
        ("prefold_ratio", 1.0),
        ("prefold_ratio", -0.1),
    ],
)
def test_a_config_out_of_range_is_refused_as_the_server_would(field: str, value: float) -> None:
    error = _refused(ErrorReason.INVALID_CONFIG, SessionConfig, **{field: value})
    assert error.metadata["field"] == field
    assert error.message.startswith(f"config.{field}: ")


def test_a_config_at_the_ends_of_its_ranges_is_accepted() -> None:
    SessionConfig(context_window=1, compact_ratio=0.30, tail_ratio=0.5, tool_content_max_bytes=4096)
    SessionConfig(compact_ratio=0.95, tool_content_max_bytes=1_048_576)  # fork overrides: no window needed
    assert SessionConfig(prefold_ratio=0.0).to_proto().HasField("prefold_ratio")  # 0 is "off", sent
    assert not SessionConfig().to_proto().HasField("prefold_ratio")  # unset is the server's default
    error = _refused(ErrorReason.INVALID_CONFIG, core.create_request, SessionConfig(system_prompt="no window"))
    assert error.metadata["field"] == "context_window"


def test_request_arguments_are_refused_with_the_servers_reasons() -> None:
    _refused(ErrorReason.SESSION_ID_REQUIRED, core.checked, pb.GetSessionRequest())
    assert core.checked(pb.ListSessionsRequest()) == pb.ListSessionsRequest()  # names no session
    _refused(ErrorReason.INVALID_PAGE_SIZE, core.list_sessions_request, 1001)
    _refused(ErrorReason.INVALID_PAGE_SIZE, core.list_messages_request, "s1", -1, False)
    _refused(ErrorReason.INVALID_PAGE_SIZE, core.list_checkpoints_request, "s1", 101, False)
    assert core.list_checkpoints_request("s1", 100, False).page_size == 100
    _refused(ErrorReason.LIMIT_OUT_OF_RANGE, core.page_limit, 3)
    assert core.page_limit(4) == 4
    _refused(ErrorReason.OFFSET_OUT_OF_RANGE, core.ToolResultReader, "s1", tool_call_id="", result_ref="r", offset=-1,
             page_bytes=None, whole=False)  # fmt: skip
    _refused(ErrorReason.SEQ_OUT_OF_RANGE, core.rewind_request, "s1", -1)
    _refused(ErrorReason.INVALID_REQUEST, core.compact_request, "s1", "", -1, False)
    _refused(ErrorReason.SEQ_OUT_OF_RANGE, core.seq_before, 0)
    _refused(ErrorReason.INVALID_CLIENT_ARGUMENT, tool_definitions, "openai_chat_v2")


def test_text_that_is_not_unicode_is_refused_as_the_server_refuses_a_nul_naming_the_field() -> None:
    """A lone surrogate (text cut between the halves of an emoji, bytes decoded with surrogateescape) cannot be
    encoded: refused before any call, as every SDK does, instead of a UnicodeEncodeError."""
    cut = "😀".encode("utf-16-le")[:2].decode("utf-16-le", "surrogatepass")
    error = _refused(ErrorReason.INVALID_TEXT, core.append_request, "s1", [user("fine"), user(f"log {cut}")], "")
    assert error.metadata["field"] == "messages[1].content"
    call = assistant("", tool_calls=[tool_call("c1", "bash", f'{{"cmd": "{cut}"}}')])
    error = _refused(ErrorReason.INVALID_TEXT, core.prepare_request, "s1", [call], overflow=False, given_request_id="",
                     known_view_version=0)  # fmt: skip
    assert error.metadata["field"] == "append[0].tool_calls[0].arguments"
    error = _refused(
        ErrorReason.INVALID_TEXT, core.create_request, SessionConfig(context_window=16000, system_prompt=cut)
    )
    assert error.metadata["field"] == "config.system_prompt"


# ---- messages and the tools of a request ----------------------------------------------------------


def test_assistant_takes_its_tool_calls_positionally() -> None:
    call = tool_call("c1", "bash", {"command": "ls"})
    assert assistant("Listing.", [call]) == assistant("Listing.", tool_calls=[call])
    assert assistant("Listing.", [call]).tool_calls == (call,)


BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}


def _view(*messages: Message, folded_results_ref: str = "") -> View:
    return View(
        messages=messages, estimated_tokens=1, view_version=1, action=Action.NONE, folded_results_ref=folded_results_ref
    )


def test_the_read_tool_is_offered_when_the_view_hides_a_result() -> None:
    shown = _view(user("hi"))
    assert "tools" not in adapters.openai_chat.to_request(shown)
    assert adapters.openai_chat.to_request(shown, tools=[BASH])["tools"] == [BASH]
    bounded = Message(role=Role.TOOL, tool_call_id="c1", content="head … tail", truncated=True, result_ref="tr_1")
    hidden = _view(user("hi"), assistant("", [tool_call("c1", "bash")]), bounded)
    read = tool_definitions("openai_chat")[0]
    assert adapters.openai_chat.to_request(hidden, tools=[BASH])["tools"] == [BASH, read]
    assert adapters.openai_chat.to_request(hidden, tools=json.dumps([BASH, read]))["tools"] == [BASH, read]
    summarized = _view(Message(role=Role.USER, content="summary", summary=True), folded_results_ref="tr_9")
    assert adapters.anthropic_messages.to_request(summarized)["tools"] == tool_definitions("anthropic")[:1]
    assert adapters.openai_responses.to_request([tool_result("c1", "x")], tools=[]) == {
        "input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]
    }

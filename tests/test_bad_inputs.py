"""A table of bad inputs. Each must get its status code and ErrorInfo reason, and none may change
anything: the session's transcript is exactly what was appended before, and no table gains a row."""

from __future__ import annotations

import base64
import contextlib
import json
import random
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from builders import append as append_messages  # this file's append() makes the calls of the table
from builders import create_session, result, user
from ctxfold.config import Settings
from ctxfold.server import RunningServer
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from rpc_errors import error_info, expect_error

Stub = pb_grpc.ContextServiceStub
MiB = 1 << 20
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


# The texts of the messages the table sends when the text is not the point are not ASCII, on purpose:
# what was stored before must come back intact, multi-byte characters included.
USER_TEXT = "hello 你好"
RESULT_TEXT = "结果 😀 ok"


def assistant_calls(*call_ids: str) -> pb.Message:
    return pb.Message(
        role=pb.ROLE_ASSISTANT,
        content="let me look",
        tool_calls=[pb.ToolCall(id=i, name="read_file", arguments='{"path": "a.py"}') for i in call_ids],
    )


# Every session starts with this; with `open_call`, an assistant call that waits for its result follows.
BASELINE = [
    pb.Message(role=pb.ROLE_SYSTEM, content="You are a careful agent."),
    user(USER_TEXT),
    assistant_calls("call_a"),
    result("call_a", RESULT_TEXT),
    pb.Message(role=pb.ROLE_ASSISTANT, content="done ✅"),
]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@dataclass(frozen=True)
class Raw:
    """A request sent as raw bytes (for bytes no generated stub would write)."""

    method: str
    wire: Callable[[str], bytes]  # the request's bytes for session `sid`
    streaming: bool = False

    def __call__(self, channel: grpc.aio.Channel, sid: str) -> Awaitable[object]:
        path = f"/ctxfold.v1.ContextService/{self.method}"
        if self.streaming:
            return drain(channel.unary_stream(path)(self.wire(sid)))
        return channel.unary_unary(path)(self.wire(sid))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Case:
    id: str
    # Makes the bad call for session `sid` (preparing anything it needs first, with calls that succeed).
    call: Callable[[Stub, str], Awaitable[object]] | Raw
    code: grpc.StatusCode
    reason: str
    metadata: dict[str, str] = field(default_factory=dict)
    open_call: bool = False
    prepares_rows: bool = False  # the preparation writes rows (a second session), the bad call none


async def drain(call: AsyncIterable[object]) -> None:
    async for _ in call:
        pass


# Text a test replaces on the wire with as many bytes of invalid UTF-8.
BAD_TEXT = "\x01BAD\x01"


def bad_utf8(request: Message) -> bytes:
    wire = request.SerializeToString()
    assert BAD_TEXT.encode() in wire
    return wire.replace(BAD_TEXT.encode(), b"\xff\xfe\xc0\x80\xfd")


def truncated(request: Message, cut: int = 3) -> bytes:
    return request.SerializeToString()[:-cut]


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_token(scope: str) -> str:
    return b64(('{"s": "' + scope + '", "p": ' + deep_json(100_000) + "}").encode())


def prepare(*messages: pb.Message, request_id: str = "", sid: str = "") -> Callable[[Stub, str], Awaitable[object]]:
    return lambda stub, s: drain(
        stub.Prepare(pb.PrepareRequest(session_id=sid or s, append=list(messages), request_id=request_id))
    )


def fork(at_seq: int = 0, sid: str = "", **config: object) -> Callable[[Stub, str], Awaitable[object]]:
    return lambda stub, s: stub.Fork(
        pb.ForkRequest(session_id=sid or s, at_seq=at_seq, config=pb.SessionConfig(**config))  # type: ignore[arg-type]
    )


def rewind(to_seq: int, sid: str = "") -> Callable[[Stub, str], Awaitable[object]]:
    return lambda stub, s: stub.Rewind(pb.RewindRequest(session_id=sid or s, to_seq=to_seq))


def observe(sid: str = "", **usage: object) -> Callable[[Stub, str], Awaitable[object]]:
    return lambda stub, s: stub.ObserveUsage(pb.ObserveUsageRequest(session_id=sid or s, **usage))  # type: ignore[arg-type]


def append(*messages: pb.Message, request_id: str = "") -> Callable[[Stub, str], Awaitable[object]]:
    return lambda stub, sid: stub.AppendMessages(
        pb.AppendMessagesRequest(session_id=sid, messages=list(messages), request_id=request_id)
    )


def list_messages(
    page_size: int = 0, token: str = "", abandoned: bool = False
) -> Callable[[Stub, str], Awaitable[object]]:
    return lambda stub, sid: stub.ListMessages(
        pb.ListMessagesRequest(session_id=sid, page_size=page_size, page_token=token, include_abandoned=abandoned)
    )


def read_result(
    offset: int = 0, limit: int = 0, call_id: str = "call_a", ref: str = ""
) -> Callable[[Stub, str], Awaitable[object]]:
    return lambda stub, sid: stub.ReadToolResult(
        pb.ReadToolResultRequest(session_id=sid, tool_call_id=call_id, result_ref=ref, offset=offset, limit=limit)
    )


def create(**config: object) -> Callable[[Stub, str], Awaitable[object]]:
    return lambda stub, sid: stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(**config)))  # type: ignore[arg-type]


def bad_config(case_id: str, field_name: str, **config: object) -> Case:
    return Case(f"config-{case_id}", create(**config), INVALID, "INVALID_CONFIG", {"field": field_name})


async def token_of_other_session(stub: Stub, sid: str) -> object:
    other = (await create_session(stub, context_window=8000)).id
    await append_messages(stub, other, user("a"), user("b"))
    token = (await stub.ListMessages(pb.ListMessagesRequest(session_id=other, page_size=1))).next_page_token
    assert token
    return await list_messages(token=token)(stub, sid)


async def token_of_session_listing(stub: Stub, sid: str) -> object:
    await create_session(stub, context_window=8000)
    token = (await stub.ListSessions(pb.ListSessionsRequest(page_size=1))).next_page_token
    assert token
    return await list_messages(token=token)(stub, sid)


async def message_token_on_session_listing(stub: Stub, sid: str) -> object:
    token = (await stub.ListMessages(pb.ListMessagesRequest(session_id=sid, page_size=1))).next_page_token
    assert token
    return await stub.ListSessions(pb.ListSessionsRequest(page_token=token))


async def token_of_other_abandoned_flag(stub: Stub, sid: str) -> object:
    token = (await stub.ListMessages(pb.ListMessagesRequest(session_id=sid, page_size=1))).next_page_token
    assert token
    return await list_messages(token=token, abandoned=True)(stub, sid)


def forged_token(position: object) -> Callable[[Stub, str], Awaitable[object]]:
    """A well-formed token for this very listing whose position is not one the server wrote."""

    def call(stub: Stub, sid: str) -> Awaitable[object]:
        raw = json.dumps({"s": f"messages:{sid}:0", "p": position}).encode()
        return list_messages(token=b64(raw))(stub, sid)

    return call


CASES = [
    # ---- which session --------------------------------------------------------------------------
    Case(
        "append-empty-session-id", lambda stub, sid: append(user(USER_TEXT))(stub, ""), INVALID, "SESSION_ID_REQUIRED"
    ),
    Case(
        "get-empty-session-id",
        lambda stub, sid: stub.GetSession(pb.GetSessionRequest()),
        INVALID,
        "SESSION_ID_REQUIRED",
    ),
    Case(
        "delete-empty-session-id",
        lambda stub, sid: stub.DeleteSession(pb.DeleteSessionRequest()),
        INVALID,
        "SESSION_ID_REQUIRED",
    ),
    Case("list-empty-session-id", lambda stub, sid: list_messages()(stub, ""), INVALID, "SESSION_ID_REQUIRED"),
    Case("read-empty-session-id", lambda stub, sid: read_result()(stub, ""), INVALID, "SESSION_ID_REQUIRED"),
    Case(
        "append-unknown-session",
        lambda stub, sid: append(user(USER_TEXT))(stub, "s_nope"),
        NOT_FOUND,
        "SESSION_NOT_FOUND",
        {"session_id": "s_nope"},
    ),
    Case(
        "get-unknown-session",
        lambda stub, sid: stub.GetSession(pb.GetSessionRequest(session_id=sid + "x")),
        NOT_FOUND,
        "SESSION_NOT_FOUND",
    ),
    Case(
        "delete-unknown-session",
        lambda stub, sid: stub.DeleteSession(pb.DeleteSessionRequest(session_id="s_nope")),
        NOT_FOUND,
        "SESSION_NOT_FOUND",
    ),
    Case("list-unknown-session", lambda stub, sid: list_messages()(stub, "s_nope"), NOT_FOUND, "SESSION_NOT_FOUND"),
    Case("read-unknown-session", lambda stub, sid: read_result()(stub, "s_nope"), NOT_FOUND, "SESSION_NOT_FOUND"),
    Case(
        "get-absurdly-long-session-id",  # the echoed id is clipped so the status still reaches the client
        lambda stub, sid: stub.GetSession(pb.GetSessionRequest(session_id="s_" + "长" * 100_000)),
        NOT_FOUND,
        "SESSION_NOT_FOUND",
    ),
    Case(
        "nul-in-session-id",
        lambda stub, sid: stub.GetSession(pb.GetSessionRequest(session_id=sid + "\x00")),
        INVALID,
        "INVALID_TEXT",
        {"field": "session_id"},
    ),
    # ---- text PostgreSQL cannot hold: refused on every store alike ---------------------------------
    Case("nul-in-content", append(user("a\x00b")), INVALID, "INVALID_TEXT", {"field": "messages[0].content"}),
    # (a NUL in a tool result's content is accepted: test_tool_results.py, binary results)
    Case(
        "nul-in-call-arguments",
        append(
            user("ok"), pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c", name="f", arguments="\x00")])
        ),
        INVALID,
        "INVALID_TEXT",
        {"field": "messages[1].tool_calls[0].arguments"},
    ),
    Case(
        "nul-in-request-id",
        append(user(USER_TEXT), request_id="r\x00"),
        INVALID,
        "INVALID_TEXT",
        {"field": "request_id"},
    ),
    Case("nul-in-result-ref", read_result(call_id="", ref="tr_\x00"), INVALID, "INVALID_TEXT"),
    Case("nul-in-page-token-position", forged_token([1, 0, "m_\x00", "b_x"]), INVALID, "INVALID_PAGE_TOKEN"),
    Case(
        "nul-in-system-prompt",
        create(context_window=100_000, system_prompt="be\x00good"),
        INVALID,
        "INVALID_TEXT",
        {"field": "config.system_prompt"},
    ),
    # ---- malformed messages ---------------------------------------------------------------------
    Case("role-unspecified", append(pb.Message(content="hi")), INVALID, "INVALID_MESSAGE", {"index": "0"}),
    Case(
        "role-out-of-range",
        append(user(USER_TEXT), pb.Message(role=99, content="hi")),
        INVALID,
        "INVALID_MESSAGE",
        {"index": "1"},
    ),
    Case("role-negative", append(pb.Message(role=-1, content="hi")), INVALID, "INVALID_MESSAGE"),
    Case("tool-result-without-call-id", append(pb.Message(role=pb.ROLE_TOOL, content="x")), INVALID, "INVALID_MESSAGE"),
    Case(
        "tool-result-with-tool-calls",
        append(
            pb.Message(role=pb.ROLE_TOOL, tool_call_id="c", content="x", tool_calls=[pb.ToolCall(id="c", name="f")])
        ),
        INVALID,
        "INVALID_MESSAGE",
        open_call=True,
    ),
    Case(
        "user-with-tool-call-id",
        append(pb.Message(role=pb.ROLE_USER, content="x", tool_call_id="call_a")),
        INVALID,
        "INVALID_MESSAGE",
    ),
    Case(
        "user-with-tool-calls",
        append(pb.Message(role=pb.ROLE_USER, content="x", tool_calls=[pb.ToolCall(id="c", name="f")])),
        INVALID,
        "INVALID_MESSAGE",
    ),
    Case(
        "tool-call-without-id",
        append(pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(name="read_file")])),
        INVALID,
        "INVALID_MESSAGE",
    ),
    Case(
        "tool-call-without-name",
        append(pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="call_x")])),
        INVALID,
        "INVALID_MESSAGE",
    ),
    Case("duplicate-call-ids", append(assistant_calls("call_x", "call_y", "call_x")), INVALID, "INVALID_MESSAGE"),
    Case(
        "call-id-too-long",
        append(pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c" * 257, name="f")])),
        INVALID,
        "INVALID_MESSAGE",
    ),
    Case(
        "name-too-long", append(pb.Message(role=pb.ROLE_USER, content="x", name="n" * 129)), INVALID, "INVALID_MESSAGE"
    ),
    Case("empty-user-message", append(user("")), INVALID, "INVALID_MESSAGE"),
    Case("empty-assistant-message", append(pb.Message(role=pb.ROLE_ASSISTANT)), INVALID, "INVALID_MESSAGE"),
    Case("empty-system-message", append(pb.Message(role=pb.ROLE_SYSTEM)), INVALID, "INVALID_MESSAGE"),
    Case("request-id-too-long", append(user(USER_TEXT), request_id="r" * 129), INVALID, "INVALID_REQUEST_ID"),
    # ---- tool call order ------------------------------------------------------------------------
    Case(
        "result-answers-no-open-call",
        append(result("call_a", RESULT_TEXT)),
        PRECONDITION,
        "TOOL_CALL_NOT_OPEN",
        {"tool_call_id": "call_a"},
    ),
    Case(
        "result-answers-another-call",
        append(result("call_zzz", RESULT_TEXT)),
        PRECONDITION,
        "TOOL_CALL_NOT_OPEN",
        open_call=True,
    ),
    Case(
        "result-answered-twice",
        append(result("call_open", RESULT_TEXT), result("call_open", RESULT_TEXT)),
        PRECONDITION,
        "TOOL_CALL_NOT_OPEN",
        {"index": "1"},
        open_call=True,
    ),
    Case(
        "user-while-calls-wait",
        append(user("are you there?")),
        PRECONDITION,
        "TOOL_RESULTS_PENDING",
        {"waiting": "call_open"},
        open_call=True,
    ),
    Case(
        "assistant-while-calls-wait",
        append(pb.Message(role=pb.ROLE_ASSISTANT, content="I will skip the result")),
        PRECONDITION,
        "TOOL_RESULTS_PENDING",
        open_call=True,
    ),
    Case(
        "later-message-breaks-a-valid-batch",  # all or nothing: the valid first message is not kept
        append(user("fine"), assistant_calls("call_b"), user("too early")),
        PRECONDITION,
        "TOOL_RESULTS_PENDING",
        {"index": "2"},
    ),
    # ---- sizes ----------------------------------------------------------------------------------
    Case("message-over-4MiB", append(user("大" * (4 * MiB // 3 + 1))), EXHAUSTED, "MESSAGE_TOO_LARGE", {"index": "0"}),
    Case(
        "reasoning-over-4MiB",
        append(pb.Message(role=pb.ROLE_ASSISTANT, content="x", reasoning_content="r" * (4 * MiB))),
        EXHAUSTED,
        "MESSAGE_TOO_LARGE",
    ),
    Case(
        "arguments-over-4MiB",
        append(
            pb.Message(
                role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c", name="f", arguments="a" * (4 * MiB + 1))]
            )
        ),
        EXHAUSTED,
        "MESSAGE_TOO_LARGE",
    ),
    Case(
        "tool-result-over-the-limit",
        append(result("call_open", "r" * (Settings().max_tool_result_bytes + 1))),
        EXHAUSTED,
        "MESSAGE_TOO_LARGE",
        open_call=True,
    ),
    Case("too-many-messages", append(*[user(str(i)) for i in range(1001)]), EXHAUSTED, "TOO_MANY_MESSAGES"),
    # ---- paging ---------------------------------------------------------------------------------
    Case("list-messages-negative-page-size", list_messages(page_size=-1), INVALID, "INVALID_PAGE_SIZE"),
    Case(
        "list-sessions-negative-page-size",
        lambda stub, sid: stub.ListSessions(pb.ListSessionsRequest(page_size=-5)),
        INVALID,
        "INVALID_PAGE_SIZE",
    ),
    Case("garbage-page-token", list_messages(token="not a token!"), INVALID, "INVALID_PAGE_TOKEN"),
    Case("non-json-page-token", list_messages(token=b64(b"\xff\xfe\x00garbage")), INVALID, "INVALID_PAGE_TOKEN"),
    Case("json-array-page-token", list_messages(token=b64(b"[1, 2, 3]")), INVALID, "INVALID_PAGE_TOKEN"),
    Case(
        "garbage-session-page-token",
        lambda stub, sid: stub.ListSessions(pb.ListSessionsRequest(page_token="%%%")),
        INVALID,
        "INVALID_PAGE_TOKEN",
    ),
    Case("token-of-another-session", token_of_other_session, INVALID, "INVALID_PAGE_TOKEN", prepares_rows=True),
    Case(
        "session-listing-token-on-messages", token_of_session_listing, INVALID, "INVALID_PAGE_TOKEN", prepares_rows=True
    ),
    Case("message-token-on-session-listing", message_token_on_session_listing, INVALID, "INVALID_PAGE_TOKEN"),
    Case("token-of-other-abandoned-flag", token_of_other_abandoned_flag, INVALID, "INVALID_PAGE_TOKEN"),
    Case("forged-token-wrong-types", forged_token(["x", "y", "z", "w"]), INVALID, "INVALID_PAGE_TOKEN"),
    Case("forged-token-too-short", forged_token([1]), INVALID, "INVALID_PAGE_TOKEN"),
    Case("forged-token-nested", forged_token([[1], {"a": 2}, None]), INVALID, "INVALID_PAGE_TOKEN"),
    Case("forged-token-huge-seq", forged_token([10**30, 0, "m_x", "b_x"]), INVALID, "INVALID_PAGE_TOKEN"),
    Case("forged-token-bool", forged_token([True, 0, "m_x", "b_x"]), INVALID, "INVALID_PAGE_TOKEN"),
    Case(
        "forged-session-token-huge-time",  # an integer no float holds, where the token has a time
        lambda stub, sid: stub.ListSessions(
            pb.ListSessionsRequest(
                page_token=b64(json.dumps({"s": "sessions:default", "p": [10**400, "s_x"]}).encode())
            )
        ),
        INVALID,
        "INVALID_PAGE_TOKEN",
    ),
    Case(
        "forged-session-token",
        lambda stub, sid: stub.ListSessions(
            pb.ListSessionsRequest(page_token=b64(json.dumps({"s": "sessions:default", "p": ["soon", 3]}).encode()))
        ),
        INVALID,
        "INVALID_PAGE_TOKEN",
    ),
    # ---- ReadToolResult -------------------------------------------------------------------------
    Case("offset-inside-a-character", read_result(offset=1), INVALID, "OFFSET_NOT_CHAR_BOUNDARY", {"char_start": "0"}),
    Case("offset-negative", read_result(offset=-1), INVALID, "OFFSET_OUT_OF_RANGE"),
    Case("offset-past-the-end", read_result(offset=10**12), INVALID, "OFFSET_OUT_OF_RANGE"),
    Case("limit-too-small", read_result(limit=3), INVALID, "LIMIT_OUT_OF_RANGE"),
    Case("limit-too-large", read_result(limit=24577), INVALID, "LIMIT_OUT_OF_RANGE"),
    Case("limit-negative", read_result(limit=-16384), INVALID, "LIMIT_OUT_OF_RANGE"),
    Case("no-ref-no-call-id", read_result(call_id=""), INVALID, "RESULT_REF_REQUIRED"),
    Case("unknown-ref", read_result(call_id="", ref="tr_nope"), NOT_FOUND, "RESULT_REF_NOT_FOUND"),
    Case("unknown-call-id", read_result(call_id="call_nope"), NOT_FOUND, "TOOL_CALL_NOT_FOUND"),
    # ---- session configs ------------------------------------------------------------------------
    bad_config("window-missing", "context_window"),
    bad_config("window-zero", "context_window", context_window=0, compact_ratio=0.8),
    bad_config("window-negative", "context_window", context_window=-1),
    bad_config("window-absurd", "context_window", context_window=10**12),
    bad_config("ratio-0.2", "compact_ratio", context_window=100_000, compact_ratio=0.2),
    bad_config("ratio-0.99", "compact_ratio", context_window=100_000, compact_ratio=0.99),
    bad_config("ratio-negative", "compact_ratio", context_window=100_000, compact_ratio=-0.8),
    bad_config("ratio-nan", "compact_ratio", context_window=100_000, compact_ratio=float("nan")),
    bad_config("ratio-inf", "compact_ratio", context_window=100_000, compact_ratio=float("inf")),
    bad_config("tail-0.9", "tail_ratio", context_window=100_000, tail_ratio=0.9),
    bad_config("tail-negative", "tail_ratio", context_window=100_000, tail_ratio=-0.1),
    bad_config("tail-nan", "tail_ratio", context_window=100_000, tail_ratio=float("nan")),
    bad_config("output-negative", "max_output_tokens", context_window=100_000, max_output_tokens=-1),
    bad_config("output-fills-window", "max_output_tokens", context_window=1000, max_output_tokens=600),
    bad_config("output-above-window", "max_output_tokens", context_window=8000, max_output_tokens=9000),
    bad_config("summary-negative", "summary_max_tokens", context_window=100_000, summary_max_tokens=-1),
    bad_config("summary-too-big", "summary_max_tokens", context_window=4000, summary_max_tokens=3000),
    bad_config(
        "summary-plus-output-too-big",
        "summary_max_tokens",
        context_window=100_000,
        max_output_tokens=40_000,
        summary_max_tokens=40_000,
    ),
    bad_config("tool-bytes-tiny", "tool_content_max_bytes", context_window=100_000, tool_content_max_bytes=100),
    bad_config("tool-bytes-negative", "tool_content_max_bytes", context_window=100_000, tool_content_max_bytes=-1),
    bad_config("cache-ttl-negative", "cache_ttl_seconds", context_window=100_000, cache_ttl_seconds=-1),
    bad_config("tools-json-garbage", "tools_json", context_window=100_000, tools_json="{not json"),
    bad_config("tools-json-object", "tools_json", context_window=100_000, tools_json='{"name": "read_file"}'),
    bad_config("summarizer-unknown", "summarizer", context_window=100_000, summarizer="gpt-magic"),
    bad_config("summarizer-absurd", "summarizer", context_window=100_000, summarizer="総" * 50_000),
    bad_config("cache-key-too-long", "prompt_cache_key", context_window=100_000, prompt_cache_key="k" * 257),
]


def _bad_text_cases() -> list[Case]:
    """Undecodable requests: invalid UTF-8 in a string field, truncated or garbage protobuf bytes."""
    text = BAD_TEXT

    def in_append(**fields: object) -> Callable[[str], bytes]:
        return lambda sid: bad_utf8(pb.AppendMessagesRequest(session_id=sid, messages=[pb.Message(**fields)]))  # type: ignore[arg-type]

    return [
        Case(f"undecodable-{name}", Raw(method, wire, streaming), INVALID, "INVALID_REQUEST")
        for name, method, wire, streaming in [
            ("utf8-session-id", "GetSession", lambda sid: bad_utf8(pb.GetSessionRequest(session_id=text)), False),
            ("utf8-content", "AppendMessages", in_append(role=pb.ROLE_USER, content=text), False),
            (
                "utf8-reasoning",
                "AppendMessages",
                in_append(role=pb.ROLE_ASSISTANT, content="x", reasoning_content=text),
                False,
            ),
            ("utf8-name", "AppendMessages", in_append(role=pb.ROLE_USER, content="x", name=text), False),
            (
                "utf8-arguments",
                "AppendMessages",
                in_append(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c", name="f", arguments=text)]),
                False,
            ),
            (
                "utf8-request-id",
                "AppendMessages",
                lambda sid: bad_utf8(
                    pb.AppendMessagesRequest(session_id=sid, messages=[user(USER_TEXT)], request_id=text)
                ),
                False,
            ),
            (
                "utf8-system-prompt",
                "CreateSession",
                lambda sid: bad_utf8(
                    pb.CreateSessionRequest(config=pb.SessionConfig(context_window=8000, system_prompt=text))
                ),
                False,
            ),
            (
                "utf8-tools-json",
                "CreateSession",
                lambda sid: bad_utf8(
                    pb.CreateSessionRequest(config=pb.SessionConfig(context_window=8000, tools_json=text))
                ),
                False,
            ),
            ("utf8-page-token", "ListSessions", lambda sid: bad_utf8(pb.ListSessionsRequest(page_token=text)), False),
            (
                "utf8-prepare-append",
                "Prepare",
                lambda sid: bad_utf8(pb.PrepareRequest(session_id=sid, append=[user(text)])),
                True,
            ),
            (
                "utf8-compact-focus",
                "Compact",
                lambda sid: bad_utf8(pb.CompactRequest(session_id=sid, focus=text)),
                True,
            ),
            (
                "utf8-result-ref",
                "ReadToolResult",
                lambda sid: bad_utf8(pb.ReadToolResultRequest(session_id=sid, result_ref=text)),
                False,
            ),
            (
                "truncated-append",
                "AppendMessages",
                lambda sid: truncated(pb.AppendMessagesRequest(session_id=sid, messages=[user("hello world")])),
                False,
            ),
            (
                "truncated-create",
                "CreateSession",
                lambda sid: truncated(
                    pb.CreateSessionRequest(config=pb.SessionConfig(context_window=8000, model="gpt-x"))
                ),
                False,
            ),
            (
                "truncated-prepare",
                "Prepare",
                lambda sid: truncated(pb.PrepareRequest(session_id=sid, append=[user("hello world")])),
                True,
            ),
            (
                "truncated-fork",
                "Fork",
                lambda sid: truncated(pb.ForkRequest(session_id=sid, config=pb.SessionConfig(system_prompt="be good"))),
                False,
            ),
            (
                "truncated-session-id",
                "GetSession",
                lambda sid: truncated(pb.GetSessionRequest(session_id=sid), 1),
                False,
            ),
            ("garbage-bytes", "ListMessages", lambda sid: b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", False),
            ("end-group-tag", "Rewind", lambda sid: b"\x0c", False),
            ("length-past-end", "DeleteSession", lambda sid: b"\x0a\x7fshort", False),
        ]
    ]


CASES += _bad_text_cases()
CASES += [
    # ---- deeply nested JSON ---------------------------------------------------------------------
    bad_config("tools-json-981-deep", "tools_json", context_window=100_000, tools_json=deep_json(981)),
    bad_config("tools-json-65-deep", "tools_json", context_window=100_000, tools_json=deep_json(65)),
    Case("fork-tools-json-deep", fork(tools_json=deep_json(981)), INVALID, "INVALID_CONFIG", {"field": "tools_json"}),
    Case(
        "messages-page-token-deep",
        lambda stub, sid: list_messages(token=deep_token(f"messages:{sid}:0"))(stub, sid),
        INVALID,
        "INVALID_PAGE_TOKEN",
    ),
    Case(
        "sessions-page-token-deep",
        lambda stub, sid: stub.ListSessions(pb.ListSessionsRequest(page_token=deep_token("sessions:default"))),
        INVALID,
        "INVALID_PAGE_TOKEN",
    ),
    # ---- configs that leave no room ---------------------------------------------------------------
    bad_config("window-too-small", "context_window", context_window=200),
    bad_config("system-prompt-above-window", "system_prompt", context_window=2000, system_prompt="word " * 3000),
    Case(
        "fork-system-prompt-above-window",
        fork(system_prompt="word " * 200_000),
        INVALID,
        "INVALID_CONFIG",
        {"field": "system_prompt"},
    ),
    Case("fork-window-too-small", fork(context_window=100), INVALID, "INVALID_CONFIG", {"field": "context_window"}),
    # ---- page sizes above the maximum are refused, not clamped -------------------------------------
    Case("list-messages-page-size-1001", list_messages(page_size=1001), INVALID, "INVALID_PAGE_SIZE"),
    Case(
        "list-sessions-page-size-huge",
        lambda stub, sid: stub.ListSessions(pb.ListSessionsRequest(page_size=2**31 - 1)),
        INVALID,
        "INVALID_PAGE_SIZE",
    ),
    # ---- Fork, Rewind ---------------------------------------------------------------------------
    Case("fork-empty-session-id", lambda stub, sid: fork()(stub, ""), INVALID, "SESSION_ID_REQUIRED"),
    Case("fork-unknown-session", fork(sid="s_nope"), NOT_FOUND, "SESSION_NOT_FOUND"),
    Case("fork-past-the-head", fork(at_seq=99), PRECONDITION, "SEQ_OUT_OF_RANGE"),
    Case("fork-negative-seq", fork(at_seq=-1), INVALID, "SEQ_OUT_OF_RANGE"),
    Case("fork-bad-override", fork(compact_ratio=2.0), INVALID, "INVALID_CONFIG", {"field": "compact_ratio"}),
    Case("rewind-empty-session-id", lambda stub, sid: rewind(0)(stub, ""), INVALID, "SESSION_ID_REQUIRED"),
    Case("rewind-unknown-session", rewind(1, sid="s_nope"), NOT_FOUND, "SESSION_NOT_FOUND"),
    Case("rewind-past-the-head", rewind(99), PRECONDITION, "SEQ_OUT_OF_RANGE"),
    Case("rewind-negative-seq", rewind(-5), INVALID, "SEQ_OUT_OF_RANGE"),
    # ---- Prepare, Compact -----------------------------------------------------------------------
    Case("prepare-empty-session-id", lambda stub, sid: prepare()(stub, ""), INVALID, "SESSION_ID_REQUIRED"),
    Case("prepare-unknown-session", prepare(sid="s_nope"), NOT_FOUND, "SESSION_NOT_FOUND"),
    Case("prepare-bad-append", prepare(pb.Message(content="no role")), INVALID, "INVALID_MESSAGE"),
    Case("prepare-append-answers-no-call", prepare(result("call_a", RESULT_TEXT)), PRECONDITION, "TOOL_CALL_NOT_OPEN"),
    Case("prepare-append-while-calls-wait", prepare(user("hi")), PRECONDITION, "TOOL_RESULTS_PENDING", open_call=True),
    Case("prepare-request-id-too-long", prepare(user(USER_TEXT), request_id="r" * 129), INVALID, "INVALID_REQUEST_ID"),
    Case("prepare-nul-in-append", prepare(user("a\x00")), INVALID, "INVALID_TEXT"),
    Case(
        "compact-empty-session-id",
        lambda stub, sid: drain(stub.Compact(pb.CompactRequest())),
        INVALID,
        "SESSION_ID_REQUIRED",
    ),
    Case(
        "compact-unknown-session",
        lambda stub, sid: drain(stub.Compact(pb.CompactRequest(session_id="s_nope"))),
        NOT_FOUND,
        "SESSION_NOT_FOUND",
    ),
    # ---- ObserveUsage, GetContextState ----------------------------------------------------------
    Case("usage-negative-input", observe(input_tokens=-1), INVALID, "INVALID_USAGE"),
    Case("usage-negative-output", observe(output_tokens=-3), INVALID, "INVALID_USAGE"),
    Case("usage-cached-above-input", observe(input_tokens=10, cached_input_tokens=11), INVALID, "INVALID_USAGE"),
    # Summed, such numbers would pass int64 in the session's counters and the process's usage metric.
    Case("usage-input-above-any-window", observe(input_tokens=2**63 - 1), INVALID, "INVALID_USAGE"),
    Case("usage-output-above-any-window", observe(input_tokens=5, output_tokens=100_000_001), INVALID, "INVALID_USAGE"),
    Case("usage-unknown-session", observe(sid="s_nope", input_tokens=5), NOT_FOUND, "SESSION_NOT_FOUND"),
    Case(
        "state-empty-session-id",
        lambda stub, sid: stub.GetContextState(pb.GetContextStateRequest()),
        INVALID,
        "SESSION_ID_REQUIRED",
    ),
    Case(
        "state-unknown-session",
        lambda stub, sid: stub.GetContextState(pb.GetContextStateRequest(session_id="s_nope")),
        NOT_FOUND,
        "SESSION_NOT_FOUND",
    ),
]


async def baseline_session(stub: Stub, open_call: bool) -> tuple[str, list[pb.Message]]:
    """A session holding BASELINE (and an open call); returns its id and messages as stored."""
    session_id = (await create_session(stub, context_window=100_000)).id
    messages = [*BASELINE, assistant_calls("call_open")] if open_call else BASELINE
    appended = await append_messages(stub, session_id, *messages)
    return session_id, list(appended.messages)


async def assert_intact(stub: Stub, session_id: str, stored: list[pb.Message]) -> None:
    listed = await stub.ListMessages(pb.ListMessagesRequest(session_id=session_id, include_abandoned=True))
    assert list(listed.messages) == stored
    assert not listed.next_page_token
    session = (await stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert session.head_seq == len(stored)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_bad_input_is_refused_and_changes_nothing(
    stub: Stub, channel: grpc.aio.Channel, server: RunningServer, case: Case
) -> None:
    session_id, stored = await baseline_session(stub, case.open_call)
    before = await server.store.row_counts()
    call = case.call(channel, session_id) if isinstance(case.call, Raw) else case.call(stub, session_id)
    await expect_error(call, case.code, case.reason, case.metadata)
    await assert_intact(stub, session_id, stored)
    if not case.prepares_rows:
        assert await server.store.row_counts() == before
    health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    # The session still accepts a good append afterwards.
    follow_up = result("call_open", RESULT_TEXT) if case.open_call else user("still here")
    appended = await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session_id, messages=[follow_up]))
    assert appended.messages[0].seq == len(stored) + 1


def test_case_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES) >= 120


async def test_a_request_above_the_grpc_limit_is_refused_by_grpc(stub: Stub, server: RunningServer) -> None:
    """Above max_receive_message_bytes (20 MiB) gRPC itself refuses the request: RESOURCE_EXHAUSTED,
    before any handler runs, and the server keeps serving."""
    session_id, stored = await baseline_session(stub, open_call=False)
    limit = server.settings.max_receive_message_bytes
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{server.port}", options=[("grpc.max_send_message_length", limit + 8 * MiB)]
    ) as channel:
        big = pb_grpc.ContextServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await big.AppendMessages(
                pb.AppendMessagesRequest(session_id=session_id, messages=[user("x" * (limit + MiB))])
            )
    assert caught.value.code() == EXHAUSTED
    await assert_intact(stub, session_id, stored)


async def test_messages_exactly_at_the_size_limits_are_accepted(stub: Stub, server: RunningServer) -> None:
    """The limits are inclusive: only what is above them is refused (see the table)."""
    session_id, stored = await baseline_session(stub, open_call=True)
    limit = server.settings.max_message_bytes
    unit = "hello world, 你好 "  # 22 bytes
    content = unit * (limit // len(unit.encode()))
    content += "x" * (limit - len(content.encode()))
    assert len(content.encode()) == limit
    answered = await stub.AppendMessages(
        pb.AppendMessagesRequest(session_id=session_id, messages=[result("call_open", RESULT_TEXT), user(content)])
    )
    assert [m.seq for m in answered.messages] == [len(stored) + 1, len(stored) + 2]
    assert answered.messages[1].content == content


# ---- requests of every RPC filled with odd values ----------------------------------------------------------

ODD_TEXTS = ["", "x", "\u0000", "s_" + "0" * 32, "é" * 10, "x" * 70_000, "{}", '{"a": 1}', "-1", "../../etc"]
ODD_NUMBERS = [0, 1, -1, 7, 1000, 100_000, 2**31 - 1, -(2**31), 2**62]
ODD_FRACTIONS = [0.0, -1.0, 0.5, 1.0, 2.0, float("nan"), float("inf"), 1e300]


def filled(message: Message, rng: random.Random, known_ids: Sequence[str], depth: int = 0) -> None:
    """Sets a random part of `message`'s fields, nested messages included, to odd values; id fields
    often name something that exists (`known_ids`), so that calls get past the lookup."""
    for descriptor in message.DESCRIPTOR.fields:
        if rng.random() < 0.4:
            continue
        for _ in range(rng.randint(1, 3) if descriptor.is_repeated else 1):
            if descriptor.type == FieldDescriptor.TYPE_MESSAGE:
                if depth < 3 and descriptor.message_type.full_name != "google.protobuf.Timestamp":
                    held = getattr(message, descriptor.name)
                    inner = held.add() if descriptor.is_repeated else held
                    filled(inner, rng, known_ids, depth + 1)
                    inner.SetInParent()
                continue
            value: object
            if descriptor.type == FieldDescriptor.TYPE_STRING:
                named = "id" in descriptor.name or "ref" in descriptor.name
                value = rng.choice(known_ids) if named and rng.random() < 0.7 else rng.choice(ODD_TEXTS)
            elif descriptor.type == FieldDescriptor.TYPE_BOOL:
                value = rng.random() < 0.5
            elif descriptor.type == FieldDescriptor.TYPE_ENUM:
                value = rng.choice([v.number for v in descriptor.enum_type.values] + [99])
            elif descriptor.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
                value = rng.choice(ODD_FRACTIONS)
            else:
                value = rng.choice(ODD_NUMBERS)
            with contextlib.suppress(ValueError, TypeError):  # out of the descriptor's range: the next one
                if descriptor.is_repeated:
                    getattr(message, descriptor.name).append(value)
                else:
                    setattr(message, descriptor.name, value)


async def test_odd_requests_of_every_rpc_get_a_status_with_a_reason(stub: Stub, channel: grpc.aio.Channel) -> None:
    """Seeded random requests of every RPC: each answers or fails with a status other than INTERNAL or
    UNKNOWN that carries an ErrorInfo, and the server stays healthy. (An overflow Prepare of an empty
    session was found this way; this seed reaches it.)"""
    rng = random.Random(24)
    known: list[str] = ["call_a"]
    for _ in range(3):
        session_id, stored = await baseline_session(stub, open_call=False)
        known += [session_id, *(m.id for m in stored), *(m.result_ref for m in stored if m.result_ref)]
    methods = pb.DESCRIPTOR.services_by_name["ContextService"].methods
    for _ in range(1000):
        method = rng.choice(methods)
        request = getattr(pb, method.input_type.name)()
        filled(request, rng, known)
        call = getattr(stub, method.name)(request, timeout=30)
        try:
            if method.server_streaming:
                async for _event in call:
                    pass
            else:
                answer = await call
                if method.output_type.fields_by_name.get("session") is not None:
                    known.append(answer.session.id)  # created, forked or rewound: later calls may name it
        except grpc.aio.AioRpcError as exc:
            assert exc.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (method.name, request)
            if exc.code() != EXHAUSTED:  # gRPC's own message-size refusal has no ErrorInfo
                assert error_info(exc).reason, (method.name, request)
    health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING

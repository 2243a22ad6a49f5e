"""Unit tests of the conversion layer, without a server."""

from __future__ import annotations

import hashlib
import pickle
import re
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from ctxfold_client import (
    CLIENT_DOMAIN,
    Action,
    CacheState,
    Client,
    CtxfoldError,
    ErrorReason,
    FoldProgress,
    FoldStage,
    Message,
    NotFoldedReason,
    Role,
    SessionConfig,
    View,
    adapters,
    assistant,
    pb,
    system,
    tool_call,
    tool_result,
    trace_metadata,
    user,
)
from ctxfold_client import _core as core
from ctxfold_client.models import CallOptions

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


def _settings_kwargs() -> dict[str, Any]:
    return {
        "token": None,
        "tls": None,
        "ca_cert": None,
        "client_cert": None,
        "client_key": None,
        "server_name": None,
        "timeout": 30.0,
        "stream_timeout": 600.0,
        "metadata": (),
        "channel_options": (),
        "propagate_trace": True,
    }


def _settings(**overrides: Any) -> core.Settings:
    return core.make_settings("127.0.0.1:1", **{**_settings_kwargs(), **overrides})


# ---- config and messages ------------------------------------------------------------------------


def test_session_config_to_proto() -> None:
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    config = SessionConfig(context_window=8000, compact_ratio=0.7, tools=tools, summarizer="extractive")
    proto = config.to_proto()
    assert proto.context_window == 8000
    assert proto.compact_ratio == pytest.approx(0.7)
    assert proto.tools_json == '[{"type":"function","function":{"name":"ls","parameters":{"type":"object"}}}]'
    assert proto.tail_ratio == 0.0  # unset: the server's default
    back = SessionConfig.from_proto(proto)
    assert back.tools == proto.tools_json
    assert back.replace(tools=tools) == config
    assert SessionConfig(tools="[]").to_proto().tools_json == "[]"
    assert SessionConfig.from_json({"context_window": 8000, "disable_task_anchor": True}) == SessionConfig(
        context_window=8000, disable_task_anchor=True, tools=""
    )


def test_prefold_ratio_keeps_its_presence_both_ways() -> None:
    assert SessionConfig.from_json({"context_window": 8000}).prefold_ratio is None  # unset: the server's default
    assert SessionConfig.from_json({"context_window": 8000, "prefold_ratio": 0}).prefold_ratio == 0.0  # off
    assert SessionConfig.from_proto(pb.SessionConfig(prefold_ratio=0.75)).prefold_ratio == pytest.approx(0.75)
    for ratio in (None, 0.0, 0.1, 0.75):
        assert SessionConfig.from_proto(SessionConfig(prefold_ratio=ratio).to_proto()).prefold_ratio == ratio
    fork = SessionConfig(prefold_ratio=0.0).to_proto()  # fork overrides: no window, an explicit 0
    assert fork.HasField("prefold_ratio") and fork.prefold_ratio == 0.0
    with pytest.raises(CtxfoldError) as raised:
        SessionConfig(prefold_ratio=float("nan"))
    assert raised.value.metadata["field"] == "prefold_ratio"


def test_message_constructors_and_proto_round_trip() -> None:
    call = tool_call("c1", "ls", {"path": "é"})
    assert call.arguments == '{"path":"é"}'
    message = assistant("thinking", tool_calls=[call], reasoning_content="hmm")
    assert message.role is Role.ASSISTANT
    assert message.tool_calls[0].id == "c1"
    assert tool_result("c1", "out").tool_call_id == "c1"
    assert system("rules", pinned=True).pinned
    assert user("hi", name="ann").name == "ann"
    assert Message.from_proto(message.to_proto()) == message
    stored = pb.Message(id="m1", seq=3, role=pb.ROLE_TOOL, tool_call_id="c1", result_ref="tr_1", truncated=True)
    stored.create_time.FromSeconds(1_700_000_000)
    typed = Message.from_proto(stored)
    assert (typed.seq, typed.result_ref, typed.truncated, typed.create_time is not None) == (3, "tr_1", True, True)
    assert typed.to_proto() == stored
    assert Message.from_json({"role": "ROLE_USER", "content": "x", "create_time": None}) == user("x")
    with pytest.raises(TypeError):
        core.append_request("s1", user("not a list"), "")  # type: ignore[arg-type]


def test_enums_are_generated_from_the_proto_and_print_their_proto_names() -> None:
    for enum_type, proto in [
        (Role, pb.Role),
        (Action, pb.Action),
        (CacheState, pb.CacheState),
        (FoldStage, pb.FoldStage),
        (NotFoldedReason, pb.NotFoldedReason),
    ]:
        assert [str(member) for member in enum_type] == list(proto.keys())
        assert [int(member) for member in enum_type] == list(proto.values())
    assert [str(reason) for reason in ErrorReason] == list(pb.ErrorReason.keys())
    assert f"{FoldStage.PASS_COMMITTED}" == "FOLD_STAGE_PASS_COMMITTED"
    assert repr(FoldStage.PASS_COMMITTED) == "FoldStage.PASS_COMMITTED"  # a name in dataclass reprs too
    assert FoldStage(99) is FoldStage.UNSPECIFIED  # a stage of a newer server
    assert ErrorReason.SESSION_NOT_FOUND == "SESSION_NOT_FOUND"


def test_request_ids_are_generated_once_per_call() -> None:
    first = core.append_request("s1", [user("a")], "").request_id
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", first)
    assert core.append_request("s1", [user("a")], "").request_id != first
    assert core.append_request("s1", [user("a")], "mine").request_id == "mine"
    prepare = core.prepare_request("s1", (), overflow=False, given_request_id="", known_view_version=3)
    assert prepare.request_id and prepare.known_view_version == 3


def test_fork_names_its_point_explicitly() -> None:
    assert core.fork_request("s1", None, True, None).at_seq == 0
    assert core.fork_request("s1", 4, False, SessionConfig(max_output_tokens=9)).config.max_output_tokens == 9
    for at_seq, at_head in [(None, False), (4, True), (0, False)]:
        with pytest.raises(CtxfoldError) as raised:
            core.fork_request("s1", at_seq, at_head, None)
        assert (raised.value.reason, raised.value.domain) == (ErrorReason.SEQ_OUT_OF_RANGE, CLIENT_DOMAIN)


# ---- adapters: the rules the shared scenarios do not reach ----------------------------------------


def _view(messages: list[Message], stable: int) -> View:
    return View(
        messages=tuple(messages), estimated_tokens=1, view_version=1, action=Action.NONE, stable_prefix_messages=stable
    )


def test_anthropic_cache_breakpoint_follows_the_stable_prefix() -> None:
    messages = [system("rules"), user("a"), assistant(""), user("b"), system("reminder")]
    on_system = adapters.anthropic_messages.to_request(_view(messages, 1))
    assert on_system["system"] == [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}]
    # the empty assistant message has no block: the breakpoint stays on the last block of the prefix
    request = adapters.anthropic_messages.to_request(_view(messages, 3))
    assert request["messages"][0]["content"] == [
        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "b"},
        {"type": "text", "text": "reminder"},
    ]  # consecutive user-side messages form one turn; a later system message is user text
    assert "cache_control" not in str(adapters.anthropic_messages.to_request(_view(messages, 0)))
    with pytest.raises(CtxfoldError, match="not a JSON object") as raised:
        adapters.anthropic_messages.to_request([assistant(tool_calls=[tool_call("c", "f", "[1]")])])
    assert (raised.value.reason, raised.value.domain) == (ErrorReason.INVALID_MESSAGE, CLIENT_DOMAIN)


@pytest.mark.parametrize(
    ("adapter", "response"),
    [
        (adapters.openai_chat, {"choices": [{"message": ["not", "an", "object"]}]}),
        (adapters.openai_chat, {"choices": [{"message": {"tool_calls": [{"function": "f"}]}}]}),
        (adapters.openai_chat, {"choices": [{"message": {}}], "usage": "many"}),
        (adapters.openai_chat, {"choices": [{"message": {}}], "usage": {"prompt_tokens_details": 3}}),
        (adapters.openai_responses, {"output": [], "usage": ["a"]}),
        (adapters.openai_responses, {"output": [], "usage": {"input_tokens_details": True}}),
        (adapters.anthropic_messages, {"content": [], "usage": 5}),
    ],
)
def test_an_object_field_of_another_type_reads_as_empty(adapter: Any, response: dict[str, Any]) -> None:
    """As the other SDKs read it (Java's `Json.object`); it raised AttributeError."""
    turn = adapter.from_response(response)
    assert turn.usage.input_tokens == turn.usage.cached_input_tokens == 0
    assert [(m.content, [c.name for c in m.tool_calls]) for m in turn.messages] in ([("", [])], [("", [""])])


def test_adapters_read_sdk_objects_and_missing_fields() -> None:
    class SdkCompletion:  # what the openai SDK returns: a pydantic model
        def model_dump(self) -> dict[str, Any]:
            return {"choices": [{"message": {"role": "assistant", "content": None, "refusal": "no"}}], "usage": None}

    reply = adapters.openai_chat.from_response(SdkCompletion())
    assert reply.messages[0].content == "no"
    assert (reply.usage.input_tokens, reply.usage.finish_reason) == (0, "")
    with pytest.raises(CtxfoldError, match="no choices"):
        adapters.openai_chat.from_response({"choices": []})
    assert adapters.openai_chat.to_request([assistant("x", reasoning_content="r")], include_reasoning=True)[
        "messages"
    ] == [{"role": "assistant", "content": "x", "reasoning_content": "r"}]
    assert adapters.openai_responses.to_request([user("hi")]) == {
        "input": [{"type": "message", "role": "user", "content": "hi"}]
    }


# ---- the Prepare/Compact stream and deltas ------------------------------------------------------------


def _result(
    messages: list[pb.Message], version: int, *, delta: bool = False, count: int | None = None
) -> pb.PrepareResponse:
    return pb.PrepareResponse(
        result=pb.PreparedContext(
            messages=messages,
            view_version=version,
            delta=delta,
            view_message_count=count if count is not None else len(messages),
            action=pb.ACTION_NONE,
            cache_state=pb.CACHE_STATE_WARM,
        )
    )


def _known(*messages: Message, version: int = 7) -> core.KnownView:
    return core.KnownView(View(messages=messages, estimated_tokens=1, view_version=version, action=Action.NONE))


def test_fold_stream_progress_then_result() -> None:
    cache = core.ViewCache(4)
    stream = core.FoldStream("s1", None, cache)
    event = stream.feed(pb.PrepareResponse(progress=pb.FoldProgress(stage=pb.FOLD_STAGE_PLANNED, passes_planned=2)))
    assert event == FoldProgress(stage=FoldStage.PLANNED, passes_planned=2)
    for stage in (pb.FOLD_STAGE_BACKGROUND_STARTED, pb.FOLD_STAGE_PREPARED_INSTALLED, pb.FOLD_STAGE_BACKGROUND_RUNNING):
        background = stream.feed(pb.PrepareResponse(progress=pb.FoldProgress(stage=stage)))
        assert isinstance(background, FoldProgress)
        assert str(background.stage) == pb.FoldStage.Name(stage)  # FOLD_STAGE_BACKGROUND_STARTED, ...
    assert stream.feed(pb.PrepareResponse()) is None  # an item kind from a newer server
    view = stream.feed(_result([user("a").to_proto(), user("b").to_proto()], 7))
    assert isinstance(view, View)
    stream.finish()
    assert view.cache_state is CacheState.WARM
    assert [m.content for m in view.messages] == ["a", "b"]
    known = cache.get("s1")
    assert known is not None
    assert known.version == 7
    with pytest.raises(CtxfoldError) as raised:
        stream.feed(_result([], 8))
    assert raised.value.reason == ErrorReason.PROTOCOL_VIOLATION


def test_fold_stream_applies_a_delta_to_the_known_view() -> None:
    cache = core.ViewCache(4)
    stream = core.FoldStream("s1", _known(user("a"), user("b")), cache)
    view = stream.feed(_result([user("c").to_proto()], 8, delta=True, count=3))
    assert isinstance(view, View)
    assert [m.content for m in view.messages] == ["a", "b", "c"]
    assert cache.get("s1") == core.KnownView(view)
    assert not stream.needs_whole_view


@pytest.mark.parametrize("known", [None, _known(user("a"))])
def test_a_delta_that_does_not_fit_asks_for_the_whole_view(known: core.KnownView | None) -> None:
    cache = core.ViewCache(4)
    cache.put("s1", _known(version=1))
    stream = core.FoldStream("s1", known, cache)
    assert stream.feed(_result([user("c").to_proto()], 8, delta=True, count=5)) is None
    stream.finish()  # not an error: the client prepares once more without appending
    assert stream.needs_whole_view
    assert cache.get("s1") is None
    whole = core.whole_view_request("s1")
    assert (list(whole.append), whole.known_view_version) == ([], 0)


def test_a_whole_view_whose_count_disagrees_is_a_protocol_violation() -> None:
    stream = core.FoldStream("s1", None, core.ViewCache(4))
    with pytest.raises(CtxfoldError) as raised:
        stream.feed(_result([user("a").to_proto()], 8, count=2))
    assert raised.value.reason == ErrorReason.PROTOCOL_VIOLATION


def test_fold_stream_without_result() -> None:
    stream = core.FoldStream("s1", None, core.ViewCache(4))
    stream.feed(pb.PrepareResponse(progress=pb.FoldProgress(stage=pb.FOLD_STAGE_PASS_STARTED)))
    with pytest.raises(CtxfoldError) as raised:
        stream.finish()
    assert raised.value.reason == ErrorReason.STREAM_ENDED_WITHOUT_RESULT
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert raised.value.domain == "client.ctxfold.dev"  # raised by the SDK itself, not the server


def test_view_cache_is_bounded() -> None:
    cache = core.ViewCache(2)
    for name in ("a", "b", "c"):
        cache.put(name, _known())
    assert cache.get("a") is None
    assert cache.get("b") is not None
    cache.put("d", _known())  # "c" is now the least recently used
    assert cache.get("c") is None
    off = core.ViewCache(0)
    off.put("a", _known())
    assert off.get("a") is None


# ---- paging -------------------------------------------------------------------------------------


def _pages(text: str, size: int) -> list[pb.ReadToolResultResponse]:
    raw = text.encode()
    digest = hashlib.sha256(raw).hexdigest()
    pages = []
    offset = 0
    while True:
        end = min(offset + size, len(raw))
        while end < len(raw) and (raw[end] & 0xC0) == 0x80:
            end -= 1
        pages.append(
            pb.ReadToolResultResponse(
                data=raw[offset:end].decode(),
                offset=offset,
                next_offset=end,
                total_bytes=len(raw),
                sha256=digest,
                complete=end == len(raw),
                result_ref="tr_1",
            )
        )
        if end == len(raw):
            return pages
        offset = end


def test_tool_result_reader_assembles_and_verifies() -> None:
    text = "añ漢🦀" * 50
    reader = core.ToolResultReader("s1", tool_call_id="c1", result_ref="", page_bytes=16, whole=True)
    first = reader.next_request
    assert first is not None
    assert (first.tool_call_id, first.offset, first.limit) == ("c1", 0, 16)
    for page in _pages(text, 16):
        request = reader.next_request
        assert request is not None
        assert request.offset == page.offset
        reader.feed(page)
        if not page.complete:
            assert reader.next_request is not None
            assert reader.next_request.result_ref == "tr_1"  # later pages by ref, never ambiguous
    assert reader.next_request is None
    whole = reader.result()
    assert whole.text == text
    assert whole.verify()


def test_tool_result_reader_detects_corruption_and_bad_paging() -> None:
    pages = _pages("hello world", 4)
    reader = core.ToolResultReader("s1", tool_call_id="", result_ref="tr_1", page_bytes=4, whole=True)
    for page in pages:
        if page.complete:
            page.data = page.data.upper()
        reader.feed(page)
    with pytest.raises(CtxfoldError) as raised:
        reader.result()
    assert raised.value.reason == ErrorReason.RESULT_CHECKSUM_MISMATCH
    assert raised.value.code is grpc.StatusCode.DATA_LOSS
    assert raised.value.domain == CLIENT_DOMAIN

    stuck = core.ToolResultReader("s1", tool_call_id="", result_ref="tr_1", page_bytes=4, whole=True)
    page = _pages("hello world", 4)[0]
    page.next_offset = 0
    with pytest.raises(CtxfoldError, match="no progress"):
        stuck.feed(page)
    with pytest.raises(CtxfoldError, match="name the tool result"):
        core.ToolResultReader("s1", tool_call_id="", result_ref="", page_bytes=None, whole=True)
    with pytest.raises(CtxfoldError, match="page_bytes"):
        core.ToolResultReader("s1", tool_call_id="", result_ref="tr_1", page_bytes=24577, whole=True)


def test_next_page() -> None:
    request = core.list_messages_request("s1", 10, True)
    following = core.next_page(request, "tok")
    assert following is not None
    assert (following.page_token, following.page_size, following.include_abandoned) == ("tok", 10, True)
    assert request.page_token == ""
    assert core.next_page(following, "") is None
    with pytest.raises(CtxfoldError):
        core.next_page(following, "tok")


def test_seq_before() -> None:
    assert core.seq_before(5) == 4
    assert core.seq_before(Message(role=Role.USER, seq=1)) == 0
    with pytest.raises(CtxfoldError):
        core.seq_before(0)


# ---- settings, metadata and trace context ---------------------------------------------------------------


def test_call_args_defaults_and_overrides() -> None:
    settings = _settings(token="tok-0123456789abcdef", metadata=[("X-App", "demo")], propagate_trace=False)
    timeout, metadata = core.call_args(settings, {})
    assert timeout == 30.0
    assert metadata == (("authorization", "Bearer tok-0123456789abcdef"), ("x-app", "demo"))
    assert core.call_args(settings, {}, streaming=True)[0] == 600.0
    call: CallOptions = {"timeout": None, "metadata": [("x-req", "1")], "traceparent": TRACEPARENT}
    timeout, metadata = core.call_args(settings, call)
    assert timeout is None
    assert metadata[-2:] == (("x-req", "1"), ("traceparent", TRACEPARENT))


def test_trace_context_is_injected_from_opentelemetry() -> None:
    assert trace_metadata() == []  # no active span: nothing to send
    context = SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with trace.use_span(NonRecordingSpan(context)):
        assert ("traceparent", TRACEPARENT) in trace_metadata()
        assert trace_metadata(propagate=False) == []
        explicit = f"00-{'1' * 32}-{'2' * 16}-00"
        assert trace_metadata(explicit, "k=v") == [("traceparent", explicit), ("tracestate", "k=v")]
        _, metadata = core.call_args(_settings(), {})
        assert ("traceparent", TRACEPARENT) in metadata
    with pytest.raises(CtxfoldError):
        trace_metadata("not-a-traceparent")


def test_tls_settings(tmp_path: Path) -> None:
    assert _settings().credentials is None
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    assert _settings(ca_cert=pem).credentials is not None  # TLS implied
    path = tmp_path / "ca.pem"
    path.write_text(pem)
    assert _settings(ca_cert=path).credentials is not None
    assert _settings(tls=True).credentials is not None  # system roots
    named = _settings(server_name="ctxfold.internal")
    assert ("grpc.ssl_target_name_override", "ctxfold.internal") in named.channel_options

    def refused(**overrides: Any) -> CtxfoldError:
        with pytest.raises(CtxfoldError) as raised:
            _settings(**overrides)
        assert (raised.value.code, raised.value.reason, raised.value.domain) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            ErrorReason.INVALID_CLIENT_ARGUMENT,
            CLIENT_DOMAIN,
        )
        return raised.value

    assert "go together" in refused(client_cert=pem).message
    assert "cannot read" in refused(ca_cert=tmp_path / "missing.pem").message
    assert "need tls" in refused(tls=False, ca_cert=pem).message
    assert refused(token="two words").metadata["field"] == "token"
    assert refused(timeout=-1.0).metadata["field"] == "timeout"
    assert refused(stream_timeout=0.0).metadata["field"] == "stream_timeout"
    with pytest.raises(CtxfoldError, match="address"):
        core.make_settings("", **_settings_kwargs())
    with pytest.raises(CtxfoldError, match="view_cache_size") as raised:
        Client("127.0.0.1:1", view_cache_size=-1)
    assert raised.value.reason is ErrorReason.INVALID_CLIENT_ARGUMENT


# ---- errors -------------------------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    """What grpc raises: an RpcError that is also a Call (code, details, trailing metadata)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, bytes], ...] = ()) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:  # grpc's own stub type for it is private
        return self._trailers


def _rich(code: grpc.StatusCode, message: str, reason: str, **metadata: str) -> FakeRpcError:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="ctxfold.dev", metadata=metadata))
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=[detail])
    converted = rpc_status.to_status(status)
    return FakeRpcError(converted.code, converted.details, tuple(converted.trailing_metadata))


def test_error_from_a_rich_status() -> None:
    error = CtxfoldError.from_rpc_error(
        _rich(grpc.StatusCode.FAILED_PRECONDITION, "ambiguous", "RESULT_REF_AMBIGUOUS", tool_call_id="c1")
    )
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == ErrorReason.RESULT_REF_AMBIGUOUS
    assert error.domain == "ctxfold.dev"  # the server's, as sent
    assert dict(error.metadata) == {"tool_call_id": "c1"}
    assert error.message == "ambiguous"
    assert str(error) == "FAILED_PRECONDITION RESULT_REF_AMBIGUOUS: ambiguous"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.reason, copy.domain, dict(copy.metadata)) == (
        error.code,
        error.reason,
        error.domain,
        dict(error.metadata),
    )
    with pytest.raises(TypeError):
        error.metadata["x"] = "y"  # type: ignore[index]


def test_error_without_a_rich_status() -> None:
    error = CtxfoldError.from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert error.reason is ErrorReason.ERROR_REASON_UNSPECIFIED
    assert error.domain == ""
    assert error.status is None
    assert str(error) == "UNAVAILABLE: connection refused"
    mismatched = _rich(grpc.StatusCode.NOT_FOUND, "gone", "SESSION_NOT_FOUND")
    mismatched._code = grpc.StatusCode.INTERNAL
    assert CtxfoldError.from_rpc_error(mismatched).reason is ErrorReason.ERROR_REASON_UNSPECIFIED


def test_the_reason_is_the_generated_enum() -> None:
    known = CtxfoldError.from_rpc_error(_rich(grpc.StatusCode.NOT_FOUND, "gone", "SESSION_NOT_FOUND"))
    assert known.reason is ErrorReason.SESSION_NOT_FOUND
    newer = CtxfoldError.from_rpc_error(_rich(grpc.StatusCode.NOT_FOUND, "gone", "A_REASON_FROM_A_NEWER_SERVER"))
    assert newer.reason is ErrorReason.ERROR_REASON_UNSPECIFIED
    assert str(newer) == "NOT_FOUND: gone"
    assert pickle.loads(pickle.dumps(known)).reason is ErrorReason.SESSION_NOT_FOUND


def test_error_carries_the_retry_delay() -> None:
    info, retry = any_pb2.Any(), any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason="SESSION_BUSY", domain="ctxfold.dev"))
    delay = error_details_pb2.RetryInfo()
    delay.retry_delay.FromMilliseconds(1500)
    retry.Pack(delay)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message="busy", details=[info, retry])
    converted = rpc_status.to_status(status)
    error = CtxfoldError.from_rpc_error(
        FakeRpcError(converted.code, converted.details, tuple(converted.trailing_metadata))
    )
    assert (error.reason, error.retry_delay) == (ErrorReason.SESSION_BUSY, 1.5)
    assert pickle.loads(pickle.dumps(error)).retry_delay == 1.5

"""Unit tests of the conversion layer, without a server."""

from __future__ import annotations

import hashlib
import pickle
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
    Action,
    CacheState,
    CtxfoldError,
    FoldProgress,
    FoldStage,
    PreparedView,
    Role,
    SessionConfig,
    assistant,
    from_openai_message,
    pb,
    system,
    to_openai_messages,
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
    assert core.create_session_request(proto).config == proto


def test_message_constructors() -> None:
    call = tool_call("c1", "ls", {"path": "é"})
    assert call.arguments == '{"path":"é"}'
    message = assistant("thinking", tool_calls=[call], reasoning_content="hmm")
    assert message.role == pb.ROLE_ASSISTANT
    assert message.tool_calls[0].id == "c1"
    assert tool_result("c1", "out").tool_call_id == "c1"
    assert system("rules", pinned=True).pinned
    assert user("hi", name="ann").name == "ann"
    with pytest.raises(TypeError):
        core.to_messages(user("not a list"))  # type: ignore[arg-type]


def test_openai_conversion_both_ways() -> None:
    view = [
        system("You are terse."),
        user("list files"),
        assistant(tool_calls=[tool_call("c1", "ls", '{"path": "."}')], reasoning_content="need ls"),
        tool_result("c1", "a.py\nb.py"),
        assistant("Two files."),
    ]
    messages = to_openai_messages(view)
    assert messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
        {"role": "assistant", "content": "Two files."},
    ]
    assert to_openai_messages(view[2:3], include_reasoning=True)[0]["reasoning_content"] == "need ls"
    back = [from_openai_message(m) for m in messages]
    assert [m.SerializeToString() for m in back] == [
        m.SerializeToString() for m in [*view[:2], assistant(tool_calls=view[2].tool_calls), *view[3:]]
    ]


def test_from_openai_message_variants() -> None:
    class SdkMessage:  # what the openai SDK returns: a pydantic model
        def model_dump(self) -> dict[str, Any]:
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
                "refusal": None,
            }

    converted = from_openai_message(SdkMessage())
    assert converted.tool_calls[0].arguments == '{"a":1}'
    assert converted.content == ""
    parts = from_openai_message(
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    )
    assert parts.role == pb.ROLE_SYSTEM
    assert parts.content == "a\nb"
    with pytest.raises(ValueError, match="only text"):
        from_openai_message({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})
    with pytest.raises(ValueError, match="role"):
        from_openai_message({"role": "function", "content": "x"})
    with pytest.raises(ValueError, match="no role"):
        to_openai_messages([pb.Message(content="x")])


def test_enums_mirror_the_proto_and_tolerate_new_values() -> None:
    assert int(Role.TOOL) == int(pb.ROLE_TOOL)
    assert int(Action.FOLDED) == int(pb.ACTION_FOLDED)
    assert int(CacheState.WARM) == int(pb.CACHE_STATE_WARM)
    assert int(FoldStage.PASS_FAILED) == int(pb.FOLD_STAGE_PASS_FAILED)
    assert FoldStage(99) is FoldStage.UNSPECIFIED
    assert len(FoldStage) == len(pb.FoldStage.keys())
    assert len(Role) == len(pb.Role.keys())


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


def test_fold_stream_progress_then_result() -> None:
    cache = core.ViewCache(4)
    stream = core.FoldStream("s1", None, cache)
    event = stream.feed(pb.PrepareResponse(progress=pb.FoldProgress(stage=pb.FOLD_STAGE_PLANNED, passes_planned=2)))
    assert event == FoldProgress(stage=FoldStage.PLANNED, passes_planned=2)
    assert stream.feed(pb.PrepareResponse()) is None  # an item kind from a newer server
    view = stream.feed(_result([user("a"), user("b")], 7))
    assert isinstance(view, PreparedView)
    assert stream.finish() is view
    assert view.cache_state is CacheState.WARM
    assert [m.content for m in view.messages] == ["a", "b"]
    known = cache.get("s1")
    assert known is not None
    assert known.version == 7
    with pytest.raises(CtxfoldError) as raised:
        stream.feed(_result([], 8))
    assert raised.value.reason == "STREAM_AFTER_RESULT"


def test_fold_stream_applies_a_delta_to_the_known_view() -> None:
    cache = core.ViewCache(4)
    known = core.KnownView(7, (user("a"), user("b")))
    stream = core.FoldStream("s1", known, cache)
    view = stream.feed(_result([user("c")], 8, delta=True, count=3))
    assert isinstance(view, PreparedView)
    assert view.delta
    assert [m.content for m in view.messages] == ["a", "b", "c"]
    assert [m.content for m in view.received] == ["c"]
    assert cache.get("s1") == core.KnownView(8, view.messages)


@pytest.mark.parametrize("known", [None, core.KnownView(7, (user("a"),))])
def test_fold_stream_rejects_a_delta_that_does_not_fit(known: core.KnownView | None) -> None:
    cache = core.ViewCache(4)
    cache.put("s1", core.KnownView(1, ()))
    stream = core.FoldStream("s1", known, cache)
    with pytest.raises(CtxfoldError) as raised:
        stream.feed(_result([user("c")], 8, delta=True, count=5))
    assert raised.value.reason == "VIEW_DELTA_MISMATCH"
    assert raised.value.domain == "client.ctxfold.dev"
    assert cache.get("s1") is None  # the next prepare asks for the whole view


def test_fold_stream_without_result() -> None:
    stream = core.FoldStream("s1", None, core.ViewCache(4))
    stream.feed(pb.PrepareResponse(progress=pb.FoldProgress(stage=pb.FOLD_STAGE_PASS_STARTED)))
    with pytest.raises(CtxfoldError) as raised:
        stream.finish()
    assert raised.value.reason == "STREAM_WITHOUT_RESULT"
    assert raised.value.code is grpc.StatusCode.INTERNAL


def test_view_cache_is_bounded() -> None:
    cache = core.ViewCache(2)
    for name in ("a", "b", "c"):
        cache.put(name, core.KnownView(1, ()))
    assert cache.get("a") is None
    assert cache.get("b") is not None
    cache.put("d", core.KnownView(1, ()))  # "c" is now the least recently used
    assert cache.get("c") is None
    off = core.ViewCache(0)
    off.put("a", core.KnownView(1, ()))
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
    reader = core.ToolResultReader("s1", tool_call_id="c1", limit=16)
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
    assert whole.data == text
    assert whole.verify()
    assert whole.pages == len(_pages(text, 16))


def test_tool_result_reader_detects_corruption_and_bad_paging() -> None:
    pages = _pages("hello world", 4)
    reader = core.ToolResultReader("s1", result_ref="tr_1")
    for page in pages:
        if page.complete:
            page.data = page.data.upper()
        reader.feed(page)
    with pytest.raises(CtxfoldError) as raised:
        reader.result()
    assert raised.value.reason == "TOOL_RESULT_CORRUPT"
    assert raised.value.code is grpc.StatusCode.DATA_LOSS

    stuck = core.ToolResultReader("s1", result_ref="tr_1")
    page = _pages("hello world", 4)[0]
    page.next_offset = 0
    with pytest.raises(CtxfoldError, match="no progress"):
        stuck.feed(page)
    with pytest.raises(ValueError):
        core.ToolResultReader("s1")


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
    assert core.seq_before(pb.Message(seq=1)) == 0
    with pytest.raises(ValueError):
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
    with pytest.raises(ValueError):
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
    with pytest.raises(ValueError, match="go together"):
        _settings(client_cert=pem)
    with pytest.raises(ValueError, match="cannot read"):
        _settings(ca_cert=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="need tls"):
        _settings(tls=False, ca_cert=pem)
    with pytest.raises(ValueError, match="whitespace"):
        _settings(token="two words")
    with pytest.raises(ValueError, match="address"):
        core.make_settings("", **_settings_kwargs())


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
    assert error.reason == "RESULT_REF_AMBIGUOUS"
    assert error.domain == "ctxfold.dev"
    assert dict(error.metadata) == {"tool_call_id": "c1"}
    assert error.message == "ambiguous"
    assert str(error) == "FAILED_PRECONDITION RESULT_REF_AMBIGUOUS: ambiguous"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.reason, dict(copy.metadata)) == (error.code, error.reason, dict(error.metadata))
    with pytest.raises(TypeError):
        error.metadata["x"] = "y"  # type: ignore[index]


def test_error_without_a_rich_status() -> None:
    error = CtxfoldError.from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert error.reason == ""
    assert error.status is None
    assert str(error) == "UNAVAILABLE: connection refused"
    mismatched = _rich(grpc.StatusCode.NOT_FOUND, "gone", "SESSION_NOT_FOUND")
    mismatched._code = grpc.StatusCode.INTERNAL
    assert CtxfoldError.from_rpc_error(mismatched).reason == ""

"""The clients against an in-process fake ContextService (built on the client's own generated
servicer): what goes on the wire (auth, trace context, deadlines) and how broken streams surface."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from ctxfold_client import VERSION, AsyncClient, Client, CtxfoldError, ErrorReason, FoldProgress, pb, user
from ctxfold_client._gen import context_service_pb2_grpc as pb_grpc

TOKEN = "fake-token-0123456789"
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


class FakeService(pb_grpc.ContextServiceServicer):
    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []
        self.prepares: list[pb.PrepareRequest] = []
        self.transcripts: dict[str, list[pb.Message]] = {}
        self.cancelled = threading.Event()

    def _record(self, context: grpc.ServicerContext) -> None:
        self.metadata.append({key: str(value) for key, value in context.invocation_metadata()})

    def GetSession(self, request: pb.GetSessionRequest, context: grpc.ServicerContext) -> pb.GetSessionResponse:
        self._record(context)
        if request.session_id == "slow":
            time.sleep(1.0)
        return pb.GetSessionResponse(session=pb.Session(id=request.session_id))

    def Prepare(self, request: pb.PrepareRequest, context: grpc.ServicerContext) -> Iterator[pb.PrepareResponse]:
        self._record(context)
        yield pb.PrepareResponse(progress=pb.FoldProgress(stage=pb.FOLD_STAGE_PLANNED, message="planning"))
        if request.session_id == "endless":
            context.add_callback(self.cancelled.set)
            while context.is_active():
                time.sleep(0.005)
                yield pb.PrepareResponse(progress=pb.FoldProgress(stage=pb.FOLD_STAGE_SUMMARY_DELTA, summary_delta="."))
            return
        if request.session_id == "no-result":
            return
        if request.session_id == "bad-delta":  # answers every known view with a delta that cannot fit
            self.prepares.append(request)
            transcript = self.transcripts.setdefault(request.session_id, [])
            transcript.extend(request.append)
            count = len(transcript)
            tail = list(request.append) if request.known_view_version else transcript
            result = pb.PreparedContext(
                messages=tail,
                view_version=count,
                delta=bool(request.known_view_version),
                view_message_count=count + 9,
                appended=request.append,
            )
            if not request.known_view_version:
                result.view_message_count = count
            yield pb.PrepareResponse(result=result)
            return
        yield pb.PrepareResponse(
            result=pb.PreparedContext(
                messages=list(request.append), view_version=1, view_message_count=len(request.append)
            )
        )


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeService, str]]:
    service = FakeService()  # type: ignore[abstract]  # the RPCs it lacks answer UNIMPLEMENTED
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ContextServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield service, f"127.0.0.1:{port}"
    server.stop(grace=None)


def _span() -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)))


def test_sync_client_sends_token_metadata_and_trace_context(fake: tuple[FakeService, str]) -> None:
    service, address = fake
    with Client(address, token=TOKEN, metadata=[("x-agent", "tester")]) as client:
        client.get_session("s1")
        sent = service.metadata[-1]
        assert sent["authorization"] == f"Bearer {TOKEN}"
        assert sent["x-agent"] == "tester"
        assert "traceparent" not in sent
        with trace.use_span(_span()):
            client.get_session("s1")
            assert service.metadata[-1]["traceparent"] == TRACEPARENT
            explicit = f"00-{'a' * 32}-{'b' * 16}-01"
            client.get_session("s1", traceparent=explicit, metadata=[("x-call", "1")])
            assert service.metadata[-1]["traceparent"] == explicit
            assert service.metadata[-1]["x-call"] == "1"
            view = client.prepare("s1", [user("hi")])
            assert service.metadata[-1]["traceparent"] == TRACEPARENT
            assert [m.content for m in view.messages] == ["hi"]
    with Client(address, propagate_trace=False) as quiet, trace.use_span(_span()):
        quiet.get_session("s1")
        assert "traceparent" not in service.metadata[-1]


async def test_async_client_sends_trace_context(fake: tuple[FakeService, str]) -> None:
    service, address = fake
    async with AsyncClient(address, token=TOKEN) as client:
        with trace.use_span(_span()):
            await client.get_session("s1")
        assert service.metadata[-1]["traceparent"] == TRACEPARENT
        assert service.metadata[-1]["authorization"] == f"Bearer {TOKEN}"


def test_stream_without_result_is_an_error(fake: tuple[FakeService, str]) -> None:
    _, address = fake
    seen: list[FoldProgress] = []
    with Client(address) as client, pytest.raises(CtxfoldError) as raised:
        client.prepare("no-result", on_progress=seen.append)
    assert raised.value.reason == ErrorReason.STREAM_ENDED_WITHOUT_RESULT
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert [e.message for e in seen] == ["planning"]


async def test_async_stream_without_result_is_an_error(fake: tuple[FakeService, str]) -> None:
    _, address = fake
    async with AsyncClient(address) as client:
        with pytest.raises(CtxfoldError) as raised:
            await client.prepare("no-result")
        assert raised.value.reason == ErrorReason.STREAM_ENDED_WITHOUT_RESULT


def test_a_failing_callback_cancels_the_stream(fake: tuple[FakeService, str]) -> None:
    service, address = fake
    service.cancelled.clear()

    def stop(event: FoldProgress) -> None:
        if event.summary_delta:
            raise KeyboardInterrupt

    with Client(address) as client, pytest.raises(KeyboardInterrupt):
        client.prepare("endless", on_progress=stop)
    assert service.cancelled.wait(10)


async def test_async_stream_deadline(fake: tuple[FakeService, str]) -> None:
    _, address = fake
    async with AsyncClient(address, stream_timeout=0.3) as client:
        with pytest.raises(CtxfoldError) as raised:
            await client.prepare("endless")
        assert raised.value.code is grpc.StatusCode.DEADLINE_EXCEEDED


def test_default_deadline(fake: tuple[FakeService, str]) -> None:
    _, address = fake
    with Client(address, timeout=0.2) as client:
        with pytest.raises(CtxfoldError) as raised:
            client.get_session("slow")
        assert raised.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        assert raised.value.reason is ErrorReason.ERROR_REASON_UNSPECIFIED
        assert client.get_session("slow", timeout=5).id == "slow"  # a per-call deadline wins


def test_the_client_names_itself_in_the_user_agent(fake: tuple[FakeService, str]) -> None:
    service, address = fake
    with Client(address) as client:
        client.get_session("s1")
    assert service.metadata[-1]["user-agent"].startswith(f"ctxfold-python/{VERSION} ")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_delta_that_cannot_be_applied_is_recovered_by_preparing_again(
    fake: tuple[FakeService, str], asynchronous: bool
) -> None:
    service, address = fake
    service.prepares.clear()
    service.transcripts.clear()
    if asynchronous:
        async with AsyncClient(address) as aclient:
            await aclient.prepare("bad-delta", [user("a")])
            view = await aclient.prepare("bad-delta", [user("b")], request_id="r-2", overflow=True)
    else:
        with Client(address) as client:
            client.prepare("bad-delta", [user("a")])
            view = client.prepare("bad-delta", [user("b")], request_id="r-2", overflow=True)
    assert [m.content for m in view.messages] == ["a", "b"]  # whole, and "b" appended once
    assert [m.content for m in view.appended] == ["b"], "the view says what the call appended, as in every SDK"
    _first, second, again = service.prepares
    assert (second.known_view_version, second.request_id, [m.content for m in second.append]) == (1, "r-2", ["b"])
    assert (again.known_view_version, list(again.append), again.overflow) == (0, [], False), "no second overflow"
    assert again.request_id not in ("", "r-2")

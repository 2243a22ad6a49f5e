"""Traces and metrics: the span tree of a multi-pass fold (in-memory exporter), and spans and metrics
received over the wire by a real OTLP/gRPC receiver, continuing the client's trace."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from builders import call, compact, create_session, prepare, result, user
from conftest import free_port, fresh_database, settings_for
from ctxfold import __version__
from ctxfold.api.tracing import mark_error
from ctxfold.engine.errors import DomainError, Kind
from ctxfold.replay.options import Options
from ctxfold.replay.runner import replay
from ctxfold.replay.trace import parse_trace
from ctxfold.server import RunningServer, start
from ctxfold.service.run import Hooks
from ctxfold.telemetry import exporter_names
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc
from fake_provider import FakeProvider
from traces import tool_output

ROOT = Path(__file__).resolve().parents[1]
SMALL_WINDOW_SUMMARIZER = json.dumps({"small": {"type": "extractive", "input_window_tokens": 6000}})


@pytest.fixture(scope="session")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
async def small_summarizer_stub(
    backend: str, tmp_path: Path, spans: InMemorySpanExporter
) -> AsyncIterator[pb_grpc.ContextServiceStub]:
    running = await start(settings_for(await fresh_database(backend, tmp_path), summarizers=SMALL_WINDOW_SUMMARIZER))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield pb_grpc.ContextServiceStub(channel)
    await running.stop(grace=1.0)


def children(all_spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in all_spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


async def test_a_multi_pass_fold_is_one_span_tree(
    small_summarizer_stub: pb_grpc.ContextServiceStub, spans: InMemorySpanExporter
) -> None:
    stub = small_summarizer_stub
    session = await create_session(stub, context_window=64_000, summarizer="small")
    await prepare(stub, session.id, user("Audit the ORM"))
    for i in range(40):
        await stub.AppendMessages(
            pb.AppendMessagesRequest(
                session_id=session.id, messages=[call(f"c{i}"), result(f"c{i}", tool_output(i, 3000))]
            )
        )
    spans.clear()
    outcome = await compact(stub, session.id)
    committed = [p for p in outcome.progress if p.stage == pb.FOLD_STAGE_PASS_COMMITTED]
    assert len(committed) >= 2
    finished = list(spans.get_finished_spans())
    rpc = next(s for s in finished if s.name == "ctxfold.v1.ContextService/Compact")
    assert rpc.attributes is not None and rpc.attributes["ctxfold.action"] == "folded"
    assert rpc.attributes["ctxfold.session.id"] == session.id
    (fold,) = [s for s in children(finished, rpc) if s.name == "ctxfold.fold"]
    assert fold.attributes is not None and fold.attributes["ctxfold.fold.passes"] == len(committed)
    assert fold.attributes["ctxfold.fold.trigger"] == "compact"
    assert fold.attributes["ctxfold.context_window"] == 64_000
    assert fold.attributes["ctxfold.trigger_tokens"] == int(0.8 * 64_000)
    assert fold.attributes["ctxfold.hard_limit_tokens"] == 64_000 - 256
    assert fold.attributes["ctxfold.summarizer"] == "extractive"
    assert fold.attributes["ctxfold.summarizer.input_window_tokens"] == 6000
    assert fold.attributes["ctxfold.tenant"] == "default"
    assert fold.attributes["ctxfold.fold.outcome"] == "installed"
    assert fold.attributes["ctxfold.fold.passes_planned"] == len(committed)  # the final plan, not the first
    positions = {
        c.id: c.position_seq
        for c in (
            await stub.ListCheckpoints(pb.ListCheckpointsRequest(session_id=session.id, page_size=100))
        ).checkpoints
    }

    def install_position(event: pb.FoldProgress) -> int:
        return positions[event.checkpoint_id]

    passes = [s for s in children(finished, fold) if s.name == "ctxfold.fold.pass"]
    assert [s.attributes["ctxfold.fold.pass_index"] for s in passes if s.attributes] == list(
        range(1, len(committed) + 1)
    )
    for index, pass_span in enumerate(passes):
        names = [s.name for s in children(finished, pass_span)]
        assert names == ["ctxfold.summarize extractive", "ctxfold.checkpoint.install"]
        summarize, install = children(finished, pass_span)
        # The extractive summarizer calls no model: no GenAI attributes, no client span.
        assert summarize.kind == SpanKind.INTERNAL and summarize.attributes is not None
        assert not [key for key in summarize.attributes if key.startswith("gen_ai.")]
        assert summarize.attributes["ctxfold.summary.tokens"] > 0  # type: ignore[operator]
        assert pass_span.attributes is not None and pass_span.attributes["ctxfold.session.id"] == session.id
        first, last = pass_span.attributes["ctxfold.fold.first_seq"], pass_span.attributes["ctxfold.fold.last_seq"]
        # The range this pass read; the checkpoint's position is said apart only where it differs.
        position = install_position(committed[index])
        assert 0 < first <= last <= position  # type: ignore[operator]
        assert pass_span.attributes.get("ctxfold.checkpoint.position_seq", last) == position
        assert last - first + 1 == pass_span.attributes["ctxfold.fold.messages"]  # type: ignore[operator]
        assert pass_span.attributes["ctxfold.fold.messages"] > 0  # type: ignore[operator]
        assert install.attributes is not None
        assert install.attributes["ctxfold.checkpoint.id"] == committed[index].checkpoint_id
        assert install.attributes["ctxfold.tokens.after"] < install.attributes["ctxfold.tokens.before"]  # type: ignore[operator]
    assert all(s.context.trace_id == rpc.context.trace_id for s in passes)


@pytest.mark.parametrize("answer", ["ok", "retried", "error500"])
async def test_a_model_summary_is_a_genai_chat_span_naming_the_model_and_server(
    backend: str, tmp_path: Path, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    """And the fold span says what the fold came to: installed, or failed (status ERROR, the reason)."""
    monkeypatch.setenv("CTXFOLD_TEST_TELEMETRY_KEY", "k")
    with FakeProvider() as fake:
        if answer == "retried":  # the SDK retries a 500 inside the one call
            fake.script("error500", then="ok")
        else:
            fake.script(then=answer)
        summarizers = {
            "llm": {
                "type": "openai",
                "base_url": fake.base_url,
                "model": "m-fake",
                "api_key_env": "CTXFOLD_TEST_TELEMETRY_KEY",
            }
        }
        running = await start(
            settings_for(await fresh_database(backend, tmp_path), summarizers=json.dumps(summarizers))
        )
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                stub = pb_grpc.ContextServiceStub(channel)
                session = await create_session(stub, context_window=16_000, summarizer="llm")
                turns = [user("start")] + [
                    m for i in range(16) for m in (call(f"c{i}"), result(f"c{i}", tool_output(i, 800)))
                ]
                await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=turns))
                spans.clear()
                if answer != "error500":
                    outcome = await compact(stub, session.id)
                    assert outcome.result.action == pb.ACTION_FOLDED, outcome
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await compact(stub, session.id)
                    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            await running.stop(grace=1.0)
    (fold,) = [s for s in spans.get_finished_spans() if s.name == "ctxfold.fold"]
    fold_attributes = fold.attributes or {}
    if answer != "error500":
        assert fold_attributes["ctxfold.fold.outcome"] == "installed" and fold.status.status_code == StatusCode.UNSET
    else:
        assert fold_attributes["ctxfold.fold.outcome"] == "failed" and fold.status.status_code == StatusCode.ERROR
        assert fold_attributes["ctxfold.fold.failure"] and fold_attributes["ctxfold.fold.passes"] == 0
    (chat,) = [s for s in spans.get_finished_spans() if s.name == "chat m-fake"]
    attributes = chat.attributes or {}
    assert chat.kind == SpanKind.CLIENT
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "m-fake"
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["ctxfold.session.id"] == session.id
    assert attributes["server.port"] == fake.port and attributes["gen_ai.conversation.id"] == session.id
    attempts = [(e.attributes or {})["http.response.status_code"] for e in chat.events if e.name.endswith("attempt")]
    assert attempts == {"ok": [200], "retried": [500, 200], "error500": [500, 500, 500]}[answer]
    if answer != "error500":
        assert attributes["gen_ai.response.model"] == "m-fake" and attributes["gen_ai.response.id"]
    else:  # the provider's answer, not the SDK's exception class
        assert chat.status.status_code == StatusCode.ERROR and attributes["error.type"] == "500"


async def test_a_prune_install_names_no_checkpoint(
    stub: pb_grpc.ContextServiceStub, spans: InMemorySpanExporter
) -> None:
    session = await create_session(stub, context_window=30_000, compact_ratio=0.5)
    await prepare(stub, session.id, user("Audit the repository"))
    spans.clear()
    actions = []
    for i in range(8):
        outcome = await prepare(stub, session.id, call(f"c{i}"), result(f"c{i}", tool_output(i, 10_000)))
        actions.append(outcome.result.action)
    assert pb.ACTION_PRUNED in actions
    installs = [s for s in spans.get_finished_spans() if s.name == "ctxfold.checkpoint.install"]
    prunes = [s for s in installs if (s.attributes or {}).get("ctxfold.install.kind") == "prune"]
    assert prunes and all("ctxfold.checkpoint.id" not in (s.attributes or {}) for s in prunes)
    # Each prune is a `ctxfold.prune` span saying how many results and the tokens before and after.
    (pruned, *_) = [s for s in spans.get_finished_spans() if s.name == "ctxfold.prune"]
    attributes = pruned.attributes or {}
    assert attributes["ctxfold.prune.results"] >= 1  # type: ignore[operator]
    assert attributes["ctxfold.tokens.before"] > attributes["ctxfold.tokens.after"]  # type: ignore[operator]


async def test_results_bounded_to_fit_are_a_bound_span(
    stub: pb_grpc.ContextServiceStub, spans: InMemorySpanExporter
) -> None:
    """Parallel reads larger than the window, none large enough to prune: bounded, as `ctxfold.bound`."""
    session = await create_session(stub, context_window=12_000)
    reads = [pb.ToolCall(id=f"r{i}", name="Read", arguments="{}") for i in range(8)]
    spans.clear()
    outcome = await prepare(
        stub,
        session.id,
        user("Read the parser files"),
        pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=reads),
        *(result(f"r{i}", tool_output(i, 7500)) for i in range(8)),
    )
    assert outcome.result.action == pb.ACTION_PRUNED
    (bound,) = [s for s in spans.get_finished_spans() if s.name == "ctxfold.bound"]
    attributes = bound.attributes or {}
    assert attributes["ctxfold.bound.results"] >= 1  # type: ignore[operator]
    assert attributes["ctxfold.tokens.after"] <= outcome.result.hard_limit_tokens  # type: ignore[operator]


TINY_TRACE = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}]


async def test_a_replay_with_a_traceparent_is_one_trace_under_the_callers_span(
    server: RunningServer, spans: InMemorySpanExporter
) -> None:
    """`ctxfold replay --traceparent`: every RPC of the replay is a child of the caller's span."""
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    spans.clear()
    replayed = await replay(
        parse_trace("tiny", json.dumps({"messages": TINY_TRACE})),
        Options(window=8000),
        server=f"127.0.0.1:{server.port}",
        traceparent=f"00-{trace_id}-{parent_id}-01",
    )
    assert replayed.turns == 1
    rpcs = [s for s in spans.get_finished_spans() if s.name.startswith("ctxfold.v1.ContextService/")]
    assert {s.name.rsplit("/", 1)[1] for s in rpcs} >= {"CreateSession", "Prepare", "DeleteSession"}
    assert all(format(s.context.trace_id, "032x") == trace_id for s in rpcs)
    assert all(s.parent is not None and format(s.parent.span_id, "016x") == parent_id for s in rpcs)


# ---- every RPC span, errors, cancellation -------------------------------------------------------


def rpc_span(finished: list[ReadableSpan], method: str) -> ReadableSpan:
    (span,) = [s for s in finished if s.name == f"ctxfold.v1.ContextService/{method}"]
    return span


async def test_every_rpc_span_names_its_session_and_domain_fields(
    stub: pb_grpc.ContextServiceStub, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    session = await create_session(stub, context_window=64_000)
    appended = await stub.AppendMessages(
        pb.AppendMessagesRequest(session_id=session.id, messages=[user("go"), call("c1"), result("c1", "x" * 9000)])
    )
    result_ref = appended.messages[-1].result_ref
    await stub.ReadToolResult(pb.ReadToolResultRequest(session_id=session.id, tool_call_id="c1", limit=100))
    prepared = await prepare(stub, session.id)
    await stub.ObserveUsage(
        pb.ObserveUsageRequest(
            session_id=session.id,
            view_version=prepared.result.view_version,
            input_tokens=4000,
            cached_input_tokens=3500,
            output_tokens=120,
        )
    )
    fork = (await stub.Fork(pb.ForkRequest(session_id=session.id))).session
    await stub.Rewind(pb.RewindRequest(session_id=fork.id, to_seq=1))
    await stub.GetContextState(pb.GetContextStateRequest(session_id=session.id))
    await stub.ListCheckpoints(pb.ListCheckpointsRequest(session_id=session.id))
    finished = list(spans.get_finished_spans())
    methods = {
        "CreateSession": session.id,
        "AppendMessages": session.id,
        "ReadToolResult": session.id,
        "Prepare": session.id,
        "ObserveUsage": session.id,
        "Fork": session.id,
        "Rewind": fork.id,
        "GetContextState": session.id,
        "ListCheckpoints": session.id,
    }
    attributes = {method: dict(rpc_span(finished, method).attributes or {}) for method in methods}
    for method, session_id in methods.items():
        assert attributes[method]["ctxfold.session.id"] == session_id, method
        assert attributes[method]["rpc.method"] == method and attributes[method]["rpc.grpc.status_code"] == 0
        assert attributes[method]["ctxfold.tenant"] == "default", method  # the tenant's name, never its token
    # A request field left at its default is one the caller did not set: not an attribute.
    assert "ctxfold.request.known_view_version" not in attributes["Prepare"]
    assert "ctxfold.request.overflow" not in attributes["Prepare"]
    assert "ctxfold.request.append.count" not in attributes["Prepare"]
    assert attributes["AppendMessages"]["ctxfold.request.messages.count"] == 3
    read = attributes["ReadToolResult"]
    assert read["ctxfold.request.tool_call_id"] == "c1" and read["ctxfold.response.result_ref"] == result_ref
    assert read["ctxfold.request.limit"] == 100 and read["ctxfold.response.total_bytes"] == 9000
    assert "ctxfold.response.data" not in read  # content stays off spans
    usage = attributes["ObserveUsage"]
    assert (usage["ctxfold.request.input_tokens"], usage["ctxfold.request.cached_input_tokens"]) == (4000, 3500)
    assert usage["ctxfold.request.output_tokens"] == 120
    assert attributes["Fork"]["ctxfold.response.session.id"] == fork.id
    assert attributes["Rewind"]["ctxfold.request.to_seq"] == 1
    assert "ctxfold.response.state_json" not in attributes["GetContextState"]


async def test_a_client_error_leaves_the_span_status_unset_with_its_reason_and_code(
    stub: pb_grpc.ContextServiceStub, spans: InMemorySpanExporter
) -> None:
    """OpenTelemetry's RPC conventions: a server span is an error only when the server failed; a
    caller's mistake (NOT_FOUND here) records its code and reason, no status and no stack trace."""
    spans.clear()
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.GetSession(pb.GetSessionRequest(session_id="s_missing"))
    with pytest.raises(grpc.aio.AioRpcError):
        await compact(stub, "s_missing")
    finished = list(spans.get_finished_spans())
    for method in ("GetSession", "Compact"):
        span = rpc_span(finished, method)
        assert span.status.status_code == StatusCode.UNSET, method
        attributes = span.attributes or {}
        assert attributes["ctxfold.error.reason"] == "SESSION_NOT_FOUND"
        assert attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
        assert attributes["ctxfold.session.id"] == "s_missing"
        assert "error.type" not in attributes
        assert span.events == (), method


def test_a_server_error_marks_the_span_failed_with_its_reason_and_one_exception_event() -> None:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    error = DomainError(Kind.UNAVAILABLE, "STORE_UNAVAILABLE", "the database cannot be reached")
    with provider.get_tracer("test").start_as_current_span("rpc"):
        mark_error(error, grpc.StatusCode.UNAVAILABLE, error)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == "the database cannot be reached"
    attributes = span.attributes or {}
    assert attributes["ctxfold.error.reason"] == attributes["error.type"] == "STORE_UNAVAILABLE"
    assert [event.name for event in span.events] == ["exception"]


async def test_a_cancelled_stream_ends_its_span_without_tracebacks(
    backend: str, tmp_path: Path, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    hooks = Hooks()
    holding = asyncio.Event()

    async def hold(_session_id: str) -> None:
        holding.set()
        await asyncio.Event().wait()  # until cancelled

    hooks.before_install = hold
    running = await start(settings_for(await fresh_database(backend, tmp_path)), hooks=hooks)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ContextServiceStub(channel)
            session = await create_session(stub, context_window=8000)
            turns = [user("start")] + [
                m for i in range(8) for m in (call(f"c{i}"), result(f"c{i}", tool_output(i, 1500)))
            ]
            await stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.id, messages=turns))
            spans.clear()
            stream = stub.Compact(pb.CompactRequest(session_id=session.id))

            async def read() -> None:
                async for _ in stream:
                    pass

            reader = asyncio.create_task(read())
            await asyncio.wait_for(holding.wait(), 10)
            stream.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
            deadline = time.monotonic() + 10
            while not any(s.name.endswith("/Compact") for s in spans.get_finished_spans()):
                assert time.monotonic() < deadline, "the Compact span never ended"
                await asyncio.sleep(0.05)
    finally:
        await running.stop(grace=1.0)
    span = rpc_span(list(spans.get_finished_spans()), "Compact")
    assert (span.attributes or {})["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    assert span.events == ()
    assert [r for r in caplog.records if r.name.startswith("opentelemetry") or r.exc_info] == []


# ---- over the wire --------------------------------------------------------------------------------


class Receiver(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    """A minimal OTLP/gRPC collector that keeps what it receives."""

    def __init__(self) -> None:
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            self.traces.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()
        self.metrics.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def span_names(self, trace_id: bytes) -> set[str]:
        return {
            span.name
            for request in self.traces
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
            if span.trace_id == trace_id
        }

    def metric_names(self) -> set[str]:
        return {
            metric.name
            for request in self.metrics
            for resource_metrics in request.resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
        }


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    from concurrent import futures

    collector = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield collector, port
    server.stop(0)


@pytest.mark.parametrize(
    ("environ", "traces", "metrics"),
    [
        ({}, ["none"], ["none"]),
        # The documented Jaeger setup: Jaeger refuses metrics, so none are pushed to it.
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, ["otlp"], ["none"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_METRICS_EXPORTER": "otlp"}, ["otlp"], ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4317"}, ["none"], ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console"}, ["console"], ["console"]),
    ],
)
def test_an_otlp_endpoint_alone_exports_traces_and_metrics_only_where_asked_for(
    environ: dict[str, str], traces: list[str], metrics: list[str]
) -> None:
    assert exporter_names(environ) == (traces, metrics)


async def test_spans_and_metrics_reach_an_otlp_receiver_in_the_clients_trace(
    receiver: tuple[Receiver, int], tmp_path: Path
) -> None:
    collector, collector_port = receiver
    port = free_port()
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector_port}",
        "OTEL_METRICS_EXPORTER": "otlp",  # the endpoint alone exports traces only
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
        "OTEL_SERVICE_NAME": "ctxfold-under-test",
    }
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "ctxfold.cli", "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path)],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 30)
            stub = pb_grpc.ContextServiceStub(channel)
            session = await create_session(stub, context_window=4000, max_output_tokens=256)
            trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
            metadata = (("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),)
            for i in range(10):
                request = pb.PrepareRequest(
                    session_id=session.id, append=[call(f"c{i}"), result(f"c{i}", tool_output(i, 1500))]
                )
                if i == 0:
                    request.append.insert(0, user("start"))
                async for _ in stub.Prepare(request, metadata=metadata):
                    pass
            deadline = time.monotonic() + 45
            wanted = {
                "ctxfold.v1.ContextService/Prepare",
                "ctxfold.fold",
                "ctxfold.fold.pass",
                "ctxfold.summarize extractive",
            }
            wanted_metrics = {"ctxfold.prepare.duration", "ctxfold.maintenance.operations"}
            while time.monotonic() < deadline:
                names = collector.span_names(bytes.fromhex(trace_id))
                # Metrics arrive with periodic exports: wait for all of them, not just the first one.
                if wanted <= names and wanted_metrics <= collector.metric_names():
                    break
                await asyncio.sleep(0.2)
            names = collector.span_names(bytes.fromhex(trace_id))
            assert wanted <= names, f"spans received in the client's trace: {names}"
            metric_names = collector.metric_names()
            assert wanted_metrics <= metric_names, metric_names
            service_names = {
                attribute.value.string_value
                for request in collector.traces
                for resource_spans in request.resource_spans
                for attribute in resource_spans.resource.attributes
                if attribute.key == "service.name"
            }
            assert service_names == {"ctxfold-under-test"}
            versions = {
                attribute.value.string_value
                for request in collector.traces
                for resource_spans in request.resource_spans
                for attribute in resource_spans.resource.attributes
                if attribute.key == "service.version"
            }
            assert versions == {__version__}
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)


async def test_a_background_fold_is_a_trace_of_its_own_linked_to_the_prepares_that_started_and_installed_it(
    small_summarizer_stub: pb_grpc.ContextServiceStub, spans: InMemorySpanExporter
) -> None:
    stub = small_summarizer_stub
    session = await create_session(stub, context_window=12_000, prefold_ratio=0.6)
    await prepare(stub, session.id, user("Audit the ORM"))
    spans.clear()
    turn = 0

    async def step() -> list[int]:
        nonlocal turn
        turn += 1
        outcome = await prepare(stub, session.id, call(f"c{turn}"), result(f"c{turn}", tool_output(turn, 2000)))
        return [p.stage for p in outcome.progress]

    while pb.FOLD_STAGE_BACKGROUND_STARTED not in await step():
        assert turn < 60
    starter = [s for s in spans.get_finished_spans() if s.name == "ctxfold.v1.ContextService/Prepare"][-1]
    fold = None
    for _ in range(200):
        fold = next((s for s in spans.get_finished_spans() if s.name == "ctxfold.fold"), None)
        if fold is not None:
            break
        await asyncio.sleep(0.025)
    assert fold is not None and fold.attributes is not None
    assert fold.parent is None  # its own trace, not part of the RPC that started it
    assert fold.context.trace_id != starter.context.trace_id
    assert fold.attributes["ctxfold.fold.trigger"] == "background"
    assert fold.attributes["ctxfold.fold.outcome"] == "prepared"
    assert [(link.context.span_id, link.attributes) for link in fold.links] == [
        (starter.context.span_id, {"ctxfold.link": "started_by"})
    ]
    # Nothing was installed by it: no install span in its trace.
    assert not [
        s
        for s in spans.get_finished_spans()
        if s.context.trace_id == fold.context.trace_id and s.name == "ctxfold.checkpoint.install"
    ]
    while pb.FOLD_STAGE_PREPARED_INSTALLED not in await step():
        assert turn < 80
    installer = [s for s in spans.get_finished_spans() if s.name == "ctxfold.v1.ContextService/Prepare"][-1]
    (install,) = [
        s
        for s in spans.get_finished_spans()
        if s.name == "ctxfold.checkpoint.install" and s.context.trace_id == installer.context.trace_id
    ]
    assert [(link.context.span_id, link.context.trace_id) for link in install.links] == [
        (fold.context.span_id, fold.context.trace_id)
    ]

"""OpenTelemetry traces and metrics: instrumentation through the API (`TRACER`, `INSTRUMENTS`), a no-op until
`configure()` installs the SDK from the standard OTEL_* variables (docs/observability.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.metrics import Counter, Histogram, UpDownCounter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from ctxfold import __version__

log = logging.getLogger(__name__)

TRACER = trace.get_tracer("ctxfold")
_METER = metrics.get_meter("ctxfold")


@dataclass(frozen=True)
class Instruments:
    prepare_duration: Histogram
    maintenance_operations: Counter
    tokens_saved: Counter
    summarizer_duration: Histogram
    usage_input_tokens: Counter
    hot_state_lookups: Counter
    hot_state_evictions: Counter
    hot_state_bytes: UpDownCounter
    hot_state_sessions: UpDownCounter
    event_loop_lag: Histogram


INSTRUMENTS = Instruments(
    prepare_duration=_METER.create_histogram(
        "ctxfold.prepare.duration", unit="s", description="Prepare and Compact latency, by action"
    ),
    maintenance_operations=_METER.create_counter(
        "ctxfold.maintenance.operations", unit="{operation}", description="Prunes and folds, by action and outcome"
    ),
    tokens_saved=_METER.create_counter(
        "ctxfold.maintenance.tokens_saved", unit="{token}", description="Estimated request tokens removed"
    ),
    summarizer_duration=_METER.create_histogram(
        "gen_ai.client.operation.duration", unit="s", description="Summarizer call latency"
    ),
    usage_input_tokens=_METER.create_counter(
        "ctxfold.usage.input_tokens",
        unit="{token}",
        description="Provider-billed input tokens from ObserveUsage; cached=true are prompt-cache hits",
    ),
    hot_state_lookups=_METER.create_counter(
        "ctxfold.hot_state.lookups", unit="{lookup}", description="Hot-state cache lookups; hit=false are misses"
    ),
    hot_state_evictions=_METER.create_counter(
        "ctxfold.hot_state.evictions", unit="{session}", description="Sessions evicted from the hot-state cache"
    ),
    hot_state_bytes=_METER.create_up_down_counter(
        "ctxfold.hot_state.size", unit="By", description="Estimated bytes held by the hot-state cache"
    ),
    hot_state_sessions=_METER.create_up_down_counter(
        "ctxfold.hot_state.sessions", unit="{session}", description="Sessions held by the hot-state cache"
    ),
    event_loop_lag=_METER.create_histogram(
        "ctxfold.event_loop.lag", unit="s", description="How late a timer set every 10 ms fired on the event loop"
    ),
)


def _names(value: str | None) -> list[str]:
    return [name.strip().lower() for name in (value or "").split(",") if name.strip()]


def _protocol(environ: Mapping[str, str], signal: str) -> str:
    return environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"


def _span_exporter(name: str, environ: Mapping[str, str]) -> SpanExporter | None:
    if name == "console":
        return ConsoleSpanExporter()
    if name == "otlp":
        if _protocol(environ, "TRACES") == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

            return HttpSpanExporter()
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter()
    if name != "none":
        raise ValueError(f"OTEL_TRACES_EXPORTER: unsupported exporter {name!r} (otlp, console, none)")
    return None


def _metric_exporter(name: str, environ: Mapping[str, str]) -> MetricExporter | None:
    if name == "console":
        return ConsoleMetricExporter()
    if name == "otlp":
        if _protocol(environ, "METRICS") == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter as HttpMetricExporter,
            )

            return HttpMetricExporter()
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        return GrpcMetricExporter()
    if name != "none":
        raise ValueError(f"OTEL_METRICS_EXPORTER: unsupported exporter {name!r} (otlp, console, none)")
    return None


def exporter_names(environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The trace and metric exporters the variables ask for. OTEL_EXPORTER_OTLP_ENDPOINT alone turns on
    traces, not metrics (most often it is Jaeger, which refuses them; docs/observability.md)."""
    traces_default = "otlp" if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") else "none"
    metrics_default = "otlp" if environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") else "none"
    return (
        _names(environ.get("OTEL_TRACES_EXPORTER") or traces_default),
        _names(environ.get("OTEL_METRICS_EXPORTER") or metrics_default),
    )


def configure(environ: Mapping[str, str]) -> Callable[[], object]:
    """Installs the SDK as the variables say and returns a function that flushes and shuts it down."""
    trace_names, metric_names = exporter_names(environ)
    # service.name ctxfold unless OTEL_SERVICE_NAME names it; OTEL_RESOURCE_ATTRIBUTES adds to these.
    named = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": "ctxfold"}
    resource = Resource.create({"service.version": __version__, **named})
    shutdowns: list[Callable[[], object]] = []
    span_exporters = [e for n in trace_names if (e := _span_exporter(n, environ))]
    if span_exporters:
        tracer_provider = TracerProvider(resource=resource)
        for span_exporter in span_exporters:
            tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        trace.set_tracer_provider(tracer_provider)
        shutdowns.append(tracer_provider.shutdown)
    metric_exporters = [m for n in metric_names if (m := _metric_exporter(n, environ))]
    if metric_exporters:
        meter_provider = MeterProvider(
            resource=resource, metric_readers=[PeriodicExportingMetricReader(e) for e in metric_exporters]
        )
        metrics.set_meter_provider(meter_provider)
        shutdowns.append(meter_provider.shutdown)
    if span_exporters or metric_exporters:
        log.info("telemetry: %d trace and %d metric exporter(s) configured", len(span_exporters), len(metric_exporters))
    return lambda: [stop() for stop in shutdowns]

"""What a Prepare or Compact reports while it runs (progress, spans, metrics), step by step; nothing here decides."""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from ctxfold.engine import estimator
from ctxfold.engine.candidate import FoldInstall, Install
from ctxfold.engine.maintenance import FoldOutcome, FoldPass, MaintainRequest
from ctxfold.engine.model import SessionConfig
from ctxfold.engine.state import Receipt, ReceiptStatus
from ctxfold.store import StaleSession
from ctxfold.summarizers.base import IN_PROCESS_PROVIDER, Summarizer, SummaryRequest, SummaryResult
from ctxfold.telemetry import INSTRUMENTS, TRACER


class FoldStage(enum.Enum):
    PRUNED = "pruned"
    PLANNED = "planned"
    PASS_STARTED = "pass_started"
    SUMMARY_DELTA = "summary_delta"
    PASS_COMMITTED = "pass_committed"
    PASS_FAILED = "pass_failed"
    SUMMARIZER_FALLBACK = "summarizer_fallback"
    RESULTS_BOUNDED = "results_bounded"
    BACKGROUND_STARTED = "background_started"
    PREPARED_INSTALLED = "prepared_installed"
    BACKGROUND_RUNNING = "background_running"


@dataclass(frozen=True)
class FoldProgress:
    stage: FoldStage
    message: str
    pass_index: int = 0
    passes_planned: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    checkpoint_id: str = ""
    summary_delta: str = ""
    summarizer: str = ""


@dataclass(frozen=True)
class AppendStored:
    """A Prepare's first event: its append is stored (what is left may wait for a summarizer). Not sent."""


Emit = Callable[[FoldProgress], Awaitable[None]]


async def no_progress(_: FoldProgress) -> None:
    """The emit of a call nobody listens to (a background fold)."""


@dataclass
class SummarizerCall:
    """One summarizer call as its span sees it; `failure` decides the duration metric's error type."""

    span: Span
    summarizer: Summarizer
    calls_model: bool
    failure: str = ""

    def answered(self, result: SummaryResult, text: str, failure: str) -> None:
        if self.calls_model:
            self.span.set_attributes(
                {
                    "gen_ai.response.model": result.response_model or self.summarizer.model,
                    **({"gen_ai.response.id": result.response_id} if result.response_id else {}),
                    "gen_ai.usage.input_tokens": result.input_tokens,
                    "gen_ai.usage.output_tokens": result.output_tokens,
                    "gen_ai.usage.cache_read.input_tokens": result.cached_input_tokens,
                    "gen_ai.response.finish_reasons": [result.finish_reason],
                }
            )
        else:
            self.span.set_attribute("ctxfold.summary.tokens", estimator.count_text(text))
        if result.native is not None:
            self.span.set_attribute("ctxfold.summarizer.native", result.native.format)
        if result.native_fallback:
            self.span.set_attribute("ctxfold.summarizer.native_fallback", result.native_fallback)
        self.failure = failure

    def raised(self, exc: Exception, failure: str) -> None:
        self.span.record_exception(exc)
        self.span.set_attribute("error.type", provider_error_type(exc))
        self.failure = failure


def provider_error_type(exc: BaseException) -> str:
    """The provider's HTTP status (as the GenAI conventions suggest), else the exception's class (no answer came)."""
    cause: BaseException | None = exc
    while cause is not None:  # a SummarizerError wraps the SDK's error
        status = getattr(cause, "status_code", None)
        if isinstance(status, int):
            return str(status)
        cause = cause.__cause__ or cause.__context__
    return type(exc).__qualname__


_TRACE_CONTEXT = TraceContextTextMapPropagator()


def traceparent_of(span: Span) -> str:
    """The W3C traceparent of `span` ("" when it is not recorded)."""
    carrier: dict[str, str] = {}
    _TRACE_CONTEXT.inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def span_context_of(traceparent: str) -> trace.SpanContext:
    return trace.get_current_span(_TRACE_CONTEXT.extract({"traceparent": traceparent})).get_span_context()


@dataclass
class MaintenanceObserver:
    emit: Emit
    session_id: str
    tenant: str
    _pass: tuple[int, int] = (0, 0)  # the current pass's index and plan (`fold_pass`); (0, 0) between passes

    def _span(
        self, name: str, attributes: Mapping[str, AttributeValue], links: Sequence[trace.Link] | None = None, **kw: Any
    ) -> AbstractContextManager[Span]:
        attributes = {"ctxfold.session.id": self.session_id, **attributes}
        return TRACER.start_as_current_span(name, links=links, attributes=attributes, **kw)

    async def _progress(self, stage: FoldStage, message: str, **fields: Any) -> None:
        """An event; one of a pass carries its index and plan."""
        index, passes = self._pass
        await self.emit(FoldProgress(stage, message, **{"pass_index": index, "passes_planned": passes, **fields}))

    async def discarded(self) -> None:
        await self._progress(FoldStage.PASS_FAILED, "the session changed meanwhile: candidate discarded, starting over")

    @contextlib.contextmanager
    def installing(self, install: Install, before: int, after: int, prepared_by: str = "") -> Iterator[None]:
        """The install's span; a prepared fold's links to that fold's span (`prepared_by`, its W3C traceparent)."""
        fold = install if isinstance(install, FoldInstall) else None
        links = [trace.Link(span_context_of(prepared_by), {"ctxfold.link": "prepared_by"})] if prepared_by else None
        attributes: dict[str, AttributeValue] = {
            "ctxfold.install.kind": "checkpoint" if fold else "prune",
            "ctxfold.tokens.before": before,
            "ctxfold.tokens.after": after,
            **({"ctxfold.checkpoint.id": fold.checkpoint.id} if fold else {}),  # a prune installs no checkpoint
        }
        with self._span("ctxfold.checkpoint.install", attributes, links) as span:
            try:
                yield
            except StaleSession:
                span.set_status(StatusCode.ERROR, "stale: the session changed; candidate discarded")
                raise

    @staticmethod
    def receipt(receipt: Receipt) -> None:
        action, status = receipt.action.value, receipt.status.value
        INSTRUMENTS.maintenance_operations.add(1, {"ctxfold.action": action, "ctxfold.status": status})
        if receipt.status is ReceiptStatus.APPLIED:
            INSTRUMENTS.tokens_saved.add(receipt.tokens_saved, {"ctxfold.action": action})

    @contextlib.asynccontextmanager
    async def pruning(self, results: int, before: int, after: int, bound: bool) -> AsyncIterator[None]:
        """A prune's span (`ctxfold.prune`; `bound`: results bounded to fit, `ctxfold.bound`), then its event."""
        name = "ctxfold.bound" if bound else "ctxfold.prune"
        attributes = {f"{name}.results": results, "ctxfold.tokens.before": before, "ctxfold.tokens.after": after}
        with self._span(name, attributes):
            yield
        if bound:
            message = (
                f"nothing more to fold and the view above the hard ceiling: bounded {results} tool results "
                f"(head + tail + their result_ref): {before} → {after} tokens"
            )
        else:
            message = f"pruned {results} old tool results: {before} → {after} tokens"
        stage = FoldStage.RESULTS_BOUNDED if bound else FoldStage.PRUNED
        await self._progress(stage, message, tokens_before=before, tokens_after=after)

    def folding(
        self,
        request: MaintainRequest,
        config: SessionConfig,
        summarizer: Summarizer,
        passes: int,
        before: int,
        started_by: trace.SpanContext | None = None,
    ) -> AbstractContextManager[Span]:
        """The fold's span; a background fold's is a trace of its own, linked to the call that started it."""
        links = [trace.Link(started_by, {"ctxfold.link": "started_by"})] if started_by is not None else None
        attributes: dict[str, AttributeValue] = {
            "ctxfold.tenant": self.tenant,
            "ctxfold.fold.trigger": request.trigger.value,
            "ctxfold.context_window": config.context_window,
            "ctxfold.trigger_tokens": config.trigger_tokens,
            "ctxfold.hard_limit_tokens": config.hard_limit_tokens,
            "ctxfold.fold.passes_planned": passes,
            "ctxfold.tokens.before": before,
            "ctxfold.summarizer": summarizer.name,
            "ctxfold.summarizer.input_window_tokens": summarizer.input_window_tokens,
        }
        return self._span("ctxfold.fold", attributes, links)

    async def prepared_installed(self, before: int, after: int, checkpoint_id: str, summarizer: str) -> None:
        message = f"installed the fold prepared in the background by {summarizer}: {before} → {after} tokens"
        fields = {"tokens_before": before, "tokens_after": after, "checkpoint_id": checkpoint_id}
        await self._progress(FoldStage.PREPARED_INSTALLED, message, **fields, summarizer=summarizer)

    async def planned(self, passes: int, before: int) -> None:
        message = f"folding in {passes} pass(es) from {before} tokens"
        await self._progress(FoldStage.PLANNED, message, passes_planned=passes, tokens_before=before)

    @staticmethod
    def folded(span: Span, installed: int, planned: int, after: int, outcome: FoldOutcome, failure: str) -> None:
        """The end of the fold whose span (`folding`) is `span`: the passes it installed of the final plan's, and its
        outcome."""
        span.set_attributes(
            {
                "ctxfold.fold.passes": installed,
                "ctxfold.fold.passes_planned": planned,
                "ctxfold.tokens.after": after,
                "ctxfold.fold.outcome": outcome.value,
            }
        )
        if outcome in (FoldOutcome.FAILED, FoldOutcome.PARTIAL):
            span.set_attribute("ctxfold.fold.failure", failure)
        if outcome is FoldOutcome.FAILED:
            span.set_status(StatusCode.ERROR, failure)

    @contextlib.contextmanager
    def fold_pass(self, index: int, passes: int) -> Iterator[None]:
        """A pass's span; the events inside it carry its index and plan."""
        attributes = {"ctxfold.fold.pass_index": index, "ctxfold.fold.passes_planned": passes}
        with self._span("ctxfold.fold.pass", attributes):
            self._pass = (index, passes)
            try:
                yield
            finally:
                self._pass = (0, 0)

    async def pass_started(self, fold: FoldPass, before: int, summarizer: str) -> None:
        folded_seqs = [m.source.seq for m in fold.folded if m.source is not None]
        last_seq = max(folded_seqs, default=0)
        span = trace.get_current_span()
        span.set_attributes(
            {
                "ctxfold.tokens.before": before,
                "ctxfold.fold.input_tokens": fold.input_tokens,
                "ctxfold.fold.messages": len(fold.folded),
                "ctxfold.fold.first_seq": min(folded_seqs, default=0),
                "ctxfold.fold.last_seq": last_seq,
            }
        )
        if fold.position_seq != last_seq:  # the checkpoint also covers messages this pass did not read
            span.set_attribute("ctxfold.checkpoint.position_seq", fold.position_seq)
        message = f"pass {self._pass[0]}: summarizing {len(fold.folded)} messages ({fold.input_tokens} tokens read)"
        await self._progress(FoldStage.PASS_STARTED, message, tokens_before=before, summarizer=summarizer)

    def summary_deltas(self) -> Callable[[str], Awaitable[None]]:
        return lambda text: self._progress(FoldStage.SUMMARY_DELTA, "", summary_delta=text)

    async def fell_back(self, before: int, failed: str, fallback: str, note: str) -> None:
        trace.get_current_span().set_attribute("ctxfold.fold.fallback_from", failed)
        message = f"pass {self._pass[0]}: {note}"
        await self._progress(FoldStage.SUMMARIZER_FALLBACK, message, tokens_before=before, summarizer=fallback)

    async def pass_failed(self, why: str) -> None:
        trace.get_current_span().set_status(StatusCode.ERROR, why)
        await self._progress(FoldStage.PASS_FAILED, why)

    @staticmethod
    def candidate(checkpoint_id: str, after: int) -> None:
        trace.get_current_span().set_attributes({"ctxfold.tokens.after": after, "ctxfold.checkpoint.id": checkpoint_id})

    async def pass_committed(self, before: int, after: int, checkpoint_id: str, summarizer: str) -> None:
        message = f"pass {self._pass[0]} committed checkpoint {checkpoint_id}: {before} → {after} tokens"
        fields = {"tokens_before": before, "tokens_after": after, "checkpoint_id": checkpoint_id}
        await self._progress(FoldStage.PASS_COMMITTED, message, **fields, summarizer=summarizer)

    @contextlib.contextmanager
    def summarizing(self, summarizer: Summarizer, request: SummaryRequest) -> Iterator[SummarizerCall]:
        """A model call as a GenAI `chat` client span, an in-process summarizer as what it is; its duration a metric."""
        calls_model = summarizer.provider != IN_PROCESS_PROVIDER
        metric = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": summarizer.provider,
            "gen_ai.request.model": summarizer.model,
        }
        name = f"chat {summarizer.model}" if calls_model else f"ctxfold.summarize {summarizer.name}"
        attributes: dict[str, AttributeValue] = {"ctxfold.summarizer": summarizer.name}
        if calls_model:
            attributes |= {
                **metric,
                "gen_ai.request.max_tokens": request.max_tokens,
                "gen_ai.conversation.id": self.session_id,
                **(
                    {"server.address": summarizer.server_address, "server.port": summarizer.server_port}
                    if summarizer.server_address
                    else {}
                ),
            }
        with self._span(name, attributes, kind=SpanKind.CLIENT if calls_model else SpanKind.INTERNAL) as span:
            started = time.perf_counter()
            call = SummarizerCall(span, summarizer, calls_model)
            try:
                yield call
            finally:
                if call.failure:
                    span.set_status(StatusCode.ERROR, call.failure)
                failed = {"error.type": "summary"} if call.failure else {}
                INSTRUMENTS.summarizer_duration.record(time.perf_counter() - started, {**metric, **failed})

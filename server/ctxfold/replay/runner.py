"""Replays a trace through a ctxfold server turn by turn, as an agent would: append what came
before the next model call, Prepare (collecting progress), send the returned view to the simulated
provider, take the recorded assistant message as the model's answer, report usage with
ObserveUsage, and append the answer with the next Prepare."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Literal

import grpc

from ctxfold.engine import estimator
from ctxfold.engine.model import DEFAULT_COMPACT_RATIO, DEFAULT_TAIL_RATIO, ToolCall
from ctxfold.replay import probes
from ctxfold.replay.metrics import AGENT_KEY, Meter, ModelCall, Recording, ReplayResult, SummaryCall, last_view
from ctxfold.replay.prices import BUILT_IN, DEFAULT_SHEET, PriceError, PriceSheet, sheet_from_mapping
from ctxfold.replay.simulator import Bill, Provider, cache_model
from ctxfold.replay.trace import Msg, Trace, Turn, parse_trace, turns
from ctxfold.summarizers.base import SummaryRequest
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc

_TO_PB = {"system": pb.ROLE_SYSTEM, "user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT, "tool": pb.ROLE_TOOL}
_FROM_PB = {v: k for k, v in _TO_PB.items()}
CONNECT_TIMEOUT_SECONDS = 10.0
BACKGROUND_SETTLE_SECONDS = 60.0
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


class ReplayError(Exception):
    """The replay could not go on; the message says why."""


@dataclass(frozen=True)
class Options:
    window: int = 32000
    ratio: float = 0.0  # 0 = the server's default (DEFAULT_COMPACT_RATIO)
    tail_ratio: float = 0.0
    max_output_tokens: int = 0
    summary_max_tokens: int = 0
    summarizer: str = ""
    prices: PriceSheet = BUILT_IN[DEFAULT_SHEET]
    provider_cache: str = ""  # "" = the price sheet's provider
    cache_ttl: float | Literal["default"] | None = "default"
    think_seconds: float = 10.0
    prefold_ratio: float | None = None  # None = the server's default for the summarizer

    def settings(self) -> dict[str, object]:
        return {
            "window": self.window,
            "ratio": self.ratio or DEFAULT_COMPACT_RATIO,
            "tail_ratio": self.tail_ratio or DEFAULT_TAIL_RATIO,
            "max_output_tokens": self.max_output_tokens,
            "summarizer": self.summarizer or "extractive",
            "think_seconds": self.think_seconds,
            **({} if self.prefold_ratio is None else {"prefold_ratio": self.prefold_ratio}),
        }

    def config(self, trace: Trace) -> pb.SessionConfig:
        """The session config a replay of `trace` creates."""
        config = pb.SessionConfig(
            context_window=self.window,
            compact_ratio=self.ratio,
            tail_ratio=self.tail_ratio,
            max_output_tokens=self.max_output_tokens,
            summary_max_tokens=self.summary_max_tokens,
            system_prompt=trace.system_prompt,
            tools_json=trace.tools_json,
            summarizer=self.summarizer,
        )
        if self.prefold_ratio is not None:
            config.prefold_ratio = self.prefold_ratio
        return config

    def provider(self) -> Provider:
        return Provider(cache_model(self.provider_cache or self.prices.provider, self.cache_ttl), self.prices)


def load_trace_file(path: str | Path) -> Trace:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_trace(p.name, text)


def load_prices(name_or_path: str) -> PriceSheet:
    """A built-in sheet by name, or a JSON file of `PriceSheet` fields."""
    if name_or_path in BUILT_IN:
        return BUILT_IN[name_or_path]
    path = Path(name_or_path)
    if not path.exists():
        raise PriceError(f"unknown price sheet {name_or_path!r}: not a built-in ({', '.join(BUILT_IN)}) nor a file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PriceError(f"price sheet {name_or_path}: {exc}") from None
    if not isinstance(data, dict):
        raise PriceError(f"price sheet {name_or_path}: expected a JSON object")
    return sheet_from_mapping(data, str(data.get("name") or path.stem))


def to_pb(message: Msg) -> pb.Message:
    return pb.Message(
        role=_TO_PB[message.role],
        content=message.content,
        tool_call_id=message.tool_call_id,
        reasoning_content=message.reasoning,
        tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in message.tool_calls],
    )


def from_pb(message: pb.Message, sources: dict[int, int]) -> Msg:
    """A view message as a `Msg`; `sources` maps canonical seqs to trace indexes."""
    return Msg(
        role=_FROM_PB.get(message.role, "user"),
        content=message.content,
        tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in message.tool_calls),
        tool_call_id=message.tool_call_id,
        reasoning=message.reasoning_content,
        source=sources.get(message.seq, -1) if message.id else -1,
        summary=message.summary,
        elided=message.pruned,
        ref=message.result_ref,
    )


class ProgressBar:
    """One line on stderr, redrawn in place; silent when disabled."""

    def __init__(self, total: int, label: str, enabled: bool, stream: IO[str] = sys.stderr, width: int = 30):
        self.total = max(1, total)
        self.label = label
        self.enabled = enabled
        self.stream = stream
        self.width = width
        self._last = 0.0

    def update(self, done: int, note: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < self.total and now - self._last < 0.1:
            return
        self._last = now
        filled = self.width * done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {done}/{self.total} {note}\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _summary_calls(
    previous_view: Sequence[Msg],
    appended: Sequence[Msg],
    new_view: Sequence[Msg],
    key: str,
    instruction: str,
    passes: int,
    committed: int,
) -> list[SummaryCall]:
    """The fold's summarizer request(s) as an LLM would receive them (a cache-safe fork of the
    agent's request): the view before the fold up to its last folded message, then the instruction.
    Several passes in one Prepare are modeled as that one read, plus empty reads for the others."""
    before = [*previous_view, *appended]
    kept = {m.source for m in new_view if m.source >= 0}
    cut = max((i for i, m in enumerate(before) if m.summary or (m.source >= 0 and m.source not in kept)), default=-1)
    output = sum(estimator.count_text(m.content) for m in new_view if m.summary) if committed else 0
    first = SummaryCall(key, (*before[: cut + 1], Msg("user", instruction)), output)
    return [first, *(SummaryCall(key, (), 0) for _ in range(passes - 1))]


async def replay_through(
    stub: pb_grpc.ContextServiceAsyncStub,
    trace: Trace,
    options: Options,
    metadata: tuple[tuple[str, str], ...] = (),
    on_turn: Callable[[int, int, ReplayResult], None] | None = None,
    policy: str = "ctxfold",
) -> tuple[ReplayResult, Recording]:
    """Replays `trace` through the server behind `stub` in a new session (deleted at the end)."""
    calls, trailing = turns(trace)
    meter = Meter(trace, options.provider(), policy, options.settings(), options.think_seconds)
    try:
        created = await stub.CreateSession(pb.CreateSessionRequest(config=options.config(trace)), metadata=metadata)
    except grpc.aio.AioRpcError as exc:
        raise ReplayError(f"CreateSession failed: {exc.code().name}: {exc.details()}") from None
    replay = _Replay(
        stub, created.session, metadata, meter, created.session.config.summary_max_tokens or options.window // 8
    )
    try:
        for number, turn in enumerate(calls, 1):
            await replay.turn(number, turn)
            if on_turn is not None:
                on_turn(number, len(calls), meter.result)
        replay.ended()
        refs = await stored_refs(stub, replay.session.id, replay.sources, metadata)
        documents = await read_documents(stub, replay.session.id, replay.view, trace, refs, metadata)
        await _append_trailing(stub, replay.session.id, trailing, metadata)
    finally:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.DeleteSession(pb.DeleteSessionRequest(session_id=replay.session.id), metadata=metadata)
    appended_count = calls[-1].answer.source if calls else 0
    recording = Recording(policy, options.settings(), tuple(replay.recorded), appended_count, refs, documents)
    return meter.finish(last_view(replay.recorded), appended_count, refs, documents), recording


class _Replay:
    """One replayed session, turn by turn: what it sent (`recorded`), the view the agent holds and
    which trace message each seq is."""

    def __init__(
        self,
        stub: pb_grpc.ContextServiceAsyncStub,
        session: pb.Session,
        metadata: tuple[tuple[str, str], ...],
        meter: Meter,
        summary_limit: int,
    ) -> None:
        self.stub, self.session, self.metadata, self.meter = stub, session, metadata, meter
        self.summary_limit = summary_limit
        # With background folds on, a pass made in the Prepare itself is the offline fold (`_model_call`).
        self.offline = session.config.prefold_ratio > 0
        self.sources: dict[int, int] = {}  # seq -> trace index of the message appended there
        self.view: list[Msg] = []
        self.recorded: list[ModelCall] = []
        self.head = 0
        self.background = Background()

    async def turn(self, number: int, turn: Turn) -> None:
        """One Prepare (its append and what it did) and the model call it answered for, billed."""
        for message in turn.append:
            self.head += 1  # a Prepare appends before it maintains, so its append stays even when it fails
            self.sources[self.head] = message.source
        started = time.perf_counter()
        try:
            result, progress = await _prepare(self.stub, self.session.id, turn.append, self.metadata, number)
        except PrepareRefused as refusal:
            refused = ModelCall(view=(), answer=turn.answer, action="refused", refused=refusal.why)
            self.meter.call(refused)
            self.recorded.append(refused)
            return
        waited = time.perf_counter() - started
        new_view = [from_pb(m, self.sources) for m in result.messages]
        appended = [from_pb(m, self.sources) for m in result.appended]
        call = _model_call(
            turn,
            result,
            progress,
            self.view,
            new_view,
            appended,
            self.summary_limit,
            self.background,
            waited,
            self.offline,
        )
        if pb.FOLD_STAGE_BACKGROUND_STARTED in (p.stage for p in progress):
            await self.background.settled(self.stub, self.session.id, self.metadata)
        bill = self.meter.call(call)
        self.recorded.append(call)
        self.view = new_view
        assert bill is not None  # an accepted call is billed
        await _observe(self.stub, self.session.id, result.view_version, bill, turn, self.metadata, number)

    def ended(self) -> None:
        """A background fold still pending when the session ended: its summary was paid for, never used."""
        if self.background.started is None or not self.recorded:
            return
        never_used = self.background.unused(self.view, self.summary_limit)
        self.meter.unused(never_used)
        last = self.recorded[-1]
        self.recorded[-1] = replace(
            last, summary_calls=(*last.summary_calls, never_used), unused_summaries=last.unused_summaries + 1
        )


async def _append_trailing(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    trailing: Sequence[Msg],
    metadata: tuple[tuple[str, str], ...],
) -> None:
    """The messages after the last answer: appended, never sent (they have no recorded answer)."""
    if not trailing:
        return
    try:
        await stub.AppendMessages(
            pb.AppendMessagesRequest(session_id=session_id, messages=[to_pb(m) for m in trailing]), metadata=metadata
        )
    except grpc.aio.AioRpcError as exc:
        raise ReplayError(f"appending the last messages failed: {exc.code().name}: {exc.details()}") from None


async def stored_refs(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    sources: dict[int, int],
    metadata: tuple[tuple[str, str], ...],
) -> dict[int, str]:
    """The result_ref of every stored message that has one, by trace index (read back, so that the
    messages a refused Prepare appended are known too)."""
    refs: dict[int, str] = {}
    token = ""
    while True:
        try:
            page = await stub.ListMessages(
                pb.ListMessagesRequest(session_id=session_id, page_size=1000, page_token=token), metadata=metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise ReplayError(f"ListMessages failed: {exc.code().name}: {exc.details()}") from None
        for message in page.messages:
            if message.result_ref and message.seq in sources:
                refs[sources[message.seq]] = message.result_ref
        token = page.next_page_token
        if not token:
            return refs


async def read_documents(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    view: Sequence[Msg],
    trace: Trace,
    refs: dict[int, str],
    metadata: tuple[tuple[str, str], ...],
) -> dict[str, str]:
    """Every reference the view names that is not a tool result's own (the folded-results index, a
    bounded task or instruction), read in full through ReadToolResult as an agent would: what the
    service really serves is what the probes may count as reachable. A reference the service does
    not serve is left out."""
    results = {ref for source, ref in refs.items() if trace.messages[source].role == "tool"}
    documents: dict[str, str] = {}
    for ref in probes.refs_named(probes.view_text(view)):
        if ref in results:
            continue
        pages: list[str] = []
        offset, complete = 0, False
        try:
            while not complete:
                page = await stub.ReadToolResult(
                    pb.ReadToolResultRequest(session_id=session_id, result_ref=ref, offset=offset), metadata=metadata
                )
                pages.append(page.data)
                offset, complete = page.next_offset, page.complete or page.next_offset <= offset
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                continue
            raise ReplayError(f"ReadToolResult({ref}) failed: {exc.code().name}: {exc.details()}") from None
        documents[ref] = "".join(pages)
    return documents


class PrepareRefused(Exception):
    """The service could not give a view that fits (a failed precondition such as
    CONTEXT_BUDGET_UNSATISFIED): the agent is stuck at this turn."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


async def _prepare(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    append: Sequence[Msg],
    metadata: tuple[tuple[str, str], ...],
    number: int,
) -> tuple[pb.PreparedContext, list[pb.FoldProgress]]:
    progress: list[pb.FoldProgress] = []
    result: pb.PreparedContext | None = None
    try:
        stream = stub.Prepare(
            pb.PrepareRequest(session_id=session_id, append=[to_pb(m) for m in append]), metadata=metadata
        )
        async for event in stream:
            if event.HasField("progress"):
                progress.append(event.progress)
            else:
                result = event.result
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED):
            raise PrepareRefused(f"{exc.code().name}: {exc.details()}") from None
        raise ReplayError(f"turn {number}: Prepare failed: {exc.code().name}: {exc.details()}") from None
    if result is None:
        raise ReplayError(f"turn {number}: Prepare ended without a result")
    return result, progress


@contextlib.asynccontextmanager
async def embedded_server(summarizers: str = "") -> AsyncIterator[str]:
    """A ctxfold server in this process on a temporary SQLite database; yields its address."""
    from ctxfold.config import Settings
    from ctxfold.server import start

    with tempfile.TemporaryDirectory(prefix="ctxfold-replay-") as tmp:
        settings = Settings(
            listen="127.0.0.1:0",
            database=f"sqlite:///{Path(tmp) / 'replay.db'}",
            summarizers=summarizers,
            grace_seconds=1.0,
            log_level="WARNING",
        )
        running = await start(settings)
        try:
            yield f"127.0.0.1:{running.port}"
        finally:
            await running.stop(grace=1.0)


@contextlib.asynccontextmanager
async def channel_to(address: str, tls_ca: str = "") -> AsyncIterator[grpc.aio.Channel]:
    if tls_ca:
        try:
            root = await asyncio.to_thread(Path(tls_ca).read_bytes)
        except OSError as exc:
            raise ReplayError(f"cannot read {tls_ca}: {exc.strerror or exc}") from None
        channel = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(root), options=CHANNEL_OPTIONS)
    else:
        channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    async with channel:
        yield channel


async def replay(
    trace: Trace,
    options: Options,
    server: str = "",
    token: str = "",
    tls_ca: str = "",
    summarizers: str = "",
    progress: bool = False,
    traceparent: str = "",
) -> ReplayResult:
    """Replays `trace` through `server`, or through an embedded server when `server` is empty; with
    `traceparent` (W3C), every call continues that trace."""
    metadata = ((("authorization", f"Bearer {token}"),) if token else ()) + (
        (("traceparent", traceparent),) if traceparent else ()
    )
    bar = ProgressBar(len(turns(trace)[0]), trace.name, progress)

    def on_turn(done: int, total: int, result: ReplayResult) -> None:
        bar.update(done, f"folds {result.folds} prunes {result.prunes} ${result.cost + result.summarizer_cost:.4f}")

    async with contextlib.AsyncExitStack() as stack:
        address = server or await stack.enter_async_context(embedded_server(summarizers))
        channel = await stack.enter_async_context(channel_to(address, tls_ca))
        if server:
            try:
                await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_SECONDS)
            except TimeoutError:
                raise ReplayError(
                    f"cannot reach a server at {address} within {CONNECT_TIMEOUT_SECONDS:.0f} s"
                ) from None
        try:
            result, _ = await replay_through(pb_grpc.ContextServiceStub(channel), trace, options, metadata, on_turn)
            return result
        finally:
            bar.close()


def _model_call(
    turn: Turn,
    result: pb.PreparedContext,
    progress: Sequence[pb.FoldProgress],
    view: Sequence[Msg],
    new_view: Sequence[Msg],
    appended: Sequence[Msg],
    limit: int,
    background: Background,
    waited: float,
    offline: bool,
) -> ModelCall:
    """The model call a Prepare answered for: its view, what maintenance did and every summary request
    it stands for (its passes'; a background fold's, when installed here or replaced unused). With
    background folds on (`offline`), a pass in the Prepare itself is the offline fold of a view that
    cannot be sent (`Fold.offline`): written by `extractive`, it is no LLM request and no wait."""
    stages = [p.stage for p in progress]
    passes = stages.count(pb.FOLD_STAGE_PASS_STARTED)
    key = result.prompt_cache_key or AGENT_KEY
    summary_calls: list[SummaryCall] = []
    if passes and not offline:
        previous_summary = next((m.content for m in view if m.summary), "")
        instruction = SummaryRequest("", "", "", previous_summary, (), (), limit).instruction()
        committed = stages.count(pb.FOLD_STAGE_PASS_COMMITTED)
        summary_calls = _summary_calls(view, appended, new_view, key, instruction, passes, committed)
    unused = 0
    if pb.FOLD_STAGE_PREPARED_INSTALLED in stages and background.started is not None:
        summary_calls += background.installed(new_view, key, limit)
    if pb.FOLD_STAGE_BACKGROUND_STARTED in stages:
        if background.started is not None:  # the one before was never installed
            summary_calls.append(background.unused(new_view, limit))
            unused += 1
        background.start(new_view, key)
    return ModelCall(
        view=tuple(new_view),
        answer=turn.answer,
        action={pb.ACTION_FOLDED: "folded", pb.ACTION_PRUNED: "pruned"}.get(result.action, "none"),
        key=key,
        summary_calls=tuple(summary_calls),
        prunes=stages.count(pb.FOLD_STAGE_PRUNED) + stages.count(pb.FOLD_STAGE_RESULTS_BOUNDED),
        failed_summaries=stages.count(pb.FOLD_STAGE_PASS_FAILED),
        unused_summaries=unused,
        prepare_seconds=waited,
    )


async def _observe(
    stub: pb_grpc.ContextServiceAsyncStub,
    session_id: str,
    view_version: int,
    bill: Bill,
    turn: Turn,
    metadata: tuple[tuple[str, str], ...],
    number: int,
) -> None:
    """ObserveUsage with what the simulated provider billed for the view."""
    try:
        await stub.ObserveUsage(
            pb.ObserveUsageRequest(
                session_id=session_id,
                view_version=view_version,
                input_tokens=bill.cache.input_tokens,
                cached_input_tokens=bill.cache.hit,
                output_tokens=bill.output_tokens,
                finish_reason="tool_calls" if turn.answer.tool_calls else "stop",
            ),
            metadata=metadata,
        )
    except grpc.aio.AioRpcError as exc:
        raise ReplayError(f"turn {number}: ObserveUsage failed: {exc.code().name}: {exc.details()}") from None


class Background:
    """The background fold the replayed session started last, until a Prepare installs it. Its
    summarizer request is modeled like a fold's, from the view it was started over, and billed when it
    is installed, or as paid for nothing when another one starts (it went stale or failed) or the
    replay ends."""

    def __init__(self) -> None:
        self.started: tuple[tuple[Msg, ...], str] | None = None  # (view it folds, cache key)
        self._receipts: set[str] = set()

    def start(self, view: Sequence[Msg], key: str) -> None:
        self.started = (tuple(view), key)

    def installed(self, new_view: Sequence[Msg], key: str, limit: int) -> list[SummaryCall]:
        assert self.started is not None
        view, started_key = self.started
        self.started = None
        previous_summary = next((m.content for m in view if m.summary), "")
        instruction = SummaryRequest("", "", "", previous_summary, (), (), limit).instruction()
        return [
            replace(made, background=True)
            for made in _summary_calls(view, [], new_view, started_key, instruction, 1, 1)
        ]

    def unused(self, latest_view: Sequence[Msg], limit: int) -> SummaryCall:
        """The summary request of a background fold never installed; its summary is assumed as long as
        the newest one shown (half the summary budget before any)."""
        assert self.started is not None
        view, key = self.started
        self.started = None
        shown = [estimator.count_text(m.content) for m in latest_view if m.summary]
        return SummaryCall(key, (*view, Msg("user", "summarize")), shown[0] if shown else limit // 2, background=True)

    async def settled(
        self, stub: pb_grpc.ContextServiceAsyncStub, session_id: str, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        """Waits until the background fold just started has ended (its "prepared" or "failed" receipt):
        the replay stands for an agent whose model call takes longer than the summary."""
        deadline = time.monotonic() + BACKGROUND_SETTLE_SECONDS
        while time.monotonic() < deadline:
            response = await stub.GetContextState(pb.GetContextStateRequest(session_id=session_id), metadata=metadata)
            receipts = json.loads(response.state_json).get("receipts", [])
            ended = {
                r["operation_id"]
                for r in receipts
                if r.get("action") == "background" and r.get("status") in ("prepared", "failed")
            }
            if ended - self._receipts:
                self._receipts |= ended
                return
            await asyncio.sleep(0.01)
        raise ReplayError(f"a background fold did not end within {BACKGROUND_SETTLE_SECONDS:g} s")

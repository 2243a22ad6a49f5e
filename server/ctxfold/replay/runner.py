"""Replays a trace through a ctxfold server turn by turn, as an agent would: append what came
before the next model call, Prepare (collecting progress), send the returned view to the simulated
provider, take the recorded assistant message as the model's answer, report usage with
ObserveUsage, and append the answer with the next Prepare."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import IO

import grpc

from ctxfold.replay.connection import CONNECT_TIMEOUT_SECONDS, channel_to, embedded_server
from ctxfold.replay.metrics import Meter, ModelCall, Recording, ReplayResult, last_view
from ctxfold.replay.model_calls import Background, model_call
from ctxfold.replay.options import Options, ReplayError
from ctxfold.replay.rpc import PrepareRefused, append_trailing, from_pb, observe, prepare, read_documents, stored_refs
from ctxfold.replay.trace import Msg, Trace, Turn, turns
from ctxfold.v1 import context_service_pb2 as pb
from ctxfold.v1 import context_service_pb2_grpc as pb_grpc


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
        await append_trailing(stub, replay.session.id, trailing, metadata)
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
        # With background folds on, a pass made in the Prepare itself is the offline fold (`model_call`).
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
            result, progress = await prepare(self.stub, self.session.id, turn.append, self.metadata, number)
        except PrepareRefused as refusal:
            refused = ModelCall(view=(), answer=turn.answer, action="refused", refused=refusal.why)
            self.meter.call(refused)
            self.recorded.append(refused)
            return
        waited = time.perf_counter() - started
        new_view = [from_pb(m, self.sources) for m in result.messages]
        appended = [from_pb(m, self.sources) for m in result.appended]
        call = model_call(
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
        await observe(self.stub, self.session.id, result.view_version, bill, turn, self.metadata, number)

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

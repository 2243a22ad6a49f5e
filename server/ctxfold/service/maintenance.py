"""Context maintenance use cases, Prepare and Compact: the driver loop (load, `decide`, prune or fold, install,
answer) of docs/architecture.md, The view and maintenance."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ctxfold import cpu
from ctxfold.engine.answer import PreparedContext, answer, appended_anyway, check_response_size
from ctxfold.engine.background import applied
from ctxfold.engine.context import AppendRequest, Context
from ctxfold.engine.errors import DomainError, invalid, kept_changing
from ctxfold.engine.maintenance import (
    Answer,
    Blocked,
    Fold,
    FoldInBackground,
    InstallPrepared,
    MaintainRequest,
    NotFolded,
    Prune,
    Snapshot,
    Trigger,
    WhileMaintained,
    decide,
    unanswerable,
    while_maintained,
)
from ctxfold.engine.model import NewMessage, StoredMessage
from ctxfold.engine.projection import Projection, check_fixed_costs
from ctxfold.engine.prune import bound_to_fit
from ctxfold.engine.state import ReceiptAction, ReceiptStatus
from ctxfold.service.background import BackgroundFolds
from ctxfold.service.contexts import KeyedLock
from ctxfold.service.folding import Folding
from ctxfold.service.observer import AppendStored, Emit, FoldProgress, MaintenanceObserver
from ctxfold.service.run import FoldedElsewhere, Hooks, Run
from ctxfold.service.states import ContextStates
from ctxfold.store import StaleSession
from ctxfold.summarizers.base import Summarizer

log = logging.getLogger(__name__)

# A maintenance call whose rounds keep being overtaken (folded elsewhere, the session changed) gives up after this many.
MAX_ROUNDS = 8


Event = FoldProgress | PreparedContext


class Maintenance:
    def __init__(
        self,
        states: ContextStates,
        summarizers: Mapping[str, Summarizer],
        *,
        max_response_bytes: int,
        hooks: Hooks | None = None,
        max_waiting_per_session: int = 16,
    ):
        self.store, self.contexts, self.states = states.store, states.contexts, states
        # Calls of this process that must maintain one session take turns, so no input is summarized twice (a
        # view that fits is answered without waiting); across replicas the fold lease does the same.
        self._sessions = KeyedLock(max_waiting_per_session)
        self.folding = Folding(self.store, summarizers, hooks or Hooks())
        self.background = BackgroundFolds(states, self.folding, self._sessions)
        self.max_response_bytes = max_response_bytes

    async def _stream(
        self, work: Callable[[Emit], Coroutine[Any, Any, PreparedContext]]
    ) -> AsyncGenerator[Event, None]:
        """Runs `work` as a task, yielding its progress events, then its result; a consumer that goes away (client
        cancelled) cancels it: installs are single transactions, so nothing is left half-written."""
        queue: asyncio.Queue[FoldProgress | None] = asyncio.Queue()
        task = asyncio.create_task(work(queue.put))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
            yield task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def prepare(
        self, tenant: str, session_id: str, append: Sequence[NewMessage], request: AppendRequest, request_id: str
    ) -> AsyncGenerator[AppendStored | Event, None]:
        """A Prepare: its checks and append, `AppendStored` once stored, then its answer: in the caller's task when no
        maintenance was due, else after maintenance, run as a `_stream` task reporting its progress."""
        written = await self.contexts.append(tenant, session_id, append, request_id, request)
        yield AppendStored()
        appended = written.messages

        async def work(emit: Emit) -> PreparedContext:
            trigger = Trigger.OVERFLOW if request.overflow else Trigger.THRESHOLD
            result = await self._maintain(tenant, session_id, MaintainRequest(trigger), emit)
            answered = await self._answer(result, request.known_view_version, appended)
            if (background := self.background.progress(tenant, result)) is not None:
                await emit(background)
            return answered

        try:
            if written.answered is None or written.context is None:
                async for event in self._stream(work):
                    yield event
                return
            prepared = replace(written.answered, appended=tuple(appended))
            check_response_size(prepared.messages, self.max_response_bytes)
            if (background := self.background.progress(tenant, written.context)) is not None:
                yield background
            yield prepared
        except DomainError as error:
            raise appended_anyway(error, appended, request_id) from None

    def compact(
        self, tenant: str, session_id: str, focus: str, keep_tokens: int = 0, dry_run: bool = False
    ) -> AsyncGenerator[Event, None]:
        """Folds all outside the minimal kept set and the newest `keep_tokens`; `dry_run` answers the candidate without
        installing. A Compact that cannot fold says why in its result; one whose fold fails ends with an error."""

        async def work(emit: Emit) -> PreparedContext:
            if keep_tokens < 0:
                raise invalid("INVALID_REQUEST", "keep_tokens must be >= 0", field="keep_tokens")
            context = await self.contexts.load(tenant, session_id)
            check_fixed_costs(context.config, context.session.system_tokens, context.session.tools_tokens)
            request = MaintainRequest(Trigger.COMPACT, focus, keep_tokens, dry_run)
            run = await self._maintain(tenant, session_id, request, emit)
            return await self._answer(run, 0, [])

        return self._stream(work)

    def maintaining(self, session_id: str) -> bool:
        """Whether a call of this process maintains (or waits to) the session; a cancelled call counts until its task
        unwound (a pass it was installing committed or discarded, its fold lease released)."""
        return self._sessions.held(session_id)

    async def _maintain(self, tenant: str, session_id: str, request: MaintainRequest, emit: Emit) -> Run:
        observer = MaintenanceObserver(emit, session_id, tenant)
        if self.maintaining(session_id):
            # Another call of this process is maintaining (folding) the session.
            run = Run.of(await self.contexts.load(tenant, session_id, fresh=True), request, observer, self.store)
            tokens, config = run.projection.tokens(), run.config
            match while_maintained(run.projection, request.trigger):
                case WhileMaintained.ANSWER:
                    if tokens >= config.trigger_tokens:
                        why = "another call of this server is folding this session"
                        run.not_folding(NotFolded.FOLD_IN_PROGRESS, why)
                    return run
                case WhileMaintained.STOP_BACKGROUND:
                    above = config.above_ceiling(tokens)
                    why = "the view went above the hard ceiling" if above else "the provider refused the view"
                    await self.background.stop(run, f"{why} ({tokens} tokens) and was folded offline at once")
        async with self._sessions.hold(session_id):
            for _ in range(MAX_ROUNDS):
                run = Run.of(await self.contexts.load(tenant, session_id, fresh=True), request, observer, self.store)
                try:
                    await self._round(run)
                except FoldedElsewhere:
                    continue
                except StaleSession:
                    # Something changed underneath; what was committed stays, the rest is recomputed.
                    await run.observer.discarded()
                    continue
                error = unanswerable(run.projection, request, run.failure)
                if error is not None:
                    # Keep the receipts (e.g. the failed summary); the view and checkpoints stay as they were.
                    await self.store.save_state(run.session.id, run.state.to_json(), run.revision)
                    raise error
                return run
        raise kept_changing(session_id)

    async def _round(self, run: Run) -> None:
        """Decide, act, decide again on what was installed, until the engine says to answer."""
        prepared, candidate = await self.background.read_prepared(run) or (None, None)
        while True:
            snapshot = Snapshot(run.projection, run.first_tokens, run.state.failed_fold_tokens, candidate)
            match await cpu.run(run.work, decide, snapshot, run.request):
                case Answer():
                    if prepared is not None:
                        await self.background.discard_prepared(run, prepared, "this trigger was met without it")
                    return
                case Prune() as prune:
                    await self._install_pruned(run, prune.candidate, prune.results, f"pruned {prune.results} results")
                    if prepared is not None:  # does it still apply to the pruned view?
                        candidate = await cpu.run(run.work, applied, run.projection, prepared)
                case FoldInBackground():
                    detail = "a fold runs in the background; the view fits meanwhile and a later Prepare installs it"
                    run.not_folding(NotFolded.FOLD_IN_PROGRESS, detail)
                    return
                case InstallPrepared() as install:
                    assert prepared is not None  # decide installs only a prepared fold it was given
                    await self.background.install_prepared(run, prepared, install.candidate)
                    prepared = candidate = None
                case Blocked() as blocked:
                    why, tokens = "the last fold of this input failed", blocked.tokens
                    run.record(ReceiptStatus.BLOCKED, ReceiptAction.SUMMARY, tokens, tokens, why)
                    run.not_folding(NotFolded.PREVIOUS_FAILURE, blocked.detail)
                    return
                case Fold() as fold:
                    await self.folding.fold(run, fold)
                    # The last resort when folding left the view above the hard ceiling: its largest results bounded.
                    if not run.request.dry_run and (bound := await cpu.run(run.work, bound_to_fit, run.projection)):
                        ceiling = run.config.hard_limit_tokens
                        why = f"bounded {bound.results} tool results to fit the hard ceiling ({ceiling} tokens)"
                        await self._install_pruned(run, bound.candidate, bound.results, why, bound=True)
                    return

    async def _install_pruned(
        self, run: Run, candidate: Projection, results: int, why: str, bound: bool = False
    ) -> None:
        """Installs `candidate` (`results` more results pruned or bounded) and its receipt."""
        async with run.observer.pruning(results, run.projection.tokens(), candidate.tokens(), bound):
            await run.install(candidate, why)

    async def _answer(self, run: Run, known_view_version: int, appended: list[StoredMessage]) -> PreparedContext:
        """The result and its bookkeeping write (view record, activity, receipts), skipped, not retried over another's,
        if the state changed meanwhile; what was answered becomes the cached context."""
        answered = await cpu.run(run.work, answer, run.answering(), known_view_version, self.store.clock())
        prepared, session = replace(answered, appended=tuple(appended)), run.session
        revision = await self.store.save_state(session.id, prepared.state.to_json(), run.revision)
        self.contexts.written(session, Context(session, run.projection, prepared.state, revision) if revision else None)
        if not revision:
            log.debug(
                "state of session %s changed meanwhile; bookkeeping of view %d skipped",
                session.id,
                prepared.view_version,
            )
        check_response_size(prepared.messages, self.max_response_bytes)
        return prepared

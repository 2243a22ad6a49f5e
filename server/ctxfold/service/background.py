"""Background folds: started by a Prepare, made and kept prepared, installed or discarded at the trigger; one
task per session in this process (docs/architecture.md, The view and maintenance, Background folds)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import OrderedDict

from opentelemetry import trace

from ctxfold import cpu
from ctxfold.engine.background import PreparedFold, applied, covered_digest, may_install_prepared, prefold_due
from ctxfold.engine.context import Context
from ctxfold.engine.errors import DomainError
from ctxfold.engine.maintenance import FoldOutcome, MaintainRequest, Trigger, plan_pass
from ctxfold.engine.projection import Projection
from ctxfold.engine.state import Receipt, ReceiptAction, ReceiptStatus
from ctxfold.service.contexts import KeyedLock
from ctxfold.service.exclusion import Lease, holding
from ctxfold.service.folding import Folding
from ctxfold.service.observer import FoldProgress, FoldStage, MaintenanceObserver, no_progress, traceparent_of
from ctxfold.service.run import Run, new_receipt
from ctxfold.service.states import ContextStates

log = logging.getLogger(__name__)

# Why a prepared fold is discarded when it no longer applies (said in its receipt).
STALE = "no longer applies (the history it covers or the head checkpoint changed)"
# Sessions remembered as "already tried over this head checkpoint" (oldest forgotten first).
MEMO_SESSIONS = 10_000


class BackgroundFolds:
    def __init__(self, states: ContextStates, folding: Folding, sessions: KeyedLock) -> None:
        # The store, the contexts and the summarizers are the foreground folds'.
        self.store, self.states, self.folding = folding.store, states, folding
        # The session's turn and the fold lease: a background fold takes both, as any other fold.
        self._sessions = sessions
        # session id -> (task, the seq its fold reads up to)
        self._tasks: dict[str, tuple[asyncio.Task[bool], int]] = {}
        # session id -> the installed state (head checkpoint:generation) last tried, not tried twice; forgotten
        # when the fold made nothing (a failed summary, another replica's lease), so a later Prepare retries.
        self._tried: OrderedDict[str, str] = OrderedDict()

    def progress(self, tenant: str, answered: Context | Run) -> FoldProgress | None:
        """After an answer: starts the session's background fold when the view reached `prefold_tokens` (`prefold_due`)
        and none ran over this head checkpoint; the progress event saying so, or that one runs, else None."""
        config, session_id = answered.config, answered.session.id
        if not config.prefold_tokens:
            return None  # background folds off (the default): the common Prepare pays for nothing more
        projection = answered.projection
        tokens = projection.tokens()
        if self.running(session_id):
            message = "a fold of this session runs in the background"
            return FoldProgress(FoldStage.BACKGROUND_RUNNING, message, tokens_before=tokens)
        # Once per installed state: a prune or fold since lets another start.
        head = f"{answered.session.checkpoint_id or ''}:{answered.state.generation}"
        if self._tried.get(session_id) == head or not prefold_due(projection):
            return None
        self._tried[session_id] = head
        self._tried.move_to_end(session_id)
        while len(self._tried) > MEMO_SESSIONS:
            self._tried.popitem(last=False)
        # A context of its own: the fold is not part of this RPC's trace (it links to it) and outlives it.
        started_by = trace.get_current_span().get_span_context()
        task = asyncio.create_task(self._prefold(tenant, session_id, started_by), context=contextvars.Context())
        self._tasks[session_id] = (task, projection.head_seq)
        task.add_done_callback(lambda done: self._finished(session_id, done))
        message = (
            f"the view reached {tokens} tokens (prefold_ratio × context_window = {config.prefold_tokens}): "
            f"a fold started in the background; the trigger ({config.trigger_tokens}) installs it"
        )
        return FoldProgress(FoldStage.BACKGROUND_STARTED, message, tokens_before=tokens)

    async def _prefold(self, tenant: str, session_id: str, started_by: trace.SpanContext) -> bool:
        """A background fold: one pass made like any other (the session's turn, lease, summarizer, checks) and
        kept prepared, not installed; a Prepare whose view cannot be sent meanwhile `stop`s it."""
        try:
            async with self._sessions.hold(session_id):
                return await self._prefold_locked(tenant, session_id, started_by)
        except DomainError as error:  # the session went away, or its history cannot be folded now
            log.info("background fold of session %s not made: %s", session_id, error.message)
            return False

    async def _prefold_locked(self, tenant: str, session_id: str, started_by: trace.SpanContext) -> bool:
        """Whether a fold is prepared (by this call or earlier); False lets a later Prepare try again."""
        observer = MaintenanceObserver(no_progress, session_id, tenant)
        # No recent tail beyond the minimal kept set: what the agent appends until the trigger is its tail.
        request = MaintainRequest(Trigger.BACKGROUND, keep_tokens=0)
        run = Run.of(await self.states.contexts.load(tenant, session_id, fresh=True), request, observer, self.store)
        summarizer = self.folding.summarizers.get(run.config.summarizer)
        if summarizer is None or not prefold_due(run.projection):
            return False
        if await self.read_prepared(run) is not None:
            return True  # made already (by another replica)
        window, keep_tokens = summarizer.input_window_tokens, run.request.keep_tokens
        fold = (await cpu.run(run.work, plan_pass, run.projection, window, keep_tokens, ahead=True)).first
        if fold is None:
            return False
        async with holding(self.store, run.session, wait=False) as held:
            if held.lease is not Lease.TAKEN:
                return False  # another replica folds this session
            before = run.projection.tokens()
            with run.observer.folding(run.request, run.config, summarizer, 1, before, started_by) as span:
                with run.observer.fold_pass(1, 1):
                    made = await self.folding.candidate(run, summarizer, fold)
                if made is None:
                    failure = run.failure[1] if run.failure else ""
                    run.observer.folded(span, 0, 1, before, FoldOutcome.FAILED, failure)
                    await self._receipt(run, ReceiptStatus.FAILED, before, before, failure)
                    return False
                outcome, document, _ = made
                checkpoint, after = outcome.checkpoint, outcome.candidate.tokens()
                label = checkpoint.notes.summarizer if checkpoint.notes else summarizer.name
                covered = covered_digest(run.projection.messages, checkpoint.position_seq)
                made_fold = PreparedFold(
                    checkpoint, document, covered, before, after, label, traceparent_of(span), self.store.clock()
                )
                await self.store.save_prepared(run.session, made_fold)
                run.observer.folded(span, 1, 1, after, FoldOutcome.PREPARED, "")
        why = f"prepared in the background over seqs ≤ {checkpoint.position_seq}; installed at the trigger"
        await self._receipt(run, ReceiptStatus.PREPARED, before, after, why)
        return True

    async def read_prepared(self, run: Run) -> tuple[PreparedFold, Projection] | None:
        """The session's prepared fold and its view (`applied`) when this round may install one (at or above the
        trigger); one that no longer applies is discarded here, with a receipt (its summary was paid for)."""
        background = run.request.trigger is Trigger.BACKGROUND  # it makes one only where none applies
        if not background and not may_install_prepared(run.config, run.request, run.first_tokens):
            return None
        prepared = await self.store.read_prepared(run.session)
        if prepared is None:
            return None
        candidate = await cpu.run(run.work, applied, run.projection, prepared)
        if candidate is not None:
            return prepared, candidate
        await self.discard_prepared(run, prepared, STALE)
        return None

    async def discard_prepared(self, run: Run, prepared: PreparedFold, why: str) -> None:
        """Drops a prepared fold the trigger did not use, with a receipt: its summary was paid for."""
        if await self.store.discard_prepared(run.session, prepared.checkpoint.id):
            before, after = prepared.tokens_before, prepared.tokens_after
            reason = f"the fold prepared in the background at {before} tokens {why}; its summary is not used"
            if run.request.trigger is Trigger.BACKGROUND:
                await self._receipt(run, ReceiptStatus.DISCARDED, before, after, reason)
            else:
                run.record(ReceiptStatus.DISCARDED, ReceiptAction.BACKGROUND, before, after, reason)

    async def install_prepared(self, run: Run, prepared: PreparedFold, candidate: Projection) -> None:
        before, after = run.projection.tokens(), candidate.tokens()
        why = f"installed the fold prepared in the background at {prepared.tokens_before} tokens"
        await run.install(candidate, why, prepared.document, prepared.traceparent)
        await run.observer.prepared_installed(before, after, prepared.checkpoint.id, prepared.summarizer)

    def running(self, session_id: str) -> bool:
        return session_id in self._tasks

    def _finished(self, session_id: str, task: asyncio.Task[bool]) -> None:
        self._tasks.pop(session_id, None)  # always `task`: no other starts while it is listed
        if task.cancelled() or task.exception() is not None or not task.result():
            self._tried.pop(session_id, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background fold of session %s failed: %s", session_id, task.exception())

    async def stop(self, run: Run, why: str) -> None:
        """Cancels this process's background fold of the session, if any, and waits; its paid call gets a receipt."""
        running = self._tasks.get(run.session.id)
        if running is None:
            return
        running[0].cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await running[0]
        tokens = run.projection.tokens()
        await self._receipt(run, ReceiptStatus.DISCARDED, tokens, tokens, f"stopped before it was ready: {why}")

    async def _receipt(self, run: Run, status: ReceiptStatus, before: int, after: int, why: str) -> None:
        """A background fold's receipt, written to the stored state (its run's state is not written)."""
        receipt = new_receipt(self.store, status, ReceiptAction.BACKGROUND, before, after, why)
        await self.states.add_receipt(run.session, receipt)

    def rewound(self, session_id: str, to_seq: int) -> Receipt | None:
        """A rewind to `to_seq` cancels a background fold reading past it (one may start again): its receipt, if any."""
        self._tried.pop(session_id, None)
        running = self._tasks.get(session_id)
        if running is None or running[1] <= to_seq:
            return None
        running[0].cancel()
        why = f"stopped before it was ready: a rewind to seq {to_seq} went below the history it read"
        return new_receipt(self.store, ReceiptStatus.DISCARDED, ReceiptAction.BACKGROUND, 0, 0, why)

    async def close(self) -> None:
        """Cancels every background fold and waits for them to unwind (their leases handed back)."""
        tasks = [task for task, _ in self._tasks.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

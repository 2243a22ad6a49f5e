"""Context maintenance use cases: Prepare, Compact, ObserveUsage, GetContextState.

The flow of docs/architecture.md ("The view and maintenance") as a driver loop: load what is
stored, ask the engine what to do (`decide`), prune or summarize, install, and repeat until the
engine says to answer; folds made ahead of the trigger run in the background. Every install is a
compare-and-swap on the session: if anything changed underneath (an append, another replica's fold,
a rewind), the candidate is discarded and the round starts again from what is stored. What the call
reports on the way (progress, spans, metrics) goes to its `MaintenanceObserver`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry import trace

from ctxfold.engine import artifacts, folded_index
from ctxfold.engine.answer import Answered, Answering, answer, check_response_size
from ctxfold.engine.background import PreparedFold, applied, covered_digest, prefold_due
from ctxfold.engine.briefing import FoldRecord, record_fold, strip_engine_sections
from ctxfold.engine.candidate import (
    Accepted,
    FoldDocument,
    Install,
    Rejected,
    accept,
    body_budget,
    fold_install,
    prune_install,
    summary_failure,
)
from ctxfold.engine.context import AppendRequest, Context, SessionRecord
from ctxfold.engine.errors import DomainError, Kind, with_context
from ctxfold.engine.maintenance import (
    Action,
    Answer,
    Blocked,
    Fold,
    FoldInBackground,
    FoldOutcome,
    FoldPass,
    FoldPlan,
    InstallPrepared,
    MaintainRequest,
    NotFolded,
    Prune,
    Snapshot,
    Trigger,
    bound_to_fit,
    decide,
    fold_outcome,
    plan_pass,
)
from ctxfold.engine.model import NewMessage, SessionConfig, StoredMessage
from ctxfold.engine.projection import Projection, budget_error, check_fixed_costs
from ctxfold.engine.state import ContextState, Receipt
from ctxfold.engine.view import ViewMessage
from ctxfold.service.background import BackgroundFolds
from ctxfold.service.contexts import Contexts
from ctxfold.service.exclusion import FoldLeases, KeyedLock, Lease
from ctxfold.service.observer import Emit, MaintenanceObserver, Progress, Stage, no_progress, traceparent_of
from ctxfold.service.sessions import SessionConfigs
from ctxfold.service.states import MAX_ROUNDS, ContextStates, kept_changing
from ctxfold.service.transcript import Transcript
from ctxfold.store import StaleSession, Store
from ctxfold.store.rows import new_id, new_result_ref
from ctxfold.summarizers.base import OnDelta, Summarizer, SummaryRequest, SummaryResult
from ctxfold.summarizers.extractive import ExtractiveSummarizer

log = logging.getLogger(__name__)

STALE = "no longer applies (the history it covers or the head checkpoint changed)"


@dataclass(frozen=True)
class Prepared:
    messages: list[ViewMessage]
    estimated_tokens: int
    view_version: int
    action: Action
    cache_state: str
    prompt_cache_key: str
    checkpoint_id: str
    stable_prefix_messages: int
    delta: bool
    view_message_count: int
    trigger_tokens: int
    hard_limit_tokens: int
    appended: list[StoredMessage] = field(default_factory=list)
    not_folded: NotFolded = NotFolded.UNSPECIFIED
    not_folded_detail: str = ""
    candidate_summary: str = ""
    folded_results_ref: str = ""
    estimated_input_tokens: int = 0


Event = Progress | Prepared


@dataclass
class Hooks:
    """Test seams: `before_install` runs after a candidate is made and before it is installed."""

    before_install: Callable[[str], Awaitable[None]] | None = None


@dataclass
class _Run:
    """The state of one Prepare or Compact call as it moves through a round."""

    session: SessionRecord
    projection: Projection
    state: ContextState
    revision: int
    first_view: list[ViewMessage]
    first_tokens: int
    request: MaintainRequest = field(default_factory=MaintainRequest)
    action: Action = Action.NONE
    not_folded: NotFolded = NotFolded.UNSPECIFIED
    not_folded_detail: str = ""
    # Set by a dry run: the view and summary a fold would install.
    candidate: Projection | None = None
    # (reason, message) of the last failed pass: a Compact ends with it as its error.
    failure: tuple[str, str] | None = None

    @staticmethod
    def of(context: Context) -> _Run:
        projection = context.projection
        return _Run(
            context.session, projection, context.state, context.revision, projection.view(), projection.tokens()
        )

    @property
    def config(self) -> SessionConfig:
        """The session's config (installs replace the projection, never its config)."""
        return self.projection.config

    def not_folding(self, why: NotFolded, detail: str) -> None:
        self.not_folded, self.not_folded_detail = why, detail


def _appended_anyway(error: DomainError, appended: Sequence[StoredMessage], request_id: str) -> DomainError:
    """The rule for a Prepare that fails after its append: the appended messages are canonical (the
    append committed first) and the error names their seqs. Retrying with the same request_id
    appends nothing again; without one, a retry appends them a second time."""
    if not appended:
        return error
    first, last = appended[0].seq, appended[-1].seq
    retry = "retry with the same request_id" if request_id else "do not append them again"
    return with_context(
        error,
        f"the {len(appended)} appended messages (seqs {first}–{last}) were kept: {retry}",
        appended_first_seq=first,
        appended_last_seq=last,
        appended_count=len(appended),
    )


class FoldedElsewhere(Exception):
    """Another server held the session's fold lease; what it installed must be looked at afresh."""


class Maintenance:
    def __init__(
        self,
        store: Store,
        transcript: Transcript,
        summarizers: Mapping[str, Summarizer],
        configs: SessionConfigs,
        *,
        max_response_bytes: int,
        contexts: Contexts,
        states: ContextStates,
        hooks: Hooks | None = None,
        max_waiting_per_session: int = 16,
    ):
        self.store = store
        self.transcript = transcript
        self.summarizers = summarizers
        self.configs = configs
        # The store's clock: receipts and the stamps of hot appends agree with what the store writes.
        self.clock = store.clock
        self.hooks = hooks or Hooks()
        # Concurrent calls on one session in this process that must maintain it take turns, so they do
        # not summarize the same input twice (a view that fits is answered without waiting); across
        # replicas the fold lease and the compare-and-swap do the same.
        self._sessions = KeyedLock(max_waiting_per_session)
        self._leases = FoldLeases(store)
        self.max_response_bytes = max_response_bytes
        self.contexts = contexts
        self.states = states
        self.background = BackgroundFolds()

    # ---- streaming shell ------------------------------------------------------------------------

    async def _stream(self, work: Callable[[Emit], Coroutine[Any, Any, Prepared]]) -> AsyncGenerator[Event, None]:
        """Runs `work` as a task and yields its progress events, then its result. If the consumer
        goes away (client cancelled), the task is cancelled: installs are single transactions, so
        nothing is left half-written and committed passes stay."""
        queue: asyncio.Queue[Progress | None] = asyncio.Queue()

        async def emit(event: Progress) -> None:
            await queue.put(event)

        task = asyncio.create_task(work(emit))
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
        self,
        tenant: str,
        session_id: str,
        append: Sequence[NewMessage],
        overflow: bool,
        known_view_version: int,
        request_id: str = "",
        on_appended: Callable[[], None] = lambda: None,
    ) -> AsyncGenerator[Event, None]:
        """The checks, the append and, when no maintenance is due, the answer written with it run in
        the caller's task: they emit no progress, so the common call (one result) pays for no task and
        queue. Only maintenance, which may report progress, runs as a `_stream` task. `on_appended` is
        called once the append is stored, before anything waits for a lock or a summarizer."""
        started = time.perf_counter()
        config, tokens = await self.configs.get(tenant, session_id)
        check_fixed_costs(config, tokens.system, tokens.tools)
        rows = await self.transcript.rows(append, request_id, config, field="append") if append else []
        request = AppendRequest((), 0.0, overflow, known_view_version)
        written = await self.transcript.append(tenant, session_id, rows, request_id, request)
        on_appended()
        appended = written.messages
        if written.answered is not None and written.context is not None:
            run = _Run.of(written.context)
            prepared = self._prepared(run, written.answered, appended)
            try:
                self._finish(run, written.answered.state, prepared, started)
            except DomainError as error:
                raise _appended_anyway(error, appended, request_id) from None
            if (background := self._background(tenant, session_id, run)) is not None:
                yield background
            yield prepared
            return

        async def work(emit: Emit) -> Prepared:
            try:
                request = MaintainRequest(Trigger.OVERFLOW if overflow else Trigger.THRESHOLD)
                result = await self._maintain(tenant, session_id, request, emit)
                answered = await self._answer(result, known_view_version, appended, started)
                if (background := self._background(tenant, session_id, result)) is not None:
                    await emit(background)
                return answered
            except DomainError as error:
                raise _appended_anyway(error, appended, request_id) from None

        async for event in self._stream(work):
            yield event

    def compact(
        self, tenant: str, session_id: str, focus: str, keep_tokens: int = 0, dry_run: bool = False
    ) -> AsyncGenerator[Event, None]:
        """Folds everything outside the minimal kept set and the newest `keep_tokens` of history; a
        `dry_run` makes the candidate and answers it without installing. A Compact that cannot fold
        says why in the result; one whose fold fails ends with an error."""

        async def work(emit: Emit) -> Prepared:
            started = time.perf_counter()
            if keep_tokens < 0:
                raise DomainError(Kind.INVALID_ARGUMENT, "INVALID_REQUEST", "keep_tokens must be >= 0")
            config, tokens = await self.configs.get(tenant, session_id)
            check_fixed_costs(config, tokens.system, tokens.tools)
            request = MaintainRequest(Trigger.COMPACT, focus, keep_tokens, dry_run)
            run = await self._maintain(tenant, session_id, request, emit)
            return await self._answer(run, 0, [], started)

        return self._stream(work)

    # ---- the flow -------------------------------------------------------------------------------

    async def _load(self, tenant: str, session_id: str) -> _Run:
        return _Run.of(await self.contexts.load(tenant, session_id, fresh=True))

    def maintaining(self, session_id: str) -> bool:
        """Whether a call of this process is maintaining (or waiting to maintain) the session. A call the
        client cancelled counts until its task has unwound (a pass it was installing is then committed
        or discarded, and its fold lease released)."""
        return self._sessions.held(session_id)

    async def _maintain(self, tenant: str, session_id: str, request: MaintainRequest, emit: Emit) -> _Run:
        if request.trigger is Trigger.THRESHOLD and self.maintaining(session_id):
            # Another call of this process is maintaining (folding) the session: a view that still fits
            # is answered now, as committed, instead of waiting for that fold (as across replicas).
            run = await self._load(tenant, session_id)
            if run.projection.tokens() <= run.config.hard_limit_tokens:
                run.request = request
                if run.projection.tokens() >= run.config.trigger_tokens:
                    run.not_folding(NotFolded.FOLD_IN_PROGRESS, "another call of this server is folding this session")
                return run
        async with self._sessions.hold(session_id):
            observer = MaintenanceObserver(emit, session_id, tenant)
            return await self._maintain_locked(tenant, session_id, request, observer)

    async def _maintain_locked(
        self, tenant: str, session_id: str, request: MaintainRequest, observer: MaintenanceObserver
    ) -> _Run:
        for _ in range(MAX_ROUNDS):
            run = await self._load(tenant, session_id)
            run.request = request
            try:
                await self._round(run, observer)
            except FoldedElsewhere:
                continue
            except StaleSession:
                # Something changed underneath; what was committed stays, the rest is recomputed.
                await observer.discarded()
                continue
            if request.trigger is Trigger.COMPACT and run.failure is not None:
                await self.store.save_state(run.session.id, run.state.to_json(), run.revision)
                reason, message = run.failure
                raise DomainError(Kind.FAILED_PRECONDITION, reason, f"Compact folded nothing: {message}")
            tokens = run.projection.tokens()
            if tokens > run.config.hard_limit_tokens:
                # Keep the receipts (e.g. the failed summary); the view and checkpoints stay as they were.
                await self.store.save_state(run.session.id, run.state.to_json(), run.revision)
                raise budget_error(run.projection, tokens, run.failure[1] if run.failure else "")
            return run
        raise kept_changing(session_id)

    async def _round(self, run: _Run, observer: MaintenanceObserver) -> None:
        """Decide, act, decide again on what was installed, until the engine says to answer."""
        prepared = await self._read_prepared(run, observer)
        while True:
            candidate = applied(run.projection, prepared) if prepared is not None else None
            snapshot = Snapshot(run.projection, run.first_tokens, run.state.failed_fold_tokens, candidate)
            match decide(snapshot, run.request):
                case Answer():
                    if prepared is not None:
                        await self._discard_prepared(run, prepared, "this trigger was met without it", observer)
                    return
                case Prune() as prune:
                    await self._prune(run, prune, observer)
                case FoldInBackground():
                    detail = "a fold runs in the background; the view fits meanwhile and a later Prepare installs it"
                    run.not_folding(NotFolded.FOLD_IN_PROGRESS, detail)
                    return
                case InstallPrepared() as install:
                    assert prepared is not None  # decide installs only a prepared fold it was given
                    await self._install_prepared(run, prepared, install.candidate, observer)
                    prepared = None
                case Blocked() as blocked:
                    tokens = blocked.tokens
                    self._record(
                        run, observer, "blocked", "summary", tokens, tokens, "the last fold of this input failed"
                    )
                    run.not_folding(NotFolded.PREVIOUS_FAILURE, blocked.detail)
                    return
                case Fold() as fold:
                    await self._fold(run, fold, observer)
                    await self._bound(run, observer)
                    return

    async def _prune(self, run: _Run, prune: Prune, observer: MaintenanceObserver) -> None:
        before, after = run.projection.tokens(), prune.candidate.tokens()
        receipt = self._receipt("applied", "prune", before, after, f"pruned {prune.results} results")
        state = replace(run.state, pruned=dict(prune.candidate.pruned), generation=run.state.generation + 1)
        install = prune_install(state.with_receipt(receipt), run.session.branch_id, run.session.checkpoint_id)
        with observer.pruning(prune.results, before, after):
            await self._install(run, install, prune.candidate, before, after, observer)
        run.action = Action.PRUNED
        await observer.pruned(prune.results, before, after)

    async def _bound(self, run: _Run, observer: MaintenanceObserver) -> None:
        """The last resort when folding left the view above the hard ceiling: its largest tool results
        bounded until it fits (`bound_to_fit`), installed like a prune and reported as such."""
        bound = None if run.request.dry_run else bound_to_fit(run.projection)
        if bound is None:
            return
        before, after = run.projection.tokens(), bound.candidate.tokens()
        why = f"bounded {bound.results} tool results to fit the hard ceiling ({run.config.hard_limit_tokens} tokens)"
        receipt = self._receipt("applied", "prune", before, after, why)
        state = replace(
            run.state,
            pruned=dict(bound.candidate.pruned),
            bounds=dict(bound.candidate.bounds),
            generation=run.state.generation + 1,
        )
        install = prune_install(state.with_receipt(receipt), run.session.branch_id, run.session.checkpoint_id)
        with observer.bounding(bound.results, before, after):
            await self._install(run, install, bound.candidate, before, after, observer)
        if run.action is Action.NONE:
            run.action = Action.PRUNED
        await observer.bounded(bound.results, before, after)

    async def _fold(self, run: _Run, fold: Fold, observer: MaintenanceObserver) -> None:
        summarizer = self.summarizers.get(run.config.summarizer)
        if summarizer is None:
            raise DomainError(
                Kind.FAILED_PRECONDITION,
                "SUMMARIZER_NOT_CONFIGURED",
                f"summarizer {run.config.summarizer!r} is not configured on this server",
                {"summarizer": run.config.summarizer},
            )
        before = run.projection.tokens()
        keep_tokens = run.request.keep_tokens
        plan = plan_pass(run.projection, summarizer.input_window_tokens, keep_tokens)
        if plan.first is None:
            self._record(run, observer, "noop", "summary", before, before, "nothing to fold")
            run.not_folding(
                NotFolded.NOTHING_OUTSIDE_KEPT_SET,
                f"all {len(run.projection.messages)} messages of the view are in the kept set (the opening "
                "anchors, pinned messages, the input the next call must answer, the newest call group"
                + (f", the newest {keep_tokens} tokens)" if keep_tokens else ")"),
            )
            return
        # Only a call that must fold waits for another holder's fold: any other Prepare answers with
        # the current view, which still fits.
        async with self._leases.holding(run.session, wait=fold.must_fold) as held:
            if held.lease is Lease.WAITED:
                raise FoldedElsewhere(run.session.id)
            if held.lease is Lease.HELD_ELSEWHERE:
                why = (
                    f"another call folds this session (fold lease holder {held.holder}, renewed while it "
                    f"runs; it runs out {max(held.until - self.clock(), 0):.0f} s from now unless renewed)"
                )
                self._record(run, observer, "blocked", "summary", before, before, why)
                run.not_folding(NotFolded.FOLD_IN_PROGRESS, why)
                return
            await self._fold_passes(run, summarizer, plan, observer)

    async def _fold_passes(
        self, run: _Run, summarizer: Summarizer, plan: FoldPlan, observer: MaintenanceObserver
    ) -> None:
        """Pass after pass, each planned afresh from what the previous one installed, until the fold is
        complete (or after one pass on overflow, or a dry run's candidate, or a failed pass)."""
        before = run.projection.tokens()
        passes = 1 if run.request.one_pass else plan.passes_planned
        await observer.planned(passes, before)
        with observer.folding(run.request, run.config, summarizer, passes, before):
            fold: FoldPass | None = plan.first
            index = 0
            committed = True
            while fold is not None:
                index += 1
                with observer.fold_pass(index, passes):
                    committed = await self._fold_pass(run, summarizer, fold, index, passes, observer)
                if not committed or run.request.dry_run or run.request.one_pass or fold.final:
                    break
                fold = plan_pass(run.projection, summarizer.input_window_tokens, run.request.keep_tokens).first
                passes = max(passes, index + 1)
            installed = index if committed else index - 1
            outcome = fold_outcome(installed, not committed, run.request.dry_run)
            observer.folded(installed, passes, run.projection.tokens(), outcome, run.failure[1] if run.failure else "")

    async def _fold_pass(
        self, run: _Run, summarizer: Summarizer, fold: FoldPass, index: int, passes: int, observer: MaintenanceObserver
    ) -> bool:
        """One summarizer call and its install; False when the pass failed (nothing installed)."""
        before = run.projection.tokens()
        made = await self._candidate(run, summarizer, fold, index, passes, observer)
        if made is None:
            return False
        outcome, document, fell_back = made
        checkpoint, after = outcome.checkpoint, outcome.candidate.tokens()
        if run.request.dry_run:
            run.candidate = outcome.candidate
            run.not_folding(NotFolded.DRY_RUN, f"dry run: the fold would take the view from {before} to {after} tokens")
            return True
        note = f"pass {index}" + (f": {fell_back}" if fell_back else "")
        receipt = self._receipt("applied", "summary", before, after, note)
        state = replace(
            run.state,
            pruned=dict(outcome.candidate.pruned),
            bounds=dict(outcome.candidate.bounds),
            generation=run.state.generation + 1,
            failed_fold_tokens=0,
        ).with_receipt(receipt)
        if self.hooks.before_install is not None:
            await self.hooks.before_install(run.session.id)
        install = fold_install(state, run.session.branch_id, outcome, document, before)
        await self._install(run, install, outcome.candidate, before, after, observer)
        run.action = Action.FOLDED
        label = checkpoint.notes.summarizer if checkpoint.notes else summarizer.name
        await observer.pass_committed(index, passes, before, after, checkpoint.id, label)
        return True

    async def _candidate(
        self, run: _Run, summarizer: Summarizer, fold: FoldPass, index: int, passes: int, observer: MaintenanceObserver
    ) -> tuple[Accepted, FoldDocument, str] | None:
        """One summarizer call: the accepted candidate, its folded-results document and how the pass
        fell back ("" when it did not), or None when the pass failed (recorded in `run`). Above the
        hard ceiling a failed LLM summary falls back to extractive."""
        projection = run.projection
        before = projection.tokens()
        await observer.pass_started(fold, index, passes, before, summarizer.name)
        on_delta = observer.summary_deltas(index, passes)
        record = await self._record_fold(run, fold)
        previous = projection.checkpoint
        request = SummaryRequest(
            system_prompt=run.config.system_prompt,
            tools_json=run.config.tools_json,
            prompt_cache_key=run.config.prompt_cache_key,
            previous_summary=(previous.notes.body if previous.notes else previous.summary) if previous else "",
            prefix=fold.prefix,
            folded=fold.folded,
            max_tokens=body_budget(record.notes, run.config),
            focus=run.request.focus,
            send_max_tokens=run.config.max_output_tokens > 0,
        )

        fell_back = ""

        async def attempt(with_summarizer: Summarizer) -> Accepted | Rejected:
            nonlocal fell_back
            result, failure = await self._summarize(run, with_summarizer, request, on_delta, observer)
            if result is None:
                return Rejected(failure, "SUMMARIZER_FAILED")
            if result.native_fallback:
                # Native compaction was asked for and is unsupported here: this is the application summary.
                fell_back = result.native_fallback
                name = with_summarizer.name
                await observer.fell_back(index, passes, before, name, name, fell_back)
            notes = replace(record.notes, summarizer=with_summarizer.name)
            body = strip_engine_sections(result.text)
            outcome = accept(projection, fold, notes, body, new_id("cp"), result.native)
            if isinstance(outcome, Rejected) and outcome.not_folded is not NotFolded.UNSPECIFIED:
                run.not_folding(outcome.not_folded, outcome.why)
            return outcome

        outcome = await attempt(summarizer)
        above_ceiling = before > run.config.hard_limit_tokens
        if isinstance(outcome, Rejected) and summarizer.name != ExtractiveSummarizer.name and above_ceiling:
            # Above the ceiling the agent cannot go on without a fold: the offline summarizer always answers.
            fallback = self.summarizers.get(ExtractiveSummarizer.name) or ExtractiveSummarizer()
            fell_back = f"{summarizer.name} failed ({outcome.why}); folded with {fallback.name}"
            await observer.fell_back(index, passes, before, summarizer.name, fallback.name, fell_back)
            outcome = await attempt(fallback)
        if isinstance(outcome, Rejected):
            await observer.pass_failed(index, passes, outcome.why)
            run.state = replace(run.state, failed_fold_tokens=before)
            run.failure = (outcome.reason, outcome.why)
            if run.not_folded is NotFolded.UNSPECIFIED and run.action is not Action.FOLDED:
                run.not_folding(NotFolded.SUMMARIZER_FAILED, outcome.why)
            self._record(run, observer, "failed", "summary", before, before, outcome.why)
            return None
        observer.candidate(outcome.checkpoint.id, outcome.candidate.tokens())
        last_folded = fold.folded[-1].source
        assert last_folded is not None  # folded view messages render canonical messages
        document = FoldDocument(record.notes.index_ref, last_folded.id, folded_index.render(record.index))
        return outcome, document, fell_back

    async def _record_fold(self, run: _Run, fold: FoldPass) -> FoldRecord:
        """The engine's notes and folded-results index after `fold`, rolled forward from the head
        checkpoint's (its index document is read back as data, not parsed out of summary text)."""
        projection = run.projection
        notes = projection.checkpoint.notes if projection.checkpoint else None
        previous = folded_index.FoldedIndex()
        if notes is not None and notes.index_ref:
            raw = await self.store.read_raw_result(run.session, notes.index_ref)
            previous = folded_index.parse(raw.data.decode())
        folded = [v.source for v in fold.folded if v.source is not None]
        return record_fold(
            notes,
            previous,
            projection.messages,
            folded,
            new_result_ref(),
            artifacts.budget(run.config),
            projection.anchor_end,
            projection.mode,
        )

    @staticmethod
    async def _summarize(
        run: _Run, summarizer: Summarizer, request: SummaryRequest, on_delta: OnDelta, observer: MaintenanceObserver
    ) -> tuple[SummaryResult | None, str]:
        """(the answer, its text stripped, "") or (None, why it failed): one summarizer call."""
        with observer.summarizing(summarizer, request) as call:
            try:
                result = await summarizer.summarize(request, on_delta)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("summarizer %s failed for session %s: %s", summarizer.name, run.session.id, exc)
                failure = f"the summarizer failed: {exc}"
                call.raised(exc, failure)
                return None, failure
            text = result.text.strip()
            failure = summary_failure(text, result.finish_reason, native=result.native is not None)
            call.answered(result, text, failure)
        return (None, failure) if failure else (replace(result, text=text), "")

    async def _install(
        self,
        run: _Run,
        install: Install,
        candidate: Projection,
        before: int,
        after: int,
        observer: MaintenanceObserver,
        prepared_by: str = "",
    ) -> None:
        with observer.installing(install, before, after, prepared_by):
            run.session, run.revision = await self.store.install(run.session, install)
            run.projection = candidate
            run.state = install.state
        receipt = run.state.last_receipt
        if receipt is not None:
            observer.receipt(receipt)

    def _receipt(self, status: str, action: str, tokens_in: int, tokens_out: int, reason: str) -> Receipt:
        return Receipt(uuid.uuid4().hex, status, action, tokens_in, tokens_out, reason, self.clock())

    def _record(
        self, run: _Run, observer: MaintenanceObserver, status: str, action: str, before: int, after: int, reason: str
    ) -> None:
        receipt = self._receipt(status, action, before, after, reason)
        run.state = run.state.with_receipt(receipt)
        observer.receipt(receipt)

    # ---- background folds -------------------------------------------------------------------------

    def _background(self, tenant: str, session_id: str, run: _Run) -> Progress | None:
        """After an answer: starts the session's background fold when the view has reached
        `prefold_tokens` (`prefold_due`) and none ran over this head checkpoint; the progress event
        that says so, or that one is running, else None."""
        projection = run.projection
        tokens = projection.tokens()
        if self.background.running(session_id):
            message = "a fold of this session runs in the background"
            return Progress(Stage.BACKGROUND_RUNNING, message, tokens_before=tokens)
        # Once per installed state: a prune or fold since lets another start.
        head = f"{run.session.checkpoint_id or ''}:{run.state.generation}"
        if not self.background.due(session_id, head) or not prefold_due(projection):
            return None
        started_by = trace.get_current_span().get_span_context()
        self.background.start(session_id, head, projection.head_seq, self._prefold(tenant, session_id, started_by))
        message = (
            f"the view reached {tokens} tokens (prefold_ratio × context_window = {run.config.prefold_tokens}): "
            f"a fold started in the background; the trigger ({run.config.trigger_tokens}) installs it"
        )
        return Progress(Stage.BACKGROUND_STARTED, message, tokens_before=tokens)

    async def _prefold(self, tenant: str, session_id: str, started_by: trace.SpanContext) -> bool:
        """A background fold: one pass made like any other (same lease, summarizer and checks) and kept
        prepared, not installed. It takes its turn with the session's other maintenance, so a Prepare
        that must fold meanwhile waits for it and then installs what it made."""
        try:
            async with self._sessions.hold(session_id):
                return await self._prefold_locked(tenant, session_id, started_by)
        except DomainError as error:  # the session went away, or its history cannot be folded now
            log.info("background fold of session %s not made: %s", session_id, error.message)
            return False

    async def _prefold_locked(self, tenant: str, session_id: str, started_by: trace.SpanContext) -> bool:
        """Whether a fold is prepared (by this call or earlier); False lets a later Prepare try again."""
        run = await self._load(tenant, session_id)
        summarizer = self.summarizers.get(run.config.summarizer)
        if summarizer is None or not prefold_due(run.projection):
            return False
        prepared = await self.store.read_prepared(run.session)
        if prepared is not None:
            if applied(run.projection, prepared) is not None:
                return True  # made already (by another replica)
            if await self.store.discard_prepared(run.session, prepared.checkpoint.id):
                await self.states.add_receipt(tenant, run.session, self._discarded(prepared, STALE))
        # No recent tail beyond the minimal kept set: what the agent appends until the trigger is its tail.
        run.request = MaintainRequest(Trigger.BACKGROUND, keep_tokens=0)
        fold = plan_pass(run.projection, summarizer.input_window_tokens, run.request.keep_tokens, ahead=True).first
        if fold is None:
            return False
        observer = MaintenanceObserver(no_progress, session_id, tenant)
        async with self._leases.holding(run.session, wait=False) as held:
            if held.lease is not Lease.TAKEN:
                return False  # another replica folds this session
            before = run.projection.tokens()
            with observer.folding(run.request, run.config, summarizer, 1, before, started_by) as span:
                with observer.fold_pass(1, 1):
                    made = await self._candidate(run, summarizer, fold, 1, 1, observer)
                if made is None:
                    failure = run.failure[1] if run.failure else ""
                    observer.folded(0, 1, before, FoldOutcome.FAILED, failure)
                    receipt = self._receipt("failed", "background", before, before, failure)
                    await self.states.add_receipt(tenant, run.session, receipt)
                    return False
                outcome, document, _ = made
                checkpoint, after = outcome.checkpoint, outcome.candidate.tokens()
                label = checkpoint.notes.summarizer if checkpoint.notes else summarizer.name
                covered = covered_digest(run.projection.messages, checkpoint.position_seq)
                made_fold = PreparedFold(
                    checkpoint, document, covered, before, after, label, traceparent_of(span), self.clock()
                )
                await self.store.save_prepared(run.session, made_fold)
                observer.folded(1, 1, after, FoldOutcome.PREPARED, "")
        why = f"prepared in the background over seqs ≤ {checkpoint.position_seq}; installed at the trigger"
        await self.states.add_receipt(tenant, run.session, self._receipt("prepared", "background", before, after, why))
        return True

    async def _read_prepared(self, run: _Run, observer: MaintenanceObserver) -> PreparedFold | None:
        """The session's prepared fold when this round may install one (a Prepare at or above the
        trigger); one that no longer applies is discarded here, with a receipt (its summary was paid for)."""
        config = run.config
        if config.prefold_tokens == 0 or run.request.trigger not in (Trigger.THRESHOLD, Trigger.OVERFLOW):
            return None
        if run.first_tokens < config.trigger_tokens and run.request.trigger is Trigger.THRESHOLD:
            return None
        prepared = await self.store.read_prepared(run.session)
        if prepared is None or applied(run.projection, prepared) is not None:
            return prepared
        await self._discard_prepared(run, prepared, STALE, observer)
        return None

    async def _discard_prepared(
        self, run: _Run, prepared: PreparedFold, why: str, observer: MaintenanceObserver
    ) -> None:
        """Drops a prepared fold the trigger did not use, with a receipt: its summary was paid for."""
        if await self.store.discard_prepared(run.session, prepared.checkpoint.id):
            receipt = self._discarded(prepared, why)
            run.state = run.state.with_receipt(receipt)
            observer.receipt(receipt)

    def _discarded(self, prepared: PreparedFold, why: str) -> Receipt:
        reason = (
            f"the fold prepared in the background at {prepared.tokens_before} tokens {why}; its summary is not used"
        )
        return self._receipt("discarded", "background", prepared.tokens_before, prepared.tokens_after, reason)

    async def _install_prepared(
        self, run: _Run, prepared: PreparedFold, candidate: Projection, observer: MaintenanceObserver
    ) -> None:
        before, after = run.projection.tokens(), candidate.tokens()
        why = f"installed the fold prepared in the background at {prepared.tokens_before} tokens"
        receipt = self._receipt("applied", "summary", before, after, why)
        state = replace(
            run.state,
            pruned=dict(candidate.pruned),
            bounds=dict(candidate.bounds),
            generation=run.state.generation + 1,
            failed_fold_tokens=0,
        ).with_receipt(receipt)
        install = fold_install(state, run.session.branch_id, Accepted(candidate), prepared.document, before)
        await self._install(run, install, candidate, before, after, observer, prepared.traceparent)
        run.action = Action.FOLDED
        await observer.prepared_installed(before, after, prepared.checkpoint.id, prepared.summarizer)

    # ---- the answer -----------------------------------------------------------------------------

    async def _answer(
        self, run: _Run, known_view_version: int, appended: list[StoredMessage], started: float
    ) -> Prepared:
        """The result, plus the bookkeeping write (view record, activity, receipts); that write is
        skipped, never retried over someone else's, if the state changed meanwhile. What was answered
        becomes the session's cached context."""
        answering = Answering(
            run.projection,
            run.state,
            run.first_view,
            run.first_tokens,
            run.action,
            run.session.head_seq,
            run.session.checkpoint_id,
            run.candidate,
        )
        answered = answer(answering, known_view_version, self.clock())
        prepared = self._prepared(run, answered, appended)
        revision = await self.store.save_state(run.session.id, answered.state.to_json(), run.revision)
        if revision:
            self.contexts.put(Context(run.session, run.projection, answered.state, revision))
        else:
            self.contexts.drop(run.session.tenant, run.session.id)
            log.debug(
                "state of session %s changed meanwhile; bookkeeping of view %d skipped",
                run.session.id,
                prepared.view_version,
            )
        self._finish(run, answered.state, prepared, started)
        return prepared

    @staticmethod
    def _prepared(run: _Run, answered: Answered, appended: list[StoredMessage]) -> Prepared:
        return Prepared(
            messages=answered.messages,
            estimated_tokens=answered.estimated_tokens,
            view_version=answered.view_version,
            action=run.action,
            cache_state=answered.cache_state,
            prompt_cache_key=run.config.prompt_cache_key,
            checkpoint_id=answered.checkpoint_id,
            stable_prefix_messages=answered.stable_prefix_messages,
            delta=answered.delta,
            view_message_count=answered.view_message_count,
            trigger_tokens=run.config.trigger_tokens,
            hard_limit_tokens=run.config.hard_limit_tokens,
            appended=appended,
            not_folded=run.not_folded,
            not_folded_detail=run.not_folded_detail,
            candidate_summary=answered.candidate_summary,
            folded_results_ref=answered.folded_results_ref,
            estimated_input_tokens=answered.estimated_input_tokens,
        )

    def _finish(self, run: _Run, state: ContextState, prepared: Prepared, started: float) -> None:
        """Telemetry of an answered call, and RESPONSE_TOO_LARGE when its view cannot be sent."""
        MaintenanceObserver.answered(run.session.id, state, run.request.operation, run.action, started)
        if run.not_folded is not NotFolded.UNSPECIFIED:
            MaintenanceObserver.not_folded(run.not_folded.value, run.not_folded_detail)
        check_response_size(prepared.messages, self.max_response_bytes)

"""Context maintenance use cases: Prepare, Compact, ObserveUsage, GetContextState.

The flow of SPEC §3: append, build the view, and only at or above the trigger (or on overflow, or
when asked by Compact) prune, then fold in passes. Every install is a compare-and-swap on the
session: if anything changed underneath (an append, another replica's fold, a rewind), the
candidate is discarded and the flow starts again from what is stored."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from ctxfold.engine import estimator, folded_index
from ctxfold.engine.briefing import FoldRecord, record_fold, render_summary, strip_engine_sections
from ctxfold.engine.cache import cache_state, cache_ttl_seconds
from ctxfold.engine.errors import DomainError, Kind, busy, with_context
from ctxfold.engine.maintenance import (
    FoldPass,
    FoldPlan,
    Projection,
    after_position,
    apply_pass,
    budget_error,
    check_fixed_costs,
    plan_pass,
    prune,
)
from ctxfold.engine.model import NewMessage, SessionConfig, StoredMessage, Usage, config_from_json
from ctxfold.engine.state import (
    ContextState,
    Receipt,
    ViewRecord,
    fingerprint,
    load_state,
    split_view_version,
    view_version,
)
from ctxfold.engine.view import Checkpoint, ViewMessage
from ctxfold.service.sessions import SessionConfigs
from ctxfold.service.transcript import Transcript
from ctxfold.store.repository import (
    ContextSnapshot,
    FoldDocument,
    SessionRecord,
    StaleSession,
    Store,
    new_id,
    new_result_ref,
)
from ctxfold.summarizers.base import IN_PROCESS_PROVIDER, OnDelta, Summarizer, SummaryRequest
from ctxfold.summarizers.extractive import ExtractiveSummarizer
from ctxfold.telemetry import INSTRUMENTS, TRACER

log = logging.getLogger(__name__)

# A Prepare that keeps losing compare-and-swap races gives up after this many rounds.
MAX_ROUNDS = 8
# Calibration moves this far toward each accepted observation.
CALIBRATION_SMOOTHING = 0.3
# A fold holds the session's lease for this long at a time and renews it while it runs, so the lease
# of a crashed holder runs out within seconds, however long its summarizer call would have taken.
FOLD_LEASE_SECONDS = 10.0
FOLD_LEASE_RENEW_SECONDS = FOLD_LEASE_SECONDS / 4
FOLD_LEASE_POLL_SECONDS = 0.25
# The least a summarizer is given for its body, however much the engine's sections take.
MIN_BODY_TOKENS = 256


class Action(enum.Enum):
    NONE = "none"
    PRUNED = "pruned"
    FOLDED = "folded"


class Stage(enum.Enum):
    PRUNED = "pruned"
    PLANNED = "planned"
    PASS_STARTED = "pass_started"
    SUMMARY_DELTA = "summary_delta"
    PASS_COMMITTED = "pass_committed"
    PASS_FAILED = "pass_failed"
    SUMMARIZER_FALLBACK = "summarizer_fallback"


class NotFolded(enum.Enum):
    """Why a call that had to fold (or was asked to) folded nothing."""

    UNSPECIFIED = "unspecified"
    NOTHING_OUTSIDE_KEPT_SET = "nothing_outside_kept_set"
    PREVIOUS_FAILURE = "previous_failure"
    NOT_SMALLER = "not_smaller"
    DRY_RUN = "dry_run"


@dataclass(frozen=True)
class Progress:
    stage: Stage
    message: str
    pass_index: int = 0
    passes_planned: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    checkpoint_id: str = ""
    summary_delta: str = ""
    summarizer: str = ""


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


Event = Progress | Prepared
Emit = Callable[[Progress], Awaitable[None]]


class Mode(enum.Enum):
    PREPARE = "prepare"
    COMPACT = "compact"


@dataclass
class Hooks:
    """Test seams: `before_install` runs after a candidate is made and before it is installed."""

    before_install: Callable[[str], Awaitable[None]] | None = None


@dataclass
class _Run:
    """The state of one Prepare or Compact call as it moves through the steps."""

    session: SessionRecord
    config: SessionConfig
    projection: Projection
    state: ContextState
    revision: int
    first_view: list[ViewMessage]
    first_tokens: int
    action: Action = Action.NONE
    trigger: str = ""  # why maintenance folds: threshold, overflow or compact (for the fold span)
    # Compact's asks: tokens of recent history to keep verbatim (None: the tail budget), dry run.
    keep_tokens: int | None = None
    dry_run: bool = False
    not_folded: NotFolded = NotFolded.UNSPECIFIED
    not_folded_detail: str = ""
    # Set by a dry run: the view and summary a fold would install.
    candidate: Projection | None = None
    # (reason, message) of the last failed pass: a Compact ends with it as its error.
    failure: tuple[str, str] | None = None

    def not_folding(self, why: NotFolded, detail: str) -> None:
        self.not_folded, self.not_folded_detail = why, detail


def _summary_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _same(a: ViewMessage, b: ViewMessage) -> bool:
    return (a.role, a.content, a.summary, a.source.id if a.source else "") == (
        b.role,
        b.content,
        b.summary,
        b.source.id if b.source else "",
    )


def _common_prefix(a: Sequence[ViewMessage], b: Sequence[ViewMessage]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if not _same(x, y):
            break
        count += 1
    return count


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


# Room in a response for everything but the view's text: ids, framing, the other fields.
RESPONSE_FRAMING_BYTES = 1 << 20


def _check_response_size(messages: Sequence[ViewMessage], max_response_bytes: int) -> None:
    """RESPONSE_TOO_LARGE, before anything is sent, when the view's text cannot fit one response."""
    texts = [
        text
        for m in messages
        for text in (
            m.content,
            *((m.source.reasoning_content, *(c.arguments for c in m.source.tool_calls)) if m.source else ()),
        )
    ]
    room = max_response_bytes - RESPONSE_FRAMING_BYTES
    # Characters are counted first: at most 4 bytes each, so only a view near the bound is encoded.
    if sum(map(len, texts)) * 4 <= room:
        return
    size = sum(len(text.encode()) for text in texts)
    if size > room:
        raise DomainError(
            Kind.RESOURCE_EXHAUSTED,
            "RESPONSE_TOO_LARGE",
            f"the view holds {size} bytes of text but one response carries at most {room}: lower the session's "
            "context_window, or send known_view_version to receive only the new messages",
            {"view_bytes": size, "max_response_bytes": room},
        )


def _index_ref(projection: Projection) -> str:
    checkpoint = projection.checkpoint
    return checkpoint.notes.index_ref if checkpoint is not None and checkpoint.notes is not None else ""


class FoldedElsewhere(Exception):
    """Another server held the session's fold lease; what it installed must be looked at afresh."""


class Lease(enum.Enum):
    TAKEN = "taken"
    WAITED = "waited"  # another holder's lease ended (released or run out) while we waited
    HELD_ELSEWHERE = "held_elsewhere"  # another holder folds; we did not wait


class KeyedLock:
    """One asyncio lock per key, dropped when nobody holds or waits for it. At most `max_waiting` calls
    wait for one key: more are refused at once (SESSION_BUSY), so a busy session's queue stays short
    and a client learns to back off instead of piling up calls."""

    def __init__(self, max_waiting: int, retry_after_seconds: float = 1.0) -> None:
        self.max_waiting = max_waiting
        self.retry_after_seconds = retry_after_seconds
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def held(self, key: str) -> bool:
        return key in self._locks

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        if users > self.max_waiting:  # one holder and max_waiting waiters already
            raise busy(
                f"{users - 1} calls already wait to maintain session {key!r} (at most {self.max_waiting}); retry later",
                self.retry_after_seconds,
                scope="session",
                session_id=key,
                limit=self.max_waiting,
            )
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class Maintenance:
    def __init__(
        self,
        store: Store,
        transcript: Transcript,
        summarizers: Mapping[str, Summarizer],
        configs: SessionConfigs,
        clock: Callable[[], float] = time.time,
        hooks: Hooks | None = None,
        max_waiting_per_session: int = 16,
        max_response_bytes: int = 64 << 20,
    ):
        self.store = store
        self.transcript = transcript
        self.summarizers = summarizers
        self.configs = configs
        self.clock = clock
        self.hooks = hooks or Hooks()
        # Concurrent calls on one session in this process that must maintain it take turns, so they do
        # not summarize the same input twice (a view that fits is answered without waiting); across
        # replicas the fold lease and the compare-and-swap do the same.
        self._sessions = KeyedLock(max_waiting_per_session)
        self.max_response_bytes = max_response_bytes

    # ---- streaming shell ------------------------------------------------------------------------

    async def _stream(self, work: Callable[[Emit], Coroutine[Any, Any, Prepared]]) -> AsyncIterator[Event]:
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

    def prepare(
        self,
        tenant: str,
        session_id: str,
        append: Sequence[NewMessage],
        overflow: bool,
        known_view_version: int,
        request_id: str = "",
    ) -> AsyncIterator[Event]:
        async def work(emit: Emit) -> Prepared:
            started = time.perf_counter()
            config, tokens = await self.configs.get(tenant, session_id)
            check_fixed_costs(config, tokens.system, tokens.tools)
            appended: list[StoredMessage] = []
            if append:
                appended, _ = await self.transcript.append(tenant, session_id, append, request_id, config)
            try:
                result = await self._maintain(tenant, session_id, Mode.PREPARE, emit, overflow=overflow)
                return await self._answer(result, known_view_version, appended, Mode.PREPARE, started)
            except DomainError as error:
                raise _appended_anyway(error, appended, request_id) from None

        return self._stream(work)

    def compact(
        self, tenant: str, session_id: str, focus: str, keep_tokens: int = 0, dry_run: bool = False
    ) -> AsyncIterator[Event]:
        """Folds everything outside the minimal kept set and the newest `keep_tokens` of history; a
        `dry_run` makes the candidate and answers it without installing. A Compact that cannot fold
        says why in the result; one whose fold fails ends with an error."""

        async def work(emit: Emit) -> Prepared:
            started = time.perf_counter()
            if keep_tokens < 0:
                raise DomainError(Kind.INVALID_ARGUMENT, "INVALID_REQUEST", "keep_tokens must be >= 0")
            config, tokens = await self.configs.get(tenant, session_id)
            check_fixed_costs(config, tokens.system, tokens.tools)
            run = await self._maintain(
                tenant, session_id, Mode.COMPACT, emit, focus=focus, keep_tokens=keep_tokens, dry_run=dry_run
            )
            return await self._answer(run, 0, [], Mode.COMPACT, started)

        return self._stream(work)

    # ---- usage and state ------------------------------------------------------------------------

    async def observe_usage(self, tenant: str, session_id: str, usage: Usage) -> tuple[float, bool]:
        """Records provider usage and calibrates the estimator; never maintains anything."""
        for field_name in ("input_tokens", "cached_input_tokens", "output_tokens"):
            if getattr(usage, field_name) < 0:
                raise DomainError(Kind.INVALID_ARGUMENT, "INVALID_USAGE", f"{field_name} must be >= 0")
        if usage.cached_input_tokens > usage.input_tokens:
            raise DomainError(Kind.INVALID_ARGUMENT, "INVALID_USAGE", "cached_input_tokens cannot exceed input_tokens")
        session = await self.store.get_session(tenant, session_id)
        accepted = False
        calibration = 1.0
        for _ in range(MAX_ROUNDS):
            text, revision = await self.store.read_state(session)
            state, _why = load_state(text, fingerprint(session.branch_id, session.checkpoint_id))
            record = state.view(usage.view_version)
            estimated = record.estimated_tokens if record else 0
            ratio = usage.input_tokens / estimated if estimated else 0.0
            accepted = estimated > 0 and estimator.MIN_CALIBRATION <= ratio <= estimator.MAX_CALIBRATION
            calibration = state.calibration
            if accepted:
                calibration += CALIBRATION_SMOOTHING * (ratio - calibration)
            state = (
                replace(state, calibration=calibration)
                .count("observations")
                .count("input_tokens", usage.input_tokens)
                .count("cached_input_tokens", usage.cached_input_tokens)
                .count("output_tokens", usage.output_tokens)
            )
            if await self.store.save_state(session.id, state.to_json(), revision):
                break
            session = await self.store.get_session(tenant, session_id)
        await self.store.record_usage(session, replace(usage, estimated_tokens=estimated))
        INSTRUMENTS.usage_input_tokens.add(usage.cached_input_tokens, {"ctxfold.cached": True})
        INSTRUMENTS.usage_input_tokens.add(usage.input_tokens - usage.cached_input_tokens, {"ctxfold.cached": False})
        return calibration, accepted

    async def context_state(self, tenant: str, session_id: str) -> str:
        """The stored state when it is valid for the session, else the state it would be rebuilt to."""
        session = await self.store.get_session(tenant, session_id)
        text, _revision = await self.store.read_state(session)
        state, _why = load_state(text, fingerprint(session.branch_id, session.checkpoint_id))
        return state.to_json()

    # ---- the flow -------------------------------------------------------------------------------

    async def _load(self, tenant: str, session_id: str) -> _Run:
        snapshot: ContextSnapshot = await self.store.load_context(tenant, session_id)
        session = snapshot.session
        config = config_from_json(session.config_json)
        state, why = load_state(snapshot.state_json, fingerprint(session.branch_id, session.checkpoint_id))
        if why not in ("", "new"):
            log.warning("context state of session %s rebuilt: %s", session.id, why)
            state = state.count("state_rebuilds")
        # Built once: a set expression inside the comprehension's condition would be rebuilt for every
        # pruned entry (O(pruned × view) per Prepare).
        in_view = {m.id for m in [*snapshot.kept, *snapshot.after]}
        projection = Projection(
            config=config,
            system_tokens=session.system_tokens,
            tools_tokens=session.tools_tokens,
            calibration=state.calibration,
            checkpoint=snapshot.checkpoint,
            kept=tuple(snapshot.kept),
            after=tuple(snapshot.after),
            pruned={k: v for k, v in state.pruned.items() if k in in_view},
        )
        return _Run(session, config, projection, state, snapshot.state_revision, projection.view(), projection.tokens())

    async def _maintain(
        self,
        tenant: str,
        session_id: str,
        mode: Mode,
        emit: Emit,
        overflow: bool = False,
        focus: str = "",
        keep_tokens: int | None = None,
        dry_run: bool = False,
    ) -> _Run:
        if mode is Mode.PREPARE and not overflow and self._sessions.held(session_id):
            # Another call of this process is maintaining (folding) the session: a view that still fits
            # is answered now, as committed, instead of waiting for that fold (as across replicas).
            run = await self._load(tenant, session_id)
            if run.projection.tokens() <= run.config.hard_limit_tokens:
                return run
        async with self._sessions.hold(session_id):
            return await self._maintain_locked(tenant, session_id, mode, emit, overflow, focus, keep_tokens, dry_run)

    async def _maintain_locked(
        self,
        tenant: str,
        session_id: str,
        mode: Mode,
        emit: Emit,
        overflow: bool,
        focus: str,
        keep_tokens: int | None,
        dry_run: bool,
    ) -> _Run:
        for _ in range(MAX_ROUNDS):
            run = await self._load(tenant, session_id)
            run.keep_tokens, run.dry_run = keep_tokens, dry_run
            try:
                await self._steps(run, mode, emit, overflow, focus)
            except FoldedElsewhere:
                continue
            except StaleSession:
                # Something changed underneath; what was committed stays, the rest is recomputed.
                await emit(
                    Progress(Stage.PASS_FAILED, "the session changed meanwhile: candidate discarded, starting over")
                )
                continue
            if mode is Mode.COMPACT and run.failure is not None:
                await self.store.save_state(run.session.id, run.state.to_json(), run.revision)
                reason, message = run.failure
                raise DomainError(Kind.FAILED_PRECONDITION, reason, f"Compact folded nothing: {message}")
            tokens = run.projection.tokens()
            if tokens > run.config.hard_limit_tokens:
                # Keep the receipts (e.g. the failed summary); the view and checkpoints stay as they were.
                await self.store.save_state(run.session.id, run.state.to_json(), run.revision)
                raise budget_error(run.projection, tokens, run.failure[1] if run.failure else "")
            return run
        raise DomainError(
            Kind.ABORTED,
            "CONCURRENT_MODIFICATION",
            f"session {session_id!r} kept changing during maintenance; retry",
            {"session_id": session_id},
            retry_after_seconds=1.0,
        )

    async def _steps(self, run: _Run, mode: Mode, emit: Emit, overflow: bool, focus: str) -> None:
        before = run.projection.tokens()
        if mode is Mode.PREPARE:
            if before < run.config.trigger_tokens and not overflow:
                return
            await self._pruned(run, emit)
            after_prune = run.projection.tokens()
            if not overflow and before <= run.state.failed_fold_tokens and after_prune <= run.config.hard_limit_tokens:
                # The same input failed to fold before and the view still fits: wait until it grows.
                # (A view above the hard ceiling is retried: that is the only way forward.)
                if after_prune >= run.config.trigger_tokens:
                    await self._record(run, "blocked", "summary", before, before, "the last fold of this input failed")
                    run.not_folding(
                        NotFolded.PREVIOUS_FAILURE,
                        f"the last fold of this input ({before} tokens) failed; it is retried when the view grows",
                    )
                return
            if run.projection.tokens() < run.config.trigger_tokens and not overflow:
                return
        run.trigger = "compact" if mode is Mode.COMPACT else "overflow" if overflow else "threshold"
        await self._fold(run, mode, emit, focus, one_pass=overflow)

    async def _pruned(self, run: _Run, emit: Emit) -> None:
        projection = run.projection
        pruned = prune(projection)
        if pruned == dict(projection.pruned):
            return
        before = projection.tokens()
        candidate = replace(projection, pruned=pruned)
        after = candidate.tokens()
        if after >= before:
            return
        count = len(pruned) - len(projection.pruned)
        with TRACER.start_as_current_span("ctxfold.prune") as span:
            span.set_attributes(
                {
                    "ctxfold.session.id": run.session.id,
                    "ctxfold.prune.results": count,
                    "ctxfold.tokens.before": before,
                    "ctxfold.tokens.after": after,
                }
            )
            state = replace(run.state, pruned=pruned, generation=run.state.generation + 1).with_receipt(
                self._receipt("applied", "prune", before, after, f"pruned {count} results")
            )
            await self._install(run, None, state, candidate, before, after)
        run.action = Action.PRUNED
        await emit(
            Progress(
                Stage.PRUNED,
                f"pruned {count} old tool results: {before} → {after} tokens",
                tokens_before=before,
                tokens_after=after,
            )
        )

    async def _fold(self, run: _Run, mode: Mode, emit: Emit, focus: str, one_pass: bool) -> None:
        summarizer = self.summarizers.get(run.config.summarizer)
        if summarizer is None:
            raise DomainError(
                Kind.FAILED_PRECONDITION,
                "SUMMARIZER_NOT_CONFIGURED",
                f"summarizer {run.config.summarizer!r} is not configured on this server",
                {"summarizer": run.config.summarizer},
            )
        before = run.projection.tokens()
        plan = plan_pass(run.projection, summarizer.input_window_tokens, run.keep_tokens)
        if plan.first is None:
            await self._record(run, "noop", "summary", before, before, "nothing to fold")
            run.not_folding(
                NotFolded.NOTHING_OUTSIDE_KEPT_SET,
                f"all {len(run.projection.messages)} messages of the view are in the kept set (the opening "
                "anchors, pinned messages, the input the next call must answer, the newest call group"
                + (f", the newest {run.keep_tokens} tokens)" if run.keep_tokens else ")"),
            )
            return
        owner = uuid.uuid4().hex
        # Only a view above the hard ceiling (or a Compact, which asks for a fold) waits for another
        # holder's fold: any other Prepare answers with the current view, which still fits.
        must_fold = mode is Mode.COMPACT or before > run.config.hard_limit_tokens
        lease = await self._take_lease(run, owner, wait=must_fold)
        if lease is Lease.WAITED:
            raise FoldedElsewhere(run.session.id)
        if lease is Lease.HELD_ELSEWHERE:
            await self._record(run, "blocked", "summary", before, before, "another call is folding this session")
            return
        heartbeat = asyncio.create_task(self._renew_lease(run.session, owner))
        try:
            await self._fold_leased(run, summarizer, plan, emit, focus, one_pass)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            # Shielded: a cancelled call still hands the lease back (else it would run out by itself).
            await asyncio.shield(self.store.release_fold_lease(run.session, owner))

    async def _renew_lease(self, session: SessionRecord, owner: str) -> None:
        """Renews the fold lease while the fold runs; a failed renewal is retried at the next beat (the
        lease outlives a few missed beats)."""
        while True:
            await asyncio.sleep(FOLD_LEASE_RENEW_SECONDS)
            try:
                await self.store.take_fold_lease(session, owner, FOLD_LEASE_SECONDS)
            except Exception as exc:  # the fold goes on; the next beat tries again
                log.warning("renewing the fold lease of session %s failed: %s", session.id, exc)

    async def _take_lease(self, run: _Run, owner: str, wait: bool) -> Lease:
        """Takes the fold lease; when another holder has it, either answers HELD_ELSEWHERE at once or
        (with `wait`) waits until it is released or runs out and answers WAITED (that holder's fold has
        probably changed the session)."""
        until = await self.store.take_fold_lease(run.session, owner, FOLD_LEASE_SECONDS)
        if not until:
            return Lease.TAKEN
        if not wait:
            return Lease.HELD_ELSEWHERE
        while until and until > time.time():
            await asyncio.sleep(min(FOLD_LEASE_POLL_SECONDS, until - time.time()))
            until = await self.store.fold_lease_until(run.session)
        return Lease.WAITED

    async def _fold_leased(
        self,
        run: _Run,
        summarizer: Summarizer,
        plan: FoldPlan,
        emit: Emit,
        focus: str,
        one_pass: bool,
    ) -> None:
        before = run.projection.tokens()
        passes = 1 if one_pass else plan.passes_planned
        await emit(
            Progress(
                Stage.PLANNED,
                f"folding in {passes} pass(es) from {before} tokens",
                passes_planned=passes,
                tokens_before=before,
            )
        )
        with TRACER.start_as_current_span("ctxfold.fold") as span:
            span.set_attributes(
                {
                    "ctxfold.session.id": run.session.id,
                    "ctxfold.fold.trigger": run.trigger,
                    "ctxfold.context_window": run.config.context_window,
                    "ctxfold.trigger_tokens": run.config.trigger_tokens,
                    "ctxfold.hard_limit_tokens": run.config.hard_limit_tokens,
                    "ctxfold.fold.passes_planned": passes,
                    "ctxfold.tokens.before": before,
                    "ctxfold.summarizer": summarizer.name,
                    "ctxfold.summarizer.input_window_tokens": summarizer.input_window_tokens,
                }
            )
            fold: FoldPass | None = plan.first
            index = 0
            while fold is not None:
                index += 1
                attributes: dict[str, str | int] = {
                    "ctxfold.session.id": run.session.id,
                    "ctxfold.fold.pass_index": index,
                    "ctxfold.fold.passes_planned": passes,
                }
                with TRACER.start_as_current_span("ctxfold.fold.pass", attributes=attributes):
                    committed = await self._fold_pass(run, summarizer, fold, index, passes, focus, emit)
                if not committed or run.dry_run:
                    break
                if one_pass or fold.final:
                    break
                fold = plan_pass(run.projection, summarizer.input_window_tokens, run.keep_tokens).first
                passes = max(passes, index + 1)
            span.set_attributes({"ctxfold.fold.passes": index, "ctxfold.tokens.after": run.projection.tokens()})

    async def _fold_pass(
        self,
        run: _Run,
        summarizer: Summarizer,
        fold: FoldPass,
        index: int,
        passes: int,
        focus: str,
        emit: Emit,
    ) -> bool:
        """One summarizer call and its install (inside the pass's span); False when the pass failed
        (nothing installed). Above the hard ceiling a failed LLM summary falls back to extractive."""
        projection = run.projection
        before = projection.tokens()
        span = trace.get_current_span()
        folded_seqs = [m.source.seq for m in fold.folded if m.source is not None]
        span.set_attributes(
            {
                "ctxfold.tokens.before": before,
                "ctxfold.fold.input_tokens": fold.input_tokens,
                "ctxfold.fold.messages": len(fold.folded),
                "ctxfold.fold.first_seq": min(folded_seqs, default=0),
                "ctxfold.fold.last_seq": fold.position_seq,
            }
        )
        await emit(
            Progress(
                Stage.PASS_STARTED,
                f"pass {index}: summarizing {len(fold.folded)} messages ({fold.input_tokens} tokens read)",
                pass_index=index,
                passes_planned=passes,
                tokens_before=before,
                summarizer=summarizer.name,
            )
        )

        async def on_delta(text: str) -> None:
            await emit(Progress(Stage.SUMMARY_DELTA, "", pass_index=index, passes_planned=passes, summary_delta=text))

        record = await self._record_fold(run, fold)
        # The summarizer writes the body; the engine's sections take their share of summary_max_tokens.
        engine_tokens = estimator.count_text(render_summary(replace(record.notes, body="")))
        body_budget = max(MIN_BODY_TOKENS, run.config.summary_max_tokens - engine_tokens)
        previous = projection.checkpoint
        request = SummaryRequest(
            system_prompt=run.config.system_prompt,
            tools_json=run.config.tools_json,
            prompt_cache_key=run.config.prompt_cache_key,
            previous_summary=(previous.notes.body if previous.notes else previous.summary) if previous else "",
            prefix=fold.prefix,
            folded=fold.folded,
            max_tokens=body_budget,
            focus=focus,
            send_max_tokens=run.config.max_output_tokens > 0,
        )

        async def attempt(with_summarizer: Summarizer) -> tuple[Projection | None, str, str]:
            """(candidate, "", "") or (None, why it failed, its ErrorInfo reason)."""
            text, failure = await self._summarize(run, with_summarizer, request, on_delta)
            if failure:
                return None, failure, "SUMMARIZER_FAILED"
            body = strip_engine_sections(text)
            if estimator.count_text(body) > body_budget:  # before any candidate is built from it
                return None, f"the summary has more than the {body_budget} tokens left for it", "SUMMARIZER_FAILED"
            notes = replace(record.notes, body=body, summarizer=with_summarizer.name)
            summary = render_summary(notes)
            checkpoint = Checkpoint(
                id=new_id("cp"),
                parent_id=previous.id if previous else None,
                position_seq=fold.position_seq,
                summary=summary,
                summary_tokens=estimator.count_text(summary),
                kept_ids=tuple(m.id for m in fold.kept),
                notes=notes,
            )
            candidate = apply_pass(projection, fold, checkpoint, after_position(projection, fold.position_seq))
            if candidate.tokens() >= before:
                why = f"the candidate ({candidate.tokens()} tokens) is not smaller than the view ({before})"
                run.not_folding(NotFolded.NOT_SMALLER, why)
                return None, why, "COMPACT_FAILED"
            return candidate, "", ""

        candidate, failure, reason = await attempt(summarizer)
        fell_back = ""
        if failure and summarizer.name != ExtractiveSummarizer.name and before > run.config.hard_limit_tokens:
            # Above the ceiling the agent cannot go on without a fold: the offline summarizer always answers.
            fallback = self.summarizers.get(ExtractiveSummarizer.name) or ExtractiveSummarizer()
            fell_back = f"{summarizer.name} failed ({failure}); folded with {fallback.name}"
            span.set_attribute("ctxfold.fold.fallback_from", summarizer.name)
            await emit(
                Progress(
                    Stage.SUMMARIZER_FALLBACK,
                    f"pass {index}: {fell_back}",
                    pass_index=index,
                    passes_planned=passes,
                    tokens_before=before,
                    summarizer=fallback.name,
                )
            )
            candidate, failure, reason = await attempt(fallback)
        checkpoint = candidate.checkpoint if candidate is not None else None
        if failure or candidate is None or checkpoint is None:
            span.set_status(StatusCode.ERROR, failure)
            await emit(Progress(Stage.PASS_FAILED, failure, pass_index=index, passes_planned=passes))
            run.state = replace(run.state, failed_fold_tokens=before)
            run.failure = (reason, failure)
            await self._record(run, "failed", "summary", before, before, failure)
            return False
        after = candidate.tokens()
        span.set_attributes({"ctxfold.tokens.after": after, "ctxfold.checkpoint.id": checkpoint.id})
        if run.dry_run:
            run.candidate = candidate
            run.not_folding(NotFolded.DRY_RUN, f"dry run: the fold would take the view from {before} to {after} tokens")
            return True
        note = f"pass {index}" + (f": {fell_back}" if fell_back else "")
        receipt = self._receipt("applied", "summary", before, after, note)
        state = replace(
            run.state, pruned=dict(candidate.pruned), generation=run.state.generation + 1, failed_fold_tokens=0
        ).with_receipt(receipt)
        if self.hooks.before_install is not None:
            await self.hooks.before_install(run.session.id)
        last_folded = fold.folded[-1].source
        assert last_folded is not None  # folded view messages render canonical messages
        document = FoldDocument(record.notes.index_ref, last_folded.id, folded_index.render(record.index))
        await self._install(run, checkpoint, state, candidate, before, after, document)
        run.action = Action.FOLDED
        await emit(
            Progress(
                Stage.PASS_COMMITTED,
                f"pass {index} committed checkpoint {checkpoint.id}: {before} → {after} tokens",
                pass_index=index,
                passes_planned=passes,
                tokens_before=before,
                tokens_after=after,
                checkpoint_id=checkpoint.id,
                summarizer=checkpoint.notes.summarizer if checkpoint.notes else summarizer.name,
            )
        )
        return True

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
            run.config.summary_max_tokens,
            projection.anchor_end,
        )

    async def _summarize(
        self, run: _Run, summarizer: Summarizer, request: SummaryRequest, on_delta: OnDelta
    ) -> tuple[str, str]:
        """(summary text, "") or ("", why it failed): one summarizer call, timed and traced: a model
        call as a GenAI `chat` client span, an in-process summarizer (extractive) as what it is."""
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": summarizer.provider}
        calls_model = summarizer.provider != IN_PROCESS_PROVIDER
        name = f"chat {summarizer.model}" if calls_model else f"ctxfold.summarize {summarizer.name}"
        with TRACER.start_as_current_span(name, kind=SpanKind.CLIENT if calls_model else SpanKind.INTERNAL) as span:
            if calls_model:
                span.set_attributes(
                    {
                        **attributes,
                        "gen_ai.request.model": summarizer.model,
                        "gen_ai.request.max_tokens": request.max_tokens,
                        **({"server.address": summarizer.server_address} if summarizer.server_address else {}),
                    }
                )
            span.set_attributes({"ctxfold.session.id": run.session.id, "ctxfold.summarizer": summarizer.name})
            started = time.perf_counter()
            failure = ""
            text = ""
            try:
                result = await summarizer.summarize(request, on_delta)
                text = result.text.strip()
                if calls_model:
                    span.set_attributes(
                        {
                            "gen_ai.response.model": result.response_model or summarizer.model,
                            "gen_ai.usage.input_tokens": result.input_tokens,
                            "gen_ai.usage.output_tokens": result.output_tokens,
                            "gen_ai.usage.cache_read.input_tokens": result.cached_input_tokens,
                            "gen_ai.response.finish_reasons": [result.finish_reason],
                        }
                    )
                else:
                    span.set_attribute("ctxfold.summary.tokens", estimator.count_text(text))
                if result.finish_reason == "length":
                    failure = "the summary was truncated (finish_reason=length)"
                elif not text:
                    failure = "the summary was empty"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("summarizer %s failed for session %s: %s", summarizer.name, run.session.id, exc)
                span.record_exception(exc)
                span.set_attribute("error.type", type(exc).__name__)
                failure = f"the summarizer failed: {exc}"
            if failure:
                span.set_status(StatusCode.ERROR, failure)
            INSTRUMENTS.summarizer_duration.record(
                time.perf_counter() - started,
                {
                    **attributes,
                    "gen_ai.request.model": summarizer.model,
                    **({"error.type": "summary"} if failure else {}),
                },
            )
        return ("", failure) if failure else (text, "")

    async def _install(
        self,
        run: _Run,
        checkpoint: Checkpoint | None,
        state: ContextState,
        candidate: Projection,
        before: int,
        after: int,
        document: FoldDocument | None = None,
    ) -> None:
        with TRACER.start_as_current_span("ctxfold.checkpoint.install") as span:
            span.set_attributes(
                {
                    "ctxfold.session.id": run.session.id,
                    "ctxfold.install.kind": "checkpoint" if checkpoint else "prune",
                    "ctxfold.checkpoint.id": checkpoint.id if checkpoint else "",
                    "ctxfold.tokens.before": before,
                    "ctxfold.tokens.after": after,
                }
            )
            checkpoint_id = checkpoint.id if checkpoint else run.session.checkpoint_id
            state = replace(
                state,
                fingerprint=fingerprint(run.session.branch_id, checkpoint_id),
                checkpoint_id=checkpoint_id,
                covered_count=checkpoint.position_seq if checkpoint else state.covered_count,
                summary_hash=_summary_hash(checkpoint.summary) if checkpoint else state.summary_hash,
                projection_version=state.projection_version + 1,
            )
            try:
                run.session, run.revision = await self.store.install(
                    run.session, checkpoint, state.to_json(), before, after, document
                )
            except StaleSession:
                span.set_status(StatusCode.ERROR, "stale: the session changed; candidate discarded")
                raise
            run.projection = candidate
            run.state = state
        receipt = run.state.last_receipt
        if receipt is not None:
            self._count(receipt)

    def _receipt(self, status: str, action: str, tokens_in: int, tokens_out: int, reason: str) -> Receipt:
        return Receipt(uuid.uuid4().hex, status, action, tokens_in, tokens_out, reason, self.clock())

    async def _record(self, run: _Run, status: str, action: str, before: int, after: int, reason: str) -> None:
        receipt = self._receipt(status, action, before, after, reason)
        run.state = run.state.with_receipt(receipt)
        self._count(receipt)

    @staticmethod
    def _count(receipt: Receipt) -> None:
        INSTRUMENTS.maintenance_operations.add(1, {"ctxfold.action": receipt.action, "ctxfold.status": receipt.status})
        if receipt.status == "applied":
            INSTRUMENTS.tokens_saved.add(receipt.tokens_saved, {"ctxfold.action": receipt.action})

    # ---- the answer -----------------------------------------------------------------------------

    async def _answer(
        self, run: _Run, known_view_version: int, appended: list[StoredMessage], mode: Mode, started: float
    ) -> Prepared:
        """The result, plus the bookkeeping write (view record, activity, receipts); that write is
        skipped, never retried over someone else's, if the state changed meanwhile."""
        view = run.projection.view()
        state = run.state
        now = self.clock()
        cache = cache_state(state.last_activity, now, cache_ttl_seconds(run.config))
        version = view_version(state.generation, len(view))
        previous = state.views[-1] if state.views else None
        if run.action is not Action.NONE:
            stable = _common_prefix(run.first_view, view)
        elif previous is not None and split_view_version(previous.version)[0] == state.generation:
            stable = min(split_view_version(previous.version)[1], len(view))
        else:
            stable = 0
        estimated = run.projection.tokens()
        state = replace(
            state.with_view(ViewRecord(version, run.projection.raw_tokens())),
            last_activity=now,
            cache_state=cache,
            transcript_version=run.session.head_seq,
            checkpoint_id=run.session.checkpoint_id,
            covered_count=run.projection.checkpoint.position_seq if run.projection.checkpoint else 0,
            prompt_cache_key=run.config.prompt_cache_key,
            source_tokens=run.first_tokens,
            projection_tokens=estimated,
        ).count("prepares")
        if not await self.store.save_state(run.session.id, state.to_json(), run.revision):
            log.debug("state of session %s changed meanwhile; bookkeeping of view %d skipped", run.session.id, version)
        trace.get_current_span().set_attributes(
            {
                "ctxfold.session.id": run.session.id,
                "ctxfold.view.version": version,
                "ctxfold.view.messages": len(view),
                "ctxfold.tokens.before": run.first_tokens,
                "ctxfold.tokens.after": estimated,
                "ctxfold.action": run.action.value,
                "ctxfold.cache_state": cache,
            }
        )
        INSTRUMENTS.prepare_duration.record(
            time.perf_counter() - started, {"ctxfold.operation": mode.value, "ctxfold.action": run.action.value}
        )
        known_generation, known_count = split_view_version(known_view_version)
        delta = known_view_version > 0 and known_generation == state.generation and known_count <= len(view)
        sent = view[known_count:] if delta else view
        _check_response_size(sent, self.max_response_bytes)
        prepared = Prepared(
            messages=sent,
            estimated_tokens=estimated,
            view_version=version,
            action=run.action,
            cache_state=cache,
            prompt_cache_key=run.config.prompt_cache_key,
            checkpoint_id=run.session.checkpoint_id or "",
            stable_prefix_messages=stable,
            delta=delta,
            view_message_count=len(view),
            trigger_tokens=run.config.trigger_tokens,
            hard_limit_tokens=run.config.hard_limit_tokens,
            appended=appended,
            not_folded=run.not_folded,
            not_folded_detail=run.not_folded_detail,
            folded_results_ref=_index_ref(run.projection),
        )
        if run.candidate is None:
            return prepared
        # A dry run answers the candidate: not installed, so it has no version to observe usage against.
        candidate_view = run.candidate.view()
        return replace(
            prepared,
            messages=candidate_view,
            estimated_tokens=run.candidate.tokens(),
            view_version=0,
            checkpoint_id="",
            stable_prefix_messages=_common_prefix(view, candidate_view),
            delta=False,
            view_message_count=len(candidate_view),
            candidate_summary=run.candidate.checkpoint.summary if run.candidate.checkpoint else "",
            folded_results_ref=_index_ref(run.candidate),
        )

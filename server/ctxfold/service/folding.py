"""A fold of one run, pass after pass: the fold lease, the plan, one summarizer call per pass (extractive above
the hard ceiling), the candidate, its install. A background fold makes its one `candidate` here too."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from ctxfold import cpu
from ctxfold.engine import folded_index
from ctxfold.engine.briefing import FoldRecord, strip_engine_sections
from ctxfold.engine.candidate import (
    Accepted,
    FoldDocument,
    Rejected,
    accept,
    body_budget,
    record_pass,
    summary_failure,
)
from ctxfold.engine.errors import failed_precondition
from ctxfold.engine.ids import new_id, new_result_ref
from ctxfold.engine.maintenance import (
    Action,
    Fold,
    FoldPass,
    FoldPlan,
    NotFolded,
    another_pass,
    falls_back,
    fold_outcome,
    offline_stand_in,
    plan_pass,
)
from ctxfold.engine.model import text_chars
from ctxfold.engine.state import ReceiptAction, ReceiptStatus
from ctxfold.service.exclusion import Lease, holding
from ctxfold.service.run import FoldedElsewhere, Hooks, Run
from ctxfold.store import Store
from ctxfold.summarizers.base import Summarizer, SummaryRequest
from ctxfold.summarizers.extractive import ExtractiveSummarizer

log = logging.getLogger(__name__)


class Folding:
    def __init__(self, store: Store, summarizers: Mapping[str, Summarizer], hooks: Hooks):
        self.store = store
        self.summarizers = summarizers
        self.hooks = hooks

    async def fold(self, run: Run, fold: Fold) -> None:
        if (configured := self.summarizers.get(name := run.config.summarizer)) is None:
            message = f"summarizer {name!r} is not configured on this server"
            raise failed_precondition("SUMMARIZER_NOT_CONFIGURED", message, summarizer=name)
        before = run.projection.tokens()
        stand_in = offline_stand_in(fold, run.config, before, configured.name)
        summarizer = self._extractive() if stand_in else configured
        keep_tokens = run.request.keep_tokens
        plan = await cpu.run(run.work, plan_pass, run.projection, summarizer.input_window_tokens, keep_tokens)
        if plan.first is None:
            run.record(ReceiptStatus.NOOP, ReceiptAction.SUMMARY, before, before, "nothing to fold")
            run.not_folding(
                NotFolded.NOTHING_OUTSIDE_KEPT_SET,
                f"all {run.projection.message_count} messages of the view are in the kept set (the opening "
                "anchors, pinned messages, the input the next call must answer, the newest call group"
                + (f", the newest {keep_tokens} tokens)" if keep_tokens else ")"),
            )
            return
        if fold.offline:
            # The lease only saves paying a summary twice; an offline fold pays none, so never waits (one swap wins).
            await self._fold_passes(run, summarizer, plan, stand_in)
            return
        # Only a must-fold call waits for another holder's fold; any other answers with the current view, which fits.
        async with holding(self.store, run.session, wait=fold.must_fold) as held:
            if held.lease is Lease.WAITED:
                raise FoldedElsewhere(run.session.id)
            if held.lease is Lease.HELD_ELSEWHERE:
                why = (
                    f"another call folds this session (fold lease holder {held.holder}, renewed while it "
                    f"runs; it runs out {max(held.until - self.store.clock(), 0):.0f} s from now unless renewed)"
                )
                run.record(ReceiptStatus.BLOCKED, ReceiptAction.SUMMARY, before, before, why)
                run.not_folding(NotFolded.FOLD_IN_PROGRESS, why)
                return
            await self._fold_passes(run, summarizer, plan)

    def _extractive(self) -> Summarizer:
        return self.summarizers.get(ExtractiveSummarizer.name) or ExtractiveSummarizer()

    async def _fold_passes(self, run: Run, summarizer: Summarizer, plan: FoldPlan, stand_in: str = "") -> None:
        """Pass after pass, each planned from what the last installed, until complete (or one pass on overflow, a dry
        run's candidate, a failed pass); `stand_in`: why `summarizer` folds instead of the configured one."""
        before = run.projection.tokens()
        passes = 1 if run.request.one_pass else plan.passes_planned
        await run.observer.planned(passes, before)
        with run.observer.folding(run.request, run.config, summarizer, passes, before) as span:
            fold: FoldPass | None = plan.first
            index = 0
            committed = True
            while fold is not None:
                index += 1
                with run.observer.fold_pass(index, passes):
                    committed = await self._fold_pass(run, summarizer, fold, index, stand_in)
                if not another_pass(run.request, fold, committed):
                    break
                window, keep_tokens = summarizer.input_window_tokens, run.request.keep_tokens
                fold = (await cpu.run(run.work, plan_pass, run.projection, window, keep_tokens)).first
                passes = max(passes, index + 1)
            installed = index if committed else index - 1
            outcome = fold_outcome(installed, not committed, run.request.dry_run)
            failure = run.failure[1] if run.failure else ""
            run.observer.folded(span, installed, passes, run.projection.tokens(), outcome, failure)

    async def _fold_pass(self, run: Run, summarizer: Summarizer, fold: FoldPass, index: int, stand_in: str) -> bool:
        """One summarizer call and its install; False when the pass failed (nothing installed)."""
        before = run.projection.tokens()
        made = await self.candidate(run, summarizer, fold, stand_in)
        if made is None:
            return False
        outcome, document, fell_back = made
        checkpoint, after = outcome.checkpoint, outcome.candidate.tokens()
        if run.request.dry_run:
            run.candidate = outcome.candidate
            run.not_folding(NotFolded.DRY_RUN, f"dry run: the fold would take the view from {before} to {after} tokens")
            return True
        if self.hooks.before_install is not None:
            await self.hooks.before_install(run.session.id)
        note = f"pass {index}" + (f": {fell_back}" if fell_back else "")
        await run.install(outcome.candidate, note, document)
        label = checkpoint.notes.summarizer if checkpoint.notes else summarizer.name
        await run.observer.pass_committed(before, after, checkpoint.id, label)
        return True

    async def candidate(
        self, run: Run, summarizer: Summarizer, fold: FoldPass, stand_in: str = ""
    ) -> tuple[Accepted, FoldDocument, str] | None:
        """One summarizer call: (the accepted candidate, its folded-results document, how it fell back or `stand_in`),
        or None when it failed (recorded in `run`). Above the hard ceiling a failed summary falls back to extractive."""
        projection = run.projection
        before = projection.tokens()
        await run.observer.pass_started(fold, before, summarizer.name)
        if stand_in:
            await run.observer.fell_back(before, run.config.summarizer, summarizer.name, stand_in)
        on_delta = run.observer.summary_deltas()
        record, index_text = await self._record_fold(run, fold)
        request = _summary_request(run, fold, record)
        fell_back = stand_in

        async def attempt(with_summarizer: Summarizer) -> Accepted | Rejected:
            nonlocal fell_back
            with run.observer.summarizing(with_summarizer, request) as call:
                try:
                    result = await with_summarizer.summarize(request, on_delta)
                except Exception as exc:
                    log.warning("summarizer %s failed for session %s: %s", with_summarizer.name, run.session.id, exc)
                    call.raised(exc, failure := f"the summarizer failed: {exc}")
                    return Rejected(failure, "SUMMARIZER_FAILED")
                text = result.text.strip()
                failure = summary_failure(text, result.finish_reason, native=result.native is not None)
                call.answered(result, text, failure)
            if failure:
                return Rejected(failure, "SUMMARIZER_FAILED")
            if result.native_fallback:
                # Native compaction was asked for and is unsupported here: this is the application summary.
                fell_back = result.native_fallback
                name = with_summarizer.name
                await run.observer.fell_back(before, name, name, fell_back)
            notes = replace(record.notes, summarizer=with_summarizer.name)
            body = strip_engine_sections(text)
            outcome = await cpu.run(run.work, accept, projection, fold, notes, body, new_id("cp"), result.native)
            if isinstance(outcome, Rejected) and outcome.not_folded is not NotFolded.UNSPECIFIED:
                run.not_folding(outcome.not_folded, outcome.why)
            return outcome

        outcome = await attempt(summarizer)
        if isinstance(outcome, Rejected) and falls_back(run.config, before, summarizer.name):
            # Above the ceiling the agent cannot go on without a fold: the offline summarizer always answers.
            fallback = self._extractive()
            fell_back = f"{summarizer.name} failed ({outcome.why}); folded with {fallback.name}"
            await run.observer.fell_back(before, summarizer.name, fallback.name, fell_back)
            outcome = await attempt(fallback)
        if isinstance(outcome, Rejected):  # said, remembered (not retried until the view grows) and receipted
            await run.observer.pass_failed(outcome.why)
            run.state, run.failure = replace(run.state, failed_fold_tokens=before), (outcome.reason, outcome.why)
            if run.not_folded is NotFolded.UNSPECIFIED and run.action is not Action.FOLDED:
                run.not_folding(NotFolded.SUMMARIZER_FAILED, outcome.why)
            run.record(ReceiptStatus.FAILED, ReceiptAction.SUMMARY, before, before, outcome.why)
            return None
        run.observer.candidate(outcome.checkpoint.id, outcome.candidate.tokens())
        last_folded = fold.folded[-1].source
        assert last_folded is not None  # folded view messages render canonical messages
        document = FoldDocument(record.notes.index_ref, last_folded.id, index_text)
        return outcome, document, fell_back

    async def _record_fold(self, run: Run, fold: FoldPass) -> tuple[FoldRecord, str]:
        """The engine's notes and folded-results index after `fold`, rolled forward from the head
        checkpoint's (its index document is read back as data, not parsed out of summary text), and the
        new index's document."""
        projection = run.projection
        notes = projection.checkpoint.notes if projection.checkpoint else None
        raw = b""
        if notes is not None and notes.index_ref:
            raw = (await self.store.read_raw_result(run.session, notes.index_ref)).data
        folded = [v.source for v in fold.folded if v.source is not None]

        def record() -> tuple[FoldRecord, str]:
            previous = folded_index.parse(raw.decode()) if raw else folded_index.FoldedIndex()
            recorded = record_pass(projection, folded, previous, new_result_ref())
            return recorded, folded_index.render(recorded.index)

        # It reads every folded text (the artifacts of megabytes of tool arguments) and the previous index, and
        # writes the new one (every result the session folded, however small its view): off the loop when large.
        return await cpu.run(run.work + len(raw) + text_chars(folded), record)


def _summary_request(run: Run, fold: FoldPass, record: FoldRecord) -> SummaryRequest:
    """What the summarizer is asked: a cache-safe fork of the agent's request (system prompt, tools, cache key), the
    pass's prefix, the previous summary's body to update, and the budget the engine's sections leave."""
    config, previous = run.config, run.projection.checkpoint
    return SummaryRequest(
        system_prompt=config.system_prompt,
        tools_json=config.tools_json,
        prompt_cache_key=config.prompt_cache_key,
        previous_summary=(previous.notes.body if previous.notes else previous.summary) if previous else "",
        prefix=fold.prefix,
        folded=fold.folded,
        max_tokens=body_budget(record.notes, config),
        focus=run.request.focus,
        send_max_tokens=config.max_output_tokens > 0,
    )

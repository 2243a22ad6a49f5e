"""One maintenance call's state through its rounds (`Run`) and its writes: installs and receipts."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields

from ctxfold import cpu
from ctxfold.engine.answer import Answering
from ctxfold.engine.candidate import Accepted, FoldDocument, Install, fold_install, prune_install
from ctxfold.engine.context import Context, SessionRecord
from ctxfold.engine.maintenance import Action, MaintainRequest, NotFolded
from ctxfold.engine.model import SessionConfig
from ctxfold.engine.projection import Projection
from ctxfold.engine.state import ContextState, Receipt, ReceiptAction, ReceiptStatus
from ctxfold.engine.view import ViewMessage
from ctxfold.service.observer import MaintenanceObserver
from ctxfold.store import Store


@dataclass
class Hooks:
    """Test seams: `before_install` runs after a candidate is made and before it is installed."""

    before_install: Callable[[str], Awaitable[None]] | None = None


# What an answer is made from, but the session's head: a run holds it under the same names.
_ANSWERING_FIELDS = [f.name for f in fields(Answering) if f.name not in ("head_seq", "checkpoint_id")]


@dataclass
class Run:
    """The state of one Prepare or Compact call as it moves through a round."""

    session: SessionRecord
    projection: Projection
    state: ContextState
    revision: int
    first_view: list[ViewMessage]
    first_tokens: int
    observer: MaintenanceObserver  # what the call reports to
    store: Store  # what it installs into
    request: MaintainRequest
    action: Action = Action.NONE
    not_folded: NotFolded = NotFolded.UNSPECIFIED
    not_folded_detail: str = ""
    # Set by a dry run: the view and summary a fold would install.
    candidate: Projection | None = None
    # (reason, message) of the last failed pass: a Compact ends with it as its error.
    failure: tuple[str, str] | None = None

    @staticmethod
    def of(context: Context, request: MaintainRequest, observer: MaintenanceObserver, store: Store) -> Run:
        view, state = context.projection, context.state
        return Run(context.session, view, state, context.revision, view.view(), view.tokens(), observer, store, request)

    @property
    def work(self) -> int:
        """What an engine step over the run's view costs (`cpu.run` decides from it where it runs): its messages, and
        the texts it scans for fenced commands when the session may act in text."""
        return self.projection.message_count * cpu.MESSAGE_WORK_BYTES + self.projection.fenced_chars

    @property
    def config(self) -> SessionConfig:
        """The session's config (installs replace the projection, never its config)."""
        return self.projection.config

    def answering(self) -> Answering:
        """What the answer is made from once the round's maintenance is done: the run's fields of the same names."""
        ran = {name: getattr(self, name) for name in _ANSWERING_FIELDS}
        return Answering(**ran, head_seq=self.session.head_seq, checkpoint_id=self.session.checkpoint_id)

    def not_folding(self, why: NotFolded, detail: str) -> None:
        self.not_folded, self.not_folded_detail = why, detail

    async def install(
        self, candidate: Projection, why: str, document: FoldDocument | None = None, prepared_by: str = ""
    ) -> None:
        """Installs `candidate` (a fold's, with its `document`, else a prune's) and its receipt by compare-and-swap
        (StaleSession when the session changed); the run follows it. `prepared_by`: a prepared fold's traceparent."""
        before, after, session = self.projection.tokens(), candidate.tokens(), self.session
        action = ReceiptAction.PRUNE if document is None else ReceiptAction.SUMMARY
        receipt = new_receipt(self.store, ReceiptStatus.APPLIED, action, before, after, why)
        state = self.state.installed(candidate.pruned, candidate.bounds, receipt, folded=document is not None)
        if document is None:
            install: Install = prune_install(state, session.branch_id, session.checkpoint_id)
        else:
            install = fold_install(state, session.branch_id, Accepted(candidate), document, before)
        with self.observer.installing(install, before, after, prepared_by):
            self.session, self.revision, superseded = await self.store.install(session, install)
            self.projection, self.state = candidate, install.state
        self.observer.receipt(receipt)
        if superseded is not None:  # its summary was paid for: said, as any prepared fold not used
            made_at = superseded[0]
            why = (
                f"the fold prepared in the background at {made_at} tokens no longer applies: another fold was installed"
            )
            self.record(ReceiptStatus.DISCARDED, ReceiptAction.BACKGROUND, *superseded, why)
        if document is not None or self.action is Action.NONE:  # a fold after a prune is what the run did
            self.action = Action.PRUNED if document is None else Action.FOLDED

    def record(self, status: ReceiptStatus, action: ReceiptAction, before: int, after: int, reason: str) -> None:
        """A receipt of what the run did not install, on its state and to its observer."""
        receipt = new_receipt(self.store, status, action, before, after, reason)
        self.state = self.state.with_receipt(receipt)
        self.observer.receipt(receipt)


class FoldedElsewhere(Exception):
    """Another server held the session's fold lease; what it installed must be looked at afresh."""


def new_receipt(
    store: Store, status: ReceiptStatus, action: ReceiptAction, tokens_in: int, tokens_out: int, reason: str
) -> Receipt:
    """A receipt stamped by the store's clock, so it agrees with the rows the store writes."""
    return Receipt(uuid.uuid4().hex, status, action, tokens_in, tokens_out, reason, store.clock())

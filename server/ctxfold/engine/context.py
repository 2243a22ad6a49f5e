"""A session's current context, and what an append makes of it.

`Context` is one session as the last write left it: its row (`SessionRecord`), the projection its
view is built from, and its context state with the state's stored revision. It is what the service
caches per session and what every decision starts from. `append` is the first, pure step of every
AppendMessages and Prepare: the messages as stored, the session and projection after them and, when
no maintenance is due, the answer with its bookkeeping — what the one write then commits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ctxfold.engine.answer import Answering, PreparedContext, answer
from ctxfold.engine.maintenance import Action, Answer, MaintainRequest, Snapshot, Trigger, decide
from ctxfold.engine.model import SessionConfig, StoredMessage, Usage
from ctxfold.engine.projection import Projection, check_fixed_costs
from ctxfold.engine.state import ContextState, fingerprint, load_state, observed
from ctxfold.engine.transcript import advance_open_calls
from ctxfold.engine.view import Checkpoint


@dataclass(frozen=True)
class SessionRecord:
    """A session's row: who owns it, its config and what its transcript and checkpoints are now.
    `version` counts its changes (every write compare-and-swaps on it); `branch_id` names its lineage
    state (renewed by every Create, Fork and Rewind)."""

    id: str
    tenant: str
    config_json: str
    system_tokens: int
    tools_tokens: int
    segment_id: str
    head_seq: int
    branch_id: str
    checkpoint_id: str | None
    open_tool_calls: tuple[str, ...]
    version: int
    forked_from_session_id: str | None
    forked_at_seq: int
    create_time: float
    update_time: float


@dataclass(frozen=True)
class Context:
    session: SessionRecord
    projection: Projection
    state: ContextState
    revision: int  # of the stored state (0: none stored yet)
    # The stored state document is `state` but for its bookkeeping fields, so writing those alone makes
    # it `state` again (False for a new or rebuilt state: the next write stores the whole of it).
    state_stored: bool = True

    @property
    def config(self) -> SessionConfig:
        return self.projection.config


def loaded(
    session: SessionRecord,
    config: SessionConfig,
    checkpoint: Checkpoint | None,
    kept: Sequence[StoredMessage],
    after: Sequence[StoredMessage],
    state_json: str | None,
    revision: int,
) -> tuple[Context, str]:
    """The context read from the store (the head checkpoint, its kept messages and the messages after
    it, the stored state), and why its state was rebuilt ("" when it was valid, "new" when none)."""
    state, why = load_state(state_json, fingerprint(session.branch_id, session.checkpoint_id))
    if why not in ("", "new"):
        state = state.count("state_rebuilds")
    in_view = {m.id for m in [*kept, *after]}
    projection = Projection(
        config=config,
        system_tokens=session.system_tokens,
        tools_tokens=session.tools_tokens,
        calibration=state.calibration,
        checkpoint=checkpoint,
        kept=tuple(kept),
        after=tuple(after),
        pruned={k: v for k, v in state.pruned.items() if k in in_view},
        bounds={k: v for k, v in state.bounds.items() if k in in_view},
    )
    return Context(session, projection, state, revision, state_stored=why == ""), why


@dataclass(frozen=True)
class Appended:
    """What an append makes of a context: `context` after it, the messages as stored, and the answer
    (its `state` is the bookkeeping to write with the append) when no maintenance is due."""

    context: Context
    messages: tuple[StoredMessage, ...]
    answered: PreparedContext | None

    def bookkeeping(self) -> tuple[str, bool] | None:
        """What the answer writes with the append: the state's bookkeeping fields over the stored state,
        or (`True`) the whole state when the stored one is not it but for them (a new or rebuilt state)."""
        if self.answered is None:
            return None
        whole = not self.context.state_stored
        state = self.answered.state
        return (state.to_json() if whole else state.bookkeeping_json()), whole

    def written(self, revision: int) -> Context | None:
        """The context once the append is written and its bookkeeping made the state's `revision` (0: no
        bookkeeping); None when the bookkeeping was skipped (the state was written meanwhile: unknown here)."""
        if self.answered is not None and not revision:
            return None
        state = self.answered.state if self.answered else self.context.state
        stored = bool(revision) or self.context.state_stored
        return replace(self.context, state=state, revision=revision or self.context.revision, state_stored=stored)


@dataclass(frozen=True)
class UsageObserved:
    """What ObserveUsage writes: the context with the observed state (calibration, counters) and its projection
    recalibrated, and the usage as recorded (with the estimate of the view it reports on)."""

    context: Context
    usage: Usage
    accepted: bool  # whether the calibration moved toward this observation


def observe(context: Context, usage: Usage) -> UsageObserved:
    """The provider's `usage` for one of the session's views, observed on its context (`observed`)."""
    result = observed(context.state, usage)
    projection = context.projection.recalibrated(result.state.calibration)
    recorded = replace(usage, estimated_tokens=result.estimated_tokens)
    return UsageObserved(replace(context, projection=projection, state=result.state), recorded, result.accepted)


@dataclass(frozen=True)
class AppendRequest:
    messages: tuple[StoredMessage, ...]  # ids, bounded contents and token counts made; no seq yet
    now: float
    overflow: bool = False  # the provider refused the last view: maintain whatever the size
    known_view_version: int = 0
    answer: bool = True  # AppendMessages makes no answer

    @property
    def field(self) -> str:
        """The request field the messages came in, which errors about them name."""
        return "append" if self.answer else "messages"


def append_work(context: Context, request: AppendRequest) -> int:
    """How many messages `append` goes through: the new ones; every one of the view when it must build
    the view, answer with all of it (no known version), or decide on one at its trigger."""
    projection, new = context.projection, request.messages
    if not projection.has_view:
        return projection.message_count + len(new)
    tokens = projection.tokens() + sum(m.tokens for m in new)
    at_trigger = request.overflow or tokens >= projection.config.trigger_tokens
    whole = request.answer and (at_trigger or not request.known_view_version)
    return projection.message_count + len(new) if whole else len(new)


def append(context: Context, request: AppendRequest) -> Appended:
    """`request.messages` appended to `context` (FAILED_PRECONDITION when they break the tool-call
    protocol, or, for a Prepare, when the session's fixed costs leave no room for a view), and the answer
    when the grown view needs no maintenance."""
    session = context.session
    if request.answer:
        check_fixed_costs(context.config, session.system_tokens, session.tools_tokens)
    open_calls = advance_open_calls(session.open_tool_calls, request.messages, request.field)
    messages = tuple(
        replace(m, seq=session.head_seq + 1 + i, create_time=request.now) for i, m in enumerate(request.messages)
    )
    if messages:
        session = replace(
            session,
            head_seq=session.head_seq + len(messages),
            open_tool_calls=open_calls,
            version=session.version + 1,
            update_time=request.now,
        )
    projection = context.projection.extended(messages)
    grown = replace(context, session=session, projection=projection)
    if not request.answer:
        return Appended(grown, messages, None)
    tokens = projection.tokens()
    trigger = Trigger.OVERFLOW if request.overflow else Trigger.THRESHOLD
    snapshot = Snapshot(projection, tokens, context.state.failed_fold_tokens)
    if not isinstance(decide(snapshot, MaintainRequest(trigger)), Answer):
        return Appended(grown, messages, None)
    answering = Answering(
        projection, context.state, projection.view(), tokens, Action.NONE, session.head_seq, session.checkpoint_id
    )
    return Appended(grown, messages, answer(answering, request.known_view_version, request.now))

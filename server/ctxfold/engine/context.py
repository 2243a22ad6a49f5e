"""A session's current context, and what an append makes of it.

`Context` is one session as the last write left it: its row (`SessionRecord`), the projection its
view is built from, and its context state with the state's stored revision. It is what the service
caches per session and what every decision starts from. `append` is the first, pure step of every
AppendMessages and Prepare: the messages as stored, the session and projection after them and, when
no maintenance is due, the answer with its bookkeeping — what the one write then commits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ctxfold.engine import estimator
from ctxfold.engine.answer import Answering, PreparedContext, answer
from ctxfold.engine.maintenance import Action, Answer, MaintainRequest, Snapshot, Trigger, decide
from ctxfold.engine.model import NewMessage, SessionConfig, StoredMessage, Usage, config_from_json, text_chars
from ctxfold.engine.projection import Projection, check_fixed_costs
from ctxfold.engine.state import ContextState, Receipt, fingerprint, load_state, observed
from ctxfold.engine.transcript import (
    AppendLimits,
    advance_open_calls,
    keeps_raw_result,
    stored_form,
    validate_new_messages,
)
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


@dataclass(frozen=True)
class StoredContext:
    """What the store holds of a session's context, read in one transaction: its row, the head checkpoint,
    its kept messages and the messages after it, the stored state (`Snapshot` is what a decision is made
    from, once these became a projection)."""

    session: SessionRecord
    checkpoint: Checkpoint | None
    kept: list[StoredMessage]
    after: list[StoredMessage]
    state_json: str | None
    state_revision: int  # 0 when the session has no stored state yet


def loaded(stored: StoredContext) -> tuple[Context, str]:
    """The context `stored` holds, its view built (what follows costs what is new), and why its state was rebuilt
    ("" when it was valid, "new" when none)."""
    session, kept, after = stored.session, stored.kept, stored.after
    config = config_from_json(session.config_json)
    state, why = load_state(stored.state_json, fingerprint(session.branch_id, session.checkpoint_id))
    if why not in ("", "new"):
        state = state.count("state_rebuilds")
    in_view = {m.id for m in [*kept, *after]}
    projection = Projection(
        config=config,
        system_tokens=session.system_tokens,
        tools_tokens=session.tools_tokens,
        calibration=state.calibration,
        checkpoint=stored.checkpoint,
        kept=tuple(kept),
        after=tuple(after),
        pruned={k: v for k, v in state.pruned.items() if k in in_view},
        bounds={k: v for k, v in state.bounds.items() if k in in_view},
    )
    projection.tokens()
    return Context(session, projection, state, stored.state_revision, state_stored=why == ""), why


@dataclass(frozen=True)
class Appended:
    """What one write makes of a context: `context` after it, the messages it appends (stored forms) and the
    answer when no maintenance is due (its `state` is the bookkeeping to write with them); or, for a usage
    report or a receipt, which append nothing, `context.state` to write whole (`state_changed`) with the
    provider `usage` it records."""

    context: Context
    messages: tuple[StoredMessage, ...] = ()
    answered: PreparedContext | None = None
    state_changed: bool = False
    usage: Usage | None = None
    results: tuple[AppendedResult, ...] = ()  # the raw results of `messages`

    def bookkeeping(self) -> tuple[str, bool] | None:
        """What is written with the messages: the state's bookkeeping fields over the stored state, or (`True`)
        the whole state when it changed or the stored one is not it but for them (a new or rebuilt state)."""
        if self.state_changed:
            return self.context.state.to_json(), True
        if self.answered is None:
            return None
        whole = not self.context.state_stored
        state = self.answered.state
        return (state.to_json() if whole else state.bookkeeping_json()), whole

    def written(self, revision: int) -> Context | None:
        """The context once the write is made and its state write made the state's `revision` (0: none); None
        when the state write was skipped (the state was written meanwhile: unknown here)."""
        if (self.answered is not None or self.state_changed) and not revision:
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


def _state_written(context: Context, now: float, usage: Usage | None = None) -> Appended:
    """`context`, whose state alone changed, as a write at `now` of its whole state (with the `usage` row)."""
    session = replace(context.session, update_time=now)
    return Appended(replace(context, session=session), state_changed=True, usage=usage)


@dataclass
class Observing:
    """ObserveUsage as a step of the one write: `usage` observed on the context it is given (`observe`; the last
    one in `observed`)."""

    usage: Usage
    observed: UsageObserved | None = None

    def __call__(self, context: Context, now: float) -> Appended:
        self.observed = observe(context, self.usage)
        return _state_written(self.observed.context, now, self.observed.usage)


def receipted(receipt: Receipt) -> Step:
    """A receipt written apart from a call, as a step of the one write: added to the context's state."""
    return lambda context, now: _state_written(replace(context, state=context.state.with_receipt(receipt)), now)


@dataclass(frozen=True)
class AppendRequest:
    messages: tuple[StoredMessage, ...]  # ids, bounded contents and token counts made; no seq yet
    overflow: bool = False  # the provider refused the last view: maintain whatever the size
    known_view_version: int = 0
    answer: bool = True  # AppendMessages makes no answer

    @property
    def field(self) -> str:
        """The request field the messages came in, which errors about them name."""
        return "append" if self.answer else "messages"


def append_work(context: Context, request: AppendRequest, new: int, new_tokens: int) -> int:
    """How many messages `append` goes through: the `new` ones; every one of the view when it must build
    the view, answer with all of it (no known version), or decide on one at its trigger (the new ones
    bring `new_tokens`; a bound is enough)."""
    projection = context.projection
    if not projection.has_view:
        return projection.message_count + new
    at_trigger = request.overflow or projection.tokens() + new_tokens >= projection.config.trigger_tokens
    whole = request.answer and (at_trigger or not request.known_view_version)
    return projection.message_count + new if whole else new


def append(context: Context, now: float, request: AppendRequest) -> Appended:
    """`request.messages` appended to `context` at `now` (FAILED_PRECONDITION when they break the tool-call
    protocol, or, for a Prepare, when the session's fixed costs leave no room for a view), and the answer
    when the grown view needs no maintenance."""
    session = context.session
    if request.answer:
        check_fixed_costs(context.config, session.system_tokens, session.tools_tokens)
    open_calls = advance_open_calls(session.open_tool_calls, request.messages, request.field)
    messages = tuple(replace(m, seq=session.head_seq + 1 + i, create_time=now) for i, m in enumerate(request.messages))
    if messages:
        session = replace(
            session,
            head_seq=session.head_seq + len(messages),
            open_tool_calls=open_calls,
            version=session.version + 1,
            update_time=now,
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
    return Appended(grown, messages, answer(answering, request.known_view_version, now))


# A change of a session's context, decided on its current context at the store's time (pure: run by `cpu.run`).
Step = Callable[[Context, float], Appended]


@dataclass(frozen=True)
class AppendedResult:
    """A raw result an append stores whole under its `ref`: a tool result, or a user message. `inline`:
    it is the message's content (stored by reference to the message, no copy)."""

    ref: str
    message_id: str
    data: bytes
    inline: bool


@dataclass(frozen=True)
class Made:
    """New messages made into their stored forms (but for seq and time, which `append` gives them) and the
    raw results to store with them."""

    messages: tuple[StoredMessage, ...]
    results: tuple[AppendedResult, ...]


def made(
    messages: Sequence[NewMessage],
    ids: Sequence[tuple[str, str]],
    config: SessionConfig,
    limits: AppendLimits,
    field: str = "messages",
    count_large: Callable[[str], int] = estimator.count_text,
) -> Made:
    """`messages` checked (errors name `field`) and made (`stored_form`; `ids`: the id and result ref of each,
    the ref kept where `keeps_raw_result`), with their raw results."""
    validate_new_messages(messages, limits, field)
    forms = [
        stored_form(m, config, message_id, ref if keeps_raw_result(m.role) else "", count_large)
        for m, (message_id, ref) in zip(messages, ids, strict=True)
    ]
    results = tuple(
        AppendedResult(m.result_ref, m.id, m.content.encode() if raw is None else raw, inline=raw is None)
        for m, raw in forms
        if m.result_ref
    )
    return Made(tuple(m for m, _ in forms), results)


@dataclass
class AppendStep:
    """An append as a step of the one write: `messages` are `made` on the first context it is given, and kept
    for a retry on a fresher one (its session has the same config); then `append`. Texts of at least
    `estimator.LARGE_TEXT_CHARS` are counted by `count_large` (the server's counting process)."""

    messages: Sequence[NewMessage]
    ids: Sequence[tuple[str, str]]
    limits: AppendLimits
    request: AppendRequest
    count_large: Callable[[str], int] = estimator.count_text
    _made: Made | None = None

    def work(self, context: Context) -> tuple[int, int]:
        """The messages (`append_work`) and characters of text the step goes through: the new messages' text
        until they are made (their tokens bounded by their UTF-8 bytes: a token is one or more), then their raw
        results (which the write encodes each time); through the whole view, the texts it scans for fenced commands."""
        if self._made is not None:
            new, chars = len(self._made.messages), sum(len(r.data) for r in self._made.results)
            messages = append_work(context, self.request, new, sum(m.tokens for m in self._made.messages))
        else:
            new, chars = len(self.messages), text_chars(self.messages)
            bound = 4 * chars + sum(m.payload.tokens for m in self.messages if m.payload)
            messages = append_work(context, self.request, new, bound)
        return messages, chars + (context.projection.fenced_chars if messages > new else 0)

    def __call__(self, context: Context, now: float) -> Appended:
        if self._made is None:
            request, config = self.request, context.config
            self._made = made(self.messages, self.ids, config, self.limits, request.field, self.count_large)
        appended = append(context, now, replace(self.request, messages=self._made.messages))
        return replace(appended, results=self._made.results)

"""What a Prepare or Compact answers, pure: the view's version, how much of it the previous answer
already had (the stable prefix), only the new messages when the client holds the rest, the
bookkeeping written with it, and whether it fits one response."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ctxfold.engine.cache import cache_state, cache_ttl_seconds
from ctxfold.engine.errors import DomainError, Kind, with_context
from ctxfold.engine.maintenance import Action, NotFolded
from ctxfold.engine.model import StoredMessage
from ctxfold.engine.projection import Projection
from ctxfold.engine.state import ContextState, ViewRecord, split_view_version, view_version
from ctxfold.engine.view import (
    ViewMessage,
)

# ---- the answer ------------------------------------------------------------------------------------


def _same(a: ViewMessage, b: ViewMessage) -> bool:
    return (a.role, a.content, a.summary, a.source.id if a.source else "") == (
        b.role,
        b.content,
        b.summary,
        b.source.id if b.source else "",
    )


def common_prefix(a: Sequence[ViewMessage], b: Sequence[ViewMessage]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if not _same(x, y):
            break
        count += 1
    return count


def _index_ref(projection: Projection) -> str:
    checkpoint = projection.checkpoint
    return checkpoint.notes.index_ref if checkpoint is not None and checkpoint.notes is not None else ""


@dataclass(frozen=True)
class PreparedContext:
    """What a Prepare or Compact answers (the proto's `PreparedContext`), and `state`, the bookkeeping
    written with it (not sent)."""

    state: ContextState
    messages: list[ViewMessage]  # the view, only its new messages when `delta`, or a dry run's candidate
    estimated_tokens: int
    estimated_input_tokens: int
    view_version: int  # 0 for a dry run's candidate: not installed, so no usage is observed against it
    view_message_count: int
    stable_prefix_messages: int
    delta: bool
    cache_state: str
    checkpoint_id: str
    folded_results_ref: str
    action: Action
    prompt_cache_key: str
    trigger_tokens: int
    hard_limit_tokens: int
    not_folded: NotFolded = NotFolded.UNSPECIFIED
    not_folded_detail: str = ""
    candidate_summary: str = ""
    appended: tuple[StoredMessage, ...] = ()  # a Prepare's appended messages as stored


@dataclass(frozen=True)
class Answering:
    """What the answer is made from: the round's projection and state once maintenance is done."""

    projection: Projection
    state: ContextState
    first_view: Sequence[ViewMessage]  # the view as loaded, before this call's installs
    first_tokens: int
    action: Action
    head_seq: int
    checkpoint_id: str | None
    candidate: Projection | None = None  # a dry run's candidate
    not_folded: NotFolded = NotFolded.UNSPECIFIED
    not_folded_detail: str = ""


def _stable_prefix(answering: Answering, view: Sequence[ViewMessage]) -> int:
    """How many leading messages of `view` the previous answer had: after maintenance, what this call
    left of the view it loaded; else the previous view's count when it is of the same generation."""
    if answering.action is not Action.NONE:
        return common_prefix(answering.first_view, view)
    state = answering.state
    previous = state.views[-1] if state.views else None
    if previous is not None and split_view_version(previous.version)[0] == state.generation:
        return min(split_view_version(previous.version)[1], len(view))
    return 0


def _dry_run(answered: PreparedContext, view: Sequence[ViewMessage], candidate: Projection) -> PreparedContext:
    """A dry run answers the view its fold would install (version 0: nothing installed)."""
    candidate_view = candidate.view()
    return replace(
        answered,
        messages=candidate_view,
        estimated_tokens=candidate.tokens(),
        estimated_input_tokens=candidate.input_tokens(),
        view_version=0,
        view_message_count=len(candidate_view),
        stable_prefix_messages=common_prefix(view, candidate_view),
        delta=False,
        checkpoint_id="",
        folded_results_ref=_index_ref(candidate),
        candidate_summary=candidate.checkpoint.summary if candidate.checkpoint else "",
    )


def answer(answering: Answering, known_view_version: int, now: float) -> PreparedContext:
    """The view's version (generation and message count), how much of it the previous answer already
    had (the stable prefix, for prompt caching), only the new messages when the client's
    `known_view_version` is a prefix of it, and the bookkeeping: the view record, activity, counters."""
    projection, state = answering.projection, answering.state
    config = projection.config
    view = projection.view()
    hits_observed = state.telemetry.get("cached_input_tokens", 0) > 0
    cache = cache_state(state.last_activity, now, cache_ttl_seconds(config, hits_observed))
    version = view_version(state.generation, len(view))
    stable = _stable_prefix(answering, view)
    estimated = projection.tokens()
    state = replace(  # one replace: this is every Prepare's
        state,
        views=state.views_with(ViewRecord(version, projection.raw_tokens())),
        telemetry=state.counted("prepares"),
        last_activity=now,
        cache_state=cache,
        transcript_version=answering.head_seq,
        checkpoint_id=answering.checkpoint_id,
        covered_count=projection.checkpoint.position_seq if projection.checkpoint else 0,
        prompt_cache_key=config.prompt_cache_key,
        source_tokens=answering.first_tokens,
        projection_tokens=estimated,
    )
    known_generation, known_count = split_view_version(known_view_version)
    delta = known_view_version > 0 and known_generation == state.generation and known_count <= len(view)
    answered = PreparedContext(
        state=state,
        messages=view[known_count:] if delta else view,
        estimated_tokens=estimated,
        estimated_input_tokens=projection.input_tokens(),
        view_version=version,
        view_message_count=len(view),
        stable_prefix_messages=stable,
        delta=delta,
        cache_state=cache,
        checkpoint_id=answering.checkpoint_id or "",
        folded_results_ref=_index_ref(projection),
        action=answering.action,
        prompt_cache_key=config.prompt_cache_key,
        trigger_tokens=config.trigger_tokens,
        hard_limit_tokens=config.hard_limit_tokens,
        not_folded=answering.not_folded,
        not_folded_detail=answering.not_folded_detail,
    )
    if answering.candidate is not None:
        return _dry_run(answered, view, answering.candidate)
    return answered


# Room in a response for everything but the view's text: ids, framing, the other fields.
RESPONSE_FRAMING_BYTES = 1 << 20


def _texts(message: ViewMessage) -> tuple[str, ...]:
    """The texts a view message's answer carries."""
    source = message.source
    if source is None:
        return message.content, message.payload.json if message.payload else ""
    arguments = (call.arguments for call in source.tool_calls)
    return message.content, source.reasoning_content, *arguments, source.payload.json if source.payload else ""


def check_response_size(messages: Sequence[ViewMessage], max_response_bytes: int) -> None:
    """RESPONSE_TOO_LARGE, before anything is sent, when the view's text (provider payloads too) cannot fit one
    response."""
    texts = [text for m in messages for text in _texts(m)]
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


def appended_anyway(error: DomainError, appended: Sequence[StoredMessage], request_id: str) -> DomainError:
    """The error of a Prepare that failed after its append: it names the kept messages' seqs and how to retry
    (docs/architecture.md, Appends)."""
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

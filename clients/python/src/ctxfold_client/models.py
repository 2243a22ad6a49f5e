"""The SDK's typed results: frozen dataclasses for everything a call returns, each with `to_proto()`
and `from_proto()` for the generated type behind it (reachable as `ctxfold_client.pb`), plus the
enums generated from the proto and the per-call options."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client._gen.enums import Action, CacheState, FoldStage, NotFoldedReason, Role
from ctxfold_client.config import SessionConfig


def _time(stamp: Timestamp, present: bool) -> datetime | None:
    return stamp.ToDatetime(tzinfo=UTC) if present else None


def _stamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of an assistant message; `arguments` is the JSON text the model wrote."""

    id: str
    name: str
    arguments: str = "{}"

    def to_proto(self) -> pb.ToolCall:
        return pb.ToolCall(id=self.id, name=self.name, arguments=self.arguments)

    @classmethod
    def from_proto(cls, call: pb.ToolCall) -> ToolCall:
        return cls(id=call.id, name=call.name, arguments=call.arguments)


@dataclass(frozen=True, slots=True)
class ProviderPayload:
    """What a provider's message carried beyond the canonical fields, kept verbatim: `format` names
    the provider API ("openai_chat", "openai_responses", "anthropic_messages"), `json` the provider
    JSON, `fingerprint` the writer's digest of the message, `tokens` what the provider counts for it."""

    format: str
    json: str = ""
    fingerprint: str = ""
    tokens: int = 0

    def to_proto(self) -> pb.ProviderPayload:
        return pb.ProviderPayload(format=self.format, json=self.json, fingerprint=self.fingerprint, tokens=self.tokens)

    @classmethod
    def from_proto(cls, payload: pb.ProviderPayload) -> ProviderPayload:
        return cls(format=payload.format, json=payload.json, fingerprint=payload.fingerprint, tokens=payload.tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """A transcript or view message. The first seven fields are the caller's; the rest are set by
    the server (`id`, `seq`, `result_ref` where its whole stored text can be read back with
    `read_tool_result()`, `truncated`, `summary`, ...).
    Build messages with `user()`, `assistant()`, `tool_result()`, `system()` or a provider adapter."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    reasoning_content: str = ""
    name: str = ""
    pinned: bool = False
    id: str = ""
    seq: int = 0
    result_ref: str = ""
    raw_bytes: int = 0
    truncated: bool = False
    summary: bool = False
    pruned: bool = False
    tokens: int = 0
    abandoned: bool = False
    create_time: datetime | None = None
    provider_payload: ProviderPayload | None = None

    def to_proto(self) -> pb.Message:
        return pb.Message(
            id=self.id,
            seq=self.seq,
            role=pb.Role.ValueType(self.role),
            content=self.content,
            tool_calls=[call.to_proto() for call in self.tool_calls],
            tool_call_id=self.tool_call_id,
            reasoning_content=self.reasoning_content,
            pinned=self.pinned,
            result_ref=self.result_ref,
            raw_bytes=self.raw_bytes,
            truncated=self.truncated,
            summary=self.summary,
            pruned=self.pruned,
            name=self.name,
            tokens=self.tokens,
            abandoned=self.abandoned,
            create_time=_stamp(self.create_time),
            provider_payload=self.provider_payload.to_proto() if self.provider_payload is not None else None,
        )

    @classmethod
    def from_proto(cls, message: pb.Message) -> Message:
        return cls(
            role=Role(message.role),
            content=message.content,
            tool_calls=tuple(ToolCall.from_proto(call) for call in message.tool_calls),
            tool_call_id=message.tool_call_id,
            reasoning_content=message.reasoning_content,
            name=message.name,
            pinned=message.pinned,
            id=message.id,
            seq=message.seq,
            result_ref=message.result_ref,
            raw_bytes=message.raw_bytes,
            truncated=message.truncated,
            summary=message.summary,
            pruned=message.pruned,
            tokens=message.tokens,
            abandoned=message.abandoned,
            create_time=_time(message.create_time, message.HasField("create_time")),
            provider_payload=ProviderPayload.from_proto(message.provider_payload)
            if message.HasField("provider_payload")
            else None,
        )

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Message:
        """A message from its proto JSON form (`{"role": "ROLE_USER", "content": "hi"}`)."""
        return cls.from_proto(json_format.ParseDict(dict(value), pb.Message()))


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """A session: its id, effective config (server defaults filled in), head and lineage."""

    id: str
    config: SessionConfig
    head_seq: int = 0
    checkpoint_id: str = ""
    create_time: datetime | None = None
    update_time: datetime | None = None
    forked_from_session_id: str = ""
    forked_at_seq: int = 0

    def to_proto(self) -> pb.Session:
        return pb.Session(
            id=self.id,
            config=self.config.to_proto(),
            head_seq=self.head_seq,
            checkpoint_id=self.checkpoint_id,
            create_time=_stamp(self.create_time),
            update_time=_stamp(self.update_time),
            forked_from_session_id=self.forked_from_session_id,
            forked_at_seq=self.forked_at_seq,
        )

    @classmethod
    def from_proto(cls, session: pb.Session) -> Session:
        return cls(
            id=session.id,
            config=SessionConfig.from_proto(session.config),
            head_seq=session.head_seq,
            checkpoint_id=session.checkpoint_id,
            create_time=_time(session.create_time, session.HasField("create_time")),
            update_time=_time(session.update_time, session.HasField("update_time")),
            forked_from_session_id=session.forked_from_session_id,
            forked_at_seq=session.forked_at_seq,
        )


@dataclass(frozen=True, slots=True)
class FoldProgress:
    """One maintenance progress event of a Prepare or Compact stream."""

    stage: FoldStage
    pass_index: int = 0
    passes_planned: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    checkpoint_id: str = ""
    message: str = ""
    summary_delta: str = ""
    summarizer: str = ""

    def to_proto(self) -> pb.FoldProgress:
        return pb.FoldProgress(
            stage=pb.FoldStage.ValueType(self.stage),
            pass_index=self.pass_index,
            passes_planned=self.passes_planned,
            tokens_before=self.tokens_before,
            tokens_after=self.tokens_after,
            checkpoint_id=self.checkpoint_id,
            message=self.message,
            summary_delta=self.summary_delta,
            summarizer=self.summarizer,
        )

    @classmethod
    def from_proto(cls, progress: pb.FoldProgress) -> FoldProgress:
        return cls(
            stage=FoldStage(progress.stage),
            pass_index=progress.pass_index,
            passes_planned=progress.passes_planned,
            tokens_before=progress.tokens_before,
            tokens_after=progress.tokens_after,
            checkpoint_id=progress.checkpoint_id,
            message=progress.message,
            summary_delta=progress.summary_delta,
            summarizer=progress.summarizer,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class View:
    """The provider-visible context to send, as returned by `prepare()`, `compact()` and `retry()`.

    `messages` is always the WHOLE view, in order, even when the server sent only a delta (the SDK
    applied it to the view it held). `stable_prefix_messages` leading messages are unchanged since
    the previous view (the provider's prompt cache covers them); `appended` are the messages this
    call stored, with their ids and seqs.

    `estimated_tokens` is the whole request with the reserved `max_output_tokens` (what the trigger
    compares); `estimated_input_tokens` is the input alone: compare it with the input tokens the
    provider reports, or report it when the provider reports none.
    """

    messages: tuple[Message, ...]
    estimated_tokens: int
    view_version: int
    action: Action
    estimated_input_tokens: int = 0
    cache_state: CacheState = CacheState.UNSPECIFIED
    prompt_cache_key: str = ""
    checkpoint_id: str = ""
    stable_prefix_messages: int = 0
    view_message_count: int = 0
    trigger_tokens: int = 0
    hard_limit_tokens: int = 0
    appended: tuple[Message, ...] = ()
    not_folded_reason: NotFoldedReason = NotFoldedReason.UNSPECIFIED
    not_folded_detail: str = ""
    candidate_summary: str = ""
    folded_results_ref: str = ""

    @property
    def folded(self) -> bool:
        return self.action is Action.FOLDED

    @property
    def summary(self) -> Message | None:
        """The checkpoint summary message of the view, if history was folded."""
        return next((m for m in self.messages if m.summary), None)

    def to_proto(self) -> pb.PreparedContext:
        """The whole view as a `PreparedContext` (never a delta)."""
        return pb.PreparedContext(
            messages=[m.to_proto() for m in self.messages],
            estimated_tokens=self.estimated_tokens,
            estimated_input_tokens=self.estimated_input_tokens,
            view_version=self.view_version,
            action=pb.Action.ValueType(self.action),
            cache_state=pb.CacheState.ValueType(self.cache_state),
            prompt_cache_key=self.prompt_cache_key,
            checkpoint_id=self.checkpoint_id,
            stable_prefix_messages=self.stable_prefix_messages,
            view_message_count=self.view_message_count,
            trigger_tokens=self.trigger_tokens,
            hard_limit_tokens=self.hard_limit_tokens,
            appended=[m.to_proto() for m in self.appended],
            not_folded_reason=pb.NotFoldedReason.ValueType(self.not_folded_reason),
            not_folded_detail=self.not_folded_detail,
            candidate_summary=self.candidate_summary,
            folded_results_ref=self.folded_results_ref,
        )

    @classmethod
    def from_proto(cls, result: pb.PreparedContext, messages: Sequence[Message] | None = None) -> View:
        """The view of a result; `messages` (the assembled whole view) replaces a delta's tail."""
        return cls(
            messages=tuple(messages) if messages is not None else tuple(Message.from_proto(m) for m in result.messages),
            estimated_tokens=result.estimated_tokens,
            estimated_input_tokens=result.estimated_input_tokens,
            view_version=result.view_version,
            action=Action(result.action),
            cache_state=CacheState(result.cache_state),
            prompt_cache_key=result.prompt_cache_key,
            checkpoint_id=result.checkpoint_id,
            stable_prefix_messages=result.stable_prefix_messages,
            view_message_count=result.view_message_count,
            trigger_tokens=result.trigger_tokens,
            hard_limit_tokens=result.hard_limit_tokens,
            appended=tuple(Message.from_proto(m) for m in result.appended),
            not_folded_reason=NotFoldedReason(result.not_folded_reason),
            not_folded_detail=result.not_folded_detail,
            candidate_summary=result.candidate_summary,
            folded_results_ref=result.folded_results_ref,
        )

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> View:
        """A view from its proto JSON form (a `PreparedContext` holding the whole view)."""
        return cls.from_proto(json_format.ParseDict(dict(value), pb.PreparedContext(), ignore_unknown_fields=True))


@dataclass(frozen=True, slots=True)
class Usage:
    """What the provider reported for one model call: the input of `observe_usage()`, and what
    the adapters' `from_response()` read from a provider response."""

    input_tokens: int
    cached_input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""


@dataclass(frozen=True, slots=True)
class UsageResult:
    """The answer of `observe_usage()`: the estimator's calibration for the session and whether
    this observation was taken into it."""

    calibration: float
    calibration_accepted: bool

    def to_proto(self) -> pb.ObserveUsageResponse:
        return pb.ObserveUsageResponse(calibration=self.calibration, calibration_accepted=self.calibration_accepted)

    @classmethod
    def from_proto(cls, response: pb.ObserveUsageResponse) -> UsageResult:
        return cls(calibration=response.calibration, calibration_accepted=response.calibration_accepted)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A whole raw tool result read back with `read_tool_result()`, checked against its sha256."""

    text: str
    sha256: str
    total_bytes: int
    result_ref: str

    @property
    def raw(self) -> bytes:
        """The exact original bytes (UTF-8)."""
        return self.text.encode("utf-8")

    def verify(self) -> bool:
        raw = self.raw
        return len(raw) == self.total_bytes and hashlib.sha256(raw).hexdigest() == self.sha256


@dataclass(frozen=True, slots=True)
class ToolResultPage:
    """One page of a raw tool result: `data` from UTF-8 byte `offset` to `next_offset`."""

    data: str
    offset: int
    next_offset: int
    total_bytes: int
    sha256: str
    complete: bool
    result_ref: str

    def to_proto(self) -> pb.ReadToolResultResponse:
        return pb.ReadToolResultResponse(
            data=self.data,
            offset=self.offset,
            next_offset=self.next_offset,
            total_bytes=self.total_bytes,
            sha256=self.sha256,
            complete=self.complete,
            result_ref=self.result_ref,
        )

    @classmethod
    def from_proto(cls, page: pb.ReadToolResultResponse) -> ToolResultPage:
        return cls(
            data=page.data,
            offset=page.offset,
            next_offset=page.next_offset,
            total_bytes=page.total_bytes,
            sha256=page.sha256,
            complete=page.complete,
            result_ref=page.result_ref,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A summary checkpoint of a session's history (what a fold committed)."""

    id: str
    parent_id: str = ""
    position_seq: int = 0
    summary: str = ""
    summary_tokens: int = 0
    kept_message_ids: tuple[str, ...] = ()
    folded_results_ref: str = ""
    summarizer: str = ""
    create_time: datetime | None = None
    on_head_chain: bool = False

    def to_proto(self) -> pb.Checkpoint:
        return pb.Checkpoint(
            id=self.id,
            parent_id=self.parent_id,
            position_seq=self.position_seq,
            summary=self.summary,
            summary_tokens=self.summary_tokens,
            kept_message_ids=list(self.kept_message_ids),
            folded_results_ref=self.folded_results_ref,
            summarizer=self.summarizer,
            create_time=_stamp(self.create_time),
            on_head_chain=self.on_head_chain,
        )

    @classmethod
    def from_proto(cls, checkpoint: pb.Checkpoint) -> Checkpoint:
        return cls(
            id=checkpoint.id,
            parent_id=checkpoint.parent_id,
            position_seq=checkpoint.position_seq,
            summary=checkpoint.summary,
            summary_tokens=checkpoint.summary_tokens,
            kept_message_ids=tuple(checkpoint.kept_message_ids),
            folded_results_ref=checkpoint.folded_results_ref,
            summarizer=checkpoint.summarizer,
            create_time=_time(checkpoint.create_time, checkpoint.HasField("create_time")),
            on_head_chain=checkpoint.on_head_chain,
        )


def messages_to_proto(messages: Iterable[Message]) -> list[pb.Message]:
    if isinstance(messages, Message):
        raise TypeError("pass a list of messages, not a single message")
    return [m.to_proto() for m in messages]


class ViewRecord(TypedDict):
    """A view the server answered: its version and uncalibrated input estimate."""

    version: int
    estimated_tokens: int


class Receipt(TypedDict):
    """What one maintenance step did."""

    operation_id: str
    status: str  # applied | noop | blocked | failed
    action: str  # prune | summary | noop
    tokens_in: int
    tokens_out: int
    reason: str
    time: float
    tokens_saved: NotRequired[int]  # in `last_receipt`


class ContextState(TypedDict, total=False):
    """The session's context state document (schema version 3), as `get_context_state()` returns
    it: the server's bookkeeping for diagnostics. Its fields are the server's; a newer server may
    add some (they are kept), so every field is optional to the type checker."""

    schema_version: int
    fingerprint: str
    generation: int
    transcript_version: int
    checkpoint_id: str | None
    covered_count: int
    summary_hash: str
    pruned: dict[str, int]  # message id -> tokens of its pruned stub
    projection_version: int
    source_tokens: int
    projection_tokens: int
    prompt_cache_key: str
    cache_state: str  # warm | cold | unknown
    last_activity: float
    calibration: float
    views: list[ViewRecord]
    failed_fold_tokens: int
    receipts: list[Receipt]
    last_receipt: Receipt | None
    telemetry: dict[str, int]


class CallOptions(TypedDict, total=False):
    """Per-call options, accepted as keyword arguments by every client method.

    timeout: deadline in seconds for this call (None = no deadline); default: the client's.
    metadata: extra gRPC metadata pairs for this call.
    traceparent: a W3C `traceparent` to send instead of the one from the OpenTelemetry context.
    tracestate: the W3C `tracestate` going with an explicit `traceparent`.
    """

    timeout: float | None
    metadata: Sequence[tuple[str, str]]
    traceparent: str
    tracestate: str

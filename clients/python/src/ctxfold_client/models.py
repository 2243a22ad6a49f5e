"""The SDK's value types: enums mirroring the proto's, fold progress events, the prepared view,
a whole tool result and per-call options. Messages themselves stay the generated `pb.Message`."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from ctxfold_client._gen import context_service_pb2 as pb


class _ForwardCompatible(enum.IntEnum):
    """Values a newer server may send that this SDK does not know map to UNSPECIFIED."""

    @classmethod
    def _missing_(cls, value: object) -> _ForwardCompatible:
        return cls(0)


class Role(_ForwardCompatible):
    """The author of a message (`ctxfold.v1.Role`)."""

    UNSPECIFIED = pb.ROLE_UNSPECIFIED
    SYSTEM = pb.ROLE_SYSTEM
    USER = pb.ROLE_USER
    ASSISTANT = pb.ROLE_ASSISTANT
    TOOL = pb.ROLE_TOOL


class Action(_ForwardCompatible):
    """What maintenance a Prepare or Compact performed (`ctxfold.v1.Action`)."""

    UNSPECIFIED = pb.ACTION_UNSPECIFIED
    NONE = pb.ACTION_NONE
    PRUNED = pb.ACTION_PRUNED
    FOLDED = pb.ACTION_FOLDED


class CacheState(_ForwardCompatible):
    """The provider's prompt cache as judged by the server (`ctxfold.v1.CacheState`)."""

    UNSPECIFIED = pb.CACHE_STATE_UNSPECIFIED
    WARM = pb.CACHE_STATE_WARM
    COLD = pb.CACHE_STATE_COLD
    UNKNOWN = pb.CACHE_STATE_UNKNOWN


class FoldStage(_ForwardCompatible):
    """The step a progress event reports (`ctxfold.v1.FoldStage`)."""

    UNSPECIFIED = pb.FOLD_STAGE_UNSPECIFIED
    PRUNED = pb.FOLD_STAGE_PRUNED
    PLANNED = pb.FOLD_STAGE_PLANNED
    PASS_STARTED = pb.FOLD_STAGE_PASS_STARTED
    SUMMARY_DELTA = pb.FOLD_STAGE_SUMMARY_DELTA
    PASS_COMMITTED = pb.FOLD_STAGE_PASS_COMMITTED
    PASS_FAILED = pb.FOLD_STAGE_PASS_FAILED


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


@dataclass(frozen=True, slots=True)
class PreparedView:
    """The provider-visible context to send, as returned by `prepare()` / `compact()`.

    `messages` is always the WHOLE view, in order: when the server answered with a delta (only the
    messages after the view this client already held), the SDK has applied it. Treat the messages
    as read-only: the SDK keeps them to apply the next delta.
    """

    session_id: str
    messages: tuple[pb.Message, ...]
    view_version: int
    estimated_tokens: int
    action: Action
    cache_state: CacheState
    prompt_cache_key: str
    checkpoint_id: str
    stable_prefix_messages: int
    trigger_tokens: int
    hard_limit_tokens: int
    appended: tuple[pb.Message, ...]
    """The messages this call appended, with their ids and seqs."""
    delta: bool
    """True when the server sent only the new tail (`received`) and the SDK applied it."""
    received: tuple[pb.Message, ...]
    """The messages as the server sent them: the tail after the known view when `delta`."""
    raw: pb.PreparedContext = field(repr=False, compare=False)
    """The result as received, for fields newer than this SDK."""

    @property
    def folded(self) -> bool:
        return self.action is Action.FOLDED

    @property
    def summary(self) -> pb.Message | None:
        """The checkpoint summary message of the view, if history was folded."""
        return next((m for m in self.messages if m.summary), None)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A whole raw tool result read back with `read_tool_result()`, checked against its sha256."""

    result_ref: str
    data: str
    total_bytes: int
    sha256: str
    pages: int

    @property
    def raw(self) -> bytes:
        """The exact original bytes (UTF-8)."""
        return self.data.encode("utf-8")

    def verify(self) -> bool:
        raw = self.raw
        return len(raw) == self.total_bytes and hashlib.sha256(raw).hexdigest() == self.sha256


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

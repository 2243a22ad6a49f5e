"""The context state ("sidecar"), schema version 3: the session's projection (pruned results), view
versions, calibration, cache state, the last maintenance receipts and counters.

A stored state is trusted only when it parses, has schema 3 and its fingerprint matches the
session's lineage and head checkpoint. Anything else is rebuilt: the projection body is dropped (the
next Prepare re-prunes if needed), receipts, counters and calibration are kept when readable.
Unknown (legacy) fields are read and ignored."""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ctxfold.engine.errors import DomainError, Kind
from ctxfold.engine.estimator import MAX_CALIBRATION, MIN_CALIBRATION
from ctxfold.engine.model import MAX_CONTEXT_WINDOW, Usage

SCHEMA_VERSION = 3
# Calibration moves this far toward each accepted observation.
CALIBRATION_SMOOTHING = 0.3
MAX_RECEIPTS = 20
MAX_VIEWS = 16
# Views are versioned as generation << 32 | message count: a view is a prefix of another exactly when
# both have the same generation and it has no more messages.
_COUNT_BITS = 32


# What every Prepare changes (its view record, counters and activity) and nothing else: written on its
# own by an append-only Prepare, so the per-call write does not grow with the rest (pruned results,
# receipts).
BOOKKEEPING_FIELDS = (
    "transcript_version",
    "checkpoint_id",
    "covered_count",
    "source_tokens",
    "projection_tokens",
    "prompt_cache_key",
    "cache_state",
    "last_activity",
    "views",
    "telemetry",
)


def view_version(generation: int, message_count: int) -> int:
    return (generation << _COUNT_BITS) | message_count


def split_view_version(version: int) -> tuple[int, int]:
    return version >> _COUNT_BITS, version & ((1 << _COUNT_BITS) - 1)


def first_generation(fingerprint: str) -> int:
    """The generation a state made anew starts at: one of its branch's own, not 1, for a session deleted and created
    again under its key has the same id, and a client still holding a view version of the deleted one would be
    answered a delta of another transcript. Within 20 bits: versions stay below 2**53, exact as TypeScript numbers."""
    return 1 + int(hashlib.sha256(fingerprint.encode()).hexdigest()[:5], 16)


def fingerprint(branch_id: str, checkpoint_id: str | None) -> str:
    """Identifies the branch and the covered prefix (the head checkpoint) a projection belongs to."""
    return hashlib.sha256(f"{branch_id}\0{checkpoint_id or ''}".encode()).hexdigest()[:32]


class ReceiptStatus(enum.StrEnum):
    """What came of one maintenance step."""

    APPLIED = "applied"  # installed
    NOOP = "noop"  # nothing to do (nothing outside the kept set)
    BLOCKED = "blocked"  # not tried: the same input failed before, or another call holds the fold lease
    FAILED = "failed"  # the summary failed or was rejected
    PREPARED = "prepared"  # a background fold made its checkpoint, kept for the trigger
    DISCARDED = "discarded"  # a background fold's work dropped unused (stale, not needed, stopped): paid for


class ReceiptAction(enum.StrEnum):
    PRUNE = "prune"  # prune or bound tool results
    SUMMARY = "summary"  # a fold (or a prepared fold installed)
    BACKGROUND = "background"  # a fold made ahead of the trigger


@dataclass(frozen=True)
class Receipt:
    operation_id: str
    status: ReceiptStatus
    action: ReceiptAction
    tokens_in: int
    tokens_out: int
    reason: str
    time: float

    @property
    def tokens_saved(self) -> int:
        return max(0, self.tokens_in - self.tokens_out)


@dataclass(frozen=True)
class ViewRecord:
    version: int
    estimated_tokens: int  # uncalibrated, without reserved output: what ObserveUsage compares against


@dataclass(frozen=True)
class ContextState:
    fingerprint: str
    generation: int = 1
    transcript_version: int = 0
    checkpoint_id: str | None = None
    covered_count: int = 0
    summary_hash: str = ""
    pruned: dict[str, int] = field(default_factory=dict)  # message id -> tokens of its pruned stub
    # Of those, the results bounded to fit the window: message id -> code points kept.
    bounds: dict[str, int] = field(default_factory=dict)
    projection_version: int = 0
    source_tokens: int = 0
    projection_tokens: int = 0
    prompt_cache_key: str = ""
    cache_state: str = "unknown"
    last_activity: float = 0.0
    calibration: float = 1.0
    views: tuple[ViewRecord, ...] = ()
    failed_fold_tokens: int = 0  # the estimate a fold failed at; not retried until the view grows
    receipts: tuple[Receipt, ...] = ()
    telemetry: dict[str, int] = field(default_factory=dict)

    @property
    def last_receipt(self) -> Receipt | None:
        return self.receipts[-1] if self.receipts else None

    def installed(
        self, pruned: Mapping[str, int], bounds: Mapping[str, int], receipt: Receipt, folded: bool
    ) -> ContextState:
        """The state once a candidate view with these pruned and bounded results is installed: a new
        generation (its prefix changed), its receipt and, after a fold, no failed-fold memo (the input
        that failed is folded away)."""
        failed = 0 if folded else self.failed_fold_tokens
        changed = replace(
            self, pruned=dict(pruned), bounds=dict(bounds), generation=self.generation + 1, failed_fold_tokens=failed
        )
        return changed.with_receipt(receipt)

    def with_receipt(self, receipt: Receipt) -> ContextState:
        counters = dict(self.telemetry)
        key = f"{receipt.action}_{receipt.status}"
        counters[key] = counters.get(key, 0) + 1
        if receipt.status is ReceiptStatus.APPLIED:
            counters["tokens_saved"] = counters.get("tokens_saved", 0) + receipt.tokens_saved
        return replace(self, receipts=(*self.receipts, receipt)[-MAX_RECEIPTS:], telemetry=counters)

    def views_with(self, record: ViewRecord) -> tuple[ViewRecord, ...]:
        """The newest MAX_VIEWS view records once `record` is the last (it replaces one of its version)."""
        kept = tuple(v for v in self.views if v.version != record.version)
        return (*kept, record)[-MAX_VIEWS:]

    def view(self, version: int) -> ViewRecord | None:
        return next((v for v in self.views if v.version == version), None)

    def counted(self, name: str, amount: int = 1) -> dict[str, int]:
        """The telemetry counters with `amount` added to `name`."""
        counters = dict(self.telemetry)
        counters[name] = counters.get(name, 0) + amount
        return counters

    def count(self, name: str, amount: int = 1) -> ContextState:
        return replace(self, telemetry=self.counted(name, amount))

    def to_json(self) -> str:
        data = asdict(self)
        data["schema_version"] = SCHEMA_VERSION
        data["last_receipt"] = asdict(self.last_receipt) if self.last_receipt else None
        if self.last_receipt:
            data["last_receipt"]["tokens_saved"] = self.last_receipt.tokens_saved
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def bookkeeping_json(self) -> str:
        """The BOOKKEEPING_FIELDS of `to_json()`: laid over the stored document of a state that differs
        from this one only in them, they make this one."""
        data: dict[str, Any] = {name: getattr(self, name) for name in BOOKKEEPING_FIELDS}
        # Views by hand: `asdict` deep-copies every field, the biggest cost of an append-only Prepare's
        # state write (16 views per call).
        data["views"] = [{"version": v.version, "estimated_tokens": v.estimated_tokens} for v in self.views]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _receipts(raw: Any) -> tuple[Receipt, ...]:
    """The stored receipts; one of a status or action this version does not know is left out."""
    names = Receipt.__dataclass_fields__
    statuses, actions = set(ReceiptStatus), set(ReceiptAction)
    return tuple(
        replace(receipt, status=ReceiptStatus(receipt.status), action=ReceiptAction(receipt.action))
        for receipt in (Receipt(**{k: v for k, v in r.items() if k in names}) for r in raw or ())
        if receipt.status in statuses and receipt.action in actions
    )


def stored_document(state_json: str, bookkeeping_json: str | None) -> str:
    """The stored state: `state_json` with the fields of `bookkeeping_json` (`ContextState.bookkeeping_json`)
    laid over it. A document that is not a JSON object is answered as it is, for `load_state` to reject."""
    if not bookkeeping_json:
        return state_json
    try:
        base, bookkept = json.loads(state_json), json.loads(bookkeeping_json)
    except ValueError:
        return state_json
    if not isinstance(base, dict) or not isinstance(bookkept, dict):
        return state_json
    return json.dumps({**base, **bookkept}, sort_keys=True, separators=(",", ":"))


def load_state(text: str | None, expected_fingerprint: str) -> tuple[ContextState, str]:
    """The stored state if it is valid for `expected_fingerprint`, else a rebuilt one; the second
    value says why it was rebuilt ("" when it was valid, "new" when there was none)."""
    fresh = ContextState(fingerprint=expected_fingerprint, generation=first_generation(expected_fingerprint))
    if not text:
        return fresh, "new"
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError:
        return fresh, "corrupt"
    try:
        receipts = _receipts(data.get("receipts"))
        telemetry = {str(k): int(v) for k, v in (data.get("telemetry") or {}).items()}
        calibration = float(data.get("calibration", 1.0))
        generation = int(data.get("generation", 0))
    except (TypeError, ValueError, AttributeError):
        receipts, telemetry, calibration, generation = (), {}, 1.0, fresh.generation - 1
    if not MIN_CALIBRATION <= calibration <= MAX_CALIBRATION:
        calibration = 1.0
    rebuilt = ContextState(
        fingerprint=expected_fingerprint,
        generation=generation + 1,
        calibration=calibration,
        receipts=receipts,
        telemetry=telemetry,
    )
    if data.get("schema_version") != SCHEMA_VERSION:
        return rebuilt, "unknown schema"
    if data.get("fingerprint") != expected_fingerprint:
        return rebuilt, "fingerprint mismatch"
    try:
        state = ContextState(
            fingerprint=expected_fingerprint,
            generation=generation,
            transcript_version=int(data["transcript_version"]),
            checkpoint_id=data["checkpoint_id"],
            covered_count=int(data["covered_count"]),
            summary_hash=str(data["summary_hash"]),
            pruned={str(k): int(v) for k, v in data["pruned"].items()},
            bounds={str(k): int(v) for k, v in (data.get("bounds") or {}).items()},
            projection_version=int(data["projection_version"]),
            source_tokens=int(data["source_tokens"]),
            projection_tokens=int(data["projection_tokens"]),
            prompt_cache_key=str(data["prompt_cache_key"]),
            cache_state=str(data["cache_state"]),
            last_activity=float(data["last_activity"]),
            calibration=calibration,
            views=tuple(ViewRecord(int(v["version"]), int(v["estimated_tokens"])) for v in data["views"]),
            failed_fold_tokens=int(data["failed_fold_tokens"]),
            receipts=receipts,
            telemetry=telemetry,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return rebuilt, "invalid fields"
    return state, ""


def carried_over(state: ContextState, new_fingerprint: str, checkpoint_id: str | None) -> ContextState:
    """The state of a branch (after Rewind, or a new Fork) made from `state`: the pruned results stay
    pruned where they are still in view, calibration and history are kept, and the view starts a new
    generation because its prefix may have changed."""
    return ContextState(
        fingerprint=new_fingerprint,
        generation=state.generation + 1,
        checkpoint_id=checkpoint_id,
        pruned=dict(state.pruned),
        bounds=dict(state.bounds),
        prompt_cache_key=state.prompt_cache_key,
        calibration=state.calibration,
        last_activity=state.last_activity,
        receipts=state.receipts,
        telemetry=dict(state.telemetry),
    )


def check_usage(usage: Usage) -> None:
    """A provider's usage as ObserveUsage may record it (else INVALID_USAGE)."""
    for name, value in (
        ("input_tokens", usage.input_tokens),
        ("cached_input_tokens", usage.cached_input_tokens),
        ("output_tokens", usage.output_tokens),
    ):
        if value < 0:
            raise DomainError(Kind.INVALID_ARGUMENT, "INVALID_USAGE", f"{name} must be >= 0")
        # No request holds more than the largest window; summed unbounded, the session's counters and the
        # process's usage metric pass int64, which state readers and every later OTLP export then refuse.
        if value > MAX_CONTEXT_WINDOW:
            raise DomainError(
                Kind.INVALID_ARGUMENT,
                "INVALID_USAGE",
                f"{name} must be at most {MAX_CONTEXT_WINDOW} (the largest context window), got {value}",
            )
    if usage.cached_input_tokens > usage.input_tokens:
        raise DomainError(Kind.INVALID_ARGUMENT, "INVALID_USAGE", "cached_input_tokens cannot exceed input_tokens")


@dataclass(frozen=True)
class Observed:
    state: ContextState
    estimated_tokens: int  # the estimate of the reported view (0 when it is no longer known)
    accepted: bool  # whether the calibration moved toward this observation


def observed(state: ContextState, usage: Usage) -> Observed:
    """The state once the provider reported `usage` for one of its views: the calibration moves toward
    reported / estimated input when the view is known and the ratio is plausible (a ratio outside
    [MIN_CALIBRATION, MAX_CALIBRATION] means the agent sent something else than the view); the
    counters count every observation."""
    record = state.view(usage.view_version)
    estimated = record.estimated_tokens if record else 0
    ratio = usage.input_tokens / estimated if estimated else 0.0
    accepted = estimated > 0 and MIN_CALIBRATION <= ratio <= MAX_CALIBRATION
    calibration = (
        state.calibration + CALIBRATION_SMOOTHING * (ratio - state.calibration) if accepted else state.calibration
    )
    counted = (
        replace(state, calibration=calibration)
        .count("observations")
        .count("input_tokens", usage.input_tokens)
        .count("cached_input_tokens", usage.cached_input_tokens)
        .count("output_tokens", usage.output_tokens)
    )
    return Observed(counted, estimated, accepted)

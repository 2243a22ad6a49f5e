"""Conversion between the generated proto messages and the domain types."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from ctxfold.engine.answer import PreparedContext
from ctxfold.engine.context import SessionRecord
from ctxfold.engine.errors import invalid
from ctxfold.engine.maintenance import Action, NotFolded
from ctxfold.engine.model import (
    CONFIG_FIELDS,
    Author,
    ConfigInput,
    NewMessage,
    ProviderPayload,
    Role,
    StoredMessage,
    ToolCall,
    config_from_json,
)
from ctxfold.engine.view import StoredCheckpoint, ViewMessage
from ctxfold.service.observer import FoldProgress, FoldStage
from ctxfold.v1 import context_service_pb2 as pb

# Each Role is named as its proto value (a missing one fails at import).
_ROLE_TO_PB = {role: pb.Role.Value(f"ROLE_{role.name}") for role in Role}
_ROLE_FROM_PB = {value: role for role, value in _ROLE_TO_PB.items()}
_AUTHOR_FROM_PB = {pb.AUTHOR_PERSON: Author.PERSON, pb.AUTHOR_MACHINE: Author.MACHINE}
_AUTHOR_TO_PB = {Author.UNSTATED: pb.AUTHOR_UNSPECIFIED, **{a: v for v, a in _AUTHOR_FROM_PB.items()}}


def timestamp(seconds: float) -> Timestamp:
    nanos = int(seconds * 1e9)
    return Timestamp(seconds=nanos // 1_000_000_000, nanos=nanos % 1_000_000_000)


def config_input(config: pb.SessionConfig) -> ConfigInput:
    values = {name: getattr(config, name) for name in CONFIG_FIELDS}
    # The one field whose zero is a value (off), not "the default": its presence says which.
    values["prefold_ratio"] = config.prefold_ratio if config.HasField("prefold_ratio") else None
    return ConfigInput(**values)


def session_pb(r: SessionRecord) -> pb.Session:
    config = config_from_json(r.config_json)
    return pb.Session(
        id=r.id,
        config=pb.SessionConfig(**{name: getattr(config, name) for name in CONFIG_FIELDS}),
        head_seq=r.head_seq,
        checkpoint_id=r.checkpoint_id or "",
        create_time=timestamp(r.create_time),
        update_time=timestamp(r.update_time),
        forked_from_session_id=r.forked_from_session_id or "",
        forked_at_seq=r.forked_at_seq,
    )


def checkpoint_pb(stored: StoredCheckpoint) -> pb.Checkpoint:
    c = stored.checkpoint
    notes = c.notes
    return pb.Checkpoint(
        id=c.id,
        parent_id=c.parent_id or "",
        position_seq=c.position_seq,
        summary=c.summary,
        summary_tokens=c.summary_tokens,
        kept_message_ids=list(c.kept_ids),
        create_time=timestamp(stored.create_time),
        on_head_chain=stored.on_head_chain,
        folded_results_ref=notes.index_ref if notes else "",
        summarizer=notes.summarizer if notes else "",
    )


def new_messages(messages: Sequence[pb.Message], field: str = "messages") -> list[NewMessage]:
    out = []
    for index, m in enumerate(messages):
        role = _ROLE_FROM_PB.get(m.role)
        if role is None:
            raise invalid(
                "INVALID_MESSAGE",
                f"{field}[{index}]: role must be ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT or ROLE_TOOL "
                f"(got {pb.Role.Name(m.role) if m.role in pb.Role.values() else m.role})",
                index=index,
            )
        out.append(
            NewMessage(
                role=role,
                content=m.content,
                tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls),
                tool_call_id=m.tool_call_id,
                reasoning_content=m.reasoning_content,
                pinned=m.pinned,
                name=m.name,
                payload=provider_payload(m.provider_payload) if m.HasField("provider_payload") else None,
                author=_AUTHOR_FROM_PB.get(m.author, Author.UNSTATED),
            )
        )
    return out


def provider_payload(payload: pb.ProviderPayload) -> ProviderPayload:
    """The payload a message carried; the proto's fields are the domain's, by name (sent back by `vars`)."""
    return ProviderPayload(payload.format, payload.json, payload.fingerprint, payload.tokens)


def message_pb(message: StoredMessage) -> pb.Message:
    return pb.Message(
        id=message.id,
        seq=message.seq,
        role=_ROLE_TO_PB[message.role],
        content=message.content,
        tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in message.tool_calls],
        tool_call_id=message.tool_call_id,
        reasoning_content=message.reasoning_content,
        pinned=message.pinned,
        result_ref=message.result_ref,
        raw_bytes=message.raw_bytes,
        truncated=message.truncated,
        name=message.name,
        tokens=message.tokens,
        abandoned=message.abandoned,
        create_time=timestamp(message.create_time) if message.create_time else None,
        provider_payload=pb.ProviderPayload(**vars(message.payload)) if message.payload else None,
        author=_AUTHOR_TO_PB[message.author],
    )


def view_message_pb(view: ViewMessage) -> pb.Message:
    """A view message as the provider should see it, naming the canonical message it renders."""
    if view.source is None:
        return pb.Message(
            role=_ROLE_TO_PB[view.role],
            content=view.content,
            summary=view.summary,
            tokens=view.tokens,
            provider_payload=pb.ProviderPayload(**vars(view.payload)) if view.payload else None,
        )
    message = message_pb(view.source)
    message.content = view.content
    message.pruned = view.pruned
    message.tokens = view.tokens
    return message


# Each domain enum's proto value has its name with the proto enum's prefix (a missing one fails at import).
_ACTION_TO_PB = {a: pb.Action.Value(f"ACTION_{a.name}") for a in Action}
_CACHE_TO_PB = {"warm": pb.CACHE_STATE_WARM, "cold": pb.CACHE_STATE_COLD, "unknown": pb.CACHE_STATE_UNKNOWN}
_STAGE_TO_PB = {s: pb.FoldStage.Value(f"FOLD_STAGE_{s.name}") for s in FoldStage}
_NOT_FOLDED_TO_PB = {n: pb.NotFoldedReason.Value(f"NOT_FOLDED_REASON_{n.name}") for n in NotFolded}
# The fields of a PreparedContext its proto has under their own names, as they are (the rest are converted).
_CONVERTED = ("messages", "action", "cache_state", "appended", "not_folded_reason")
_PREPARED_AS_IS = [name for name in pb.PreparedContext.DESCRIPTOR.fields_by_name if name not in _CONVERTED]
assert set(_PREPARED_AS_IS) <= {f.name for f in dataclasses.fields(PreparedContext)}, "a proto field with no value"


def prepared_pb(prepared: PreparedContext) -> pb.PreparedContext:
    return pb.PreparedContext(
        **{name: getattr(prepared, name) for name in _PREPARED_AS_IS},
        messages=[view_message_pb(v) for v in prepared.messages],
        action=_ACTION_TO_PB[prepared.action],
        cache_state=_CACHE_TO_PB[prepared.cache_state],
        appended=[message_pb(m) for m in prepared.appended],
        not_folded_reason=_NOT_FOLDED_TO_PB[prepared.not_folded],
    )


def progress_pb(progress: FoldProgress) -> pb.FoldProgress:
    return pb.FoldProgress(**{**vars(progress), "stage": _STAGE_TO_PB[progress.stage]})

"""The database schema. Alembic migrations in `migrations/` create exactly this (a test compares)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING)

ID = String(64)
TENANT = String(128)


def _table(name: str, *items: Any) -> Table:
    return Table(name, metadata, *items)


def _required(**types: Any) -> list[Column[Any]]:
    """NOT NULL columns, in the order given."""
    return [Column(name, type_, nullable=False) for name, type_ in types.items()]


def _owned(parent: str, primary_key: bool = False) -> Column[Any]:
    """`<parent>_id` of a row that goes with its parent's (ON DELETE CASCADE)."""
    references = ForeignKey(f"{parent}s.id", ondelete="CASCADE")
    return Column(f"{parent}_id", ID, references, primary_key=primary_key, nullable=False)


# A branch of transcript: messages with seq > base_seq; lower seqs continue in the parent segment.
segments = _table(
    "segments",
    Column("id", ID, primary_key=True),
    Column("tenant", TENANT, nullable=False),
    Column("parent_id", ID, ForeignKey("segments.id")),
    Column("base_seq", BigInteger, nullable=False),
    # The session that wrote this segment; its abandoned messages are listed for that session only.
    Column("owner_session_id", ID, index=True),
    Column("create_time", Float, nullable=False),
    Index("ix_segments_parent_id", "parent_id"),
)

# `system_tokens`, `tools_tokens`: counted once when the config is set. `branch_id`: new at every Create, Fork and
# Rewind (a rewind may keep the head segment). `open_tool_calls`: JSON array of the calls still waiting. `version`:
# every writer's compare-and-swap; the fold lease (so replicas wait instead of summarizing twice) is not part of it.
sessions = _table(
    "sessions",
    Column("id", ID, primary_key=True),
    *_required(tenant=TENANT, config_json=Text, system_tokens=Integer, tools_tokens=Integer),
    Column("segment_id", ID, ForeignKey("segments.id"), nullable=False),
    *_required(head_seq=BigInteger, branch_id=ID),
    Column("checkpoint_id", ID, ForeignKey("checkpoints.id")),
    *_required(open_tool_calls=Text, version=BigInteger),
    Column("fold_lease_owner", String(64)),
    Column("fold_lease_until", Float),
    Column("forked_from_session_id", ID),
    *_required(forked_at_seq=BigInteger, create_time=Float, update_time=Float),
    Index("ix_sessions_tenant_created", "tenant", "create_time", "id"),
    Index("ix_sessions_segment_id", "segment_id"),
    Index("ix_sessions_checkpoint_id", "checkpoint_id"),
)

# `author`: who wrote a user message, as its caller stated it ("" when not stated: the engine's rules decide).
# `provider_payload_json`: the provider payload (`ProviderPayload` as a JSON object), NULL for messages without one.
messages = _table(
    "messages",
    Column("id", ID, primary_key=True),
    _owned("segment"),
    *_required(seq=BigInteger, role=String(16), content=Text),
    Column("tool_calls_json", Text),
    Column("tool_call_id", String(256)),
    *_required(reasoning_content=Text, name=String(128), pinned=Boolean, author=String(16), tokens=Integer),
    Column("result_ref", ID),
    *_required(raw_bytes=BigInteger, truncated=Boolean, create_time=Float),
    Column("provider_payload_json", Text),
    UniqueConstraint("segment_id", "seq", name="uq_messages_segment_seq"),
    Index("ix_messages_segment_tool_call", "segment_id", "tool_call_id"),
)

# The full text of every tool result. `codec`: "inline" (the message content), "identity" (in `data`), or
# "zstd_chunks" (`tool_result_chunks`, `data` empty); docs/architecture.md, Storage model, says when.
tool_results = _table(
    "tool_results",
    Column("ref", ID, primary_key=True),
    _owned("segment"),
    *_required(message_id=ID, codec=String(16), data=LargeBinary, total_bytes=BigInteger, sha256=String(64)),
    Column("chunk_bytes", Integer),
    Index("ix_tool_results_segment_id", "segment_id"),
)

# Raw bytes [chunk_index × chunk_bytes, +chunk_bytes) of a "zstd_chunks" result, each compressed on its own.
tool_result_chunks = _table(
    "tool_result_chunks",
    Column("ref", ID, ForeignKey("tool_results.ref", ondelete="CASCADE"), primary_key=True),
    Column("chunk_index", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

# Immutable once written; sessions share them across forks. Entries: JSON list of kept message refs
# and exactly one summary, rendered before the messages after `position_seq`.
checkpoints = _table(
    "checkpoints",
    Column("id", ID, primary_key=True),
    Column("tenant", TENANT, nullable=False),
    Column("parent_id", ID, ForeignKey("checkpoints.id")),
    *_required(position_seq=BigInteger, entries_json=Text, summary_tokens=Integer),
    *_required(tokens_before=BigInteger, tokens_after=BigInteger, create_time=Float),
    Index("ix_checkpoints_parent_id", "parent_id"),
)

# At most one background fold per session, not installed yet (`engine/background.py`); a fold install or the
# session's delete removes it. `parent_id` has no foreign key: a rewind may delete it (the fold is then stale).
# `traceparent`: the W3C traceparent of the fold's span, which the install's span links to.
prepared_folds = _table(
    "prepared_folds",
    _owned("session", True),
    Column("checkpoint_id", ID, nullable=False),
    Column("parent_id", ID),
    *_required(position_seq=BigInteger, entries_json=Text, summary_tokens=Integer),
    *_required(covered=String(64), document_ref=ID, document_message_id=ID, document_text=Text),
    *_required(tokens_before=BigInteger, tokens_after=BigInteger, summarizer=String(128)),
    *_required(traceparent=String(64), create_time=Float),
)

append_requests = _table(
    "append_requests",
    _owned("session", True),
    Column("request_id", String(128), primary_key=True),
    *_required(message_ids_json=Text, create_time=Float),
)

# The projection "sidecar" (schema v3 JSON): `state_json` with `bookkeeping_json`'s fields over it (an append writes
# only those; any other write, the whole state and NULL there). `revision`: bumped by every write, a compare-and-swap.
context_states = _table(
    "context_states",
    _owned("session", True),
    Column("state_json", Text, nullable=False),
    Column("bookkeeping_json", Text),
    *_required(revision=BigInteger, update_time=Float),
)

usage_observations = _table(
    "usage_observations",
    Column("id", Integer, primary_key=True, autoincrement=True),
    _owned("session"),
    *_required(view_version=BigInteger, estimated_tokens=BigInteger, input_tokens=BigInteger),
    *_required(cached_input_tokens=BigInteger, output_tokens=BigInteger, finish_reason=String(64)),
    Column("create_time", Float, nullable=False),
    Index("ix_usage_observations_session_id", "session_id", "id"),
)

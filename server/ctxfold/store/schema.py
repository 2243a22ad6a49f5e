"""The database schema. Alembic migrations in `migrations/` create exactly this (a test compares)."""

from __future__ import annotations

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

# A branch of transcript: messages with seq > base_seq; lower seqs continue in the parent segment.
segments = Table(
    "segments",
    metadata,
    Column("id", ID, primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("parent_id", ID, ForeignKey("segments.id"), nullable=True),
    Column("base_seq", BigInteger, nullable=False),
    # The session that wrote this segment; its abandoned messages are listed for that session only.
    Column("owner_session_id", ID, nullable=True, index=True),
    Column("create_time", Float, nullable=False),
    Index("ix_segments_parent_id", "parent_id"),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", ID, primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("config_json", Text, nullable=False),
    # Tokens of the system prompt and of the tool schemas, counted once when the config is set.
    Column("system_tokens", Integer, nullable=False),
    Column("tools_tokens", Integer, nullable=False),
    Column("segment_id", ID, ForeignKey("segments.id"), nullable=False),
    Column("head_seq", BigInteger, nullable=False),
    # A new id at every Create, Fork and Rewind: names the branch a derived state belongs to (a rewind
    # may keep the head segment, so the segment id alone does not).
    Column("branch_id", ID, nullable=False),
    Column("checkpoint_id", ID, ForeignKey("checkpoints.id"), nullable=True),
    # Tool call ids of the last assistant message still waiting for results (JSON array).
    Column("open_tool_calls", Text, nullable=False),
    # Bumped by every change; writers compare-and-swap on it.
    Column("version", BigInteger, nullable=False),
    # Who is folding the session and until when (replicas wait instead of summarizing the same input).
    # Not part of `version`: taking the lease changes nothing a candidate depends on.
    Column("fold_lease_owner", String(64), nullable=True),
    Column("fold_lease_until", Float, nullable=True),
    Column("forked_from_session_id", ID, nullable=True),
    Column("forked_at_seq", BigInteger, nullable=False),
    Column("create_time", Float, nullable=False),
    Column("update_time", Float, nullable=False),
    Index("ix_sessions_tenant_created", "tenant", "create_time", "id"),
    Index("ix_sessions_segment_id", "segment_id"),
    Index("ix_sessions_checkpoint_id", "checkpoint_id"),
)

messages = Table(
    "messages",
    metadata,
    Column("id", ID, primary_key=True),
    Column("segment_id", ID, ForeignKey("segments.id", ondelete="CASCADE"), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=False),
    Column("tool_calls_json", Text, nullable=True),
    Column("tool_call_id", String(256), nullable=True),
    Column("reasoning_content", Text, nullable=False),
    Column("name", String(128), nullable=False),
    Column("pinned", Boolean, nullable=False),
    # Who wrote a user message, as its caller stated it ("" when not stated: the engine's rules decide).
    Column("author", String(16), nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("result_ref", ID, nullable=True),
    Column("raw_bytes", BigInteger, nullable=False),
    Column("truncated", Boolean, nullable=False),
    Column("create_time", Float, nullable=False),
    # The provider payload (`ProviderPayload` as a JSON object); NULL for messages without one.
    Column("provider_payload_json", Text, nullable=True),
    UniqueConstraint("segment_id", "seq", name="uq_messages_segment_seq"),
    Index("ix_messages_segment_tool_call", "segment_id", "tool_call_id"),
)

# The full text of every tool result. `codec`: "inline" (the message content), "identity" (in `data`), or
# "zstd_chunks" (`tool_result_chunks`, `data` empty); docs/architecture.md, Storage model, says when.
tool_results = Table(
    "tool_results",
    metadata,
    Column("ref", ID, primary_key=True),
    Column("segment_id", ID, ForeignKey("segments.id", ondelete="CASCADE"), nullable=False),
    Column("message_id", ID, nullable=False),
    Column("codec", String(16), nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("total_bytes", BigInteger, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("chunk_bytes", Integer, nullable=True),
    Index("ix_tool_results_segment_id", "segment_id"),
)

# Raw bytes [chunk_index × chunk_bytes, +chunk_bytes) of a "zstd_chunks" result, each compressed on
# its own, so a page read fetches and decompresses only the one or two chunks it covers.
tool_result_chunks = Table(
    "tool_result_chunks",
    metadata,
    Column("ref", ID, ForeignKey("tool_results.ref", ondelete="CASCADE"), primary_key=True),
    Column("chunk_index", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

# Immutable once written; sessions share them across forks. Entries: JSON list of kept message refs
# and exactly one summary, rendered before the messages after `position_seq`.
checkpoints = Table(
    "checkpoints",
    metadata,
    Column("id", ID, primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("parent_id", ID, ForeignKey("checkpoints.id"), nullable=True),
    Column("position_seq", BigInteger, nullable=False),
    Column("entries_json", Text, nullable=False),
    Column("summary_tokens", Integer, nullable=False),
    Column("tokens_before", BigInteger, nullable=False),
    Column("tokens_after", BigInteger, nullable=False),
    Column("create_time", Float, nullable=False),
    Index("ix_checkpoints_parent_id", "parent_id"),
)

# At most one background fold per session, not installed yet: its checkpoint (as in `checkpoints`) and
# document (`engine/background.py`). A fold install or a delete of the session removes it.
prepared_folds = Table(
    "prepared_folds",
    metadata,
    Column("session_id", ID, ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
    Column("checkpoint_id", ID, nullable=False),
    # The head checkpoint it builds on; no foreign key: a rewind may delete it (the fold is then stale).
    Column("parent_id", ID, nullable=True),
    Column("position_seq", BigInteger, nullable=False),
    Column("entries_json", Text, nullable=False),
    Column("summary_tokens", Integer, nullable=False),
    Column("covered", String(64), nullable=False),
    Column("document_ref", ID, nullable=False),
    Column("document_message_id", ID, nullable=False),
    Column("document_text", Text, nullable=False),
    Column("tokens_before", BigInteger, nullable=False),
    Column("tokens_after", BigInteger, nullable=False),
    Column("summarizer", String(128), nullable=False),
    # The W3C traceparent of the fold's span: the span of the install that uses it links to it.
    Column("traceparent", String(64), nullable=False),
    Column("create_time", Float, nullable=False),
)

append_requests = Table(
    "append_requests",
    metadata,
    Column("session_id", ID, ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
    Column("request_id", String(128), primary_key=True),
    Column("message_ids_json", Text, nullable=False),
    Column("create_time", Float, nullable=False),
)

# The projection "sidecar" (schema v3 JSON): `state_json` with `bookkeeping_json`'s fields over it; an
# append-only Prepare writes only those, any other write the whole state and NULL there.
context_states = Table(
    "context_states",
    metadata,
    Column("session_id", ID, ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
    Column("state_json", Text, nullable=False),
    Column("bookkeeping_json", Text, nullable=True),
    # Bumped by every write; bookkeeping writes compare-and-swap on it.
    Column("revision", BigInteger, nullable=False),
    Column("update_time", Float, nullable=False),
)

usage_observations = Table(
    "usage_observations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", ID, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    Column("view_version", BigInteger, nullable=False),
    Column("estimated_tokens", BigInteger, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("cached_input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("finish_reason", String(64), nullable=False),
    Column("create_time", Float, nullable=False),
    Index("ix_usage_observations_session_id", "session_id", "id"),
)

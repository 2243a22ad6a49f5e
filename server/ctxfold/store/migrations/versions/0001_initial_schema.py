"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 00:34:09.401170
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("parent_id", sa.String(length=64), nullable=True),
        sa.Column("position_seq", sa.BigInteger(), nullable=False),
        sa.Column("entries_json", sa.Text(), nullable=False),
        sa.Column("summary_tokens", sa.Integer(), nullable=False),
        sa.Column("tokens_before", sa.BigInteger(), nullable=False),
        sa.Column("tokens_after", sa.BigInteger(), nullable=False),
        sa.Column("create_time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["checkpoints.id"], name=op.f("fk_checkpoints_parent_id_checkpoints")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index("ix_checkpoints_parent_id", ["parent_id"], unique=False)

    op.create_table(
        "segments",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("parent_id", sa.String(length=64), nullable=True),
        sa.Column("base_seq", sa.BigInteger(), nullable=False),
        sa.Column("owner_session_id", sa.String(length=64), nullable=True),
        sa.Column("create_time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["segments.id"], name=op.f("fk_segments_parent_id_segments")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_segments")),
    )
    with op.batch_alter_table("segments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_segments_owner_session_id"), ["owner_session_id"], unique=False)
        batch_op.create_index("ix_segments_parent_id", ["parent_id"], unique=False)

    op.create_table(
        "messages",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("segment_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("tool_calls_json", sa.Text(), nullable=True),
        sa.Column("tool_call_id", sa.String(length=256), nullable=True),
        sa.Column("reasoning_content", sa.Text(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("result_ref", sa.String(length=64), nullable=True),
        sa.Column("raw_bytes", sa.BigInteger(), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("create_time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["segment_id"], ["segments.id"], name=op.f("fk_messages_segment_id_segments"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_messages")),
        sa.UniqueConstraint("segment_id", "seq", name="uq_messages_segment_seq"),
    )
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index("ix_messages_segment_tool_call", ["segment_id", "tool_call_id"], unique=False)

    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("system_tokens", sa.Integer(), nullable=False),
        sa.Column("tools_tokens", sa.Integer(), nullable=False),
        sa.Column("segment_id", sa.String(length=64), nullable=False),
        sa.Column("head_seq", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=64), nullable=True),
        sa.Column("open_tool_calls", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("forked_from_session_id", sa.String(length=64), nullable=True),
        sa.Column("forked_at_seq", sa.BigInteger(), nullable=False),
        sa.Column("create_time", sa.Float(), nullable=False),
        sa.Column("update_time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["checkpoint_id"], ["checkpoints.id"], name=op.f("fk_sessions_checkpoint_id_checkpoints")
        ),
        sa.ForeignKeyConstraint(["segment_id"], ["segments.id"], name=op.f("fk_sessions_segment_id_segments")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.create_index("ix_sessions_checkpoint_id", ["checkpoint_id"], unique=False)
        batch_op.create_index("ix_sessions_segment_id", ["segment_id"], unique=False)
        batch_op.create_index("ix_sessions_tenant_created", ["tenant", "create_time", "id"], unique=False)

    op.create_table(
        "tool_results",
        sa.Column("ref", sa.String(length=64), nullable=False),
        sa.Column("segment_id", sa.String(length=64), nullable=False),
        sa.Column("message_id", sa.String(length=64), nullable=False),
        sa.Column("codec", sa.String(length=16), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("total_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["segment_id"],
            ["segments.id"],
            name=op.f("fk_tool_results_segment_id_segments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("ref", name=op.f("pk_tool_results")),
    )
    with op.batch_alter_table("tool_results", schema=None) as batch_op:
        batch_op.create_index("ix_tool_results_segment_id", ["segment_id"], unique=False)

    op.create_table(
        "append_requests",
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("message_ids_json", sa.Text(), nullable=False),
        sa.Column("create_time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_append_requests_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "request_id", name=op.f("pk_append_requests")),
    )
    op.create_table(
        "context_states",
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("state_json", sa.Text(), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("update_time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_context_states_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_context_states")),
    )
    op.create_table(
        "usage_observations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("view_version", sa.BigInteger(), nullable=False),
        sa.Column("estimated_tokens", sa.BigInteger(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("finish_reason", sa.String(length=64), nullable=False),
        sa.Column("create_time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_usage_observations_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_observations")),
    )
    with op.batch_alter_table("usage_observations", schema=None) as batch_op:
        batch_op.create_index("ix_usage_observations_session_id", ["session_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("usage_observations", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_observations_session_id")

    op.drop_table("usage_observations")
    op.drop_table("context_states")
    op.drop_table("append_requests")
    with op.batch_alter_table("tool_results", schema=None) as batch_op:
        batch_op.drop_index("ix_tool_results_segment_id")

    op.drop_table("tool_results")
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_index("ix_sessions_tenant_created")
        batch_op.drop_index("ix_sessions_segment_id")
        batch_op.drop_index("ix_sessions_checkpoint_id")

    op.drop_table("sessions")
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_index("ix_messages_segment_tool_call")

    op.drop_table("messages")
    with op.batch_alter_table("segments", schema=None) as batch_op:
        batch_op.drop_index("ix_segments_parent_id")
        batch_op.drop_index(batch_op.f("ix_segments_owner_session_id"))

    op.drop_table("segments")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_checkpoints_parent_id")

    op.drop_table("checkpoints")

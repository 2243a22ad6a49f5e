"""prepared_folds: the fold a session made in the background, not installed yet

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "prepared_folds",
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=64), nullable=False),
        sa.Column("parent_id", sa.String(length=64), nullable=True),
        sa.Column("position_seq", sa.BigInteger(), nullable=False),
        sa.Column("entries_json", sa.Text(), nullable=False),
        sa.Column("summary_tokens", sa.Integer(), nullable=False),
        sa.Column("covered", sa.String(length=64), nullable=False),
        sa.Column("document_ref", sa.String(length=64), nullable=False),
        sa.Column("document_message_id", sa.String(length=64), nullable=False),
        sa.Column("document_text", sa.Text(), nullable=False),
        sa.Column("tokens_before", sa.BigInteger(), nullable=False),
        sa.Column("tokens_after", sa.BigInteger(), nullable=False),
        sa.Column("summarizer", sa.String(length=128), nullable=False),
        sa.Column("traceparent", sa.String(length=64), nullable=False),
        sa.Column("create_time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_prepared_folds_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_prepared_folds")),
    )


def downgrade() -> None:
    op.drop_table("prepared_folds")

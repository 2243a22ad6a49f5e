"""raw tool results in independently compressed chunks

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows keep their codec (inline, identity, zstd) and stay readable as they are: a nullable
    # column is added in place (ALTER TABLE ADD COLUMN on both stores), nothing is rewritten.
    op.add_column("tool_results", sa.Column("chunk_bytes", sa.Integer(), nullable=True))
    op.create_table(
        "tool_result_chunks",
        sa.Column("ref", sa.String(length=64), nullable=False),
        sa.Column("chunk_index", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["ref"],
            ["tool_results.ref"],
            name=op.f("fk_tool_result_chunks_ref_tool_results"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("ref", "chunk_index", name=op.f("pk_tool_result_chunks")),
    )


def downgrade() -> None:
    op.drop_table("tool_result_chunks")
    with op.batch_alter_table("tool_results", schema=None) as batch_op:
        batch_op.drop_column("chunk_bytes")

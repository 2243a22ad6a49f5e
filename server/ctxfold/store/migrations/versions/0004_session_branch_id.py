"""sessions.branch_id: names the branch a derived state belongs to

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A rewind inside the head segment keeps the segment, so states are fingerprinted by a branch id
    # that every Create, Fork and Rewind renews. Existing sessions take their segment id, which is what
    # their stored states were fingerprinted with, so those states stay valid.
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("branch_id", sa.String(length=64), nullable=True))
    op.execute("UPDATE sessions SET branch_id = segment_id")
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.alter_column("branch_id", existing_type=sa.String(length=64), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_column("branch_id")

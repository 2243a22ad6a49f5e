"""fold lease on sessions; every session has a context-state row

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fold_lease_owner", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("fold_lease_until", sa.Float(), nullable=True))
    # State rows are created with their session from now on, so every state write is an update.
    op.execute(
        "INSERT INTO context_states (session_id, state_json, revision, update_time) "
        "SELECT id, '', 1, update_time FROM sessions "
        "WHERE id NOT IN (SELECT session_id FROM context_states)"
    )


def downgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_column("fold_lease_until")
        batch_op.drop_column("fold_lease_owner")

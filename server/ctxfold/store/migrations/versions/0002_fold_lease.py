"""fold lease on sessions

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


def downgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_column("fold_lease_until")
        batch_op.drop_column("fold_lease_owner")

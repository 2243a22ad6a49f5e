"""context_states.bookkeeping_json: the per-call part of a state, written without the rest

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for every existing state: nothing to carry over.
    with op.batch_alter_table("context_states", schema=None) as batch_op:
        batch_op.add_column(sa.Column("bookkeeping_json", sa.Text(), nullable=True))


def downgrade() -> None:
    # A state whose bookkeeping was written since its last whole write loses only its newest view
    # records, counters and activity time.
    with op.batch_alter_table("context_states", schema=None) as batch_op:
        batch_op.drop_column("bookkeeping_json")

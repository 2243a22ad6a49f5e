"""messages.author: who wrote a user message, as its caller stated it

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # "" (not stated) for every existing message: the engine's rules decide, as they did before. The
    # default fills existing rows (on PostgreSQL without rewriting them) and is then dropped: every insert
    # names the column.
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("author", sa.String(length=16), nullable=False, server_default=""))
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.alter_column("author", existing_type=sa.String(length=16), server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_column("author")

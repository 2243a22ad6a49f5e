"""messages.provider_payload_json: what a provider's message carried beyond the canonical fields

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for every existing message: none was written with a payload.
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("provider_payload_json", sa.Text(), nullable=True))


def downgrade() -> None:
    # Messages keep their canonical fields; only the verbatim provider JSON is lost.
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_column("provider_payload_json")

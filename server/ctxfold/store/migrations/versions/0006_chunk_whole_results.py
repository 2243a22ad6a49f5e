"""results longer than one chunk stored whole are rewritten into chunks

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
import zstandard
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# The chunking of this revision (the store's CHUNK_BYTES and ZSTD_LEVEL then); every row records its own
# chunk_bytes, so later changes to the store's constants leave these rows readable.
CHUNK_BYTES = 64 << 10
ZSTD_LEVEL = 3

tool_results = sa.table(
    "tool_results",
    sa.column("ref", sa.String),
    sa.column("message_id", sa.String),
    sa.column("codec", sa.String),
    sa.column("data", sa.LargeBinary),
    sa.column("total_bytes", sa.BigInteger),
    sa.column("chunk_bytes", sa.Integer),
)
chunks = sa.table(
    "tool_result_chunks",
    sa.column("ref", sa.String),
    sa.column("chunk_index", sa.Integer),
    sa.column("data", sa.LargeBinary),
)
messages = sa.table("messages", sa.column("id", sa.String), sa.column("content", sa.Text))


def _raw(conn: sa.Connection, ref: str, codec: str, message_id: str) -> bytes:
    if codec == "inline":
        content = conn.execute(sa.select(messages.c.content).where(messages.c.id == message_id)).scalar_one()
        return str(content).encode()
    data = bytes(conn.execute(sa.select(tool_results.c.data).where(tool_results.c.ref == ref)).scalar_one())
    return zstandard.ZstdDecompressor().decompress(data) if codec == "zstd" else data


def upgrade() -> None:
    # A page read of a result stored whole read all of it: one zstd frame (rows from before 0003) or a
    # message content of up to 1 MiB. Each such row longer than a chunk is rewritten as chunks, one row at
    # a time (memory stays one result); its bytes, length and sha256 stay as they are.
    conn = op.get_bind()
    tr = tool_results.c
    whole = sa.select(tr.ref, tr.codec, tr.message_id).where(
        sa.or_(tr.codec == "zstd", sa.and_(tr.codec.in_(["inline", "identity"]), tr.total_bytes > CHUNK_BYTES))
    )
    for ref, codec, message_id in conn.execute(whole).all():
        raw = _raw(conn, ref, codec, message_id)
        compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        rows = [
            {"ref": ref, "chunk_index": index, "data": compressor.compress(raw[start : start + CHUNK_BYTES])}
            for index, start in enumerate(range(0, len(raw), CHUNK_BYTES))
        ]
        if rows:
            conn.execute(sa.insert(chunks), rows)
        conn.execute(
            sa.update(tool_results).where(tr.ref == ref).values(codec="zstd_chunks", data=b"", chunk_bytes=CHUNK_BYTES)
        )


def downgrade() -> None:
    # Chunked rows stay readable by the code of 0004 (which reads chunks); nothing to undo.
    pass

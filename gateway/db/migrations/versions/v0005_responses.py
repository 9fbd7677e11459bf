"""Issue 26: stored Responses API answers (`GATEWAY_RESPONSES_STORE`).

Revision ID: 0005
Revises: 0004

- `gateway_responses`: one row per stored response: its key, its expiry, the JSON of the input
  it answered and of the `response` object, and their size (the per-key cap counts it).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the responses table and its indexes."""
    op.create_table(
        "gateway_responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("items", sa.Text(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
    )
    op.create_index("ix_gateway_responses_key_id", "gateway_responses", ["key_id", "created_at"])
    op.create_index("ix_gateway_responses_expires_at", "gateway_responses", ["expires_at"])


def downgrade() -> None:
    """Not supported: restore the backup taken before upgrading (docs/operations.md)."""
    raise NotImplementedError("the gateway's migrations do not downgrade; restore a backup")

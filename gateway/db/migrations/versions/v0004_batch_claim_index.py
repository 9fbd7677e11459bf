"""Issue 29: an index that serves the batch claim's order, so a claim reads only a few lines.

Revision ID: 0004
Revises: 0003

- `ix_gateway_batch_lines_claim` on `gateway_batch_lines (batch_id, state, model, line_no)`: a
  claim reads a running batch's first pending lines in model, line order and stops. Before, it
  ranked every runnable line of the queue (1.0-1.5 s on SQLite with 200,000 queued lines).
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the claim's index on the batch lines."""
    op.create_index(
        "ix_gateway_batch_lines_claim",
        "gateway_batch_lines",
        ["batch_id", "state", "model", "line_no"],
    )


def downgrade() -> None:
    """Not supported: restore the backup taken before upgrading (docs/operations.md)."""
    raise NotImplementedError("the gateway's migrations do not downgrade; restore a backup")

"""Issue 15: the OpenAI Batch API's files, batches, lines and per-batch log.

Revision ID: 0003
Revises: 0002

- `gateway_files`: uploaded inputs and the output and error files batches produce.
- `gateway_batches`: one row per batch, OpenAI's status and per-state times.
- `gateway_batch_lines`: one row per input line: state, lease (replicas share the work), result.
- `gateway_batch_events`: each batch's own log of attempts and errors.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _time(name: str, *, nullable: bool = True) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    """Create the four batch tables and their indexes."""
    op.create_table(
        "gateway_files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(20), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        _time("created_at", nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=True),
    )
    op.create_index("ix_gateway_files_key_id", "gateway_files", ["key_id", "created_at"])
    op.create_table(
        "gateway_batches",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("endpoint", sa.String(40), nullable=False),
        sa.Column("input_file_id", sa.String(40), nullable=False),
        sa.Column("completion_window", sa.String(10), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("output_file_id", sa.String(40), nullable=True),
        sa.Column("error_file_id", sa.String(40), nullable=True),
        _time("created_at", nullable=False),
        _time("expires_at", nullable=False),
        *(
            _time(f"{state}_at")
            for state in (
                "in_progress",
                "finalizing",
                "completed",
                "failed",
                "expired",
                "cancelling",
                "cancelled",
            )
        ),
    )
    op.create_index("ix_gateway_batches_key_id", "gateway_batches", ["key_id", "created_at"])
    op.create_index("ix_gateway_batches_status", "gateway_batches", ["status"])
    op.create_table(
        "gateway_batch_lines",
        sa.Column("batch_id", sa.String(40), nullable=False),
        sa.Column("line_no", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(512), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        _time("not_before"),
        sa.Column("lease_owner", sa.String(40), nullable=True),
        _time("lease_expires"),
        sa.Column("request_id", sa.String(40), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("error_code", sa.String(40), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        _time("finished_at"),
        sa.PrimaryKeyConstraint("batch_id", "line_no"),
    )
    op.create_index("ix_gateway_batch_lines_state", "gateway_batch_lines", ["state", "batch_id"])
    op.create_table(
        "gateway_batch_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("batch_id", sa.String(40), nullable=False),
        _time("at", nullable=False),
        sa.Column("event", sa.String(20), nullable=False),
        sa.Column("line_no", sa.Integer(), nullable=True),
        sa.Column("custom_id", sa.String(512), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
    )
    op.create_index("ix_gateway_batch_events_batch", "gateway_batch_events", ["batch_id", "id"])


def downgrade() -> None:
    """Not supported: restore the backup taken before upgrading (docs/operations.md)."""
    raise NotImplementedError("the gateway's migrations do not downgrade; restore a backup")

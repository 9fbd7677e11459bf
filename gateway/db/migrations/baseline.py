"""The key table as the last release before migrations (0.1, commit ba74001) created it.

Revision `0001` creates the table from these columns, and `gateway.db.migrate` completes a
table made by that release or an earlier one to this shape before stamping it `0001`. Frozen:
the table's later changes are revisions of their own, never edits here.
"""

from __future__ import annotations

import sqlalchemy as sa

API_KEYS = "gateway_api_keys"


def api_key_columns() -> list[sa.Column[object]]:
    """New `Column` objects for the key table at revision `0001` (a column joins one table only)."""
    return [
        sa.Column("id", sa.String(32), primary_key=True, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("models", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        # Added by releases after the first one; a table from before them gets them as NULLs.
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("manage_models", sa.Boolean(), nullable=True),
    ]

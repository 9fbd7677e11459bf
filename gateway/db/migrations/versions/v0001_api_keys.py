"""The key table, exactly as release 0.1 (commit ba74001) created it.

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

from alembic import op

from gateway.db.migrations.baseline import API_KEYS, api_key_columns

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create `gateway_api_keys`."""
    op.create_table(API_KEYS, *api_key_columns())


def downgrade() -> None:
    """Not supported: restore the backup taken before upgrading (docs/operations.md)."""
    raise NotImplementedError("the gateway's migrations do not downgrade; restore a backup")

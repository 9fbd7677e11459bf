"""Issue 13: rotation with a grace period, usage accounting, and an append-only audit trail.

Revision ID: 0002
Revises: 0001

- `gateway_api_keys` gains `previous_secret_hash` and `previous_secret_expires_at` (nullable:
  existing keys have no previous secret).
- `gateway_usage`: per key, model and UTC day, what the key used.
- `gateway_audit`: one row per admin action. The database itself refuses to change or remove a
  row (triggers: UPDATE and DELETE on both dialects, TRUNCATE on PostgreSQL), so a bug or a
  stray statement cannot rewrite the trail; only the tables' owner, by dropping the trigger, can.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_APPEND_ONLY = "gateway_audit is append-only"

_POSTGRESQL_TRIGGERS = (
    f"""
    CREATE FUNCTION gateway_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{_APPEND_ONLY}: % refused', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END
    $$
    """,
    """
    CREATE TRIGGER gateway_audit_append_only BEFORE UPDATE OR DELETE ON gateway_audit
    FOR EACH ROW EXECUTE FUNCTION gateway_audit_append_only()
    """,
    """
    CREATE TRIGGER gateway_audit_no_truncate BEFORE TRUNCATE ON gateway_audit
    FOR EACH STATEMENT EXECUTE FUNCTION gateway_audit_append_only()
    """,
)

_SQLITE_TRIGGERS = tuple(
    f"""
    CREATE TRIGGER gateway_audit_no_{verb.lower()} BEFORE {verb} ON gateway_audit
    BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY}: {verb} refused'); END
    """
    for verb in ("UPDATE", "DELETE")
)


def upgrade() -> None:
    """Add the rotation columns, the usage and audit tables, and the audit triggers."""
    with op.batch_alter_table("gateway_api_keys") as keys:
        keys.add_column(sa.Column("previous_secret_hash", sa.String(64), nullable=True))
        keys.add_column(
            sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True)
        )

    op.create_table(
        "gateway_usage",
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        *(
            sa.Column(name, sa.BigInteger(), nullable=False)
            for name in (
                "requests",
                "errors",
                "input_tokens",
                "output_tokens",
                "ttft_count",
                "ttft_us_sum",
                "generation_us_sum",
            )
        ),
        sa.PrimaryKeyConstraint("key_id", "model", "day"),
    )
    op.create_index("ix_gateway_usage_day", "gateway_usage", ["day"])

    op.create_table(
        "gateway_audit",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(40), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("source", sa.String(100), nullable=True),
        sa.Column("changes", sa.JSON(), nullable=True),
    )
    op.create_index("ix_gateway_audit_at", "gateway_audit", ["at"])
    op.create_index("ix_gateway_audit_key_id", "gateway_audit", ["key_id"])

    dialect = op.get_bind().dialect.name
    triggers = {"postgresql": _POSTGRESQL_TRIGGERS, "sqlite": _SQLITE_TRIGGERS}.get(dialect, ())
    for statement in triggers:
        op.execute(statement)


def downgrade() -> None:
    """Not supported: restore the backup taken before upgrading (docs/operations.md)."""
    raise NotImplementedError("the gateway's migrations do not downgrade; restore a backup")

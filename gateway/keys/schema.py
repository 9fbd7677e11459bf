"""What the gateway knows about an API key (`KeyRecord`), read from its row in `gateway.db.tables`.

Only `gateway.keys.store` reads and writes the key table; the rest of the gateway sees
`KeyRecord` (imported from `gateway.keys.store`).

`create_schema` creates the table, and adds the nullable columns that a table created by an older
gateway lacks, so a new column needs no manual migration as long as it is nullable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import anyio
from sqlalchemy import Table, inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import CreateColumn

from gateway.db.tables import ApiKeyRow, Base, UTCDateTime, as_utc

__all__ = [
    "ApiKeyRow",
    "KeyRecord",
    "KeyStatus",
    "UTCDateTime",
    "as_utc",
    "create_schema",
    "to_record",
]

KeyStatus = Literal["active", "revoked", "expired"]

# PostgreSQL advisory lock id that serialises `create_schema` across processes ("gw_keys").
_SCHEMA_LOCK_ID = 0x67775F6B657973
#: Tries of the schema change when another process changes the table at the same time.
_SCHEMA_ATTEMPTS = 5


async def create_schema(engine: AsyncEngine) -> None:
    """Create the key table if it is missing, and add the columns an older gateway did not have.

    `create_all` creates a missing table but never alters an existing one, so the columns it
    lacks are then added with `ALTER TABLE ... ADD COLUMN` (SQLite and PostgreSQL). Existing rows
    get NULL there, which is why only nullable columns qualify. Safe when replicas start at once:
    on PostgreSQL an advisory lock serialises the check-then-change; if another process still
    wins the race (SQLite), the change is retried until the table is seen complete.

    Raises:
        sqlalchemy.exc.DBAPIError: if the table cannot be created or completed.
        RuntimeError: if the table exists but lacks a NOT NULL column (that needs a hand-written
            migration, since existing rows have no value for it).
    """
    # Another process may be changing the table at the same moment (SQLite has no advisory
    # lock): its change makes ours fail, so look again, a few times, until the table is complete.
    for attempt in range(_SCHEMA_ATTEMPTS):
        try:
            async with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    lock = text("SELECT pg_advisory_xact_lock(:lock_id)")
                    await conn.execute(lock, {"lock_id": _SCHEMA_LOCK_ID})
                await conn.run_sync(Base.metadata.create_all)
                await conn.run_sync(_add_missing_columns)
            return
        except DBAPIError:
            async with engine.connect() as conn:
                missing = await conn.run_sync(_missing_columns)
            if not missing:
                return
            if attempt == _SCHEMA_ATTEMPTS - 1:
                raise
            await anyio.sleep(0.05 * (attempt + 1))


def _missing_columns(conn: Connection) -> list[str]:
    """Names of the declared columns the database's key table lacks; all of them without a table."""
    table = _key_table()
    inspector = inspect(conn)
    if not inspector.has_table(table.name):
        return [column.name for column in table.columns]
    present = {column["name"] for column in inspector.get_columns(table.name)}
    return [column.name for column in table.columns if column.name not in present]


def _add_missing_columns(conn: Connection) -> None:
    """Add the existing key table's missing columns (see `create_schema`)."""
    table = _key_table()
    missing = [table.columns[name] for name in _missing_columns(conn)]
    required = [column.name for column in missing if not column.nullable]
    if required:
        raise RuntimeError(
            f"table {table.name} lacks NOT NULL column(s) {', '.join(required)}: migrate it by hand"
        )
    quoted_table = conn.dialect.identifier_preparer.format_table(table)
    for column in missing:
        # Identifiers come from our own metadata, quoted by the dialect; nothing user-supplied.
        definition = CreateColumn(column).compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE {quoted_table} ADD COLUMN {definition}"))


def _key_table() -> Table:
    return Base.metadata.tables[ApiKeyRow.__tablename__]


def _canonical_model(model: str) -> str:
    """Ollama treats `name` and `name:latest` as the same model."""
    return model.removesuffix(":latest")


@dataclass(frozen=True)
class KeyRecord:
    """What the gateway knows about a key, without its secret. Times are aware UTC datetimes."""

    id: str
    name: str
    models: tuple[str, ...] | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    rpm: int | None = None
    """Requests per minute: None = the gateway's default (settings), 0 = unlimited."""
    tpm: int | None = None
    """Tokens (prompt + output) per minute: None = the gateway's default, 0 = unlimited."""
    max_concurrent: int | None = None
    """Requests in flight at once: None = the gateway's default, 0 = unlimited."""
    manage_models: bool = False
    """Whether the gateway relays Ollama's model-management endpoints for this key (a stored
    NULL reads as False)."""
    rotation_grace_until: datetime | None = None
    """Until when the secret from before the last rotation still opens the key; None if not."""

    def allows_model(self, model: str) -> bool:
        """Whether this key may use `model`.

        Args:
            model: The model name from the request, for example `llama3.2:1b`.

        Returns:
            True when the key has no allow-list (None), or the name is on it. Names compare
            exactly, except that `name` and `name:latest` are the same model.
        """
        if self.models is None:
            return True
        wanted = _canonical_model(model)
        return any(_canonical_model(allowed) == wanted for allowed in self.models)

    def status(self, now: datetime | None = None) -> KeyStatus:
        """The key's state as of `now` (aware; default: now).

        Returns:
            `revoked`, else `expired` (at or after `expires_at`), else `active`.

        Raises:
            ValueError: if `now` is naive.
        """
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= as_utc(now):
            return "expired"
        return "active"


def to_record(row: ApiKeyRow) -> KeyRecord:
    """The immutable, secret-free view of a key's row."""
    return KeyRecord(
        id=row.id,
        name=row.name,
        models=None if row.models is None else tuple(row.models),
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
        rpm=row.rpm,
        tpm=row.tpm,
        max_concurrent=row.max_concurrent,
        manage_models=bool(row.manage_models),
        rotation_grace_until=row.previous_secret_expires_at,
    )

"""The stored shape of an API key: the `gateway_api_keys` table and the `KeyRecord` read from it.

The table is declared once for SQLite and PostgreSQL alike, and only `gateway.keys.store` reads
and writes it; the rest of the gateway sees `KeyRecord` (imported from `gateway.keys.store`).
Times are UTC: `UTCDateTime` converts on the way in and makes every value read back
timezone-aware, because SQLite keeps no zone and returns naive datetimes.

`create_schema` creates the table, and adds the nullable columns that a table created by an older
gateway lacks, so a new column needs no manual migration as long as it is nullable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import anyio
from sqlalchemy import JSON, Boolean, DateTime, Integer, String, Table, inspect, text
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.schema import CreateColumn
from sqlalchemy.types import TypeDecorator

KeyStatus = Literal["active", "revoked", "expired"]

# PostgreSQL advisory lock id that serialises `create_schema` across processes ("gw_keys").
_SCHEMA_LOCK_ID = 0x67775F6B657973
#: Tries of the schema change when another process changes the table at the same time.
_SCHEMA_ATTEMPTS = 5


def as_utc(moment: datetime | None) -> datetime:
    """Return `moment` (default: now) as an aware UTC datetime.

    Raises:
        ValueError: if `moment` is naive, since its zone would be a guess.
    """
    if moment is None:
        return datetime.now(UTC)
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment!r}: pass a timezone-aware one")
    return moment.astimezone(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """`DateTime(timezone=True)` that accepts only aware datetimes and returns UTC-aware ones.

    On SQLite the value is stored as UTC text with microseconds (a fixed-width format, so SQL
    comparisons such as `last_used_at <= :cutoff` order correctly); on PostgreSQL as `timestamptz`.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(
        self,
        value: datetime | None,
        dialect: Dialect,  # noqa: ARG002 (SQLAlchemy's signature)
    ) -> datetime | None:
        """Convert an aware datetime to UTC before it is stored.

        Raises:
            ValueError: if `value` is naive.
        """
        return None if value is None else as_utc(value)

    def process_result_value(
        self,
        value: datetime | None,
        dialect: Dialect,  # noqa: ARG002 (SQLAlchemy's signature)
    ) -> datetime | None:
        """Return the stored time as an aware UTC datetime (SQLite's are naive, and UTC)."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base whose metadata holds the key store's tables."""


class ApiKeyRow(Base):
    """One API key. The secret itself is never stored, only `sha256(secret)` as hex."""

    __tablename__ = "gateway_api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    secret_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    # A JSON list of model names; SQL NULL (not JSON `null`) means every model.
    models: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Per-key limits: NULL = the gateway's default (settings), 0 = unlimited, n > 0 = the limit.
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # May the key use Ollama's model-management endpoints (pull, push, create, copy, delete,
    # blobs)? NULL = no: nullable so that `create_schema` can add it to an older table, whose
    # keys then stay ordinary keys.
    manage_models: Mapped[bool | None] = mapped_column(Boolean, nullable=True)

    def to_record(self) -> KeyRecord:
        """The immutable, secret-free view of this row."""
        return KeyRecord(
            id=self.id,
            name=self.name,
            models=None if self.models is None else tuple(self.models),
            created_at=self.created_at,
            expires_at=self.expires_at,
            revoked_at=self.revoked_at,
            last_used_at=self.last_used_at,
            rpm=self.rpm,
            tpm=self.tpm,
            max_concurrent=self.max_concurrent,
            manage_models=bool(self.manage_models),
        )


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

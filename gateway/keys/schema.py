"""The stored shape of an API key: the `gateway_api_keys` table and the `KeyRecord` read from it.

The table is declared once for SQLite and PostgreSQL alike, and only `gateway.keys.store` reads
and writes it; the rest of the gateway sees `KeyRecord` (imported from `gateway.keys.store`).
Times are UTC: `UTCDateTime` converts on the way in and makes every value read back
timezone-aware, because SQLite keeps no zone and returns naive datetimes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import JSON, DateTime, String
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

KeyStatus = Literal["active", "revoked", "expired"]


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
        )


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

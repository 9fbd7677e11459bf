"""The API key store: create, list, revoke, rotate and authenticate keys on SQLAlchemy async.

The same code runs on SQLite (one machine) and PostgreSQL (shared by replicas). Only
`sha256(secret)` is stored; a full key exists in memory once, when it is created or rotated, and is
never logged. Errors: `KeyNotFoundError` (admin operation on an unknown id) and `InvalidKeyError`
(a presented key cannot be used). The table lives in `gateway.keys.schema`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import or_, select, text, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from gateway.auth.apikey import KEY_PREFIX, generate_key, hash_secret, parse_key, secret_matches
from gateway.keys.schema import ApiKeyRow, Base, KeyRecord, KeyStatus, as_utc

__all__ = [
    "InvalidKeyError",
    "InvalidKeyReason",
    "KeyNotFoundError",
    "KeyRecord",
    "KeyStatus",
    "KeyStore",
]

InvalidKeyReason = Literal["malformed", "unknown", "revoked", "expired"]

# Compared against when the presented id is unknown, so that a miss costs the same hash and
# compare as a hit and response time does not reveal which ids exist.
_DUMMY_HASH = hash_secret("gateway-dummy-secret")
# PostgreSQL advisory lock id that serialises `create_schema` across processes ("gw_keys").
_SCHEMA_LOCK_ID = 0x67775F6B657973


class KeyNotFoundError(LookupError):
    """No key has this id (raised by admin operations: get, revoke, rotate)."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"no API key with id {key_id!r}")
        self.key_id = key_id


class InvalidKeyError(Exception):
    """A presented key cannot be used.

    Attributes:
        reason: `malformed` (not `gw_<id>_<secret>`), `unknown` (no such id, or a wrong secret:
            the two are deliberately indistinguishable), `revoked`, or `expired`.
        message: A sentence safe to show the client.
    """

    def __init__(self, reason: InvalidKeyReason) -> None:
        if reason == "revoked":
            message = "API key has been revoked"
        elif reason == "expired":
            message = "API key has expired"
        else:
            message = "invalid API key"
        super().__init__(message)
        self.reason: InvalidKeyReason = reason
        self.message = message


def _has_key_table(conn: Connection) -> bool:
    return conn.dialect.has_table(conn, ApiKeyRow.__tablename__)


class KeyStore:
    """API keys in a SQL database, reached through one `AsyncEngine`.

    Build it with `KeyStore.from_url(settings.database_url)`, call `create_schema()` once at
    startup, and `close()` at shutdown.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def from_url(cls, url: str, **engine_options: Any) -> KeyStore:
        """Open a store on an SQLAlchemy async URL.

        Args:
            url: For example `sqlite+aiosqlite:///./gateway.db` or
                `postgresql+asyncpg://gateway@db/gateway`.
            **engine_options: Extra `create_async_engine` arguments; they replace the defaults
                (PostgreSQL: `pool_pre_ping`, so connections dropped by a failover are replaced;
                SQLite: a 30 s wait for the file lock, as the CLI and the server may write at once).

        Returns:
            A store owning a new engine; `close()` disposes of it.
        """
        parsed = make_url(url)
        options: dict[str, Any] = {}
        if parsed.get_backend_name() == "postgresql":
            options["pool_pre_ping"] = True
        elif parsed.get_backend_name() == "sqlite":
            options["connect_args"] = {"timeout": 30.0}
        options.update(engine_options)
        return cls(create_async_engine(parsed, **options))

    async def create_schema(self) -> None:
        """Create the table if it is missing. Idempotent.

        Safe when replicas start at once: on PostgreSQL an advisory lock serialises the
        check-then-create; if another process still wins the race, the error is ignored once the
        table is seen to exist.

        Raises:
            sqlalchemy.exc.DBAPIError: if the table cannot be created and does not exist.
        """
        try:
            async with self._engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    lock = text("SELECT pg_advisory_xact_lock(:lock_id)")
                    await conn.execute(lock, {"lock_id": _SCHEMA_LOCK_ID})
                await conn.run_sync(Base.metadata.create_all)
        except DBAPIError:
            async with self._engine.connect() as conn:
                exists = await conn.run_sync(_has_key_table)
            if not exists:
                raise

    async def warm_up(self) -> None:
        """Open a pooled connection and compile the lookup, so the first request is not slower."""
        async with self._sessions() as session:
            await session.get(ApiKeyRow, "warm-up")

    async def close(self) -> None:
        """Close every pooled connection (dispose of the engine)."""
        await self._engine.dispose()

    async def create_key(
        self,
        name: str,
        *,
        models: Sequence[str] | None = None,
        expires_at: datetime | None = None,
    ) -> tuple[KeyRecord, str]:
        """Create a key.

        Args:
            name: Who or what the key is for; 1 to 200 characters, need not be unique.
            models: The models the key may use; None for all of them.
            expires_at: When the key stops working (timezone-aware); None for never.

        Returns:
            The new record, and the full key `gw_<id>_<secret>`. The key cannot be recovered
            later: only its hash is stored.

        Raises:
            ValueError: on an empty or too long name, an empty `models` list (use None for all
                models), or a naive `expires_at`.
        """
        if not name.strip() or len(name) > 200:
            raise ValueError("key name must be 1 to 200 characters")
        if isinstance(models, str):
            raise ValueError("models must be a sequence of names, not a string")
        if models is not None and not models:
            raise ValueError("models must be None (all models) or a non-empty list")
        allowed = None if models is None else list(dict.fromkeys(models))
        key_id, secret, full_key = generate_key()
        row = ApiKeyRow(
            id=key_id,
            name=name,
            secret_hash=hash_secret(secret),
            models=allowed,
            created_at=as_utc(None),
            expires_at=None if expires_at is None else as_utc(expires_at),
        )
        async with self._sessions.begin() as session:
            session.add(row)
        return row.to_record(), full_key

    async def list_keys(self) -> list[KeyRecord]:
        """Return every key, oldest first, revoked and expired ones included."""
        async with self._sessions() as session:
            rows = await session.scalars(
                select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
            )
            return [row.to_record() for row in rows]

    async def get_key(self, key_id: str) -> KeyRecord:
        """Return one key.

        Raises:
            KeyNotFoundError: if no key has this id.
        """
        async with self._sessions() as session:
            row = await session.get(ApiKeyRow, key_id)
            if row is None:
                raise KeyNotFoundError(key_id)
            return row.to_record()

    async def revoke(self, key_id: str) -> KeyRecord:
        """Revoke a key for good. Revoking a revoked key keeps its first `revoked_at`.

        Returns:
            The record with `revoked_at` set.

        Raises:
            KeyNotFoundError: if no key has this id.
        """
        revoke = (
            update(ApiKeyRow)
            .where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None))
            .values(revoked_at=as_utc(None))
            .execution_options(synchronize_session=False)
        )
        async with self._sessions.begin() as session:
            await session.execute(revoke)
            row = await session.get(ApiKeyRow, key_id)
            if row is None:
                raise KeyNotFoundError(key_id)
            return row.to_record()

    async def rotate(self, key_id: str) -> tuple[KeyRecord, str]:
        """Give a key a new secret; the old secret stops working at once. The id stays.

        Returns:
            The record, and the new full key (shown once).

        Raises:
            KeyNotFoundError: if no key has this id.
            InvalidKeyError: with reason `revoked` if the key is revoked.
        """
        _, secret, _ = generate_key()
        # Conditional UPDATE first: it locks the row on PostgreSQL, so a concurrent revoke cannot
        # slip between the check and the write; the SELECT after it tells why nothing matched.
        rotate = (
            update(ApiKeyRow)
            .where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None))
            .values(secret_hash=hash_secret(secret))
            .execution_options(synchronize_session=False)
        )
        async with self._sessions.begin() as session:
            await session.execute(rotate)
            row = await session.get(ApiKeyRow, key_id)
            if row is None:
                raise KeyNotFoundError(key_id)
            if row.revoked_at is not None:
                raise InvalidKeyError("revoked")
            return row.to_record(), f"{KEY_PREFIX}{key_id}_{secret}"

    async def authenticate(self, presented: str, *, now: datetime | None = None) -> KeyRecord:
        """Check a presented key and return its record.

        The secret is checked before anything else about the key is revealed, so only a holder of
        the right secret can learn that a key is revoked or expired.

        Args:
            presented: The credential as sent by the client.
            now: The time to check expiry against (aware); default: now.

        Returns:
            The key's record.

        Raises:
            InvalidKeyError: `malformed`, `unknown` (no such id or wrong secret), `revoked`, or
                `expired` (at or after `expires_at`); revoked wins over expired.
            ValueError: if `now` is naive.
        """
        moment = as_utc(now)
        parsed = parse_key(presented)
        if parsed is None:
            raise InvalidKeyError("malformed")
        key_id, secret = parsed
        async with self._sessions() as session:
            row = await session.get(ApiKeyRow, key_id)
            if row is None:
                secret_matches(secret, _DUMMY_HASH)
                raise InvalidKeyError("unknown")
            if not secret_matches(secret, row.secret_hash):
                raise InvalidKeyError("unknown")
            record = row.to_record()
        status = record.status(moment)
        if status != "active":
            raise InvalidKeyError(status)
        return record

    async def touch(
        self, key_id: str, *, now: datetime | None = None, min_interval: float = 60.0
    ) -> None:
        """Record that a key was used, at most once per `min_interval` seconds.

        One conditional UPDATE, so replicas need no coordination and a recent `last_used_at` costs
        no write; it never moves `last_used_at` backwards. An unknown id is ignored.

        Args:
            key_id: The key's id.
            now: The time of use (aware); default: now.
            min_interval: Seconds; skip the write when `last_used_at` is more recent than
                `now - min_interval` (`Settings.last_used_interval`).

        Raises:
            ValueError: on a negative `min_interval` or a naive `now`.
        """
        if min_interval < 0:
            raise ValueError("min_interval must not be negative")
        moment = as_utc(now)
        cutoff = moment - timedelta(seconds=min_interval)
        touch = (
            update(ApiKeyRow)
            .where(
                ApiKeyRow.id == key_id,
                or_(ApiKeyRow.last_used_at.is_(None), ApiKeyRow.last_used_at <= cutoff),
            )
            .values(last_used_at=moment)
            .execution_options(synchronize_session=False)
        )
        async with self._sessions.begin() as session:
            await session.execute(touch)

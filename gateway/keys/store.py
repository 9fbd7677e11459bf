"""The API key store: create, list, revoke, rotate, update and authenticate keys (SQLAlchemy async).

The same code runs on SQLite (one machine) and PostgreSQL (shared by replicas). Only
`sha256(secret)` is stored; a full key exists in memory once, when it is created or rotated, and is
never logged. Errors: `KeyNotFoundError` (admin operation on an unknown id) and `InvalidKeyError`
(a presented key cannot be used), both defined with the rules for field values in
`gateway.keys.validation`. The table lives in `gateway.db.tables`, its record in
`gateway.keys.schema`; `create_schema` runs the migrations (`gateway.db.migrate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from gateway.auth.apikey import KEY_PREFIX, generate_key, hash_secret, parse_key, secret_matches
from gateway.db.engine import open_engine
from gateway.db.migrate import DatabaseState, prepare_database
from gateway.keys.schema import ApiKeyRow, KeyRecord, KeyStatus, as_utc, to_record
from gateway.keys.validation import (
    UNSET,
    InvalidKeyError,
    InvalidKeyReason,
    KeyNotFoundError,
    Unset,
    check_limit,
    check_models,
    check_name,
    check_permission,
    limit_changes,
)

__all__ = [
    "UNSET",
    "InvalidKeyError",
    "InvalidKeyReason",
    "KeyNotFoundError",
    "KeyRecord",
    "KeyStatus",
    "KeyStore",
]

# Compared against when the presented id is unknown, so that a miss costs the same hash and
# compare as a hit and response time does not reveal which ids exist.
_DUMMY_HASH = hash_secret("gateway-dummy-secret")


class KeyStore:
    """API keys in a SQL database, reached through one `AsyncEngine`.

    Build it with `KeyStore.from_url(settings.database_url)`, call
    `create_schema(auto_upgrade=settings.database_auto_upgrade)` once at startup, and `close()`
    at shutdown.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def from_url(cls, url: str, **engine_options: Any) -> KeyStore:
        """Open a store on an SQLAlchemy async URL (`gateway.db.engine.open_engine`).

        Args:
            url: For example `sqlite+aiosqlite:///./gateway.db` or
                `postgresql+asyncpg://gateway@db/gateway`.
            **engine_options: Extra `create_async_engine` arguments; they replace the defaults.

        Returns:
            A store owning a new engine; `close()` disposes of it.
        """
        return cls(open_engine(url, **engine_options))

    async def create_schema(self, *, auto_upgrade: bool = True) -> DatabaseState:
        """Bring the database to this code's schema with its migrations (`prepare_database`).

        Safe when replicas start at once; a database made before migrations is adopted with its
        keys intact.

        Args:
            auto_upgrade: Upgrade a database that is behind (`Settings.database_auto_upgrade`);
                when False, refuse it.

        Returns:
            The database's state before any upgrade.

        Raises:
            gateway.db.migrate.DatabaseNewerError: if the database is newer than this code.
            gateway.db.migrate.DatabaseBehindError: if it is behind and `auto_upgrade` is off.
            gateway.db.migrate.DatabaseSchemaError: if an old key table cannot be adopted.
            sqlalchemy.exc.SQLAlchemyError: if the database refuses.
        """
        return await prepare_database(self._engine, auto_upgrade=auto_upgrade)

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
        rpm: int | None = None,
        tpm: int | None = None,
        max_concurrent: int | None = None,
        manage_models: bool = False,
    ) -> tuple[KeyRecord, str]:
        """Create a key.

        Args:
            name: Who or what the key is for; 1 to 200 characters, need not be unique.
            models: The models the key may use; None for all of them.
            expires_at: When the key stops working (timezone-aware); None for never.
            rpm: Requests per minute. For this and the two limits below: None = the gateway's
                default from settings, 0 = unlimited, a positive integer = that limit.
            tpm: Tokens per minute, prompt plus output tokens.
            max_concurrent: Requests in flight at once.
            manage_models: Whether the gateway relays Ollama's model-management endpoints
                (pull, push, create, copy, delete, blobs) for this key; other keys get 403.

        Returns:
            The new record, and the full key `gw_<id>_<secret>`. The key cannot be recovered
            later: only its hash is stored.

        Raises:
            ValueError: on an empty or too long name, an empty `models` list (use None for all
                models), a naive `expires_at`, a negative (or too large) limit, or a
                `manage_models` that is not a bool.
        """
        key_id, secret, full_key = generate_key()
        row = ApiKeyRow(
            id=key_id,
            name=check_name(name),
            secret_hash=hash_secret(secret),
            models=check_models(models),
            created_at=as_utc(None),
            expires_at=None if expires_at is None else as_utc(expires_at),
            rpm=check_limit("rpm", rpm),
            tpm=check_limit("tpm", tpm),
            max_concurrent=check_limit("max_concurrent", max_concurrent),
            manage_models=check_permission("manage_models", manage_models),
        )
        async with self._sessions.begin() as session:
            session.add(row)
        return to_record(row), full_key

    async def list_keys(self) -> list[KeyRecord]:
        """Return every key, oldest first, revoked and expired ones included."""
        async with self._sessions() as session:
            rows = await session.scalars(
                select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
            )
            return [to_record(row) for row in rows]

    async def get_key(self, key_id: str) -> KeyRecord:
        """Return one key.

        Raises:
            KeyNotFoundError: if no key has this id.
        """
        async with self._sessions() as session:
            row = await session.get(ApiKeyRow, key_id)
            if row is None:
                raise KeyNotFoundError(key_id)
            return to_record(row)

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
            return to_record(row)

    async def update_limits(
        self,
        key_id: str,
        *,
        rpm: int | Unset | None = UNSET,
        tpm: int | Unset | None = UNSET,
        max_concurrent: int | Unset | None = UNSET,
        manage_models: bool | Unset = UNSET,
    ) -> KeyRecord:
        """Change a key's limits and its model-management permission; only what is passed changes.

        One transaction, so that `gateway keys update` applies all its flags or none. Works on
        revoked keys too.

        Args:
            key_id: The key's id.
            rpm: Requests per minute: None = back to the gateway's default, 0 = unlimited, a
                positive integer = that limit; `UNSET` (the default) leaves it as it is.
            tpm: Tokens per minute (prompt plus output), as for `rpm`.
            max_concurrent: Requests in flight at once, as for `rpm`.
            manage_models: True grants the model-management permission, False clears it;
                `UNSET` leaves it as it is.

        Returns:
            The record after the change (unchanged if nothing was passed).

        Raises:
            KeyNotFoundError: if no key has this id.
            ValueError: on a negative (or too large) limit, or a `manage_models` that is not a
                bool; nothing is changed.
        """
        changes = limit_changes(rpm=rpm, tpm=tpm, max_concurrent=max_concurrent)
        if not isinstance(manage_models, Unset):
            changes["manage_models"] = check_permission("manage_models", manage_models)
        async with self._sessions.begin() as session:
            # Row lock on PostgreSQL, so the record returned is the one this update committed.
            row = await session.get(ApiKeyRow, key_id, with_for_update=True)
            if row is None:
                raise KeyNotFoundError(key_id)
            for field, value in changes.items():
                setattr(row, field, value)
        return to_record(row)

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
            return to_record(row), f"{KEY_PREFIX}{key_id}_{secret}"

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
            record = to_record(row)
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

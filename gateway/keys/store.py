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
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gateway.auth.apikey import KEY_PREFIX, generate_key, hash_secret, parse_key, secret_matches
from gateway.db.engine import open_engine
from gateway.db.migrate import DatabaseState, prepare_database
from gateway.keys.audit import INTERNAL, Actor, AuditEntry, add_entry, list_entries, record_changes
from gateway.keys.schema import ApiKeyRow, KeyRecord, KeyStatus, as_utc, to_record
from gateway.keys.validation import (
    UNSET,
    InvalidKeyError,
    InvalidKeyReason,
    KeyNotFoundError,
    Unset,
    check_expiry,
    check_grace,
    check_limit,
    check_models,
    check_name,
    check_permission,
    limit_changes,
)

__all__ = [
    "INTERNAL",
    "UNSET",
    "Actor",
    "AuditEntry",
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

    @property
    def engine(self) -> AsyncEngine:
        """The store's engine, shared with what keeps other tables in the same database (usage)."""
        return self._engine

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
        actor: Actor = INTERNAL,
    ) -> tuple[KeyRecord, str]:
        """Create a key, and record the action in the audit trail (one transaction).

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
            actor: Who creates it (`Actor.cli()`, or the admin token's subject).

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
            expires_at=check_expiry(expires_at),
            rpm=check_limit("rpm", rpm),
            tpm=check_limit("tpm", tpm),
            max_concurrent=check_limit("max_concurrent", max_concurrent),
            manage_models=check_permission("manage_models", manage_models),
        )
        record = to_record(row)
        async with self._sessions.begin() as session:
            session.add(row)
            add_entry(session, actor, "create", key_id, record_changes(None, record))
        return record, full_key

    async def list_keys(
        self,
        *,
        status: KeyStatus | None = None,
        name: str | None = None,
        model: str | None = None,
        after: tuple[datetime, str] | None = None,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> list[KeyRecord]:
        """Return keys oldest first (revoked and expired ones included unless filtered out).

        Args:
            status: Only keys in this state as of `now`.
            name: Only keys whose name contains this text (case-insensitive).
            model: Only keys that may use this model (`KeyRecord.allows_model`: keys without
                an allow-list included).
            after: Only keys after this `(created_at, id)` in the order (the previous page's
                last key).
            limit: At most this many (1 or more); None for all.
            now: The time `status` is judged at (aware); default: now.

        Raises:
            ValueError: on a `limit` below 1 or a naive `now`.
        """
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        moment = as_utc(now)
        query = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
        if status == "revoked":
            query = query.where(ApiKeyRow.revoked_at.is_not(None))
        elif status == "expired":
            query = query.where(ApiKeyRow.revoked_at.is_(None), ApiKeyRow.expires_at <= moment)
        elif status == "active":
            query = query.where(
                ApiKeyRow.revoked_at.is_(None),
                or_(ApiKeyRow.expires_at.is_(None), ApiKeyRow.expires_at > moment),
            )
        if name:
            escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            query = query.where(ApiKeyRow.name.ilike(f"%{escaped}%", escape="\\"))
        if after is not None:
            created_at, key_id = as_utc(after[0]), after[1]
            query = query.where(
                or_(
                    ApiKeyRow.created_at > created_at,
                    and_(ApiKeyRow.created_at == created_at, ApiKeyRow.id > key_id),
                )
            )
        records: list[KeyRecord] = []
        async with self._sessions() as session:
            # The allow-list is a JSON column, so the model filter runs here, on the stream of
            # rows, and stops reading once the page is full.
            async for row in await session.stream_scalars(query.execution_options(yield_per=200)):
                record = to_record(row)
                if model is not None and not record.allows_model(model):
                    continue
                records.append(record)
                if limit is not None and len(records) >= limit:
                    break
        return records

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

    async def revoke(self, key_id: str, *, actor: Actor = INTERNAL) -> KeyRecord:
        """Revoke a key for good. Revoking a revoked key keeps its first `revoked_at`.

        The action is audited in the same transaction (a repeated revoke with no changes).

        Returns:
            The record with `revoked_at` set.

        Raises:
            KeyNotFoundError: if no key has this id.
        """
        async with self._sessions.begin() as session:
            row = await _locked(session, key_id)
            if row is None:
                raise KeyNotFoundError(key_id)
            before = to_record(row)
            if row.revoked_at is None:
                row.revoked_at = as_utc(None)
                row.previous_secret_hash = None
                row.previous_secret_expires_at = None
            after = to_record(row)
            add_entry(session, actor, "revoke", key_id, record_changes(before, after))
        return after

    async def update(
        self,
        key_id: str,
        *,
        name: str | Unset = UNSET,
        models: Sequence[str] | Unset | None = UNSET,
        expires_at: datetime | Unset | None = UNSET,
        rpm: int | Unset | None = UNSET,
        tpm: int | Unset | None = UNSET,
        max_concurrent: int | Unset | None = UNSET,
        manage_models: bool | Unset = UNSET,
        actor: Actor = INTERNAL,
    ) -> KeyRecord:
        """Change a key's fields; only what is passed changes (`UNSET`, the default, leaves one).

        One transaction with its audit entry, so that `gateway keys update` and a `PATCH`
        apply all their fields or none. Works on revoked keys too (a revoked key stays revoked).

        Args:
            key_id: The key's id.
            name: The new name (as for `create_key`).
            models: The new allow-list; None = every model.
            expires_at: The new expiry (aware); None = never.
            rpm: Requests per minute: None = back to the gateway's default, 0 = unlimited, a
                positive integer = that limit.
            tpm: Tokens per minute (prompt plus output), as for `rpm`.
            max_concurrent: Requests in flight at once, as for `rpm`.
            manage_models: True grants the model-management permission, False clears it.
            actor: Who changes it.

        Returns:
            The record after the change (unchanged if nothing was passed).

        Raises:
            KeyNotFoundError: if no key has this id.
            ValueError: on any invalid value (see `create_key`); nothing is changed.
        """
        changes: dict[str, Any] = dict(
            limit_changes(rpm=rpm, tpm=tpm, max_concurrent=max_concurrent)
        )
        if not isinstance(name, Unset):
            changes["name"] = check_name(name)
        if not isinstance(models, Unset):
            changes["models"] = check_models(models)
        if not isinstance(expires_at, Unset):
            changes["expires_at"] = check_expiry(expires_at)
        if not isinstance(manage_models, Unset):
            changes["manage_models"] = check_permission("manage_models", manage_models)
        async with self._sessions.begin() as session:
            row = await _locked(session, key_id)
            if row is None:
                raise KeyNotFoundError(key_id)
            before = to_record(row)
            for field, value in changes.items():
                setattr(row, field, value)
            after = to_record(row)
            add_entry(session, actor, "update", key_id, record_changes(before, after))
        return after

    async def update_limits(
        self,
        key_id: str,
        *,
        rpm: int | Unset | None = UNSET,
        tpm: int | Unset | None = UNSET,
        max_concurrent: int | Unset | None = UNSET,
        manage_models: bool | Unset = UNSET,
        actor: Actor = INTERNAL,
    ) -> KeyRecord:
        """`update` restricted to the limits and the permission (kept for existing callers)."""
        return await self.update(
            key_id,
            rpm=rpm,
            tpm=tpm,
            max_concurrent=max_concurrent,
            manage_models=manage_models,
            actor=actor,
        )

    async def rotate(
        self,
        key_id: str,
        *,
        grace: timedelta = timedelta(0),
        actor: Actor = INTERNAL,
        now: datetime | None = None,
    ) -> tuple[KeyRecord, str]:
        """Give a key a new secret. The id stays; the action is audited (never the secrets).

        With a grace period the old secret keeps working until `now + grace`, so apps can be
        moved to the new key without an outage; then it is refused. Only one old secret is
        kept: rotating again during a grace period ends the first old secret at once and
        starts a new grace period for the secret just replaced.

        Args:
            key_id: The key's id.
            grace: How long the old secret stays valid, 0 (the default: refused at once) to 30
                days (`check_grace`).
            actor: Who rotates it.
            now: The start of the grace period (aware); default: now.

        Returns:
            The record, and the new full key (shown once).

        Raises:
            KeyNotFoundError: if no key has this id.
            InvalidKeyError: with reason `revoked` if the key is revoked.
            ValueError: on a negative or too long `grace`, or a naive `now`.
        """
        grace = check_grace(grace)
        moment = as_utc(now)
        _, secret, _ = generate_key()
        async with self._sessions.begin() as session:
            row = await _locked(session, key_id)
            if row is None:
                raise KeyNotFoundError(key_id)
            if row.revoked_at is not None:
                raise InvalidKeyError("revoked")
            before = to_record(row)
            if grace:
                row.previous_secret_hash = row.secret_hash
                row.previous_secret_expires_at = moment + grace
            else:
                row.previous_secret_hash = None
                row.previous_secret_expires_at = None
            row.secret_hash = hash_secret(secret)
            after = to_record(row)
            add_entry(session, actor, "rotate", key_id, record_changes(before, after))
        return after, f"{KEY_PREFIX}{key_id}_{secret}"

    async def list_audit(
        self,
        *,
        key_id: str | None = None,
        actor: str | None = None,
        actions: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after_id: int | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """Return audit entries, oldest first; see `gateway.keys.audit.list_entries`.

        Raises:
            ValueError: on a `limit` out of range or a naive time.
        """
        async with self._sessions() as session:
            return await list_entries(
                session,
                key_id=key_id,
                actor=actor,
                actions=actions,
                since=since,
                until=until,
                after_id=after_id,
                limit=limit,
            )

    async def authenticate(self, presented: str, *, now: datetime | None = None) -> KeyRecord:
        """Check a presented key and return its record.

        The secret is checked before anything else about the key is revealed, so only a holder of
        the right secret can learn that a key is revoked or expired. Both the current secret and
        the one from before a rotation are compared, every time, so timing does not tell whether
        a key is in a grace period.

        Args:
            presented: The credential as sent by the client.
            now: The time to check expiry against (aware); default: now.

        Returns:
            The key's record. When the old secret of a rotation opened it, `expires_at` is the
            earlier of the key's expiry and the end of the grace period: the credential's own
            expiry, which is what callers caching the result must honour.

        Raises:
            InvalidKeyError: `malformed`, `unknown` (no such id, wrong secret, or an old secret
                whose grace period ended), `revoked`, or `expired` (at or after `expires_at`);
                revoked wins over expired.
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
                secret_matches(secret, _DUMMY_HASH)
                raise InvalidKeyError("unknown")
            current = secret_matches(secret, row.secret_hash)
            previous = secret_matches(secret, row.previous_secret_hash or _DUMMY_HASH)
            record = to_record(row)
        if not current:
            grace_until = record.rotation_grace_until
            if not previous or grace_until is None or grace_until <= moment:
                raise InvalidKeyError("unknown")
            if record.expires_at is None or grace_until < record.expires_at:
                record = replace(record, expires_at=grace_until)
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


async def _locked(session: AsyncSession, key_id: str) -> ApiKeyRow | None:
    """Lock a key's row for this transaction and read it; None if there is no such key.

    A no-op UPDATE comes first: it takes PostgreSQL's row lock, and SQLite's write lock while
    the transaction has read nothing (a transaction that reads first and writes later can fail
    at once with "database is locked" instead of waiting). So concurrent admin actions on one
    key apply one after the other, and each audit entry's before/after is its own.
    """
    lock = (
        update(ApiKeyRow)
        .where(ApiKeyRow.id == key_id)
        .values(id=ApiKeyRow.id)
        .execution_options(synchronize_session=False)
    )
    await session.execute(lock)
    return await session.get(ApiKeyRow, key_id)

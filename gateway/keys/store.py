"""The API key store: create, list, revoke, rotate, update and authenticate keys (SQLAlchemy async).

The same code runs on SQLite (one machine) and PostgreSQL (shared by replicas). Only
`sha256(secret)` is stored; a full key exists in memory once, when it is created or rotated, and is
never logged. Errors: `KeyNotFoundError` (admin operation on an unknown id) and `InvalidKeyError`
(a presented key cannot be used), both defined with the rules for field values in
`gateway.keys.validation`. The table lives in `gateway.db.tables`, its record in
`gateway.keys.schema`; `create_schema` runs the migrations (`gateway.db.migrate`).

Over ~300 lines for one reason: `KeyStore`'s reads and `authenticate` share the engine, the session
factory and the row-to-record rules, and `authenticate`'s constant-cost lookup (`_STAND_IN`,
`_LOOKUP`) takes about seventy lines of its own; the changes are in `gateway.keys.changes` already.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, exists, literal, or_, select, union_all, update
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from gateway.db.engine import open_engine
from gateway.db.migrate import DatabaseState, prepare_database
from gateway.keys.apikey import hash_secret, parse_key, secret_matches
from gateway.keys.audit import INTERNAL, Actor, AuditEntry, list_entries
from gateway.keys.changes import KeyChanges
from gateway.keys.schema import ApiKeyRow, KeyRecord, KeyStatus, as_utc, may_use, to_record
from gateway.keys.validation import (
    UNSET,
    InvalidKeyError,
    InvalidKeyReason,
    KeyNotFoundError,
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

# Compared against when a key has no secret from before a rotation, and by the stand-in row of
# an unknown id, so that every lookup costs the same two hashes and compares.
_DUMMY_HASH = hash_secret("gateway-dummy-secret")

#: The row an unknown key id is checked against: never a key's id (not 12 hex characters),
#: and every column holding a value of its type, so that decoding it costs what a key's does.
_STAND_IN: dict[str, Any] = {
    **{"id": "-", "name": "unknown", "secret_hash": _DUMMY_HASH, "models": ["-"]},
    **{"created_at": datetime(2000, 1, 1, tzinfo=UTC), "expires_at": None, "revoked_at": None},
    **{"last_used_at": datetime(2000, 1, 1, tzinfo=UTC), "rpm": None, "tpm": None},
    **{"max_concurrent": None, "manage_models": False, "previous_secret_hash": _DUMMY_HASH},
    "previous_secret_expires_at": None,
}
_KEYS = ApiKeyRow.__table__
#: How `authenticate` reads a key: its row, or else (`NOT EXISTS`) the stand-in, so the database
#: returns, the driver decodes and the ORM loads one row whether or not the id exists. A plain
#: lookup returned nothing for an unknown id, and the time a found row took to read, decode and
#: load (50-90 µs over the network) told a client which ids exist.
_LOOKUP = select(ApiKeyRow).from_statement(
    union_all(
        select(_KEYS).where(_KEYS.c.id == bindparam("key_id")),
        select(*(literal(_STAND_IN[c.name], c.type).label(c.name) for c in _KEYS.c)).where(
            ~exists().where(_KEYS.c.id == bindparam("key_id"))
        ),
    )
)


class KeyStore(KeyChanges):
    """API keys in a SQL database, reached through one `AsyncEngine`.

    Reads and authentication are here; the changes (create, update, revoke, rotate, each with
    its audit entry) come from `gateway.keys.changes.KeyChanges`. Build it with
    `KeyStore.from_url(settings.database_url)`, call
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
        if model is not None and (prefilter := may_use(model)) is not None:
            query = query.where(prefilter)  # most keys that may not use it stay in the database
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
            # The allow-list is a JSON column, so the exact model filter runs here, on the
            # stream of rows (`may_use` is coarse), and stops reading once the page is full.
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

    async def names(self, key_ids: Sequence[str]) -> dict[str, str]:
        """Return the names of the keys `key_ids` (one primary-key lookup; unknown ids left out).

        Args:
            key_ids: The ids to name; the caller bounds how many (the admin API's live view
                names at most 100 keys in flight).
        """
        if not key_ids:
            return {}
        query = select(ApiKeyRow.id, ApiKeyRow.name).where(ApiKeyRow.id.in_(list(key_ids)))
        async with self._sessions() as session:
            rows = await session.execute(query)
            return {key_id: name for key_id, name in rows}  # noqa: C416 - rows, not pairs

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
        a key is in a grace period; and an unknown id is checked against a stand-in row read by
        the same query (`_LOOKUP`), so timing does not tell whether an id exists either.

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
            # One row either way: the key's, or the stand-in for an unknown id (_LOOKUP).
            row = (await session.scalars(_LOOKUP, {"key_id": key_id})).one()
            known = row.id == key_id
            # Both digests compared, and the record built, for a miss as for a hit; `known`
            # decides only after, so the stand-in's hashes can never open anything.
            current = secret_matches(secret, row.secret_hash) and known
            previous = secret_matches(secret, row.previous_secret_hash or _DUMMY_HASH) and known
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

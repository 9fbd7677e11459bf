"""The key store's changes: create, update, revoke and rotate, each with its audit entry.

`KeyChanges` holds the admin operations of `gateway.keys.store.KeyStore` (which inherits
them), so that the store module keeps to reading and authenticating. Each operation is one
transaction that checks its values (`gateway.keys.validation`), changes the key's row and adds
the audit entry (`gateway.keys.audit`): the CLI and the admin API call these same methods, and
only the `Actor` they pass differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.keys.apikey import KEY_PREFIX, generate_key, hash_secret
from gateway.keys.audit import INTERNAL, Actor, add_entry, record_changes
from gateway.keys.schema import ApiKeyRow, KeyRecord, as_utc, to_record
from gateway.keys.validation import (
    UNSET,
    InvalidKeyError,
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


class KeyChanges:
    """The admin operations on keys, over the sessions of the store that inherits them."""

    _sessions: async_sessionmaker[AsyncSession]

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
            ValueError: on an empty, too long or unprintable name (`check_name`), an empty,
                too long or unprintable `models` list (`check_models`; None for all models),
                a naive or out-of-range `expires_at`, a negative (or too large) limit, or a
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
            changes = record_changes(before, after)
            # The secret changed; the trail says so, never what it was or is.
            changes["secret"] = {"before": "not recorded", "after": "not recorded"}
            add_entry(session, actor, "rotate", key_id, changes)
        return after, f"{KEY_PREFIX}{key_id}_{secret}"


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

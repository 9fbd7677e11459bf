"""The audit trail: who did what to which key, when and from where (the `gateway_audit` table).

Every key-changing operation of `gateway.keys.store.KeyStore` writes one `AuditRow` in the same
transaction as the change, so the trail and the keys cannot disagree: an action that committed
is in the trail, one that failed is not. The CLI and the admin API reach the store with their own
`Actor`, which is all that differs between the two front ends.

Rows are only inserted, never updated or deleted: nothing in the gateway has such a statement,
and on PostgreSQL a trigger refuses them (`gateway.db.migrations`). `changes` holds, for each
field an action changed, its value before and after, JSON-encoded; never a secret or a hash of
one (a rotation records only that the secret changed, and its grace period).
"""

from __future__ import annotations

import getpass
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final, Literal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.db.tables import AuditRow, as_utc
from gateway.keys.schema import KeyRecord

AuditAction = Literal["create", "update", "revoke", "rotate"]
ACTIONS: Final[tuple[AuditAction, ...]] = ("create", "update", "revoke", "rotate")

#: The longest actor and source recorded (the columns' sizes); longer values are cut.
MAX_ACTOR = 200
MAX_SOURCE = 100
#: Most audit entries one query returns.
MAX_PAGE = 1000

# Fields of a KeyRecord that are not an admin's choice, so not worth a before/after.
_UNAUDITED = frozenset({"id", "created_at", "last_used_at"})


@dataclass(frozen=True, slots=True)
class Actor:
    """Who performs an admin action, as the audit trail names them.

    Attributes:
        subject: `cli:<os user>` for the CLI, the admin token's `sub` for the API (capped at
            200 characters, control characters removed).
        source: The client's address for the API, None for the CLI.
    """

    subject: str
    source: str | None = None

    @classmethod
    def cli(cls) -> Actor:
        """The operating-system user running `gateway keys ...`."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for the uid (a container's arbitrary uid)
            user = "unknown"
        return cls(f"cli:{user}")


#: The actor of changes made by the gateway's own code (tests, fixtures, the demo).
INTERNAL: Final = Actor("gateway")


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of the audit trail.

    Attributes:
        id: Increasing with time of insertion; the pagination cursor.
        at: When the action committed (aware UTC).
        actor: `Actor.subject`.
        action: `create`, `update`, `revoke` or `rotate`.
        key_id: The key acted on.
        source: `Actor.source`.
        changes: Field -> `{"before": ..., "after": ...}` (JSON values), or None.
    """

    id: int
    at: datetime
    actor: str
    action: str
    key_id: str | None
    source: str | None
    changes: Mapping[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        """The entry as a JSON object (the CLI's `--json` and the admin API)."""
        return {
            "id": self.id,
            # As the admin API's JSON writes UTC times, so the two listings are the same.
            "at": self.at.isoformat().replace("+00:00", "Z"),
            "actor": self.actor,
            "action": self.action,
            "key_id": self.key_id,
            "source": self.source,
            "changes": None if self.changes is None else dict(self.changes),
        }


def record_changes(before: KeyRecord | None, after: KeyRecord) -> dict[str, Any]:
    """Field -> `{"before", "after"}` for each admin-set field that differs (all on a create).

    Args:
        before: The record before the action; None for a create (every `before` is None).
        after: The record after it.

    Returns:
        JSON-ready values: times as ISO 8601 strings, model tuples as lists.
    """
    changes: dict[str, Any] = {}
    for field in fields(KeyRecord):
        if field.name in _UNAUDITED:
            continue
        old = None if before is None else getattr(before, field.name)
        new = getattr(after, field.name)
        if before is None or old != new:
            changes[field.name] = {"before": _json_value(old), "after": _json_value(new)}
    return changes


def add_entry(
    session: AsyncSession,
    actor: Actor,
    action: AuditAction,
    key_id: str,
    changes: Mapping[str, Any] | None,
) -> None:
    """Add one audit row to `session`'s transaction (committed, or rolled back, with it)."""
    session.add(
        AuditRow(
            at=as_utc(None),
            actor=_clean(actor.subject, MAX_ACTOR) or "unknown",
            action=action,
            key_id=key_id,
            source=None if actor.source is None else _clean(actor.source, MAX_SOURCE),
            changes=None if not changes else dict(changes),
        )
    )


async def list_entries(
    session: AsyncSession,
    *,
    key_id: str | None = None,
    actor: str | None = None,
    actions: Sequence[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after_id: int | None = None,
    limit: int = 100,
) -> list[AuditEntry]:
    """Return audit entries, oldest first, that match every filter given.

    Args:
        session: An open session on the gateway's database.
        key_id: Only actions on this key.
        actor: Only actions by this actor (exact `Actor.subject`).
        actions: Only these actions.
        since: Only entries at or after this time (aware).
        until: Only entries before this time (aware).
        after_id: Only entries with a larger id (the previous page's last id).
        limit: At most this many, 1 to `MAX_PAGE + 1` (one more than a page: how a caller
            tells whether another page follows).

    Raises:
        ValueError: on a `limit` out of range or a naive time.
    """
    if not 1 <= limit <= MAX_PAGE + 1:
        raise ValueError(f"limit must be 1 to {MAX_PAGE + 1}")
    query = select(AuditRow).order_by(AuditRow.id).limit(limit)
    if key_id is not None:
        query = query.where(AuditRow.key_id == key_id)
    if actor is not None:
        query = query.where(AuditRow.actor == actor)
    if actions is not None:
        query = query.where(AuditRow.action.in_(list(actions)))
    if since is not None:
        query = query.where(AuditRow.at >= as_utc(since))
    if until is not None:
        query = query.where(AuditRow.at < as_utc(until))
    if after_id is not None:
        query = query.where(AuditRow.id > after_id)
    rows = await session.scalars(query)
    return [
        AuditEntry(
            id=row.id,
            at=row.at,
            actor=row.actor,
            action=row.action,
            key_id=row.key_id,
            source=row.source,
            changes=row.changes,
        )
        for row in rows
    ]


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return list(value)
    return value


def _clean(text: str, limit: int) -> str:
    """Drop control characters (a subject is the token's claim) and cap the length."""
    return "".join(char for char in text if char.isprintable())[:limit]

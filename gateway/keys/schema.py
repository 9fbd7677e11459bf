"""What the gateway knows about an API key (`KeyRecord`), read from its row in `gateway.db.tables`.

Only `gateway.keys.store` reads and writes the key table; the rest of the gateway sees
`KeyRecord` (imported from `gateway.keys.store`).

The table is created and upgraded by the migrations in `gateway.db.migrations`
(`KeyStore.create_schema`, `gateway db upgrade`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import ColumnElement, Text, cast, func, or_

from gateway.db.tables import ApiKeyRow, UTCDateTime, as_utc
from gateway.model_names import canonical_model

__all__ = [
    "ApiKeyRow",
    "KeyRecord",
    "KeyStatus",
    "UTCDateTime",
    "as_utc",
    "may_use",
    "to_record",
]

KeyStatus = Literal["active", "revoked", "expired"]


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
            True when the key has no allow-list (None), or the name is on it. Names compare as
            `gateway.model_names.canonical_model` puts them: case-insensitively, and `name`
            is `name:latest` (the rule `Principal.allows_model` applies to requests).
        """
        if self.models is None:
            return True
        wanted = canonical_model(model)
        return any(canonical_model(allowed) == wanted for allowed in self.models)

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


def may_use(model: str) -> ColumnElement[bool] | None:
    r"""A SQL condition that every key allowed `model` meets (`KeyRecord.allows_model`).

    So the database skips the keys whose allow-list cannot hold the model instead of handing
    every row to Python; the caller still applies `allows_model` to the rows it gets. It never
    leaves out a key that may use the model. Allow-lists are JSON text written by `json.dumps`
    (`["a", "b"]`, every non-ASCII character escaped as `\uXXXX`), and a key may use the
    model when some name, trimmed and lower-cased, is its canonical name `W` or, for
    `W = x:latest`, `x`. So a key passes when it has no list, when its list holds `"W"` or
    `"x"` in any case, and, whatever its names, when one of them starts or ends with a space
    (`strip` would trim it) or holds an escaped character (a quote, or a non-ASCII letter:
    Python lower-cases some to ASCII ones, the Kelvin sign to `k`, which SQL's `lower` does
    not).

    Returns:
        The condition, or None when the canonical name is not printable ASCII without `"` and
        `\` (no SQL filter then: Python checks every key).
    """
    wanted = canonical_model(model)
    if not wanted or not all(" " <= c <= "~" and c not in '"\\' for c in wanted):
        return None
    text = cast(ApiKeyRow.models, Text)
    names = {wanted, wanted.removesuffix(":latest")}
    return or_(
        ApiKeyRow.models.is_(None),
        *(func.lower(text).like(f'%"{_like(name)}"%', escape="\\") for name in sorted(names)),
        text.like('%" %'),  # a name that starts with a space
        text.like('% ",%'),  # one that ends with a space, before another name
        text.like('% "]%'),  # the last one ending with a space
        text.like("%\\\\%", escape="\\"),  # a backslash: an escaped character (`\\u00e9`, `\\"`)
    )


def _like(text: str) -> str:
    """`text` as a literal in a LIKE pattern whose escape character is a backslash."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")

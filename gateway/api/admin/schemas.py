"""The admin API's request and response bodies (`/admin/v1`, docs/admin.md).

Requests are strict (`extra="forbid"`: a misspelt field is an error, not a silent no-op) and
checked again by the key store with the same rules the CLI uses (`gateway.keys.validation`);
the store's `ValueError`s become 422s. A `PATCH` changes exactly the fields it sends: a field
sent as `null` means "none" (no allow-list, no expiry, the default limit), one left out is kept.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from gateway.keys.audit import AuditEntry
from gateway.keys.schema import KeyRecord, KeyStatus
from gateway.keys.validation import MAX_GRACE, MAX_LIMIT, MAX_NAME_LENGTH

#: Most keys or audit entries one page holds.
MAX_PAGE = 1000

#: A per-key limit: a whole number from 0 (unlimited) to the largest the store keeps.
Limit = Annotated[StrictInt, Field(ge=0, le=MAX_LIMIT)]


class _Strict(BaseModel):
    # Strict types field by field (not `strict=True`, which would refuse ISO 8601 times):
    # `"1"` is not a limit and `1` is not a permission.
    model_config = ConfigDict(extra="forbid")


class KeyCreate(_Strict):
    """`POST /admin/v1/keys`: a new key. Limits: None = the gateway's default, 0 = unlimited."""

    name: StrictStr = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    models: list[StrictStr] | None = Field(default=None, min_length=1)
    expires_at: AwareDatetime | None = None
    rpm: Limit | None = None
    tpm: Limit | None = None
    max_concurrent: Limit | None = None
    manage_models: StrictBool = False


class KeyUpdate(_Strict):
    """`PATCH /admin/v1/keys/{id}`: only the fields sent change."""

    name: StrictStr = Field(default="", min_length=1, max_length=MAX_NAME_LENGTH)
    models: list[StrictStr] | None = Field(default=None, min_length=1)
    expires_at: AwareDatetime | None = None
    rpm: Limit | None = None
    tpm: Limit | None = None
    max_concurrent: Limit | None = None
    manage_models: StrictBool = False

    def changes(self) -> dict[str, Any]:
        """The fields the client sent, as keyword arguments of `KeyStore.update`."""
        return {field: getattr(self, field) for field in self.model_fields_set}


class KeyRotate(_Strict):
    """`POST /admin/v1/keys/{id}/rotate`: how long the old secret keeps working, in seconds."""

    grace_seconds: StrictInt = Field(default=0, ge=0, le=int(MAX_GRACE.total_seconds()))


class Key(BaseModel):
    """A key as the API shows it: every field but the secret (which is never stored)."""

    id: str
    name: str
    models: list[str] | None
    status: KeyStatus
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    rotation_grace_until: datetime | None
    rpm: int | None
    tpm: int | None
    max_concurrent: int | None
    manage_models: bool

    @classmethod
    def of(cls, record: KeyRecord) -> Key:
        """The API view of a record, its status judged now."""
        return cls(
            id=record.id,
            name=record.name,
            models=None if record.models is None else list(record.models),
            status=record.status(),
            created_at=record.created_at,
            expires_at=record.expires_at,
            revoked_at=record.revoked_at,
            last_used_at=record.last_used_at,
            rotation_grace_until=record.rotation_grace_until,
            rpm=record.rpm,
            tpm=record.tpm,
            max_concurrent=record.max_concurrent,
            manage_models=record.manage_models,
        )


class KeyWithSecret(BaseModel):
    """A created or rotated key, with the full key `gw_<id>_<secret>`: shown this once."""

    key: Key
    secret: str


class KeyPage(BaseModel):
    """One page of keys; pass `next_cursor` as `cursor` for the next (None: the last page)."""

    object: Literal["list"] = "list"
    data: list[Key]
    next_cursor: str | None


class ErrorDetail(BaseModel):
    """What went wrong, as OpenAI's error object carries it."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every admin API error: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


class Audit(BaseModel):
    """One audit entry (`gateway.keys.audit.AuditEntry`)."""

    id: int
    at: datetime
    actor: str
    action: str
    key_id: str | None
    source: str | None
    changes: dict[str, Any] | None

    @classmethod
    def of(cls, entry: AuditEntry) -> Audit:
        """The API view of an entry."""
        return cls(
            id=entry.id,
            at=entry.at,
            actor=entry.actor,
            action=entry.action,
            key_id=entry.key_id,
            source=entry.source,
            changes=None if entry.changes is None else dict(entry.changes),
        )


class AuditPage(BaseModel):
    """One page of audit entries, oldest first; `next_cursor` as for `KeyPage`."""

    object: Literal["list"] = "list"
    data: list[Audit]
    next_cursor: str | None

"""The authenticated caller of a request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.model_names import canonical_model

if TYPE_CHECKING:
    from gateway.keys.store import KeyRecord


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a key's id and name, the models it may use, its limits, its permission.

    Each limit is the key's own setting, not yet resolved: None means "use the gateway's
    default" (`GATEWAY_DEFAULT_RPM`, `GATEWAY_DEFAULT_TPM`, `GATEWAY_DEFAULT_MAX_CONCURRENT`),
    0 means unlimited, and a positive integer is the limit itself.

    Attributes:
        key_id: The key's public id (the `<id>` of `gw_<id>_<secret>`); safe to log.
        name: The admin-chosen key name; safe to log and to use as a metrics label.
        models: Allowed model names, or None for every model.
        rpm: Requests per minute.
        tpm: Tokens per minute, prompt plus output tokens.
        max_concurrent: Requests in flight at once.
        manage_models: Whether the gateway relays Ollama's model-management endpoints (pull,
            push, create, copy, delete, blobs) for this key; False means they answer 403.
    """

    key_id: str
    name: str
    models: tuple[str, ...] | None
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    manage_models: bool = False

    @classmethod
    def from_record(cls, record: KeyRecord) -> Principal:
        """The principal of an authenticated key: every field of `record` a request needs.

        Built here rather than field by field at each caller, so that a new key attribute
        cannot be stored yet silently dropped on its way to the request.
        """
        return cls(
            record.id,
            record.name,
            record.models,
            rpm=record.rpm,
            tpm=record.tpm,
            max_concurrent=record.max_concurrent,
            manage_models=record.manage_models,
        )

    def allows_model(self, model: str) -> bool:
        """Return True when this key may use `model`; `name` and `name:latest` are the same."""
        if self.models is None:
            return True
        wanted = canonical_model(model)
        return any(canonical_model(allowed) == wanted for allowed in self.models)

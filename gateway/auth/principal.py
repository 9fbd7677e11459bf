"""The authenticated caller of a request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: an API key's id and name, the models it may use, and its own limits.

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
    """

    key_id: str
    name: str
    models: tuple[str, ...] | None
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None

    def allows_model(self, model: str) -> bool:
        """Return True when this key may use `model`; `name` and `name:latest` are the same."""
        if self.models is None:
            return True
        wanted = _canonical(model)
        return any(_canonical(allowed) == wanted for allowed in self.models)


def _canonical(model: str) -> str:
    """Ollama's tag defaults to `latest` (reference section 2.1); names match case-insensitively."""
    model = model.strip().lower()
    return model if ":" in model.rsplit("/", 1)[-1] else f"{model}:latest"

"""The authenticated caller of a request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: an API key's id and name, and the models it may use.

    Attributes:
        key_id: The key's public id (the `<id>` of `gw_<id>_<secret>`); safe to log.
        name: The admin-chosen key name; safe to log and to use as a metrics label.
        models: Allowed model names, or None for every model.
    """

    key_id: str
    name: str
    models: tuple[str, ...] | None

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

"""How the gateway compares model names: one rule for allow-lists, listings and usage rows.

Ollama's tag defaults to `latest` (reference section 2.1: `llama3.2` is `llama3.2:latest`) and
Ollama matches names case-insensitively, so `canonical_model` lower-cases, trims and adds the
default tag. A key's allow-list, the admin API's `model` filter and the usage table all compare
names in this form, so what a key may use and what it is charged for never disagree.
"""

from __future__ import annotations


def canonical_model(model: str) -> str:
    """Return `model` as the gateway compares it: trimmed, lower case, with a tag.

    Args:
        model: A model name as a client or an admin wrote it, e.g. `Llama3.2` or
            `library/qwen2.5:7b`.

    Returns:
        For example `llama3.2:latest`; a name whose last path part has a tag keeps it. A blank
        name stays blank.
    """
    name = model.strip().lower()
    if not name or ":" in name.rsplit("/", 1)[-1]:
        return name
    return f"{name}:latest"

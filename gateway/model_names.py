"""How the gateway compares model names: one rule for allow-lists, listings and usage rows.

Ollama's tag defaults to `latest` (reference section 2.1: `llama3.2` is `llama3.2:latest`) and
Ollama matches names case-insensitively, so `canonical_model` lower-cases, trims and adds the
default tag. A key's allow-list, the admin API's `model` filter and the usage table all compare
names in this form, so what a key may use and what it is charged for never disagree.

`ModelAliases` (`GATEWAY_MODEL_ALIASES`) maps the names clients ask for (a coding agent's
`claude-*`) onto the models that run; admission applies it before the allow-list
(`gateway.relay.admission`), so the allow-list, limits, usage and metrics see the model that runs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping


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


class ModelAliases:
    """`GATEWAY_MODEL_ALIASES`: names a client asks for, and the model that runs instead.

    Keys are exact names (compared as `canonical_model` compares them: case-blind, `name` is
    `name:latest`) or patterns, where `*` stands for any run of characters (`claude-*`); a
    pattern matches a name case-blind, as written or with its default tag. Precedence: an exact
    name first; else the longest pattern (in characters); between patterns of one length, the
    first listed. A target is the model an upstream serves, sent as written.

    Args:
        mapping: Alias -> target, in the setting's order.

    Raises:
        ValueError: an empty alias or target, a target with `*`, a target that is itself an
            alias (no chains: what runs is one step from what was asked), or one name listed
            twice with different targets. The message names `GATEWAY_MODEL_ALIASES`.
    """

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self._exact: dict[str, str] = {}
        self.exact: dict[str, str] = {}  # alias as written -> target: what lists show
        patterns: list[tuple[str, re.Pattern[str], str]] = []
        for alias, target in mapping.items():
            name = alias.strip()
            if not name or not isinstance(target, str) or not target.strip():
                raise ValueError(
                    f"GATEWAY_MODEL_ALIASES: alias {alias!r} needs a non-empty name and target"
                )
            if "*" in target:
                raise ValueError(
                    f"GATEWAY_MODEL_ALIASES: the target of {alias!r} must be a model, not a "
                    f"pattern ({target!r})"
                )
            if "*" in name:
                glob = ".*".join(re.escape(part) for part in name.lower().split("*"))
                patterns.append((name, re.compile(glob, re.DOTALL), target.strip()))
                continue
            key = canonical_model(name)
            if self._exact.get(key, target.strip()) != target.strip():
                raise ValueError(
                    f"GATEWAY_MODEL_ALIASES: {alias!r} is listed twice with different targets"
                )
            self._exact[key] = target.strip()
            self.exact[name] = target.strip()
        # Longest first; `sorted` is stable, so the first listed wins a tie.
        patterns.sort(key=lambda entry: -len(entry[0]))
        self._patterns = [(regex, target) for _, regex, target in patterns]
        for alias, target in mapping.items():
            if self.target(target) is not None:
                raise ValueError(
                    f"GATEWAY_MODEL_ALIASES: the target of {alias!r}, {target.strip()!r}, is "
                    "itself an alias: name the model that runs"
                )

    def __bool__(self) -> bool:
        return bool(self._exact or self._patterns)

    def target(self, model: str) -> str | None:
        """The model `model` is an alias of, or None when it is no alias.

        Args:
            model: A model name as a client sent it.
        """
        if not self:
            return None
        key = canonical_model(model)
        exact = self._exact.get(key)
        if exact is not None:
            return exact
        name = model.strip().lower()
        for regex, target in self._patterns:
            if regex.fullmatch(name) or regex.fullmatch(key):
                return target
        return None

    def resolve(self, model: str) -> str:
        """The model that runs for `model`: its alias's target, else `model` itself."""
        target = self.target(model)
        return model if target is None else target


@functools.lru_cache(maxsize=8)
def _aliases(items: tuple[tuple[str, str], ...]) -> ModelAliases:
    return ModelAliases(dict(items))


def model_aliases(mapping: Mapping[str, str]) -> ModelAliases:
    """`ModelAliases(mapping)`, built once per distinct setting (a request reads it each time).

    Raises:
        ValueError: as `ModelAliases`.
    """
    return _aliases(tuple(mapping.items()))

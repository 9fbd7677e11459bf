"""The upstream's model list, cached: for `/v1/models` and for bounded `model` metric labels."""

from __future__ import annotations

import logging
import time

import anyio
import httpx

from gateway.metrics import OTHER_MODEL
from gateway.upstream.dialect import Dialect, ModelInfo

logger = logging.getLogger("gateway.upstream")


class ModelCatalog:
    """Caches the upstream's model list for `max_age` seconds.

    Args:
        dialect: Knows how to ask the upstream for its models.
        client: The shared upstream client.
        max_age: Seconds a fetched list stays fresh.
        timeout: Seconds allowed for fetching the list.
    """

    def __init__(
        self,
        dialect: Dialect,
        client: httpx.AsyncClient,
        max_age: float = 30.0,
        timeout: float = 5.0,
    ) -> None:
        self._dialect = dialect
        self._client = client
        self._max_age = max_age
        self._timeout = timeout
        self._models: list[ModelInfo] = []
        self._names: dict[str, str] = {}
        self._fetched_at = float("-inf")
        self._lock = anyio.Lock()

    async def models(self, *, refresh: bool = False) -> list[ModelInfo]:
        """Return the model list, fetching it when stale or when `refresh` is set.

        Raises:
            httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError: the upstream could not
                be asked, or answered nonsense, and nothing is cached.
        """
        async with self._lock:
            stale = time.monotonic() - self._fetched_at > self._max_age
            if refresh or stale:
                try:
                    with anyio.fail_after(self._timeout):
                        self._models = await self._dialect.list_models(self._client)
                except (httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError):
                    if not self._models:
                        raise
                    logger.warning("model list refresh failed; serving the cached list")
                else:
                    self._names = _names(self._models)
                    self._fetched_at = time.monotonic()
        return self._models

    def label(self, model: str) -> str:
        """Return the upstream's id for `model` (`x` -> `x:latest`, any case), else `other`.

        This keeps the `model` label's values bounded by the upstream's model list. No I/O: the
        list is kept fresh by the upstream monitor's polling, never on a request's path.
        """
        return self._names.get(model.strip().lower(), OTHER_MODEL)


def _names(models: list[ModelInfo]) -> dict[str, str]:
    """Map every lower-cased name a client may use to the model's id (`x` for `x:latest`).

    Ollama matches model names case-insensitively (reference section 2.1).
    """
    names = {}
    for info in models:
        names[info.id.lower()] = info.id
        if info.id.endswith(":latest"):
            names[info.id.lower().removesuffix(":latest")] = info.id
    return names

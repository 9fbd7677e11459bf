"""The upstream's model list, cached: for `/v1/models` and for bounded `model` metric labels."""

from __future__ import annotations

import logging

import anyio
import httpx

from gateway.metering.metrics import OTHER_MODEL
from gateway.upstream.dialects.base import Dialect, ModelInfo

logger = logging.getLogger("gateway.upstream")


class ModelCatalog:
    """The upstream's model list as last fetched, and the model-label lookup built from it.

    Args:
        dialect: Knows how to ask the upstream for its models.
        client: The shared upstream client.
        timeout: Seconds allowed for fetching the list.
    """

    def __init__(self, dialect: Dialect, client: httpx.AsyncClient, timeout: float = 5.0) -> None:
        self._dialect = dialect
        self._client = client
        self._timeout = timeout
        self._models: list[ModelInfo] = []
        self._names: dict[str, str] = {}
        self._fetched = False
        self._lock = anyio.Lock()

    @property
    def cached(self) -> list[ModelInfo]:
        """The list as last fetched (empty before the first fetch); no I/O."""
        return self._models

    async def refresh(self) -> list[ModelInfo]:
        """Fetch the model list; on failure keep serving the last one fetched.

        Raises:
            httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError: the upstream could not
                be asked, or answered nonsense, and no list was ever fetched.
        """
        async with self._lock:
            try:
                with anyio.fail_after(self._timeout):
                    self._models = await self._dialect.list_models(self._client)
            except (httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError):
                if not self._models:
                    raise
                logger.warning("model list refresh failed; serving the cached list")
            else:
                self._names = _names(self._models)
                self._fetched = True
        return self._models

    async def current(self) -> list[ModelInfo]:
        """The list as last fetched by the upstream monitor; fetched now only if it never was.

        Serving `/v1/models` from here costs the upstream nothing per request (a client polling
        it cannot load the model server), and the monitor keeps it as fresh as its poll interval.

        Raises:
            httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError: as `refresh`.
        """
        if self._fetched:
            return self._models
        return await self.refresh()

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

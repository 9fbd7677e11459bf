"""Background polling of the upstream: health, Ollama's loaded models, a server's own load.

Every `GATEWAY_UPSTREAM_POLL_INTERVAL` seconds the monitor sends the dialect's readiness probe
(`gateway_upstream_up`), refreshes the model catalog, and for the Ollama dialect reads
`GET /api/ps` (reference section 6.4): each loaded model's `size` (total bytes) and `size_vram`
(bytes resident on the GPU; `size_vram < size` means partial CPU offload) and `expires_at`
(when it unloads unless used again), kept for the admin API's live view (`loaded`). Any other
server (vLLM, llama.cpp, SGLang) may publish its own queue, running requests and KV cache
usage on `/metrics`: read each poll once it was found to (`gateway.upstream.reported`), kept
as `report` for the routing policy and the live view, and shown as
`gateway_upstream_reported_waiting`, `gateway_upstream_reported_running` and
`gateway_upstream_kv_cache_usage_ratio`. Ollama publishes none and is never asked.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx

from gateway.metering.metrics import Metrics
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.dialects.base import Dialect
from gateway.upstream.reported import STALE_POLLS, ReportReader, ServerReport
from gateway.wire.json import parse_listing

logger = logging.getLogger("gateway.upstream")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """One model Ollama has in memory (`/api/ps`, reference section 6.4).

    Attributes:
        model: Its name as the upstream lists it.
        size: Bytes it takes in all.
        size_vram: Of those, bytes resident on the GPU.
        expires_at: When it unloads unless used again (UTC); None when not said or unreadable.
    """

    model: str
    size: int
    size_vram: int
    expires_at: datetime | None


class UpstreamMonitor:
    """Polls one upstream and keeps its gauges current.

    Args:
        name: The `upstream` label value (the upstream's host:port, bounded by configuration).
        client: The shared upstream client.
        dialect: Gives the readiness probe path; `ollama` also has `/api/ps`.
        catalog: Refreshed on every poll so model labels follow the upstream.
        metrics: Where the gauges live.
        interval: Seconds between polls.
        timeout: Seconds allowed for each probe, and for each `/api/ps` or `/metrics` call,
            from sending to the last byte: an upstream that trickles bytes cannot hold a probe
            (or its connection) longer.
    """

    def __init__(
        self,
        *,
        name: str,
        client: httpx.AsyncClient,
        dialect: Dialect,
        catalog: ModelCatalog,
        metrics: Metrics,
        interval: float,
        timeout: float,
    ) -> None:
        self.name = name
        self._client = client
        self._dialect = dialect
        self._catalog = catalog
        self._metrics = metrics
        self._interval = interval
        self._timeout = httpx.Timeout(timeout)
        self._budget = timeout
        self.up: bool | None = None  # None until the first probe
        #: The models loaded as the last `/api/ps` said; None: unknown (another dialect, no
        #: answer yet, the upstream down or `/api/ps` failing).
        self.loaded: list[LoadedModel] | None = None
        #: `time.monotonic()` when the `/api/ps` that `loaded` holds was asked (0: none yet).
        self.loaded_at = 0.0
        #: Times a probe found the upstream down after it was up (or unknown): a server that
        #: comes back may come back empty (`gateway.upstream.scheduling` forgets its notes).
        self.downs = 0
        #: The server's own load as its `/metrics` last said; None: it does not publish, has
        #: not answered yet, is down, or the last reading aged out (`STALE_POLLS`).
        self.report: ServerReport | None = None
        self._reader = None if dialect.name == "ollama" else ReportReader(client, timeout)
        self._down_since = 0.0  # time.monotonic() of the probe that found it down
        self._down_detail: str | None = None  # why, as last logged; None while up

    async def run(self) -> None:
        """Poll until cancelled (the app's lifespan cancels it on shutdown).

        A failed poll is logged and retried at the next interval; it never ends the loop, since
        an exception here would end the app's lifespan while the server keeps accepting requests.
        """
        while True:
            try:
                await self.poll()
            except Exception:
                logger.exception("upstream %s: poll failed", self.name)
            await anyio.sleep(self._interval)

    async def probe(self) -> tuple[bool, str]:
        """Send the readiness probe once; set `gateway_upstream_up`; return (up, detail)."""
        try:
            with anyio.fail_after(self._budget):
                response = await self._client.get(
                    self._dialect.readiness_path, timeout=self._timeout
                )
            up, detail = response.status_code == 200, f"upstream answered {response.status_code}"
        except httpx.HTTPError as exc:
            up, detail = False, f"upstream unreachable ({type(exc).__name__})"
        except TimeoutError:
            up, detail = False, f"upstream did not answer within {self._budget:g} s"
        self._metrics.upstream_up.labels(self.name).set(1 if up else 0)
        if not up and self.up is not False:
            self.downs += 1
            if self._reader is not None:
                self._reader.server_restarted()
        self.up = up
        return up, detail

    async def poll(self) -> bool:
        """Probe, refresh the model list and loaded models; returns whether the upstream is up.

        Logs the changes, not every poll: a warning when the upstream goes down (or its reason
        changes), one line when it is back up with how long it was down. A fleet with a server
        down for an hour logs two lines, not 360.
        """
        was_up, was_detail = self.up, self._down_detail
        up, detail = await self.probe()
        if up and was_up is False:
            down_for = time.monotonic() - self._down_since
            logger.info("upstream %s is back up after %.0f s down", self.name, down_for)
            self._down_detail = None
        if not up:
            if was_up is not False:
                self._down_since = time.monotonic()
            if detail != was_detail:
                logger.warning("upstream %s is down: %s", self.name, detail)
            self._down_detail = detail
            self._metrics.forget_model_memory()
            self._metrics.upstream_models_loaded.labels(self.name).set(0)
            self.loaded = None
            self._set_report(None)
            return False
        try:
            await self._catalog.refresh()
        except (httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError):
            logger.warning("upstream %s: model list unavailable", self.name)
        if self._dialect.name == "ollama":
            await self._poll_loaded_models()
        elif self._reader is not None:
            await self._poll_report(self._reader)
        return True

    async def _poll_report(self, reader: ReportReader) -> None:
        """Read the server's `/metrics`; keep an older reading until it ages out."""
        asked = time.monotonic()
        report = await reader.read()
        if report is not None:
            fresh_until = asked + STALE_POLLS * self._interval
            self._set_report(replace(report, at=asked, fresh_until=fresh_until))
        elif reader.publishes is False or (
            self.report is not None and not self.report.fresh(time.monotonic())
        ):
            self._set_report(None)

    def _set_report(self, report: ServerReport | None) -> None:
        """Keep `report` and show it in the gauges (a value it lacks leaves its series)."""
        self.report = report
        if report is None:
            self._metrics.set_reported(self.name, None, None, None)
        else:
            self._metrics.set_reported(self.name, report.waiting, report.running, report.kv_usage)

    async def _poll_loaded_models(self) -> None:
        asked = time.monotonic()  # what was served after this may be missing from the answer
        try:
            with anyio.fail_after(self._budget):
                response = await self._client.get("/api/ps", timeout=self._timeout)
            response.raise_for_status()
            models: list[dict[str, Any]] = parse_listing(response.content).get("models") or []
        except (httpx.HTTPError, ValueError, AttributeError, TimeoutError):
            logger.warning("upstream %s: /api/ps unavailable", self.name)
            self.loaded = None
            return
        memory = self._metrics.upstream_model_memory
        loaded = self._metrics.upstream_models_loaded
        self._metrics.forget_model_memory()  # unloaded models must not linger with their value
        count = 0
        seen: list[LoadedModel] = []
        for entry in models:
            if not isinstance(entry, dict):
                continue
            model = str(entry.get("model") or entry.get("name") or "")
            size, size_vram = _bytes(entry.get("size")), _bytes(entry.get("size_vram"))
            if not model or size is None:
                continue
            count += 1
            memory.labels(self.name, model, "total").set(size)
            memory.labels(self.name, model, "vram").set(size_vram or 0.0)
            expires = entry.get("expires_at")
            seen.append(LoadedModel(model, int(size), int(size_vram or 0), _moment(expires)))
        loaded.labels(self.name).set(count)
        self.loaded = seen
        self.loaded_at = asked


def _bytes(value: object) -> float | None:
    """A byte count from JSON: a non-negative number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _moment(value: object) -> datetime | None:
    """An RFC 3339 time from JSON (Ollama writes local time, nanoseconds), in UTC, else None.

    `datetime.fromisoformat` takes any number of fractional digits from Python 3.11 on (the
    Python docs, `datetime.fromisoformat`); a time without a zone is not one we can place.
    """
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
        return moment.astimezone(UTC) if moment.tzinfo is not None else None
    except (ValueError, OverflowError):
        return None

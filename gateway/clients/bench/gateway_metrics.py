"""The gateway's own `/metrics` sampled during a benchmark run through it.

Owns `GatewayMetricsSampler`. The Prometheus text is parsed with prometheus_client's own parser
(`text_string_to_metric_families`, the gateway already depends on the library), and reduced to
one timeline row per scrape: gauges as read (what is in flight and queued right now), counters and
histogram sums/counts as the increase since the previous scrape (what happened in the interval;
a decrease means the gateway restarted, and then the new value is the increase, as Prometheus's
`increase()` treats a counter reset). Metric names are those of `gateway/metering/metrics.py` and
docs/metrics.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: Gauges read as they are, summed over their labels: timeline key -> sample name.
GAUGES: Mapping[str, str] = {
    "in_flight": "gateway_requests_in_flight",
    "upstream_in_flight": "gateway_upstream_in_flight",
    "queue_length": "gateway_upstream_queue_length",
    "slots_in_use": "gateway_upstream_slots_in_use",
    "connections_in_use": "gateway_upstream_connections_in_use",
}

#: Counters and histogram parts reported as their increase over the interval.
INCREASES: Mapping[str, str] = {
    "requests": "gateway_requests_total",
    "output_tokens": "gateway_output_tokens_total",
    "rate_limited": "gateway_rate_limited_total",
    "upstream_errors": "gateway_upstream_errors_total",
    "queue_wait_seconds_sum": "gateway_queue_wait_seconds_sum",
    "queue_wait_count": "gateway_queue_wait_seconds_count",
    "ttft_seconds_sum": "gateway_time_to_first_token_seconds_sum",
    "ttft_count": "gateway_time_to_first_token_seconds_count",
}

#: Routes whose requests are generations. The monitor's own `/api/ps` polls through the gateway
#: are counted by `gateway_requests_total` too, and must not pass for benchmark traffic.
GENERATION_ROUTES = frozenset(
    {"/api/generate", "/api/chat", "/v1/generate", "/v1/chat", "/v1/chat/completions",
     "/v1/completions"}
)  # fmt: skip

#: Seconds one scrape may take in all: httpx's timeout bounds each read, so a gateway (or a
#: proxy in front) trickling its answer would otherwise hold the monitor, and the run's end.
SCRAPE_DEADLINE = 10.0
#: Bytes of one scrape read; the gateway's labels are bounded, its text far smaller.
MAX_TEXT = 8 * 1024 * 1024

_SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_sum", "_count")}


def parse_totals(text: str) -> dict[str, float]:
    """Sum each sample name's values over its labels.

    `gateway_requests_total` keeps only the generation routes (`GENERATION_ROUTES`). A
    metric that is declared but has no series yet counts 0.

    Args:
        text: The Prometheus text exposition format.

    Returns:
        Sample name (`..._total`, `..._sum`, `..._count`, gauge name) -> summed value.

    Raises:
        ValueError: The text is not the Prometheus format.
    """
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        # A labelled metric shows no sample until its first series exists: declared but
        # empty is 0 (nothing in flight yet), not unknown.
        for suffix in _SUFFIXES.get(family.type, ()):
            totals.setdefault(family.name + suffix, 0.0)
        for sample in family.samples:
            if sample.name == INCREASES["requests"] and (
                sample.labels.get("route") not in GENERATION_ROUTES
            ):
                continue
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def _mean(total: float | None, count: float | None) -> float | None:
    return total / count if total is not None and count else None


class GatewayMetricsSampler:
    """Scrapes `GET /metrics` of one gateway into timeline rows.

    Args:
        client: The HTTP client; it is not closed here.
        url: The gateway's base URL (`/metrics` is appended).
        headers: Sent with each scrape (a key, should a proxy in front guard `/metrics`).
    """

    def __init__(
        self, client: httpx.AsyncClient, url: str, headers: Mapping[str, str] | None = None
    ) -> None:
        self._client = client
        self._url = url.rstrip("/") + "/metrics"
        self._headers = dict(headers or {})
        self._previous: dict[str, float] | None = None

    async def sample(self, t: float) -> tuple[dict[str, Any] | None, str | None]:
        """Scrape once.

        Args:
            t: The sample's time on the run's timeline, seconds.

        Returns:
            `(row, None)` with row `{"t", "source": "gateway", <GAUGES keys>, <INCREASES keys>,
            "queue_wait_seconds_mean", "ttft_seconds_mean"}` (increases are None on the first
            scrape, the means None when nothing was observed in the interval; a metric the
            gateway does not export is None), or `(None, note)` when `/metrics` could not be
            read (unreachable, an error status such as 401, slower than `SCRAPE_DEADLINE`
            seconds in all, longer than `MAX_TEXT` bytes, not the Prometheus format).
        """
        try:
            async with (
                asyncio.timeout(SCRAPE_DEADLINE),
                self._client.stream("GET", self._url, headers=self._headers) as response,
            ):
                if response.status_code != 200:
                    return None, f"gateway /metrics answered {response.status_code}: not sampled"
                text = bytearray()
                async for piece in response.aiter_bytes():
                    text += piece
                    if len(text) > MAX_TEXT:
                        return None, f"gateway /metrics longer than {MAX_TEXT} bytes: not sampled"
        except TimeoutError:
            return None, f"gateway /metrics took more than {SCRAPE_DEADLINE:g} s: not sampled"
        except httpx.HTTPError as exc:
            return None, f"gateway /metrics unreachable ({type(exc).__name__}): not sampled"
        try:
            totals = parse_totals(text.decode("utf-8", "replace"))
        except ValueError as exc:
            return None, f"gateway /metrics is not the Prometheus format ({exc}): not sampled"
        previous, self._previous = self._previous, totals
        row: dict[str, Any] = {"t": t, "source": "gateway"}
        for key, name in GAUGES.items():
            row[key] = totals.get(name)
        for key, name in INCREASES.items():
            row[key] = _increase(previous, totals, name)
        row["queue_wait_seconds_mean"] = _mean(
            row["queue_wait_seconds_sum"], row["queue_wait_count"]
        )
        row["ttft_seconds_mean"] = _mean(row["ttft_seconds_sum"], row["ttft_count"])
        return row, None


def _increase(
    previous: Mapping[str, float] | None, current: Mapping[str, float], name: str
) -> float | None:
    now = current.get(name)
    if previous is None or now is None:
        return None
    before = previous.get(name, 0.0)
    return now - before if now >= before else now  # a reset: counting started again at 0

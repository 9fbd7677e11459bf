"""What a model server says of its own load: its Prometheus `/metrics`, read by the monitor.

The Kubernetes Gateway API Inference Extension's "model server protocol" (its proposal 003,
kubernetes-sigs/gateway-api-inference-extension `docs/proposals/003-model-server-protocol`)
names what an endpoint picker scrapes from each model server: `TotalQueuedRequests` (a gauge,
the requests in the queue; vLLM's `vllm:num_requests_waiting`, SGLang's
`sglang:num_queue_reqs`), `TotalRunningRequests` (vLLM's `vllm:num_requests_running`) and
`KVCacheUtilization` (vLLM's `vllm:gpu_cache_usage_perc`, renamed `vllm:kv_cache_usage_perc`
in vLLM V1, a ratio: "a value of 1 means 100% usage"). The names read here (`METRICS`):

- waiting: `vllm:num_requests_waiting`, `llamacpp:requests_deferred`, `sglang:num_queue_reqs`;
- running: `vllm:num_requests_running`, `llamacpp:requests_processing`,
  `sglang:num_running_reqs`;
- kv_usage: `vllm:kv_cache_usage_perc` (`vllm:gpu_cache_usage_perc` before V1),
  `llamacpp:kv_cache_usage_ratio`, `sglang:token_usage`.

(vLLM docs "Production Metrics"; llama.cpp `tools/server/README.md`, `GET /metrics`, with
`--metrics`: current builds no longer export the KV gauge, older ones did; SGLang docs
"Production Metrics", with `--enable-metrics`.) Counts are summed over label sets (a server
may list several models or engines); the KV ratio is the largest one (the fullest cache
decides when prefixes start to go).

Discovery. A server that answers `/metrics` with a 4xx (404: no such path, as Ollama, or a
llama.cpp server started without `--metrics`; 400: llama.cpp's router mode, which wants
`?model=`), with a body over `MAX_METRICS_BYTES`, or with none of the names above does not
publish: it is not asked again for `RECHECK_SECONDS`, nor before it was seen down and back
(a restart may come with the flag on). A 5xx, a timeout or a refused connection is a passing
failure: the next poll asks again, and the last reading ages out meanwhile
(`ServerReport.fresh_until`).

Parsing: the text exposition format through prometheus_client's own parser
(`prometheus_client.parser.text_string_to_metric_families`), on the lines that name a metric
read here only, so a server's hundreds of histogram lines cost a line scan, not a parse.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

#: The path every server above serves its metrics on.
METRICS_PATH = "/metrics"

#: The most bytes of a `/metrics` answer read: room for a model server's histograms over
#: several models and engines, and a bound on what a server (or anything at its address)
#: can make each poll buffer. A longer one is not a server this reads.
MAX_METRICS_BYTES = 512 * 1024

#: Seconds before a server found not to publish is asked again (unless seen down and back).
RECHECK_SECONDS = 600.0

#: Poll intervals a reading stays fresh: older, it counts as absent (the server may have
#: stopped answering `/metrics` while its readiness probe still passes).
STALE_POLLS = 3

#: Each reading and the metric names it is read from (module docstring).
METRICS: dict[str, tuple[str, ...]] = {
    "waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs"),
    "running": (
        "vllm:num_requests_running",
        "llamacpp:requests_processing",
        "sglang:num_running_reqs",
    ),
    "kv_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "llamacpp:kv_cache_usage_ratio",
        "sglang:token_usage",
    ),
}

_READING = {name: reading for reading, names in METRICS.items() for name in names}
_PREFIXES = tuple(_READING)
_COMMENTS = tuple(f"# {kind} {name} " for name in _READING for kind in ("HELP", "TYPE"))


@dataclass(frozen=True, slots=True)
class ServerReport:
    """One reading of a server's own load (module docstring); None where it did not say.

    Attributes:
        waiting: Requests queued at the server, from every client (summed over label sets).
        running: Requests it is running now.
        kv_usage: Its KV cache usage, 0 to 1 (the largest over label sets).
        at: `time.monotonic()` when it was asked.
        fresh_until: `time.monotonic()` past which it counts as absent (`STALE_POLLS`).
    """

    waiting: float | None
    running: float | None
    kv_usage: float | None
    at: float = 0.0
    fresh_until: float = math.inf

    def fresh(self, now: float) -> bool:
        """Whether the reading still counts at `now` (monotonic seconds)."""
        return now <= self.fresh_until


#: The most lines naming a read metric (samples, HELP and TYPE) one body may hold: a server
#: lists a few per model it serves; a body past it publishes nothing usable (parsing it on the
#: event loop could stall every request for a large part of a second, each poll).
MAX_READ_LINES = 512


def parse_metrics(text: str) -> ServerReport | None:
    """Read a `/metrics` body in the Prometheus text format.

    Args:
        text: The body, decoded.

    Returns:
        The readings it holds (`at` 0, fresh forever: the caller stamps them; a reading it
        declares without a value, or lacks, is None), or None when it names none of
        `METRICS` or is not the text format, or holds more than `MAX_READ_LINES` lines of
        them. Values that are not finite, or negative, are left out, and so is a sum that
        is not finite; a KV ratio above 1 counts as 1.
    """
    lines = [
        line
        for line in text.splitlines()
        if line.startswith(_PREFIXES) or line.startswith(_COMMENTS)
    ]
    if len(lines) > MAX_READ_LINES:  # a label explosion, or a body made to stall the parser
        return None
    wanted = "\n".join(lines)
    sums: dict[str, float] = {}
    named = False  # a family read here was declared, even without a sample yet
    try:
        for family in text_string_to_metric_families(wanted):
            named = named or family.name in _READING
            for sample in family.samples:
                reading = _READING.get(sample.name)
                value = sample.value
                if reading is None or not math.isfinite(value) or value < 0:
                    continue
                if reading == "kv_usage":
                    sums[reading] = max(sums.get(reading, 0.0), min(value, 1.0))
                else:
                    sums[reading] = sums.get(reading, 0.0) + value
    except (ValueError, TypeError, IndexError, KeyError):  # not the text format after all
        return None
    if not sums and not named:
        return None
    # Finite samples can still add up to infinity (two of 1.7e308): such a sum says nothing.
    sums = {name: value for name, value in sums.items() if math.isfinite(value)}
    return ServerReport(sums.get("waiting"), sums.get("running"), sums.get("kv_usage"))


class ReportReader:
    """Reads one server's `/metrics` each poll, once it was found to publish (discovery).

    Args:
        client: The upstream's client (its base URL is the server).
        timeout: Seconds for the whole exchange, first byte to last (the probe timeout).
    """

    def __init__(self, client: httpx.AsyncClient, timeout: float) -> None:
        self._client = client
        self._budget = timeout
        self._timeout = httpx.Timeout(timeout)
        #: None: not known yet; False: does not publish (until `_recheck_at`); True: does.
        self.publishes: bool | None = None
        self._recheck_at = 0.0

    def server_restarted(self) -> None:
        """The server was seen down: when back, ask again whether it publishes."""
        if self.publishes is False:
            self.publishes = None

    async def read(self) -> ServerReport | None:
        """Ask `/metrics` once, when it may publish; None when it does not or did not answer.

        Never raises for what the server sends: a failure is a None (module docstring).
        """
        now = time.monotonic()
        if self.publishes is False and now < self._recheck_at:
            return None
        try:
            with anyio.fail_after(self._budget):
                status, body = await self._fetch()
        except (httpx.HTTPError, TimeoutError):
            return None  # a passing failure: ask again next poll
        if status >= 500:
            return None
        report = None
        if status == 200 and body is not None:
            report = parse_metrics(body.decode("utf-8", "replace"))
        if report is None:
            self.publishes = False
            self._recheck_at = now + RECHECK_SECONDS
            return None
        self.publishes = True
        return report

    async def _fetch(self) -> tuple[int, bytes | None]:
        """GET `/metrics`: the status and the body, or None for a body over the bound."""
        async with self._client.stream("GET", METRICS_PATH, timeout=self._timeout) as response:
            if response.status_code != 200:
                return response.status_code, None
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_METRICS_BYTES:
                    return response.status_code, None
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)

"""Prometheus metrics, bound to one `CollectorRegistry` per app (STYLE section 8).

Every metric, its labels, unit and buckets, and where each number comes from, is documented in
`docs/metrics.md`. Label values are bounded: `model` is a model the upstream lists or the fixed
value `other`; `key` is a key's admin-chosen name (`all` when `GATEWAY_METRICS_PER_KEY=false`,
`none` before a key is known); `route` is a route template; never a raw path or a secret.

Under `gateway serve --workers N` (gateway.serve.workers) prometheus-client runs in its multiprocess
mode: `PROMETHEUS_MULTIPROC_DIR` is set before any worker imports it, every process writes its
values to files there, and `/metrics` reads them all back (`MultiProcessCollector`), so any
worker answers with the totals of all. Counters and histograms add up; each gauge says how its
workers' values combine (`multiprocess_mode`, documented in docs/metrics.md).

Over ~300 lines for one reason: `Metrics` declares every metric on one registry
(`__init__`, `_batch_metrics`, `_limit_metrics`), so each app binds one `CollectorRegistry`
and `exposition` serves them all, in one process or many; the declarations are most of it.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field

import anyio
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.requests import Request
from starlette.responses import Response

from gateway.metering.live import LiveBoard
from gateway.neutral import RequestSummary

#: Time to first token, seconds: 10 ms (warm, short prompt) to 60 s (cold load, long prefill).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 30, 60)
#: Decode rate, output tokens per second: 1 (CPU, large model) to 2,000 (small model, big GPU).
TOKENS_PER_SECOND_BUCKETS = (1, 2.5, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000)
#: Time per output token (inter-token latency), seconds: 0.5 ms to 1 s.
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1)
#: Prefill rate, prompt tokens per second: 10 to 100,000 (cache hits inflate it; section 9.2).
PREFILL_BUCKETS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000)
#: Wait before the upstream request is sent, seconds: 0.5 ms to 2 min.
QUEUE_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 10, 30, 120)
#: Whole request duration, seconds: 50 ms to 10 min.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)

#: The model label for any model the upstream does not list (bounds the label's cardinality).
OTHER_MODEL = "other"
#: The key label of requests with no authenticated key (refused before or at auth).
NO_KEY = "none"
#: The key label when per-key labels are off (`GATEWAY_METRICS_PER_KEY=false`).
ALL_KEYS = "all"


#: Bucket bounds of `gateway_route_prefix_hit_tokens`: a few blocks to a long agent history.
PREFIX_HIT_BUCKETS = (0, 64, 256, 1024, 4096, 16384, 65536, 262144)


class Metrics:
    """The gateway's Prometheus metrics in their own registry.

    Attributes:
        registry: The registry `/metrics` exposes.
        requests: Counter `gateway_requests_total{route, model, key, status_class, outcome}`.
        ttft: Histogram `gateway_time_to_first_token_seconds{model, key}`, request arrival to
            the first generated token sent to the client.
        output_tokens_per_second: Histogram `gateway_output_tokens_per_second{model, key}`,
            the decode rate.
        time_per_output_token: Histogram `gateway_time_per_output_token_seconds{model}`.
        request_duration: Histogram `gateway_request_duration_seconds{route, model}`.
        input_tokens: Counter `gateway_input_tokens_total{model, key}` (prompt tokens).
        output_tokens: Counter `gateway_output_tokens_total{model, key}` (generated tokens).
        in_flight: Gauge `gateway_requests_in_flight{model}`.
        prefill_tokens_per_second: Histogram `gateway_prefill_tokens_per_second{model}`, only
            where the upstream reports `prompt_eval_count` and `prompt_eval_duration` (Ollama).
        queue_wait: Histogram `gateway_queue_wait_seconds{model}`, arrival to the upstream
            request being sent (auth, body checks and, with limits, waiting for a slot).
        upstream_errors: Counter `gateway_upstream_errors_total{kind}`.
        upstream_up: Gauge `gateway_upstream_up{upstream}`, 1 when the last probe succeeded.
        upstream_models_loaded: Gauge `gateway_upstream_models_loaded{upstream}` (Ollama /api/ps).
        upstream_model_memory: Gauge `gateway_upstream_model_memory_bytes{upstream, model, kind}`,
            `kind` is `total` (`size`) or `vram` (`size_vram`), from Ollama's /api/ps.
        upstream_reported_waiting: Gauge `gateway_upstream_reported_waiting{upstream}`,
            `upstream_reported_running` `gateway_upstream_reported_running{upstream}` and
            `upstream_kv_cache_usage` `gateway_upstream_kv_cache_usage_ratio{upstream}`: what
            the server's own `/metrics` says (`gateway.upstream.reported`, `set_reported`).
        rate_limited: Counter `gateway_rate_limited_total{kind}`.
        address_limited: Counter `gateway_address_limited_total{budget}`.
        door_refused: Counter `gateway_door_refused_total{reason}`, connections and requests
            the door (`gateway.serve.door`) refused or cut before the app saw them.
        rate_limit_storage_errors: Counter `gateway_rate_limit_storage_errors_total`.
        upstream_retries: Counter `gateway_upstream_retries_total{reason}`.
        upstream_in_flight: Gauge `gateway_upstream_in_flight{upstream}`.
        upstream_circuit_state: Gauge `gateway_upstream_circuit_state{upstream}`.
        upstream_failovers: Counter `gateway_upstream_failovers_total`.
        upstream_queue_length: Gauge `gateway_upstream_queue_length{upstream}`.
        upstream_slots_in_use: Gauge `gateway_upstream_slots_in_use{upstream}`.
        upstream_connections_in_use: Gauge `gateway_upstream_connections_in_use{upstream}`,
            pooled connections held by open upstream responses (httptools and aiohttp
            transports).
        route_decisions: Counter `gateway_route_decisions_total{reason}`.
        route_prefix_hit_tokens: Histogram `gateway_route_prefix_hit_tokens`.
        route_cold_loads: Counter `gateway_route_cold_loads_total{upstream}`.
        live: This process's requests in flight and latest answers, for the admin API's live
            view (`gateway.metering.live`; not exported to Prometheus).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        #: The directory every worker's values are in (`gateway.serve.workers`); None: one process.
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        self._exposed = self.registry
        if self.multiprocess_dir is not None:
            # Values live in the files, not in this registry: a registry of its own reads them.
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, self.multiprocess_dir)  # type: ignore[no-untyped-call]
        self._rendering: _Render | None = None  # the render running now (`exposition`)
        self._queued: _Render | None = None  # the next one, not started yet: later callers join it
        self._series: dict[tuple[str, str, str], RequestSeries] = {}
        self.live = LiveBoard()
        r = self.registry
        self.requests = Counter(
            "gateway_requests",
            "Requests by route, model, HTTP status class and outcome.",
            ("route", "model", "key", "status_class", "outcome"),
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from the request's arrival to the first generated token sent to the client.",
            ("model", "key"),
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.output_tokens_per_second = Histogram(
            "gateway_output_tokens_per_second",
            "Decode rate: output tokens per second of generation (eval_count / eval_duration).",
            ("model", "key"),
            buckets=TOKENS_PER_SECOND_BUCKETS,
            registry=r,
        )
        self.time_per_output_token = Histogram(
            "gateway_time_per_output_token_seconds",
            "Mean time between output tokens of a request (TPOT, inter-token latency).",
            ("model",),
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.request_duration = Histogram(
            "gateway_request_duration_seconds",
            "Whole request duration, arrival to the last byte or the failure.",
            ("route", "model"),
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.input_tokens = Counter(
            "gateway_input_tokens",
            "Prompt (input) tokens, as the upstream counted them.",
            ("model", "key"),
            registry=r,
        )
        self.output_tokens = Counter(
            "gateway_output_tokens",
            "Generated (output) tokens; for a stream cut short, the tokens relayed until then.",
            ("model", "key"),
            registry=r,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight",
            "Generation requests being served right now.",
            ("model",),
            multiprocess_mode="livesum",
            registry=r,
        )
        self.buffered_body_bytes = Gauge(
            "gateway_buffered_body_bytes",
            "Request-body bytes the process holds now (charged against "
            "GATEWAY_MAX_BUFFERED_BODY_BYTES until each request ends).",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.prefill_tokens_per_second = Histogram(
            "gateway_prefill_tokens_per_second",
            "Prefill rate: prompt tokens per second (prompt_eval_count / prompt_eval_duration), "
            "where the upstream reports both.",
            ("model",),
            buckets=PREFILL_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Time from the request's arrival to the upstream request being sent.",
            ("model",),
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors",
            "Upstream failures by kind (connect, timeout, pool, status, stream), and upstream "
            "refusals that are not failures (busy, rate_limited, status_4xx).",
            ("kind",),
            registry=r,
        )
        self.upstream_up = Gauge(
            "gateway_upstream_up",
            "1 when the upstream answered its last readiness probe, else 0.",
            ("upstream",),
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.upstream_models_loaded = Gauge(
            "gateway_upstream_models_loaded",
            "Models the upstream holds in memory (Ollama /api/ps).",
            ("upstream",),
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.upstream_model_memory = Gauge(
            "gateway_upstream_model_memory_bytes",
            "Memory of each loaded model (Ollama /api/ps): kind=total is `size`, "
            "kind=vram is `size_vram` (the part on the GPU).",
            ("upstream", "model", "kind"),
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self._reported_metrics()
        self._limit_metrics()
        self._batch_metrics()
        self._routing_metrics()

    def _reported_metrics(self) -> None:
        """What each model server says of its own load (gateway/upstream/reported.py)."""
        r = self.registry
        self.upstream_reported_waiting = Gauge(
            "gateway_upstream_reported_waiting",
            "Requests queued at the upstream from every client, as its own /metrics says "
            "(vllm:num_requests_waiting, llamacpp:requests_deferred, sglang:num_queue_reqs).",
            ("upstream",),
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.upstream_reported_running = Gauge(
            "gateway_upstream_reported_running",
            "Requests the upstream runs now from every client, as its own /metrics says.",
            ("upstream",),
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.upstream_kv_cache_usage = Gauge(
            "gateway_upstream_kv_cache_usage_ratio",
            "The upstream's KV cache usage, 0 to 1, as its own /metrics says "
            "(vllm:kv_cache_usage_perc).",
            ("upstream",),
            multiprocess_mode="livemostrecent",
            registry=r,
        )

    def set_reported(
        self, upstream: str, waiting: float | None, running: float | None, kv: float | None
    ) -> None:
        """Show an upstream's own reading; a None drops its series (no reading, or stale).

        With workers a series cannot be removed (`forget_model_memory`): it is set to NaN, as
        0 would read as an idle server.
        """
        gauges = (
            (self.upstream_reported_waiting, waiting),
            (self.upstream_reported_running, running),
            (self.upstream_kv_cache_usage, kv),
        )
        for gauge, value in gauges:
            if value is not None:
                gauge.labels(upstream).set(value)
            elif self.multiprocess_dir is not None:
                gauge.labels(upstream).set(math.nan)
            else:
                with contextlib.suppress(KeyError):  # no series yet
                    gauge.remove(upstream)

    def _routing_metrics(self) -> None:
        """The upstream choice (gateway/upstream/scheduling)."""
        r = self.registry
        self.route_decisions = Counter(
            "gateway_route_decisions",
            "Upstream choices by the reason that decided them: only, least_in_flight, "
            "round_robin, prefix, session, residency, load, balance_guard, failover, panic.",
            ("reason",),
            registry=r,
        )
        self.route_prefix_hit_tokens = Histogram(
            "gateway_route_prefix_hit_tokens",
            "Estimated prompt tokens the chosen upstream was recently sent already (the "
            "scored policy's prefix match; 0: none).",
            buckets=PREFIX_HIT_BUCKETS,
            registry=r,
        )
        self.route_cold_loads = Counter(
            "gateway_route_cold_loads",
            "Requests sent to an upstream known not to have the model loaded.",
            ("upstream",),
            registry=r,
        )

    def _batch_metrics(self) -> None:
        """Batch jobs (see gateway/batch)."""
        r = self.registry
        self.batch_lines = Counter(
            "gateway_batch_lines",
            "Batch line attempts by outcome: succeeded, failed (to the error file), retried, "
            "deferred (no spare slot, or the key's own limit), preempted (by interactive "
            "traffic), superseded (its lease was taken over).",
            ("outcome",),
            registry=r,
        )
        self.batch_queue_depth = Gauge(
            "gateway_batch_queue_depth",
            "Batch lines waiting to run, over every running batch (from the database).",
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.batch_lines_running = Gauge(
            "gateway_batch_lines_running",
            "Batch lines this process runs now.",
            multiprocess_mode="livesum",
            registry=r,
        )

    def _limit_metrics(self) -> None:
        """Rate limiting (gateway/limits) and the upstream gate (gateway/upstream/slots.py)."""
        r = self.registry
        self.rate_limited = Counter(
            "gateway_rate_limited",
            "Requests refused by a limit, by kind: rpm, tpm, concurrency (per key), "
            "queue_full, queue_timeout (per upstream).",
            ("kind",),
            registry=r,
        )
        self.address_limited = Counter(
            "gateway_address_limited",
            "Failed authentications refused with 429 by their client address's budget, by "
            "budget: api (API keys), admin (admin tokens).",
            ("budget",),
            registry=r,
        )
        self.door_refused = Counter(
            "gateway_door_refused",
            "Client connections or requests refused or cut before the app, by reason: "
            "connections (GATEWAY_MAX_CLIENT_CONNECTIONS), connections_per_address, "
            "head_timeout, body_timeout (408 or a close), head_too_large (431).",
            ("reason",),
            registry=r,
        )
        self.rate_limit_storage_errors = Counter(
            "gateway_rate_limit_storage_errors",
            "Limiter storage failures or timeouts (the fail-open/closed policy applied).",
            registry=r,
        )
        self.upstream_retries = Counter(
            "gateway_upstream_retries",
            "Upstream tries repeated before the first byte, by reason (connect, status).",
            ("reason",),
            registry=r,
        )
        self.upstream_in_flight = Gauge(
            "gateway_upstream_in_flight",
            "Requests in flight to each upstream (what least-in-flight balancing compares).",
            ("upstream",),
            multiprocess_mode="livesum",
            registry=r,
        )
        self.upstream_circuit_state = Gauge(
            "gateway_upstream_circuit_state",
            "Circuit breaker of each upstream: 0 closed, 1 half-open (one trial), 2 open.",
            ("upstream",),
            multiprocess_mode="livemax",
            registry=r,
        )
        self.upstream_failovers = Counter(
            "gateway_upstream_failovers",
            "Requests moved to another upstream after a failure before the first byte.",
            registry=r,
        )
        self.upstream_queue_length = Gauge(
            "gateway_upstream_queue_length",
            "Requests waiting for an upstream slot.",
            ("upstream",),
            multiprocess_mode="livesum",
            registry=r,
        )
        self.upstream_slots_in_use = Gauge(
            "gateway_upstream_slots_in_use",
            "Upstream slots taken (requests in flight through the gate).",
            ("upstream",),
            multiprocess_mode="livesum",
            registry=r,
        )
        self.upstream_connections_in_use = Gauge(
            "gateway_upstream_connections_in_use",
            "Upstream connections held by open responses (generations, probes, model lists), "
            "at most GATEWAY_MAX_CONNECTIONS.",
            ("upstream",),
            multiprocess_mode="livesum",
            registry=r,
        )

    def series(self, route: str, model: str, key: str) -> RequestSeries:
        """The labelled children a generation for (`route`, `model`, `key`) records into.

        Resolved once per label combination and kept: `labels()` costs a lock and a tuple
        lookup each, and a request records into ten series. The number kept is bounded like
        the labels themselves (module docstring).
        """
        found = self._series.get((route, model, key))
        if found is None:
            found = self._series[(route, model, key)] = RequestSeries(
                in_flight=self.in_flight.labels(model),
                request_duration=self.request_duration.labels(route, model),
                ttft=self.ttft.labels(model, key),
                queue_wait=self.queue_wait.labels(model),
                prefill_tokens_per_second=self.prefill_tokens_per_second.labels(model),
                output_tokens_per_second=self.output_tokens_per_second.labels(model, key),
                time_per_output_token=self.time_per_output_token.labels(model),
                input_tokens=self.input_tokens.labels(model, key),
                output_tokens=self.output_tokens.labels(model, key),
            )
        return found

    def record(self, series: RequestSeries, summary: RequestSummary) -> None:
        """Record one finished request into `series` (its labels' children) and the counters."""
        series.in_flight.dec()
        self.requests.labels(
            summary.route, summary.model, summary.key, f"{summary.status // 100}xx", summary.outcome
        ).inc()
        series.request_duration.observe(summary.duration_s)
        if summary.ttft_s is not None:
            series.ttft.observe(summary.ttft_s)
        if summary.queue_wait_s is not None:
            series.queue_wait.observe(summary.queue_wait_s)
        if summary.prefill_tokens_per_s is not None:
            series.prefill_tokens_per_second.observe(summary.prefill_tokens_per_s)
        if summary.tokens_per_s is not None:
            series.output_tokens_per_second.observe(summary.tokens_per_s)
        if summary.time_per_output_token_s is not None:
            series.time_per_output_token.observe(summary.time_per_output_token_s)
        if summary.tokens_in:
            series.input_tokens.inc(summary.tokens_in)
        if summary.tokens_out:
            series.output_tokens.inc(summary.tokens_out)

    def count_rejection(
        self, route: str, status: int, outcome: str, key: str | None = None
    ) -> None:
        """Count a request refused before it reached the relay (auth, body checks, limits).

        Its model is not trusted yet, so it is counted under `model="other"`; `key` is the key's
        label when the key was authenticated, else `none`.
        """
        status_class = f"{status // 100}xx"
        self.requests.labels(route, OTHER_MODEL, key or NO_KEY, status_class, outcome).inc()

    def forget_model_memory(self) -> None:
        """Drop every `gateway_upstream_model_memory_bytes` series (models were unloaded).

        With workers prometheus-client cannot remove a series (its value stays in this
        process's file), so each is set to 0 instead: it reads 0 rather than disappearing.
        """
        gauge = self.upstream_model_memory
        if self.multiprocess_dir is None:
            gauge.clear()
            return
        for labels in list(gauge._metrics):  # the children it holds (private, no accessor)
            gauge.labels(*labels).set(0)

    async def endpoint(self, _: Request) -> Response:
        """Serve `GET /metrics` in the Prometheus text format, without a redirect."""
        return Response(await self.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def exposition(self) -> bytes:
        """The metrics in the text format, with every value recorded before this call.

        Rendering the page (about 1 KB per label combination, read back from every worker's
        files under `--workers`) is Python code: it runs in a worker thread, which hands the GIL
        back to the event loop every few milliseconds, and one render at a time per process, so
        a flood of `/metrics` requests costs one render in flight. A caller never gets a render
        that started before it arrived (it could miss a value just recorded): it joins the
        queued render if there is one, else queues one that starts when the running one ends.

        Raises:
            Exception: Whatever rendering raised (each caller of that render gets it).
        """
        job = self._queued
        if job is None:
            job = _Render()
            # Shielded: callers that joined this render wait for it even if this one goes away.
            with anyio.CancelScope(shield=True):
                running = self._rendering
                if running is not None:
                    self._queued = job
                    await running.done.wait()
                    self._queued = None
                self._rendering = job
                try:
                    job.page = await anyio.to_thread.run_sync(generate_latest, self._exposed)
                except Exception as exc:  # handed to every caller of this render
                    job.error = exc
                finally:
                    self._rendering = None
                    job.done.set()
        else:
            await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.page


@dataclass(slots=True)
class _Render:
    """One render of the page (`Metrics.exposition`), shared by the callers that joined it.

    Attributes:
        done: Set when it has ended, with `page` or `error`.
        page: The text format, bytes.
        error: What rendering raised, if it failed.
    """

    done: anyio.Event = field(default_factory=anyio.Event)
    page: bytes = b""
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class RequestSeries:
    """One label combination's children of the per-request metrics (`Metrics.series`).

    Each attribute is the child of the `Metrics` attribute of the same name.
    """

    in_flight: Gauge
    request_duration: Histogram
    ttft: Histogram
    queue_wait: Histogram
    prefill_tokens_per_second: Histogram
    output_tokens_per_second: Histogram
    time_per_output_token: Histogram
    input_tokens: Counter
    output_tokens: Counter

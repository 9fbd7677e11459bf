"""The statistics of a benchmark: distributions, one repeat's summary, the spread over repeats.

`summarize` turns the `RequestRecord`s of one repeat into the run document's "repeat" object
(docs/benchmarking.md): counts, the per-repeat scalars (`requests_per_second`,
`output_tokens_per_second`, `goodput_requests_per_second`, `error_rate`), a distribution of
every per-request metric, the source of each metric, the client's own measures beside the
server's, and a few error examples. `point_summary` folds a point's repeats into `<metric>.<stat>`
keys, each with `across_repeats` (median, min, max, spread) and its confidence interval
(`gateway.clients.bench.intervals`: Student's t over the repeats; with one repeat, the interval
within the run where its requests are independent samples). Percentiles are
`gateway.clients.bench.quantiles.percentile`, below this module and the SLOs it takes.

Over ~300 lines for one reason: `summarize` and `point_summary` write the two halves of the run
document's statistics, and must name every metric and statistic alike (`distribution`,
`across_repeats`, the intervals, `CONVERGENCE_KEYS`); split, the keys one writes and the other folds
would be defined apart.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.clients.bench.intervals import (
    DEFAULT_CONFIDENCE,
    mean_interval,
    quantile_interval,
)
from gateway.clients.bench.quantiles import percentile, stat_name
from gateway.clients.bench.records import RequestRecord, Source
from gateway.clients.keyfile import redact_key

if TYPE_CHECKING:
    from gateway.clients.bench.slo import Slo

#: Per-request metrics, in the order the reports show them (JSON keys, SLO names, CSV columns).
METRICS = (
    "ttft_seconds",
    "tpot_seconds",
    "itl_seconds",
    "e2e_seconds",
    "output_tokens",
    "prompt_tokens",
    "decode_tokens_per_second",
    "prefill_tokens_per_second",
)
#: Per-repeat scalars.
SCALARS = (
    "requests_per_second",
    "output_tokens_per_second",
    "goodput_requests_per_second",
    "error_rate",
)
#: Percentiles every distribution carries; an SLO may add its own (`p99.9`, `p75`).
PERCENTILES = (50.0, 90.0, 95.0, 99.0)
#: How many error examples a repeat keeps, and how long each may be.
ERROR_EXAMPLES = 5
ERROR_EXAMPLE_CHARS = 200

Value = tuple[float, str] | None
"""A metric's value for one request and where it came from, or None (not measured)."""


def distribution(values: Sequence[float], extra: Iterable[float] = ()) -> dict[str, float | None]:
    """`mean`, `p50`, `p90`, `p95`, `p99` (plus the percentiles in `extra`), `min`, `max`, `count`.

    Every statistic but `count` is None without values.
    """
    qs = sorted({*PERCENTILES, *extra})
    out: dict[str, float | None] = {"mean": statistics.fmean(values) if values else None}
    out.update({stat_name(q): percentile(values, q) for q in qs})
    out["min"] = min(values) if values else None
    out["max"] = max(values) if values else None
    out["count"] = len(values)
    return out


def _decode(record: RequestRecord) -> Value:
    return record.decode_rate


def _prefill(record: RequestRecord) -> Value:
    return record.prefill_rate


def _client_only(value: float | None) -> Value:
    return None if value is None else (value, "client")


#: One value per request for each metric but `itl_seconds` (which has one per gap), with its
#: source. TPOT is the client's clock over the server's token count, so its source is the count's.
REQUEST_METRICS: dict[str, Callable[[RequestRecord], Value]] = {
    "ttft_seconds": lambda r: _client_only(r.ttft),
    "tpot_seconds": lambda r: None if r.tpot is None else (r.tpot, r.output_source),
    "e2e_seconds": lambda r: (r.e2e, "client"),
    "output_tokens": lambda r: (
        None if r.output_tokens is None else (float(r.output_tokens), r.output_source)
    ),
    "prompt_tokens": lambda r: (
        None
        if r.prompt_tokens is None or r.prompt_source is None
        else (float(r.prompt_tokens), r.prompt_source)
    ),
    "decode_tokens_per_second": _decode,
    "prefill_tokens_per_second": _prefill,
}


def client_decode_rate(record: RequestRecord) -> float | None:
    """Content chunks per second after the first, on the client's clock alone, or None.

    `(chunks - 1) / (end - first chunk)`: the client's view of the decode rate, shown beside the
    server's (a chunk may carry more than one token, so the two differ when it does).
    """
    chunks = len(record.chunk_times)
    if record.first_token is None or chunks < 2 or record.end <= record.first_token:
        return None
    return (chunks - 1) / (record.end - record.first_token)


def escape_error(text: str, limit: int = ERROR_EXAMPLE_CHARS, key: str | None = None) -> str:
    """`text` fit for a report: control characters escaped, cut to `limit` characters with `…`.

    `key` (the client's key, when the text came from the server) is redacted first
    (`gateway.clients.keyfile.redact_key`): after the cut, part of it would no longer be recognised.
    """
    text = redact_key(text, key)
    safe = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return safe if len(safe) <= limit else safe[: limit - 1] + "…"


def _sources(found: Iterable[Source | str]) -> str | None:
    distinct = set(found)
    if not distinct:
        return None
    return distinct.pop() if len(distinct) == 1 else "mixed"


def summarize(
    records: Sequence[RequestRecord],
    window_start: float,
    window_end: float,
    slo: Slo | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict[str, Any]:
    """One repeat's "repeat" object (the run document's schema, docs/benchmarking.md).

    Warm-up records are left out of everything. `requests_per_second` counts the successful
    requests that ended inside `[window_start, window_end]`; `output_tokens_per_second` the
    output tokens made inside it (a request straddling an edge brings the share of its chunks
    that arrived inside, `_tokens_in_window`); the distributions take every successful request,
    also one that ended after the window (its latency is as real as the others'). `error_rate`
    is failed / all requests sent.

    Args:
        records: The repeat's requests (`perf_counter` seconds).
        window_start: Start of the measured window, `perf_counter` seconds.
        window_end: Its end; must be after `window_start`.
        slo: When given, goodput counts the in-window requests that each meet every bound
            (`Slo.request_good`), and the distributions carry the SLO's own percentiles.
            Without it `goodput_requests_per_second` is None.
        confidence: The confidence of `intervals` (0.95).

    Returns:
        `window_seconds`, `requests`, `completed`, `errors`, `error_examples` (up to 5 distinct,
        escaped and cut to 200 characters), the four scalars, `metrics` (metric -> distribution),
        `sources` (metric -> source, `mixed` when requests disagree, None when unmeasured) and
        `client` (`decode_tokens_per_second` and `output_chunks` from the client's clock and
        chunk count alone), `intervals` (metric -> stat -> [low, high] or None, `within_run`)
        and `interval_confidence`.

    Raises:
        ValueError: the window is empty or reversed.
    """
    window = window_end - window_start
    if not window > 0:
        raise ValueError(f"the window must be positive, got {window_start} to {window_end}")
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    in_window = [r for r in ok if window_start <= r.end <= window_end]
    extra = slo.percentiles() if slo is not None else {}

    metrics: dict[str, dict[str, float | None]] = {}
    sources: dict[str, str | None] = {}
    intervals: dict[str, dict[str, list[float] | None]] = {}
    for name, read in REQUEST_METRICS.items():
        values = [v for v in (read(r) for r in ok) if v is not None]
        metrics[name] = distribution([v for v, _ in values], extra.get(name, ()))
        sources[name] = _sources(s for _, s in values)
        intervals[name] = within_run([v for v, _ in values], metrics[name], confidence)
    gaps = [gap for r in ok for gap in r.inter_token_latencies]
    metrics["itl_seconds"] = distribution(gaps, extra.get("itl_seconds", ()))
    sources["itl_seconds"] = "client" if gaps else None
    metrics = {name: metrics[name] for name in METRICS}
    sources = {name: sources[name] for name in METRICS}

    examples: list[str] = []
    for r in failed:
        text = escape_error(r.error or f"HTTP {r.status}")
        if text not in examples and len(examples) < ERROR_EXAMPLES:
            examples.append(text)
    client_rates = [v for v in (client_decode_rate(r) for r in ok) if v is not None]
    good = None if slo is None else sum(1 for r in in_window if slo.request_good(r))
    return {
        "window_seconds": window,
        "requests": len(measured),
        "completed": len(in_window),
        "errors": len(failed),
        "error_examples": examples,
        "requests_per_second": len(in_window) / window,
        "output_tokens_per_second": sum(_tokens_in_window(r, window_start, window_end) for r in ok)
        / window,
        "goodput_requests_per_second": None if good is None else good / window,
        "error_rate": len(failed) / len(measured) if measured else None,
        "metrics": metrics,
        "sources": sources,
        "client": {
            "decode_tokens_per_second": distribution(client_rates),
            "output_chunks": distribution([float(len(r.chunk_times)) for r in ok]),
        },
        "intervals": {name: intervals[name] for name in METRICS if name in intervals},
        "interval_confidence": confidence,
    }


def within_run(
    values: Sequence[float], dist: Mapping[str, float | None], confidence: float
) -> dict[str, list[float] | None]:
    """The intervals of one repeat's statistics of a per-request metric (one value a request).

    Requests are taken as independent draws: the mean gets Student's t interval over the
    requests, each percentile the order-statistic interval (`intervals.quantile_interval`).
    Not offered for ITL, whose gaps within one answer are not independent (a slow answer has
    slow gaps throughout), nor for the per-repeat scalars (one window, one value): their
    intervals come from repeats. In a closed loop near saturation requests wait on each other,
    so these intervals are a lower bound on the run-to-run noise: gate on repeats.

    Returns:
        `{"mean": [low, high] | None, "p50": ..., ...}` for every statistic of `dist` but
        `min`, `max`, `count`; None where the samples are too few.
    """
    ordered = sorted(values)
    out: dict[str, list[float] | None] = {}
    for stat in dist:
        if stat in ("min", "max", "count"):
            continue
        if stat == "mean":
            found = mean_interval(ordered, confidence)
            out[stat] = None if found is None else [found.low, found.high]
        else:
            span = quantile_interval(ordered, float(stat[1:]) / 100, confidence)
            out[stat] = None if span is None else [span[0], span[1]]
    return out


def _tokens_in_window(record: RequestRecord, start: float, end: float) -> float:
    """The part of a request's output tokens made inside the window, by its chunks' times.

    A request that straddles an edge of the window (started in the warm-up, or still decoding
    when a duration ends) brings only the share of its tokens that arrived inside it, so the
    edges bias neither a closed nor an open loop. The server's count is spread evenly over the
    content chunks; a request without chunks counts whole when it ended inside the window.
    """
    tokens = record.output_tokens or 0
    times = record.chunk_times
    if not times:
        return float(tokens) if start <= record.end <= end else 0.0
    inside = sum(1 for t in times if start <= t <= end)
    return tokens * inside / len(times)


def across_repeats(values: Iterable[float | None]) -> dict[str, float | None]:
    """`median`, `min`, `max` and `spread` = (max - min) / median of one value over repeats.

    Repeats without the value (None) are left out; with none left every entry is None. The
    spread is 0 with one repeat, and None when the median is 0 but the values differ.
    """
    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "min": None, "max": None, "spread": None}
    median, low, high = statistics.median(present), min(present), max(present)
    if high == low:
        spread: float | None = 0.0
    else:
        spread = (high - low) / abs(median) if median else None
    return {"median": median, "min": low, "max": high, "spread": spread}


def interval_over_repeats(
    values: Iterable[float | None],
    confidence: float = DEFAULT_CONFIDENCE,
    within: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The confidence interval of one statistic over a point's repeats.

    With 2 or more repeats: Student's t interval of their mean (`intervals.mean_interval`; each
    repeat is an independent run). With one: `within`, the repeat's own interval from its
    requests (`within_run`), when it has one. Repeats without the value are left out.

    Returns:
        `mean` (over the repeats), `ci_low`, `ci_high`, `n` (repeats with the value),
        `confidence` and `ci_method` (`t over repeats`, `within run`, or None without an
        interval, when `ci_low` and `ci_high` are None too).
    """
    present = [v for v in values if v is not None]
    found = mean_interval(present, confidence)
    out: dict[str, Any] = {
        "mean": statistics.fmean(present) if present else None,
        "ci_low": None,
        "ci_high": None,
        "n": len(present),
        "confidence": confidence,
        "ci_method": None,
    }
    if found is not None:
        out.update(ci_low=found.low, ci_high=found.high, ci_method="t over repeats")
    elif len(present) == 1 and within is not None and len(within) == 2:
        out.update(ci_low=within[0], ci_high=within[1], ci_method="within run")
    return out


def point_summary(
    repeats: Sequence[Mapping[str, Any]], confidence: float = DEFAULT_CONFIDENCE
) -> dict[str, dict[str, Any]]:
    """A point's `summary`: `<metric>.<stat>` and the bare scalars, each `across_repeats`.

    Args:
        repeats: `summarize` results of one point (one per `--repeat`).
        confidence: The confidence of the intervals (`interval_over_repeats`).

    Returns:
        For example `{"ttft_seconds.p50": {"median": ..., "min": ..., "max": ..., "spread": ...,
        "mean": ..., "ci_low": ..., "ci_high": ..., "n": ..., "confidence": ..., "ci_method":
        ...}, "output_tokens_per_second": {...}}`; `count` is left out (it is no statistic of the
        server).
    """
    out: dict[str, dict[str, Any]] = {}
    if not repeats:
        return out
    for metric in METRICS:
        for stat in repeats[0]["metrics"][metric]:
            if stat != "count":
                values = [r["metrics"][metric].get(stat) for r in repeats]
                within = (repeats[0].get("intervals") or {}).get(metric, {}).get(stat)
                out[f"{metric}.{stat}"] = {
                    **across_repeats(values),
                    **interval_over_repeats(values, confidence, within),
                }
    for scalar in SCALARS:
        values = [r[scalar] for r in repeats]
        out[scalar] = {**across_repeats(values), **interval_over_repeats(values, confidence)}
    return out


#: The statistics `--until-ci` waits on: the headline latencies and the throughput.
CONVERGENCE_KEYS = (
    "ttft_seconds.p50",
    "tpot_seconds.p50",
    "itl_seconds.p50",
    "output_tokens_per_second",
)


def unconverged(summary: Mapping[str, Mapping[str, Any]], target: float) -> list[str]:
    """The `CONVERGENCE_KEYS` whose interval over repeats is wider than `target` (`--until-ci`).

    A key converges when its `t over repeats` interval's half width is at most `target` times
    its mean (0.02: +-2%). A key not measured (None) is left out; one without an interval over
    repeats (a single repeat) has not converged.

    Returns:
        The keys still too wide, with their relative half width, e.g. `["ttft_seconds.p50
        +-3.1%"]`; empty when every key converged.
    """
    wide = []
    for key in CONVERGENCE_KEYS:
        entry = summary.get(key) or {}
        mean = entry.get("mean")
        if mean is None:
            continue
        low, high = entry.get("ci_low"), entry.get("ci_high")
        if entry.get("ci_method") != "t over repeats" or low is None or high is None:
            wide.append(f"{key} (no interval yet)")
            continue
        half = (high - low) / 2
        relative = 0.0 if half == 0 else (half / abs(mean) if mean else float("inf"))
        if relative > target:
            wide.append(f"{key} +-{relative:.1%}")
    return wide

"""One measured run: spawn the load generator(s) against a target, read what everything cost.

Owns `measure` (one target at one concurrency: latency, throughput, the proxy's CPU per request,
the upstream's and the load generator's CPU share) and `idle_stream_memory` (the gateway's RSS
per open idle stream). The load generator is `python -m benchmarks.load` in one or more processes of
its own; their JSON reports are merged here. Percentiles are
`gateway.clients.bench.quantiles.percentile`,
the one definition `gateway bench` uses too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.load import gap_seconds
from benchmarks.procstat import cpu_seconds, load_average, rss_kib
from benchmarks.servers import Target
from gateway.clients.bench.quantiles import percentile


@dataclass(frozen=True)
class LoadPlan:
    """How long and how hard to drive one run.

    Attributes:
        duration: Measured seconds per run (ignored when `requests` is set).
        warmup: Seconds over which the streams start, unmeasured.
        requests: Measure this many requests instead of a duration.
        processes: Load generator processes; the streams are split between them.
        parse_all: Parse every line (token counts and decode rates; real model only).
        client: The load generator's HTTP client, `raw` (httptools) or `httpx`.
        pace: The upstream's seconds between tokens: each answer is judged to hold or not
            (`benchmarks.load.HOLD_FACTOR`); None: not judged.
        expect_chunks: Chunks every answer must carry to hold (None: not checked).
    """

    duration: float = 10.0
    warmup: float = 1.0
    requests: int | None = None
    processes: int = 1
    parse_all: bool = False
    client: str = "raw"
    pace: float | None = None
    expect_chunks: int | None = None


def _load_argv(target: Target, streams: int, plan: LoadPlan, extra: Sequence[str]) -> list[str]:
    argv = [sys.executable, "-m", "benchmarks.load", "--url", target.url, "--path", target.path]
    argv += ["--body", json.dumps(target.body), "--concurrency", str(streams)]
    argv += ["--duration", str(plan.duration), "--warmup", str(plan.warmup)]
    if plan.requests is not None:
        argv += ["--requests", str(plan.requests)]
    if target.key:
        argv += ["--key", target.key]
    if target.sse:
        argv += ["--sse", "--events", target.events]
    if plan.parse_all:
        argv.append("--parse-all")
    argv += ["--client", plan.client]
    if plan.pace is not None:
        argv += ["--pace", str(plan.pace)]
    if plan.expect_chunks is not None:
        argv += ["--expect-chunks", str(plan.expect_chunks)]
    return [*argv, *extra]


def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def measure(
    target: Target, concurrency: int, plan: LoadPlan, upstream_pid: int | None
) -> dict[str, Any]:
    """Drive `concurrency` streams at `target` and summarise the run.

    Returns:
        The row: TTFT percentiles (ms), requests/s, chunks/s, tokens/s, the proxy's CPU ms per
        request (over every request the run completed, warm-up included), the upstream's and the
        load generators' CPU share of one core, errors with a few examples, the gaps between
        chunks (`gap_ms` p50/p99) and, with `plan.pace`, the answers that held of those judged.

    Raises:
        RuntimeError: a load generator failed (its stderr is in the message).
    """
    requests = None if plan.requests is None else _split(plan.requests, plan.processes)
    load_before = load_average()
    proxy_before = cpu_seconds(target.pids)
    upstream_before = cpu_seconds([upstream_pid] if upstream_pid else [])
    started = time.perf_counter()
    children = []
    for i, streams in enumerate(_split(concurrency, plan.processes)):
        part = plan if requests is None else LoadPlan(**{**plan.__dict__, "requests": requests[i]})
        children.append(
            subprocess.Popen(  # noqa: S603 - our own module
                _load_argv(target, streams, part, []),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    reports = []
    for child in children:
        out, err = child.communicate(timeout=plan.duration + plan.warmup + 600)
        if child.returncode != 0:
            raise RuntimeError(f"load generator failed ({child.returncode}):\n{err.decode()}")
        reports.append(json.loads(out))
    wall = time.perf_counter() - started
    proxy_cpu = cpu_seconds(target.pids) - proxy_before
    upstream_cpu = cpu_seconds([upstream_pid] if upstream_pid else []) - upstream_before
    return summarise(target, concurrency, reports, wall, proxy_cpu, upstream_cpu, load_before)


def summarise(
    target: Target,
    concurrency: int,
    reports: list[dict[str, Any]],
    wall: float,
    proxy_cpu: float,
    upstream_cpu: float,
    load_before: float,
) -> dict[str, Any]:
    """Merge the load generators' reports into one row (see `measure`)."""
    window = max(r["window_seconds"] for r in reports)
    ttfts = [t * 1000 for r in reports for t in r["ttft_seconds"]]
    decode = [rate for r in reports for rate in r["decode_tokens_per_second"]]
    per_request = [n for r in reports for n in r["tokens_per_request"]]
    completed = sum(r["completed"] for r in reports)
    row: dict[str, Any] = {
        "target": target.name,
        "baseline": None if target.baseline == target.name else target.baseline,
        "concurrency": concurrency,
        "window_seconds": round(window, 3),
        "requests": sum(r["requests"] for r in reports),
        "requests_per_second": sum(r["requests"] for r in reports) / window,
        "chunks": sum(r["chunks"] for r in reports),
        "chunks_per_second": sum(r["chunks"] for r in reports) / window,
        "tokens_per_second": sum(r["tokens"] for r in reports) / window,
        "ttft_ms": {f"p{q}": percentile(ttfts, q) for q in (50, 95, 99)},
        "ttft_samples": len(ttfts),
        "completed": completed,
        "errors": sum(r["errors"] for r in reports),
        "error_examples": [e for r in reports for e in r["error_examples"]][:5],
        "proxy_cpu_ms_per_request": (
            proxy_cpu * 1000 / completed if target.pids and completed else None
        ),
        "proxy_cpu_share": proxy_cpu / wall if target.pids else None,
        "upstream_cpu_share": upstream_cpu / wall,
        "load_cpu_share": max(r["cpu_fraction"] for r in reports),
        "load_average_before": load_before,
    }
    bins: dict[int, int] = {}
    for report in reports:
        for index, count in (report.get("gap_bins") or {}).items():
            bins[int(index)] = bins.get(int(index), 0) + count
    row["gap_ms"] = {f"p{q}": gap_percentile(bins, q) for q in (50, 99)}
    judged = sum(r.get("judged", 0) for r in reports)
    row["held"] = sum(r.get("held", 0) for r in reports) if judged else None
    row["judged"] = judged or None
    if per_request:
        row["tokens_per_request_p50"] = percentile(per_request, 50)
        row["decode_tokens_per_second_p50"] = percentile(decode, 50)
    return row


def gap_percentile(bins: dict[int, int], q: float) -> float | None:
    """The `q`th percentile (0-100) of the gaps counted in `bins`, in ms; None when empty.

    Read as the upper edge of the bin the percentile falls in (`benchmarks.load.gap_seconds`),
    so within 2 % above the exact value.
    """
    total = sum(bins.values())
    if not total:
        return None
    rank = q / 100 * total
    seen = 0
    for index in sorted(bins):
        seen += bins[index]
        if seen >= rank:
            return gap_seconds(index) * 1000
    return gap_seconds(max(bins)) * 1000


def idle_stream_memory(target: Target, gateway_pid: int, streams: int) -> dict[str, Any]:
    """The gateway's RSS per open idle stream, in KiB.

    `target` must point at a gateway whose upstream sends one chunk and then nothing for a long
    time. A few streams are opened and closed first so that first-request allocations (imports,
    caches, the connection pool) do not count; then `streams` are opened and held while RSS is
    read, and the delta over the warm baseline is divided by their number. Use 64 or more: a
    handful of streams fits in memory the allocator already holds and reads as almost nothing.
    """
    _hold(target, 8, gateway_pid)
    time.sleep(1.0)
    baseline = rss_kib(gateway_pid)
    ready, loaded = _hold(target, streams, gateway_pid)
    per_stream = (loaded - baseline) / ready if ready else None
    return {
        "streams": streams,
        "ready": ready,
        "rss_baseline_kib": baseline,
        "rss_loaded_kib": loaded,
        "kib_per_stream": per_stream,
    }


def _hold(target: Target, streams: int, pid: int) -> tuple[int, int]:
    """Open `streams` idle streams; return how many got their first chunk and the RSS then."""
    argv = _load_argv(target, streams, LoadPlan(), ["--hold", "120"])
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # noqa: S603
    try:
        assert child.stdout is not None  # noqa: S101
        line = child.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator failed:\n{child.communicate()[1].decode()}")
        ready = int(json.loads(line)["ready"])
        time.sleep(0.5)  # let the gateway settle after the last first chunk
        return ready, rss_kib(pid)
    finally:
        child.terminate()
        child.communicate(timeout=30)

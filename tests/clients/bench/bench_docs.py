"""Run documents for the verdict tests, built through the real statistics from synthetic records.

A simulated server with `parallel` slots: a request at concurrency C runs in a batch of
b = min(C, parallel), its tokens `tpot * (1 + k * (b - 1))` apart, and waits for a slot first
when C > parallel. Each of C closed-loop workers sends `per_worker` requests back to back, so the
window is the longest worker's time. `slowdown` multiplies every time (TTFT, gaps, window), so a
slowdown of 1.2 makes every latency x1.2 and every throughput /1.2; each repeat gets its own
`noise` factor (a few percent), as real repeats do. Points go through `stats.summarize` and
`stats.point_summary`, the knee through `knee.find_knee`, the policy through `policy.recommend`:
the documents have the runner's schema, not a hand-written imitation of it.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from typing import Any

from gateway.clients.bench.fingerprint import collect_fingerprint
from gateway.clients.bench.knee import find_knee, find_slo_limit
from gateway.clients.bench.policy import recommend
from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.slo import parse_slo
from gateway.clients.bench.stats import point_summary, summarize

MODEL = "llama3.2:1b"
DIGEST = "sha256:a80c4f17acd5"
GPUS = [
    {
        "index": 0,
        "name": "NVIDIA GeForce RTX 4090",
        "memory_bytes": 25_757_220_864,
        "driver": "550.54",
    }
]


def worker_records(
    concurrency: int,
    factor: float,
    rng: random.Random,
    *,
    parallel: int = 4,
    k: float = 0.1,
    ttft: float = 0.05,
    tpot: float = 0.01,
    tokens: int = 20,
    per_worker: int = 5,
    errors: int = 0,
    error_text: str = "HTTP 500: out of memory",
) -> tuple[list[RequestRecord], float]:
    """The records of one repeat at `concurrency`, and the window's end (it starts at 0)."""
    batch = min(concurrency, parallel)
    step = tpot * (1 + k * (batch - 1))
    service = ttft + (tokens - 1) * step
    wait = max(0, concurrency - parallel) / parallel * service
    records = []
    end_of_window = 0.0
    for _worker in range(concurrency):
        t = 0.0
        for index in range(per_worker):
            jitter = factor * (1 + rng.uniform(-0.01, 0.01))
            first = t + (wait + ttft * (1 + k * (batch - 1))) * jitter
            chunks = tuple(first + i * step * jitter for i in range(tokens))
            records.append(
                RequestRecord(
                    start=t,
                    end=chunks[-1],
                    ok=True,
                    status=200,
                    error=None,
                    first_token=first,
                    chunk_times=chunks,
                    output_tokens=tokens,
                    output_source="ollama",
                    prompt_tokens=24,
                    prompt_source="ollama",
                    decode_seconds=(tokens - 1) * step * jitter,
                    prefill_seconds=0.5 * ttft * jitter,
                    timing_source="ollama",
                    model=MODEL,
                    prompt_id=f"en-short-{index % 4 + 1}",
                )
            )
            t = chunks[-1]
        end_of_window = max(end_of_window, t)
    for _ in range(errors):
        records.append(
            RequestRecord(0.0, 0.01, False, 500, error_text, None, (), None, "client", model=MODEL)
        )
    return records, end_of_window


def model_entry(
    model: str = MODEL,
    *,
    levels: Sequence[int] = (1, 2, 4, 8),
    repeat: int = 3,
    slowdown: float = 1.0,
    noise: float = 0.03,
    seed: int = 1,
    slo: str | None = "ttft_p99<=200ms",
    errors: int = 0,
    error_text: str = "HTTP 500: out of memory",
    quality: float | None = 11 / 12,
) -> dict[str, Any]:
    """One model's entry: points at `levels`, knee, SLO limit, policy, size, quality."""
    rng = random.Random(seed)  # noqa: S311 - reproducible noise, not secrets
    bounds = None if slo is None else parse_slo(slo)
    points = []
    for level in levels:
        repeats = []
        for _ in range(repeat):
            factor = slowdown * (1 + rng.uniform(-noise, noise))
            records, end = worker_records(level, factor, rng, errors=errors, error_text=error_text)
            repeats.append(summarize(records, 0.0, end, bounds))
        summary = point_summary(repeats)
        points.append(
            {
                "shape": "concurrency",
                "level": level,
                "repeats": repeats,
                "summary": summary,
                "slo_met": None if bounds is None else bounds.met(summary),
                "slo_violations": [] if bounds is None else bounds.violations(summary),
            }
        )
    knee = find_knee(points, 0.1)
    slo_limit = find_slo_limit(points)
    return {
        "model": model,
        "server": {"version": "0.5.7", "digest": DIGEST},
        "cold_load": {"load_seconds": 1.8, "ttft_seconds": 2.1},
        "points": points,
        "knee": knee,
        "slo_limit": slo_limit,
        "stopped": None,
        "policy": recommend(points, knee, slo_limit),
        "size": {
            "disk_bytes": 1_321_098_329,
            "loaded_bytes": 2_100_000_000,
            "vram_bytes": 2_100_000_000,
        },
        "quality": None
        if quality is None
        else {
            "score": quality,
            "correct": round(quality * 12),
            "total": 12,
            "errors": 0,
            "set": "builtin-12",
            "answers": [],
        },
        "resources": {"timeline": [], "notes": []},
    }


def run_doc(
    entries: Sequence[dict[str, Any]] | None = None,
    *,
    repeat: int = 3,
    slo: str | None = "ttft_p99<=200ms",
    digests: dict[str, str] | None = None,
    **entry_options: Any,
) -> dict[str, Any]:
    """A whole `gateway-bench/1` document around `entries` (one default model when None)."""
    models = (
        list(entries)
        if entries is not None
        else [model_entry(repeat=repeat, slo=slo, **entry_options)]
    )
    parameters = {
        "target": "http://127.0.0.1:11434",
        "api": "ollama",
        "through_gateway": False,
        "shape": "sweep",
        "levels": [p["level"] for p in models[0]["points"]],
        "repeat": repeat,
        "duration": None,
        "requests": 20,
        "warmup": 2,
        "workload": {
            "name": "builtin",
            "prompts": 12,
            "digest": "5f1d0c9e",
            "sampling": {"temperature": 0.0, "seed": 1234, "max_tokens": 128},
        },
        "slo": slo,
        "knee_gain": 0.1,
    }
    digests = digests or {}
    target_info = {
        entry["model"]: {
            "through_gateway": False,
            "server": {
                "version": "0.5.7",
                "digest": digests.get(entry["model"], DIGEST),
                "details": {
                    "quantization_level": "Q4_K_M",
                    "parameter_size": "1.2B",
                    "family": "llama",
                    "format": "gguf",
                },
            },
        }
        for entry in models
    }
    return {
        "schema": "gateway-bench/1",
        "created": "2026-12-02T15:40:00Z",
        "command": ["gateway", "bench", "run", "--sweep", "1,2,4,8"],
        "fingerprint": collect_fingerprint(target_info, parameters, copy.deepcopy(GPUS)),
        "parameters": parameters,
        "notes": [],
        "models": models,
    }

"""GuideLLM as the established peer of `gateway bench`: its offline invocation and its numbers.

Owns `run_guidellm` (one fixed-concurrency GuideLLM run on a given server and workload) and
`read_guidellm` (its JSON report reduced to the two measures `benchmarks.peers` compares).

GuideLLM (PyPI `guidellm`, checked with 0.8.1) is installed in a venv of its own, never in the
project's: it pulls torch, transformers and datasets. It runs here without a network because the
workload is a JSONL file of chat messages (`{"messages": [...]}`), not its synthetic data: only
synthetic and trace data call the Hugging Face tokenizer (`--tokenizer`), a file dataset never
does, and `HF_HUB_OFFLINE=1` makes any attempt fail at once instead of hanging. Two backend
settings make it fit an Ollama-style or llama-cpp-python server: `api_routes./health=v1/models`
(its start-up probe is `GET /health`, which neither serves) and `extras.body` carrying
`max_tokens`, `temperature` and `seed` (its own output cap for chat is `max_completion_tokens`,
which Ollama and the emulator ignore).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Load:
    """The load both tools apply: same server, prompts, concurrency, count and sampling.

    Attributes:
        url: The server's base URL (no `/v1`).
        model: The model name sent in each request.
        workload: JSONL file, one `{"id", "messages"}` row per request, in sending order.
        concurrency: Closed-loop workers (streams).
        requests: Requests measured (the workload has exactly this many rows).
        max_tokens: Output cap per request.
        temperature: Sampling temperature.
        seed: Sampling seed.
    """

    url: str
    model: str
    workload: Path
    concurrency: int
    requests: int
    max_tokens: int
    temperature: float = 0.0
    seed: int = 1234


@dataclass(frozen=True)
class Measures:
    """The two compared measures of one tool's run, plus what explains them.

    Attributes:
        ttft_p50: Median TTFT, seconds.
        output_tokens_per_second: Output tokens of completed requests / window, tokens/s.
        completed: Requests that completed.
        errors: Requests that failed.
        output_tokens: Output tokens summed over the completed requests.
        window_seconds: The window the rate is computed over.
        detail: Secondary values (e.g. the same measures recomputed another way).
    """

    ttft_p50: float | None
    output_tokens_per_second: float | None
    completed: int
    errors: int
    output_tokens: int | None
    window_seconds: float | None
    detail: dict[str, float | None]


def scenario(load: Load, output: Path) -> dict[str, Any]:
    """Build the GuideLLM scenario (`guidellm run -c FILE`) for `load`.

    Returns:
        The scenario document: concurrent profile with `load.concurrency` streams, no warm-up or
        cool-down (the caller warms the server once for both tools), `max_requests` =
        `load.requests`, the workload as a `json_file` dataset read in order, JSON output.
    """
    return {
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": load.url,
                "model": load.model,
                "request_format": "/v1/chat/completions",
                "api_routes": {"/health": "v1/models"},
                "extras": {
                    "body": {
                        "max_tokens": load.max_tokens,
                        "temperature": load.temperature,
                        "seed": load.seed,
                    }
                },
            },
            "profile": {"kind": "concurrent", "streams": [load.concurrency]},
            "data": [{"kind": "json_file", "path": str(load.workload)}],
            "data_loader": {"kind": "pytorch", "shuffle": False},
            "constraints": [{"kind": "max_requests", "count": load.requests}],
            "outputs": [{"kind": "json", "path": str(output)}],
        }
    }


def run_guidellm(executable: str, load: Load, workdir: Path) -> Path:
    """Run GuideLLM once on `load`; return its JSON report's path.

    Raises:
        RuntimeError: GuideLLM exited non-zero (its log is named in the message).
    """
    report = workdir / "guidellm.json"
    config = workdir / "guidellm-scenario.json"
    config.write_text(json.dumps(scenario(load, report), indent=1))
    log = workdir / "guidellm.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["TRANSFORMERS_OFFLINE"] = "1"
    argv = [executable, "run", "-c", str(config), "--disable-console-interactive"]
    with log.open("wb") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)  # noqa: S603
    if done.returncode != 0 or not report.exists():
        raise RuntimeError(f"guidellm exited {done.returncode}; see {log}")
    return report


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def read_guidellm(report: Path) -> Measures:
    """Reduce GuideLLM's JSON report to the compared measures.

    Reported values: `metrics.time_to_first_token_ms.successful.median` / 1000 and
    `metrics.output_tokens_per_second.successful.mean`. The same two are recomputed from its
    per-request records (`requests.successful[].info.timings`, all kept: no `sample_size`) with
    `gateway bench`'s definitions, in `detail`, so a gap can be told apart as definition
    (nearest-rank vs interpolated median) or measurement.
    """
    bench = json.loads(report.read_text())["benchmarks"][0]
    metrics = bench["metrics"]
    done = bench["requests"]["successful"]
    ttfts = [
        r["info"]["timings"]["first_token_iteration"] - r["info"]["timings"]["request_start"]
        for r in done
        if r["info"]["timings"]["first_token_iteration"] is not None
    ]
    tokens = sum(int(r["output_tokens"] or 0) for r in done)
    window = float(bench["end_time"]) - float(bench["start_time"])
    starts = [r["info"]["timings"]["request_start"] for r in done]
    ends = [r["info"]["timings"]["request_end"] for r in done]
    own_window = max(ends) - min(starts) if done else None
    return Measures(
        ttft_p50=metrics["time_to_first_token_ms"]["successful"]["median"] / 1000.0,
        output_tokens_per_second=metrics["output_tokens_per_second"]["successful"]["mean"],
        completed=len(done),
        errors=len(bench["requests"]["errored"]) + len(bench["requests"]["incomplete"]),
        output_tokens=tokens,
        window_seconds=window,
        detail={
            "ttft_p50_interpolated": percentile(ttfts, 50.0),
            "output_tokens_per_second_recomputed": tokens / own_window if own_window else None,
        },
    )

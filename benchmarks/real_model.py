# ruff: noqa: T201 (a benchmark prints its progress)
"""The classic local-model measurement: Gemma 3 270M on llama-cpp-python, direct vs the gateway.

Owns `real_model_sweep`. The model server is `gateway.testing.stack.model_server`; the gateway
runs in front of it with `GATEWAY_UPSTREAM_DIALECT=openai`. Direct requests are OpenAI
`POST /v1/completions` (`stream: true`, `max_tokens`); through the gateway they are Ollama
`POST /v1/generate` with `raw: true` and `options.num_predict`, which the gateway translates to
the same completion. Every line is parsed so tokens (chunks with text) and per-stream decode
rates are counted; the concurrency sweep shows where aggregate tokens/s stops growing.

llama-cpp-python's server runs one generation at a time, and by default (`interrupt_requests`)
a new request cuts the one being streamed short; the sweep turns that off so that concurrent
requests queue, which is what a throughput measurement needs (`interrupt=True` keeps it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from benchmarks.measure import LoadPlan, measure
from benchmarks.servers import Target, gateway_with_key

PROMPT = "Question: Why is the sky blue? Answer:"


def real_model_sweep(
    workdir: Path,
    levels: list[int],
    plan: LoadPlan,
    *,
    max_tokens: int,
    interrupt: bool = False,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Measure direct and through-the-gateway at each concurrency level.

    Returns:
        The rows (as `measure` makes them, with token counts) and notes for the report.
    """
    try:
        from gateway.testing.stack import MODEL_ALIAS, model_server

        server = model_server(workdir / "model")
    except ImportError as exc:
        return [], [f"real model skipped: {exc} (pip install -e '.[model]')"]
    (workdir / "model").mkdir(parents=True, exist_ok=True)
    if not interrupt:
        server.argv += ["--interrupt_requests", "false"]
    notes = []
    rows: list[dict[str, Any]] = []
    parsed = LoadPlan(**{**plan.__dict__, "parse_all": True})
    with server:
        assert server.process is not None  # noqa: S101 - started
        gateway, key = gateway_with_key(workdir / "gateway-real", server.url, dialect="openai")
        with gateway:
            assert gateway.process is not None  # noqa: S101
            direct = Target(
                "direct",
                server.url,
                "/v1/completions",
                {"model": MODEL_ALIAS, "prompt": PROMPT, "max_tokens": max_tokens, "stream": True},
                sse=True,
            )
            body = {"model": MODEL_ALIAS, "prompt": PROMPT, "raw": True, "stream": True}
            via = Target(
                "gateway",
                gateway.url,
                "/v1/generate",
                {**body, "options": {"num_predict": max_tokens}},
                key=key,
                pids=(gateway.process.pid,),
            )
            warm = LoadPlan(warmup=0.0, requests=2, parse_all=True)
            for target in (direct, via):  # the model's first answer includes its warm-up
                measure(target, 1, warm, None)
            for n in levels:
                for target in (direct, via):
                    print(f"  real model: {target.name} @{n} ...", file=sys.stderr, flush=True)
                    rows.append(measure(target, n, parsed, server.process.pid))
    if interrupt:
        notes.append("real model: llama-cpp-python interrupts a stream when another arrives")
    return rows, notes

"""End to end: `gateway bench` against a real model server (llama-cpp-python) with two real
builds of Gemma 3 270M (Q4_K_M as shipped, Q8_0 quantized from it), directly and through a real
`gateway serve` with a key.

Skipped when llama-cpp-python is not installed, except under CI (`CI=true`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.testing.stack import (
    MODEL_ALIAS,
    Q8_ALIAS,
    ManagedProcess,
    create_key,
    gateway_process,
    matrix_model_server,
)
from tests.e2e import require_model_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

require_model_server()


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ManagedProcess, ManagedProcess, str]]:
    """The two-model server and a gateway in front of it; yields (model server, gateway, key)."""
    workdir = tmp_path_factory.mktemp("bench-e2e")
    with matrix_model_server(workdir) as model:
        env = {"GATEWAY_UPSTREAM_URL": model.url, "GATEWAY_UPSTREAM_DIALECT": "openai"}
        with gateway_process(workdir, env) as gateway:
            key = create_key(gateway.extra_env, "bench")
            yield model, gateway, str(key["key"])


def _bench(tmp_path: Path, *args: str, key: str | None = None) -> dict[str, Any]:
    out = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_BENCH_API_KEY"}
    if key is not None:
        env["GATEWAY_BENCH_API_KEY"] = key
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-m", "gateway", "bench", "run", *args, "--no-gpu", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def _repeats(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [repeat for point in entry["points"] for repeat in point["repeats"]]


def test_a_concurrency_sweep_against_the_model_server(servers, tmp_path):
    model, _, _ = servers
    doc = _bench(
        tmp_path, "--target", model.url, "--api", "openai", "--model", MODEL_ALIAS,
        "--concurrency", "1,2", "--requests", "4", "--max-tokens", "16",
    )  # fmt: skip
    (entry,) = doc["models"]
    assert [p["level"] for p in entry["points"]] == [1, 2]
    for repeat in _repeats(entry):
        assert repeat["errors"] == 0
        assert repeat["completed"] >= 1
        assert repeat["metrics"]["ttft_seconds"]["p50"] > 0
        assert repeat["output_tokens_per_second"] > 0
        # llama-cpp-python's stream carries no usage: the count is the client's, and says so.
        assert repeat["sources"]["output_tokens"] == "client"
        assert 1 <= repeat["metrics"]["output_tokens"]["max"] <= 16


def test_a_two_model_matrix_through_the_gateway(servers, tmp_path):
    _, gateway, key = servers
    doc = _bench(
        tmp_path, "--target", gateway.url, "--models", f"{MODEL_ALIAS},{Q8_ALIAS}",
        "--concurrency", "1", "--requests", "3", "--max-tokens", "16", "--quality",
        key=key,
    )  # fmt: skip
    assert doc["parameters"]["through_gateway"] is True
    assert doc["parameters"]["api"] == "ollama"  # the gateway's Ollama surface
    assert [entry["model"] for entry in doc["models"]] == [MODEL_ALIAS, Q8_ALIAS]
    for entry in doc["models"]:
        for repeat in _repeats(entry):
            assert repeat["errors"] == 0
            assert repeat["sources"]["output_tokens"] == "ollama"
            # The server's eval_count matches the content chunks that arrived.
            counted = repeat["metrics"]["output_tokens"]
            chunks = repeat["client"]["output_chunks"]
            assert counted["mean"] == chunks["mean"]
            assert counted["max"] == chunks["max"]
        assert entry["quality"]["total"] == 12
        assert entry["quality"]["errors"] == 0
    report = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-m", "gateway", "bench", "report", str(tmp_path / "run.json"),
         "--format", "md"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert MODEL_ALIAS in report.stdout
    assert Q8_ALIAS.replace("_", "\\_") in report.stdout  # Markdown escapes the underscore

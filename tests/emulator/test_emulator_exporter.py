"""The emulated GPU server's own load on `/metrics` (vLLM's names), over a loopback port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.emulator.prefix import BLOCK_TOKENS
from gateway.testing.server import LoopbackServer
from tests.support.metrics import metric_value

GPU = {"prefill_rate": 3000.0, "cache_tokens": 4096, "parallel": 1, "ttft": 0.01}


@pytest.fixture
def gpu() -> Iterator[str]:
    # 200 tokens at 2 ms: a generation holds its one slot for about 0.4 s.
    app = create_emulator_app(EmulatorConfig(inter_token=0.002, tokens=200, **GPU))  # type: ignore[arg-type]
    with LoopbackServer(app) as server:
        yield server.url


def _metrics(url: str) -> str:
    response = httpx.get(f"{url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text


def test_an_idle_gpu_server_reports_zeros_for_each_installed_model(gpu):
    text = _metrics(gpu)
    for family in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc"):
        assert f"# TYPE vllm:{family} gauge" in text
        assert metric_value(text, f"vllm:{family}", model_name="llama3.2:latest") == 0
        assert f'vllm:{family}{{model_name="qwen2.5:7b"}}' in text


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_queue_the_batch_and_the_cache_fill_show(gpu):
    prompt = "words " * 400  # ~600 tokens: whole blocks held after the answer
    body = {"model": "llama3.2", "prompt": prompt, "stream": False, "options": {"num_predict": 1}}
    assert httpx.post(f"{gpu}/api/generate", json=body, timeout=10).status_code == 200
    text = _metrics(gpu)
    usage = metric_value(text, "vllm:kv_cache_usage_perc", model_name="llama3.2:latest")
    assert 0 < usage < 1
    assert usage * GPU["cache_tokens"] % BLOCK_TOKENS == 0  # whole blocks
    # One slot: of three long generations at once, one runs and two wait.
    slow = {"model": "llama3.2", "prompt": "x", "stream": False}
    threads = [
        threading.Thread(target=httpx.post, args=(f"{gpu}/api/generate",), kwargs={"json": slow})
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while metric_value(_metrics(gpu), "vllm:num_requests_waiting") < 2:
        assert time.monotonic() < deadline, "the queue never showed"
        time.sleep(0.02)
    text = _metrics(gpu)
    assert metric_value(text, "vllm:num_requests_running", model_name="llama3.2:latest") == 1
    for thread in threads:
        thread.join(timeout=30)
    text = _metrics(gpu)
    assert metric_value(text, "vllm:num_requests_waiting") == 0
    assert metric_value(text, "vllm:num_requests_running") == 0


def test_outside_gpu_mode_there_is_no_metrics_path_as_on_ollama():
    with LoopbackServer(create_emulator_app(EmulatorConfig())) as server:
        response = httpx.get(f"{server.url}/metrics")
    assert response.status_code == 404
    assert response.text == "404 page not found"

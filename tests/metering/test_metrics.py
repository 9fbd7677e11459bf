"""Exported numbers match the truth: an emulator with a known TTFT and token rate (F-16, F-17)."""

from __future__ import annotations

import json
import logging
import time
import uuid

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.routing import route_label
from tests.support.client import MODEL, assert_ttft
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

TTFT = 0.3  # seconds the emulator waits before its first chunk
INTER_TOKEN = 0.02  # seconds between chunks: 50 tokens/s
TOKENS = 20


def _warm_up(gw: Gateway, emulator: Emulator) -> None:
    """One request first: the first one pays one-time costs (connections, lazy set-up)."""
    emulator.config.ttft = emulator.config.inter_token = 0.001
    body = {"model": MODEL, "prompt": "warm-up", "stream": False}
    httpx.post(f"{gw.url}/v1/generate", json=body, headers=gw.headers(), timeout=30)


def _configure(emulator: Emulator, **overrides) -> None:
    emulator.config.ttft = TTFT
    emulator.config.inter_token = INTER_TOKEN
    emulator.config.tokens = TOKENS
    for name, value in overrides.items():
        setattr(emulator.config, name, value)


def _client_stream(gw: Gateway, body: dict, *, stop_after: int | None = None) -> dict[str, float]:
    """Stream through the gateway; return the client's TTFT (first generated text) and lines."""
    with httpx.Client(timeout=30) as client:
        start = time.perf_counter()
        first = None
        lines = 0
        with client.stream("POST", f"{gw.url}/v1/generate", json=body, headers=gw.headers()) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                chunk = json.loads(line)
                lines += 1
                if first is None and (chunk.get("response") or chunk.get("thinking")):
                    first = time.perf_counter() - start
                if stop_after is not None and lines >= stop_after:
                    break
    assert first is not None
    return {"ttft": first, "lines": lines}


def _exported(gw: Gateway, wait_for_outcome: str | None = None) -> dict[str, float]:
    deadline = time.monotonic() + 3
    while True:
        text = gw.metrics_text()
        done = wait_for_outcome is None or metric_value(
            text, "gateway_requests_total", outcome=wait_for_outcome
        )
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    labels = {"model": MODEL}
    return {
        "ttft": metric_value(text, "gateway_time_to_first_token_seconds_sum", **labels),
        "ttft_count": metric_value(text, "gateway_time_to_first_token_seconds_count", **labels),
        "rate": metric_value(text, "gateway_output_tokens_per_second_sum", **labels),
        "tpot": metric_value(text, "gateway_time_per_output_token_seconds_sum", **labels),
        "prefill_count": metric_value(text, "gateway_prefill_tokens_per_second_count", **labels),
        "queue_count": metric_value(text, "gateway_queue_wait_seconds_count", **labels),
        "tokens_out": metric_value(text, "gateway_output_tokens_total", **labels),
        "tokens_in": metric_value(text, "gateway_input_tokens_total", **labels),
    }


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("dialect", ["ollama", "openai"])
def test_streamed_ttft_and_decode_rate_match_the_truth(make_gateway, emulator: Emulator, dialect):
    gw = make_gateway(upstream_dialect=dialect)
    _warm_up(gw, emulator)
    before = _exported(gw)
    _configure(emulator)
    client = _client_stream(gw, {"model": MODEL, "prompt": "x"})
    exported = {k: v - before[k] for k, v in _exported(gw).items()}
    assert exported["ttft_count"] == 1
    assert_ttft(exported["ttft"], client["ttft"], TTFT)
    assert exported["rate"] == pytest.approx(1 / INTER_TOKEN, rel=0.15)
    assert exported["tpot"] == pytest.approx(INTER_TOKEN, rel=0.15)
    assert exported["tokens_out"] == TOKENS
    assert exported["queue_count"] == 1
    # Only Ollama reports prefill timing; the gateway does not invent it for OpenAI upstreams.
    assert exported["prefill_count"] == (1 if dialect == "ollama" else 0)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("dialect", ["ollama", "openai"])
def test_non_streamed_ttft_is_the_first_token_at_the_gateway(
    make_gateway, emulator: Emulator, dialect
):
    """F-16 (d): without streaming the client sees only the end; TTFT is still the first token."""
    gw = make_gateway(upstream_dialect=dialect)
    _warm_up(gw, emulator)
    before = _exported(gw)
    _configure(emulator)
    body = {"model": MODEL, "prompt": "x", "stream": False}
    result = httpx.post(f"{gw.url}/v1/generate", json=body, headers=gw.headers(), timeout=30)
    assert result.json()["eval_count"] == TOKENS
    exported = {k: v - before[k] for k, v in _exported(gw).items()}
    assert_ttft(exported["ttft"], None, TTFT)
    assert exported["rate"] == pytest.approx(1 / INTER_TOKEN, rel=0.15)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_empty_first_chunk_does_not_start_the_ttft_clock_early(
    gateway: Gateway, emulator: Emulator
):
    """F-16 (b): an empty first frame is not a token."""
    _configure(emulator, empty_first_chunk=True)
    client = _client_stream(gateway, {"model": MODEL, "prompt": "x"})
    exported = _exported(gateway)
    assert client["ttft"] > TTFT + INTER_TOKEN * 0.5
    assert_ttft(exported["ttft"], client["ttft"], None)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_thinking_counts_as_the_first_token(gateway: Gateway, emulator: Emulator):
    """F-16 (c): documented choice: a thinking token is a generated token (docs/metrics.md)."""
    _warm_up(gateway, emulator)
    before = _exported(gateway)
    _configure(emulator, thinking_tokens=5)
    client = _client_stream(gateway, {"model": MODEL, "prompt": "x"})
    exported = {k: v - before[k] for k, v in _exported(gateway).items()}
    assert_ttft(exported["ttft"], client["ttft"], TTFT)
    assert exported["tokens_out"] == TOKENS + 5


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("dialect", ["ollama", "openai"])
def test_client_leaving_halfway_still_records_what_was_observed(
    make_gateway, emulator: Emulator, dialect
):
    gw = make_gateway(upstream_dialect=dialect)
    _configure(emulator, tokens=200)
    client = _client_stream(gw, {"model": MODEL, "prompt": "x"}, stop_after=10)
    exported = _exported(gw, wait_for_outcome="client_disconnect")
    assert_ttft(exported["ttft"], client["ttft"], None)
    assert exported["rate"] == pytest.approx(1 / INTER_TOKEN, rel=0.15)
    # What was relayed until the disconnect was noticed: at least what the client read.
    assert 10 <= exported["tokens_out"] <= 20


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_cut_openai_stream_counts_the_relayed_tokens(make_gateway, emulator: Emulator):
    """F-17: no usage arrives when the stream is cut; the relayed chunks are counted."""
    gw = make_gateway(upstream_dialect="openai")
    _configure(emulator, fault="drop_midstream", fault_after=7)
    body = {"model": MODEL, "prompt": "x"}
    httpx.post(f"{gw.url}/v1/generate", json=body, headers=gw.headers(), timeout=30)
    exported = _exported(gw, wait_for_outcome="upstream_error")
    assert exported["tokens_out"] == 7


def test_access_log_has_one_json_line_without_secrets_or_prompt(
    gateway: Gateway, emulator: Emulator, caplog: pytest.LogCaptureFixture
):
    _configure(emulator, ttft=0.01, inter_token=0.001)
    caplog.set_level(logging.INFO, logger="gateway.access")
    prompt = "my secret prompt text"
    response = httpx.post(
        f"{gateway.url}/v1/generate",
        json={"model": MODEL, "prompt": prompt},
        headers={**gateway.headers(), "X-Request-ID": "req-123"},
    )
    assert response.headers["x-request-id"] == "req-123"
    deadline = time.monotonic() + 2
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.02)
    [record] = [r for r in caplog.records if r.name == "gateway.access"]
    line = json.loads(record.getMessage())
    assert line["request_id"] == "req-123"
    assert line["key_id"] == gateway.key_id
    assert line["model"] == MODEL
    assert line["route"] == "/v1/generate"
    assert line["status"] == 200
    assert line["outcome"] == "completed"
    assert line["tokens_out"] == TOKENS
    assert line["upstream"] == gateway.settings.upstream_specs[0].name
    assert line["ttft_s"] > 0
    assert line["tokens_per_s"] > 0
    # Upstream, the client's id is a UUID (llama-cpp-python refuses any other), logged beside it.
    [sent] = [r for r in emulator.state.records if r.path == "/api/generate"]
    assert sent.headers["x-request-id"] == line["upstream_request_id"]
    assert (
        str(uuid.UUID(line["upstream_request_id"])).replace("-", "") == sent.headers["x-request-id"]
    )
    text = record.getMessage()
    assert prompt not in text
    assert gateway.key not in text
    assert gateway.key.split("_", 2)[2] not in text  # the secret (it may contain "_")


def test_upstream_gauges_follow_ollama_ps(make_gateway, emulator: Emulator):
    gw = make_gateway(upstream_poll_interval=0.2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = gw.metrics_text()
        if metric_value(text, "gateway_upstream_models_loaded"):
            break
        time.sleep(0.1)
    assert metric_value(text, "gateway_upstream_up") == 1
    assert metric_value(text, "gateway_upstream_models_loaded") >= 1
    assert metric_value(text, "gateway_upstream_model_memory_bytes", kind="total") > 0
    assert metric_value(text, "gateway_upstream_model_memory_bytes", kind="vram") >= 0


def test_upstream_down_shows_in_the_gauge(make_gateway):
    gw = make_gateway(upstream_url="http://127.0.0.1:9", upstream_poll_interval=0.2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if "gateway_upstream_up{" in gw.metrics_text():
            break
        time.sleep(0.1)
    text = gw.metrics_text()
    assert 'gateway_upstream_up{upstream="127.0.0.1:9"} 0.0' in text


def test_per_key_labels_can_be_switched_off(make_gateway, emulator: Emulator):
    gw = make_gateway(metrics_per_key=False)
    _configure(emulator, ttft=0.01, inter_token=0.001)
    body = {"model": MODEL, "prompt": "x", "stream": False}
    httpx.post(f"{gw.url}/v1/generate", json=body, headers=gw.headers(), timeout=30)
    text = gw.metrics_text()
    assert 'key="test-key"' not in text
    assert metric_value(text, "gateway_output_tokens_total", key="all") == TOKENS
    assert metric_value(text, "gateway_time_to_first_token_seconds_count", key="all") == 1


def test_per_key_labels_name_the_key(gateway: Gateway, emulator: Emulator):
    _configure(emulator, ttft=0.01, inter_token=0.001)
    body = {"model": MODEL, "prompt": "x", "stream": False}
    httpx.post(f"{gateway.url}/v1/generate", json=body, headers=gateway.headers(), timeout=30)
    text = gateway.metrics_text()
    assert metric_value(text, "gateway_time_to_first_token_seconds_count", key="test-key") == 1
    assert metric_value(text, "gateway_requests_total", key="test-key", outcome="completed") == 1


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_junk_model_names_add_no_series(gateway: Gateway, emulator: Emulator):
    """F-18: junk model names collapse into model="other"; more of them add no series."""
    from concurrent.futures import ThreadPoolExecutor

    emulator.config.ttft = emulator.config.inter_token = 0.001
    client = httpx.Client(timeout=30)  # thread-safe; one SSL context instead of 600

    def ask(i: int) -> int:
        body = {"model": f"junk-{i}-{'x' * (i % 50)}", "prompt": "x", "stream": False}
        response = client.post(f"{gateway.url}/v1/generate", json=body, headers=gateway.headers())
        return response.status_code

    def series() -> set[str]:
        return {
            line.rpartition(" ")[0]
            for line in gateway.metrics_text().splitlines()
            if not line.startswith("#")
        }

    with client, ThreadPoolExecutor(8) as pool:
        assert set(pool.map(ask, range(300))) == {404}
        first = series()
        assert set(pool.map(ask, range(300, 600))) == {404}
    assert series() == first
    text = gateway.metrics_text()
    assert "junk-" not in text
    assert metric_value(text, "gateway_requests_total", model="other", status_class="4xx") == 600


# --- the route label ------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/v1/chat", "/v1/generate"])
def test_refusals_are_counted_under_their_own_route(gateway: Gateway, route: str):
    """A 401 and a 403 on a plain Starlette route carry its template, not `other`."""
    body = {"model": MODEL, "prompt": "x", "messages": []}
    _, other_model_key = gateway.create_key("narrow", models=["qwen2.5:7b"])
    missing = httpx.post(f"{gateway.url}{route}", json=body, timeout=30)
    forbidden = httpx.post(
        f"{gateway.url}{route}", json=body, headers=gateway.headers(other_model_key), timeout=30
    )
    assert (missing.status_code, forbidden.status_code) == (401, 403)
    text = gateway.metrics_text()
    labels = {"route": route, "status_class": "4xx"}
    assert metric_value(text, "gateway_requests_total", **labels, outcome="rejected_auth") == 1
    assert metric_value(text, "gateway_requests_total", **labels, outcome="forbidden") == 1
    assert metric_value(text, "gateway_requests_total", route="other") == 0


def test_unknown_paths_are_counted_and_logged_as_other(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="gateway.access")
    paths = ["/v1/xyz", "/v1/chat/x", "/v1/modelsx/llama3", "/api/nope"]
    for path in paths:
        assert httpx.get(f"{gateway.url}{path}", headers=gateway.headers()).status_code == 404
    refused = httpx.get(f"{gateway.url}/v1/chat", headers=gateway.headers())  # 405, matched
    assert refused.status_code == 405
    deadline = time.monotonic() + 2
    lines: list[dict] = []
    while len(lines) < len(paths) + 1 and time.monotonic() < deadline:
        time.sleep(0.02)
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.access"]
    routes = [line["route"] for line in lines]
    assert routes == ["other"] * len(paths) + ["/v1/chat"]
    text = gateway.metrics_text()
    assert metric_value(text, "gateway_requests_total", route="other", outcome="not_found") == 4
    assert metric_value(text, "gateway_requests_total", route="/v1/chat", outcome="error") == 1
    assert "/v1/xyz" not in text


@pytest.mark.anyio
async def test_route_label_is_the_template_of_any_kind_of_route():
    """FastAPI and plain Starlette routes, with parameters, and two paths sharing a handler."""
    app = FastAPI()

    async def plain(request: Request) -> Response:
        return PlainTextResponse(route_label(request.scope))

    @app.get("/v1/models/{model:path}")  # the converter is not part of the label
    async def model(request: Request, model: str) -> Response:
        return PlainTextResponse(route_label(request.scope))

    app.router.routes.extend(
        [
            Route("/api/embed", plain, methods=["POST"]),
            Route("/api/embeddings", plain, methods=["POST"]),
            Route("/api/show/{name}", plain, methods=["POST"]),
        ]
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        assert (await c.get("/v1/models/llama3")).text == "/v1/models/{model}"
        assert (await c.post("/api/embed")).text == "/api/embed"
        assert (await c.post("/api/embeddings")).text == "/api/embeddings"
        assert (await c.post("/api/show/llama3")).text == "/api/show/{name}"
    assert route_label({"type": "http", "path": "/v1/xyz"}) == "other"

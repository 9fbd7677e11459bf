"""Retries before the first byte only, and the total request timeout (F-06)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.conftest import Emulator, metric_value
from tests.helpers import MODEL, OllamaLookalike, ndjson, served


class FlakyUpstream(OllamaLookalike):
    """Answers `failures` with `status` first, then a clean three-line stream."""

    def __init__(self) -> None:
        super().__init__(serve_ps=False)
        self.failures: list[int] = []
        self.calls = 0

    async def generate(self, _: Request) -> Response:
        self.calls += 1
        if self.failures:
            status = self.failures.pop(0)
            return JSONResponse({"error": f"failure {status}"}, status_code=status)
        body = ndjson(
            {"model": MODEL, "response": "a", "done": False},
            {"model": MODEL, "response": "b", "done": False},
            {"model": MODEL, "response": "", "done": True, "eval_count": 2},
        )
        return Response(body, media_type="application/x-ndjson")


@pytest.fixture
def flaky() -> Iterator[tuple[FlakyUpstream, str]]:
    yield from served(FlakyUpstream())


@pytest.fixture(params=["aiohttp", "httpx"])
def upstream_client(request: pytest.FixtureRequest) -> str:
    """Every retry rule holds for both upstream HTTP clients (GATEWAY_UPSTREAM_HTTP_CLIENT)."""
    return str(request.param)


def _generate(url: str, key: str, **body) -> httpx.Response:
    payload = {"model": MODEL, "prompt": "x", **body}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/generate", json=payload, headers=headers, timeout=30)


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_failures_before_the_first_byte_are_retried_into_one_clean_stream(
    flaky,
    make_gateway,
    status,
    upstream_client,
):
    """F-06 (b): the client sees one clean stream; every try is counted."""
    upstream, url = flaky
    gw = make_gateway(upstream_http_client=upstream_client, upstream_url=url, retry_backoff=0.01)
    upstream.failures = [status, status]
    response = _generate(gw.url, gw.key)
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert response.status_code == 200
    assert [line["response"] for line in lines] == ["a", "b", ""]
    assert lines[-1]["done"] is True
    assert upstream.calls == 3
    assert metric_value(gw.metrics_text(), "gateway_upstream_retries_total", reason="status") == 2


def test_retries_stop_after_the_configured_attempts(flaky, make_gateway, upstream_client):
    upstream, url = flaky
    gw = make_gateway(
        upstream_http_client=upstream_client, upstream_url=url, retry_backoff=0.01, retry_attempts=2
    )
    upstream.failures = [503, 503, 503]
    response = _generate(gw.url, gw.key)
    assert response.status_code == 503
    assert response.headers["retry-after"]
    assert upstream.calls == 2


def test_client_errors_are_not_retried(flaky, make_gateway, upstream_client):
    upstream, url = flaky
    gw = make_gateway(upstream_http_client=upstream_client, upstream_url=url, retry_backoff=0.01)
    upstream.failures = [404]
    assert _generate(gw.url, gw.key).status_code == 404
    assert upstream.calls == 1


def test_a_stream_that_fails_after_its_first_byte_is_never_replayed(
    make_gateway,
    emulator: Emulator,
    upstream_client,
):
    """F-06 (a): exactly one upstream call, an error line to the client."""
    gw = make_gateway(upstream_http_client=upstream_client, retry_backoff=0.01)
    emulator.config.fault = "drop_midstream"
    emulator.config.fault_after = 3
    response = _generate(gw.url, gw.key)
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert set(lines[-1]) == {"error"}
    assert len([r for r in emulator.state.records if r.path == "/api/generate"]) == 1
    assert metric_value(gw.metrics_text(), "gateway_upstream_retries_total") == 0


def test_connection_refused_is_retried_then_502(make_gateway, upstream_client):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gw = make_gateway(
        upstream_http_client=upstream_client,
        upstream_url=f"http://127.0.0.1:{port}",
        retry_backoff=0.01,
    )
    assert _generate(gw.url, gw.key).status_code == 502
    assert metric_value(gw.metrics_text(), "gateway_upstream_retries_total", reason="connect") == 2


@pytest.mark.parametrize("stream", [True, False])
def test_the_whole_request_is_bounded_by_the_request_timeout(
    make_gateway,
    emulator: Emulator,
    stream,
    upstream_client,
):
    gw = make_gateway(upstream_http_client=upstream_client, request_timeout=1.0, idle_timeout=10)
    emulator.config.tokens = 100
    emulator.config.inter_token = 0.05  # 5 s of answer
    start = time.perf_counter()
    response = _generate(gw.url, gw.key, stream=stream)
    elapsed = time.perf_counter() - start
    assert elapsed < 3
    if stream:
        assert response.status_code == 200
        last = json.loads(response.text.splitlines()[-1])
        assert "longer than 1 s" in last["error"]
    else:
        assert response.status_code == 504
        assert "longer than 1 s" in response.json()["error"]
    assert metric_value(gw.metrics_text(), "gateway_requests_total", outcome="timeout") == 1

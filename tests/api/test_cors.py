"""CORS over real sockets: preflights, listed and foreign origins, errors, streams, `*`."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.app import create_app
from gateway.settings import Settings
from gateway.testing.server import LoopbackServer
from gateway.testing.stack import create_key, gateway_process
from tests.support.client import MODEL
from tests.support.stack import Emulator, Gateway

APP = "https://app.example.com"
FOREIGN = "https://evil.example.net"


def _cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def _preflight(
    url: str, path: str, origin: str, headers: str = "authorization,content-type"
) -> httpx.Response:
    """What a browser sends before a cross-origin POST with a JSON body and a key header."""
    return httpx.options(
        f"{url}{path}",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": headers,
        },
    )


def _generate(gw: Gateway, origin: str, key: str | None = None) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/generate",
        json={"model": MODEL, "prompt": "x", "stream": False},
        headers={"Origin": origin, **({"Authorization": f"Bearer {key}"} if key else {})},
        timeout=30,
    )


def _vary(response: httpx.Response) -> set[str]:
    return {part.strip().lower() for part in response.headers.get("vary", "").split(",")}


@pytest.fixture
def cors_gateway(make_gateway: Callable[..., Gateway], emulator: Emulator) -> Gateway:
    emulator.config.ttft = emulator.config.inter_token = 0.001
    return make_gateway(cors_origins=[APP])


def test_cors_is_off_by_default(gateway: Gateway, emulator: Emulator):
    emulator.config.ttft = emulator.config.inter_token = 0.001
    preflight = _preflight(gateway.url, "/v1/generate", APP)
    assert preflight.status_code == 405
    assert _cors_headers(preflight) == {}
    answer = _generate(gateway, APP, gateway.key)
    assert answer.status_code == 200
    assert _cors_headers(answer) == {}


def test_a_preflight_from_a_listed_origin_needs_no_key(
    cors_gateway: Gateway, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="gateway.access")
    headers = "authorization,content-type,x-api-key,x-request-id"
    answer = _preflight(cors_gateway.url, "/v1/generate", APP, headers)
    assert answer.status_code == 200
    cors = _cors_headers(answer)
    assert cors["access-control-allow-origin"] == APP
    assert {"GET", "POST", "DELETE", "HEAD"} <= set(
        cors["access-control-allow-methods"].replace(" ", "").split(",")
    )
    allowed = set(cors["access-control-allow-headers"].lower().replace(" ", "").split(","))
    assert set(headers.split(",")) <= allowed
    assert "access-control-allow-credentials" not in cors
    assert "origin" in _vary(answer)
    # Logged with a request id, like any request, though the app behind never saw it.
    request_id = answer.headers["x-request-id"]
    deadline = time.monotonic() + 2
    lines: list[dict] = []
    while not lines and time.monotonic() < deadline:
        time.sleep(0.02)
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.access"]
    [line] = lines
    assert line["request_id"] == request_id
    assert (line["method"], line["status"], line["route"]) == ("OPTIONS", 200, "other")


def test_the_openai_browser_sdk_passes_the_preflight(cors_gateway: Gateway):
    """Its `x-stainless-*` headers failed Ollama's own preflight once (ollama/ollama#4388)."""
    headers = "authorization,content-type,x-stainless-os,x-stainless-retry-count,x-stainless-lang"
    assert _preflight(cors_gateway.url, "/v1/models", APP, headers).status_code == 200
    refused = _preflight(cors_gateway.url, "/v1/models", APP, "authorization,x-made-up")
    assert refused.status_code == 400


def test_a_preflight_from_a_foreign_origin_gets_no_cors_headers(cors_gateway: Gateway):
    answer = _preflight(cors_gateway.url, "/v1/generate", FOREIGN)
    assert answer.status_code == 400  # answered by the CORS layer: never a 401 from auth
    assert answer.text == "Disallowed CORS origin"
    assert _cors_headers(answer) == {}
    assert "www-authenticate" not in answer.headers


@pytest.mark.parametrize("with_key", [True, False], ids=["generation", "401"])
def test_a_listed_origin_may_read_a_generation_and_a_401(cors_gateway: Gateway, with_key: bool):
    answer = _generate(cors_gateway, APP, cors_gateway.key if with_key else None)
    assert answer.status_code == (200 if with_key else 401)
    cors = _cors_headers(answer)
    assert cors["access-control-allow-origin"] == APP
    assert "access-control-allow-credentials" not in cors
    assert "origin" in _vary(answer)
    exposed = set(cors["access-control-expose-headers"].lower().split(", "))
    assert {"x-request-id", "retry-after", "x-ratelimit-remaining"} <= exposed


@pytest.mark.parametrize("with_key", [True, False], ids=["generation", "401"])
def test_a_foreign_origin_is_never_allowed(cors_gateway: Gateway, with_key: bool):
    answer = _generate(cors_gateway, FOREIGN, cors_gateway.key if with_key else None)
    assert answer.status_code == (200 if with_key else 401)
    assert "access-control-allow-origin" not in answer.headers
    assert "access-control-allow-credentials" not in answer.headers
    assert "origin" in _vary(answer)  # a cache must not hand this answer to the app


def test_a_429_exposes_every_limit_header_it_carries(make_gateway: Callable[..., Gateway]):
    gw = make_gateway(cors_origins=[APP])
    _, key = gw.create_key("one-a-minute", rpm=1)
    _generate(gw, APP, key)
    refused = _generate(gw, APP, key)
    assert refused.status_code == 429
    exposed = set(refused.headers["access-control-expose-headers"].lower().split(", "))
    limit_headers = {k for k in refused.headers if k.startswith("x-ratelimit-")}
    assert limit_headers
    assert limit_headers | {"retry-after", "x-request-id"} <= exposed
    assert refused.headers["access-control-allow-origin"] == APP


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_stream_to_a_listed_origin_is_still_relayed_as_it_comes(
    make_gateway: Callable[..., Gateway], emulator: Emulator
):
    gw = make_gateway(cors_origins=[APP])
    emulator.config.tokens = 6
    emulator.config.ttft = 0.05
    emulator.config.inter_token = 0.2
    arrivals = []
    start = time.perf_counter()
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/chat",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Origin": APP, **gw.headers()},
        timeout=30,
    ) as response:
        assert response.headers["access-control-allow-origin"] == APP
        assert response.headers.get("transfer-encoding") == "chunked"
        for line in response.iter_lines():
            if line:
                arrivals.append(time.perf_counter() - start)
    assert len(arrivals) == 7
    # Buffered, the lines would arrive together; relayed as they come, they span the 1 s the
    # emulator takes between the first token and the last (a lower bound: load only widens it).
    assert arrivals[-1] - arrivals[0] >= 0.9


def test_star_allows_any_origin_still_without_credentials(make_gateway: Callable[..., Gateway]):
    gw = make_gateway(cors_origins=["*"])
    preflight = _preflight(gw.url, "/v1/generate", FOREIGN)
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    answer = _generate(gw, FOREIGN)
    assert answer.status_code == 401
    assert answer.headers["access-control-allow-origin"] == "*"
    for response in (preflight, answer):
        assert "access-control-allow-credentials" not in response.headers


@pytest.mark.parametrize("path", ["/metrics", "/healthz"])
def test_operator_endpoints_never_get_cors_headers(make_gateway, path: str):
    """Even with `*`, no site can read them through a browser inside the private network."""
    gw = make_gateway(cors_origins=["*"])
    answer = httpx.get(f"{gw.url}{path}", headers={"Origin": FOREIGN})
    assert answer.status_code == 200
    assert _cors_headers(answer) == {}
    assert _preflight(gw.url, path, FOREIGN).status_code == 405


@pytest.fixture
def failing_gateway(tmp_path: Path, emulator: Emulator) -> Iterator[str]:
    """A gateway with one more route, `/v1/boom`, that fails with an unexpected exception."""

    async def boom(_: Request) -> Response:
        raise RuntimeError("boom")

    settings = Settings(
        upstream_url=emulator.url,
        database_url=f"sqlite+aiosqlite:///{tmp_path}/keys.db",
        cors_origins=[APP],
    )
    app = create_app(settings)
    app.router.routes.append(Route("/v1/boom", boom, methods=["POST"]))
    with LoopbackServer(app) as server:
        yield server.url


@pytest.mark.processes
def test_the_last_resort_500_carries_cors_headers(
    failing_gateway: str, caplog: pytest.LogCaptureFixture
):
    listed = httpx.post(f"{failing_gateway}/v1/boom", headers={"Origin": APP})
    foreign = httpx.post(f"{failing_gateway}/v1/boom", headers={"Origin": FOREIGN})
    assert (listed.status_code, foreign.status_code) == (500, 500)
    assert listed.json()["error"]["message"] == "internal gateway error"  # a /v1/ path: OpenAI's
    assert listed.headers["access-control-allow-origin"] == APP
    assert "access-control-allow-origin" not in foreign.headers
    request_id = listed.headers["x-request-id"]
    assert f"unhandled error, request_id={request_id}" in caplog.text


@pytest.mark.processes
def test_gateway_serve_reads_a_comma_separated_list(tmp_path: Path, emulator: Emulator):
    """`GATEWAY_CORS_ORIGINS` as an operator writes it, through `gateway serve`, streaming."""
    env = {
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/keys.db",
        "GATEWAY_CORS_ORIGINS": f"http://localhost:5173, {APP}",
    }
    key = str(create_key(env, "app")["key"])
    emulator.config.tokens = 3
    with gateway_process(tmp_path, env) as process:
        assert _preflight(process.url, "/v1/chat", APP).status_code == 200
        assert _preflight(process.url, "/v1/chat", FOREIGN).status_code == 400
        with httpx.stream(
            "POST",
            f"{process.url}/v1/chat",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Origin": "http://localhost:5173", "Authorization": f"Bearer {key}"},
            timeout=30,
        ) as response:
            assert response.headers["access-control-allow-origin"] == "http://localhost:5173"
            assert response.headers.get("transfer-encoding") == "chunked"
            assert len([line for line in response.iter_lines() if line]) == 4

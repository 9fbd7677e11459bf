"""The generation routes' fast path (`gateway.api.relayed.RelayedRoutes`) over a real gateway.

A `POST` to a generation route runs past FastAPI's own layers; everything else on those paths
still goes through the app, and both answer in the client's own error format.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.stack import Gateway


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", {"error": "method not allowed"}),
        (
            "/v1/chat/completions",
            {"error": {"message": "method not allowed", "type": "invalid_request_error"}},
        ),
    ],
)
def test_another_method_on_a_generation_path_still_gets_the_routers_405(
    gateway: Gateway, path: str, body: dict[str, object]
):
    response = httpx.get(f"{gateway.url}{path}", headers=gateway.headers(), timeout=30)
    assert response.status_code == 405
    error = response.json()["error"]
    expected = body["error"]
    if isinstance(expected, dict):
        assert {k: error[k] for k in expected} == expected
    else:
        assert error == expected
    assert response.headers["x-request-id"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/files", "GET, POST"),  # two routes: GET lists, POST uploads
        ("PUT", "/v1/batches", "GET, POST"),
        ("PUT", "/v1/files/file-x", "DELETE, GET"),
        ("GET", "/api/chat", "POST"),  # a generation route, on the fast path for POST
    ],
)
def test_a_405_lists_every_method_the_path_accepts(
    gateway: Gateway, method: str, path: str, allow: str
) -> None:
    """RFC 9110 section 15.5.6; Starlette's router names the first matching route's only."""
    response = httpx.request(method, f"{gateway.url}{path}", headers=gateway.headers(), timeout=30)
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == allow


def test_a_refusal_on_the_fast_path_is_rendered_counted_and_labelled(gateway: Gateway):
    """A `GatewayError` from the handler goes through the app's registered handler."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=chat,
        headers={"Authorization": "Bearer gw_nope_nope"},
        timeout=30,
    )
    assert response.status_code == 401
    error = response.json()["error"]  # OpenAI's error object, not Ollama's string
    assert error["message"]
    assert error["type"]
    text = gateway.metrics_text()
    labels = {"route": "/v1/chat/completions", "status_class": "4xx"}
    assert metric_value(text, "gateway_requests_total", **labels) == 1


def test_a_stream_on_the_fast_path_is_relayed_and_metered(gateway: Gateway):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream(
        "POST", f"{gateway.url}/api/chat", json=chat, headers=gateway.headers(), timeout=30
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines
    assert '"done":true' in lines[-1].replace(" ", "")
    text = gateway.metrics_text()
    labels = {"route": "/api/chat", "outcome": "completed"}
    assert metric_value(text, "gateway_requests_total", **labels) == 1

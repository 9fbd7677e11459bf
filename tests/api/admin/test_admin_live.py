"""`whoami`, `models` and `live` over a real loopback gateway in front of the emulator.

A stream is held open by the emulator (`hang_midstream`: it sends a few tokens, then nothing,
until the client leaves), so the live view is read while the request is certainly in flight,
with no race against its end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from jose import jwt

from gateway.api.admin.views import public_url
from gateway.auth.jwt import AUDIENCE, ISSUER, mint_token
from tests.support.stack import Emulator, Gateway

SECRET = "k7Qy2mVn8RwT4pZs6XbJ3cLd9FhGa5Ue1NoKi0Mt"
HOUR = timedelta(hours=1)
MODEL = "llama3.2:latest"
VIEWS = ("/whoami", "/models", "/live")


def _token(scope: str = "admin", subject: str = "alice@example.com") -> str:
    return mint_token(SECRET, subject=subject, scope=scope, ttl=HOUR)  # type: ignore[arg-type]


def _get(gateway: Gateway, path: str, token: str | None = None) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{gateway.url}/admin/v1{path}", headers=headers, timeout=10)


def _live(gateway: Gateway) -> dict[str, Any]:
    response = _get(gateway, "/live", _token("read"))
    assert response.status_code == 200, response.text
    return response.json()


def _until(gateway: Gateway, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Read the live view until `check` holds (a wait for the gateway, not a timing test)."""
    deadline = time.monotonic() + 20
    while True:
        view = _live(gateway)
        if check(view) or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


@pytest.fixture
def admin_gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(admin_jwt_secret=SECRET, idle_timeout=60.0, first_byte_timeout=60.0)


@pytest.fixture
def held_stream(admin_gateway: Gateway, emulator: Emulator) -> Iterator[httpx.Response]:
    """A stream of the gateway's key that stays in flight until the fixture ends."""
    emulator.config.fault = "hang_midstream"
    emulator.config.fault_after = 3
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            f"{admin_gateway.url}/api/generate",
            json={"model": "llama3.2", "prompt": "hi"},
            headers=admin_gateway.headers(),
        ) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        assert json.loads(next(lines))["response"]  # a first token: the request is upstream
        emulator.config.fault = None  # the held request keeps its snapshot of the config
        yield response


def test_live_shows_a_held_stream_under_its_key_model_and_upstream(
    admin_gateway: Gateway, emulator: Emulator, held_stream: httpx.Response
) -> None:
    upstream = f"127.0.0.1:{httpx.URL(emulator.url).port}"
    view = _until(admin_gateway, lambda v: v["upstreams"][0]["loaded"] is not None)

    assert view["object"] == "live"
    host, _, pid = view["replica"].rpartition(":")
    assert host
    assert pid.isdigit()
    assert view["at"].endswith("Z")
    assert view["in_flight"] == {
        "total": 1,
        "by_key": [{"key_id": admin_gateway.key_id, "name": "test-key", "requests": 1}],
        "by_model": [{"model": MODEL, "requests": 1}],
        "by_upstream": [{"upstream": upstream, "requests": 1}],
    }
    assert view["queue"] == {"waiting": 0}
    [seen] = view["upstreams"]
    assert seen["upstream"] == upstream
    assert seen["url"] == emulator.url.rstrip("/")
    assert (seen["dialect"], seen["circuit"], seen["in_flight"]) == ("ollama", "closed", 1)
    assert seen["models"] == sorted(emulator.config.models)
    loaded = {entry["model"]: entry for entry in seen["loaded"]}
    assert set(loaded) == set(emulator.config.models)
    assert loaded[MODEL]["size_vram"] > 0
    expires = datetime.fromisoformat(loaded[MODEL]["expires_at"])
    assert expires.tzinfo is not None
    assert expires > datetime.now(UTC)  # the emulator's keep_alive: 5 minutes ahead
    assert view["recent"]["requests"] == 0  # the held stream has not finished


def test_recent_counts_finished_answers_with_ttft_and_decode_rate(
    admin_gateway: Gateway, held_stream: httpx.Response
) -> None:
    _, other = admin_gateway.create_key("other")
    answered = httpx.post(
        f"{admin_gateway.url}/api/generate",
        json={"model": "llama3.2", "prompt": "hi", "stream": False},
        headers=admin_gateway.headers(other),
        timeout=10,
    )
    assert answered.status_code == 200

    view = _until(admin_gateway, lambda v: v["recent"]["requests"] == 1)
    recent = view["recent"]
    assert (recent["requests"], recent["errors"], recent["window_seconds"]) == (1, 0, 60)
    assert recent["output_tokens"] == answered.json()["eval_count"]
    assert recent["ttft_mean_s"] > 0
    assert recent["ttft_p50_s"] == recent["ttft_mean_s"]
    assert recent["decode_tokens_per_s"] > 0
    assert [m["model"] for m in recent["by_model"]] == [MODEL]
    # Only the held stream is in flight: the finished answer's key is gone from `by_key`.
    assert [k["name"] for k in view["in_flight"]["by_key"]] == ["test-key"]

    held_stream.close()  # the client leaves: the held request ends too
    view = _until(admin_gateway, lambda v: v["in_flight"]["total"] == 0)
    assert view["in_flight"]["by_key"] == []
    assert view["in_flight"]["by_upstream"][0]["requests"] == 0
    assert view["recent"]["requests"] == 2
    assert view["recent"]["errors"] == 0  # a client leaving is not the gateway's error


def test_whoami_names_the_token_and_its_scopes(admin_gateway: Gateway) -> None:
    before = datetime.now(UTC)
    admin = _get(admin_gateway, "/whoami", _token("admin", "alice@example.com"))
    reader = _get(admin_gateway, "/whoami", _token("read", "bob@example.com"))

    assert admin.status_code == 200, admin.text
    assert admin.json()["subject"] == "alice@example.com"
    assert admin.json()["scopes"] == ["admin", "read"]
    assert reader.json()["subject"] == "bob@example.com"
    assert reader.json()["scopes"] == ["read"]
    expires = admin.json()["expires_at"]
    assert expires.endswith("Z")
    moment = datetime.fromisoformat(expires)
    assert before + HOUR - timedelta(seconds=5) <= moment <= before + HOUR + timedelta(minutes=1)


def test_a_token_with_no_admin_scope_is_refused(admin_gateway: Gateway) -> None:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "carol", "scope": "chat"}
    token = jwt.encode({**claims, "iat": now, "exp": now + 600}, SECRET, algorithm="HS256")

    response = _get(admin_gateway, "/whoami", token)

    assert response.status_code == 403
    assert response.json()["error"]["message"] == "token grants no admin scope"


def test_models_lists_the_upstreams_models(admin_gateway: Gateway, emulator: Emulator) -> None:
    upstream = f"127.0.0.1:{httpx.URL(emulator.url).port}"

    response = _get(admin_gateway, "/models", _token("read"))

    assert response.status_code == 200, response.text
    assert response.json() == {
        "object": "list",
        "data": [{"id": m, "upstreams": [upstream]} for m in sorted(emulator.config.models)],
    }


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_views_need_an_admin_token(make_gateway: Callable[..., Gateway]) -> None:
    # Six refusals from one address: more than the default budget of failed authentications.
    admin_gateway = make_gateway(admin_jwt_secret=SECRET, admin_auth_failures_per_minute=100)
    for path in VIEWS:
        assert _get(admin_gateway, path, _token("read")).status_code == 200, path
        for token in (None, admin_gateway.key):
            response = _get(admin_gateway, path, token)
            assert response.status_code == 401, (path, token)
            assert response.headers["www-authenticate"].startswith("Bearer")


def test_the_views_do_not_exist_with_the_admin_api_off(gateway: Gateway) -> None:
    for path in VIEWS:
        response = _get(gateway, path, _token())
        assert response.status_code == 404, path


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_views_are_in_the_openapi_document(admin_gateway: Gateway) -> None:
    document = _get(admin_gateway, "/openapi.json", _token("read")).json()

    for path in VIEWS:
        operation = document["paths"][f"/admin/v1{path}"]["get"]
        assert "200" in operation["responses"], path
        assert "401" in operation["responses"], path
    schemas = document["components"]["schemas"]
    assert {"in_flight", "queue", "upstreams", "recent", "replica"} <= set(
        schemas["LiveView"]["properties"]
    )


def test_upstream_urls_are_shown_without_credentials() -> None:
    assert public_url("http://user:pw@gpu1:11434/v1?key=abc#top") == "http://gpu1:11434/v1"
    assert public_url("http://[::1]:11434") == "http://[::1]:11434"

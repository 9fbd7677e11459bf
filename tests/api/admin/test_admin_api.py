"""The admin API over a real loopback gateway: keys end to end with HS256 admin tokens.

The flows check both sides: what the API answers, and what the generation routes then do with
the key (a change made here applies to this replica's next request at once). JWT refusals are
unit-tested in tests/auth/test_admin_jwt.py; here each kind of refusal is checked once over HTTP,
with its status, its error object and a log that never holds the token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from gateway.auth.jwt import mint_token
from tests.support.stack import Gateway

SECRET = "k7Qy2mVn8RwT4pZs6XbJ3cLd9FhGa5Ue1NoKi0Mt"
HOUR = timedelta(hours=1)
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def _token(scope: str = "admin", subject: str = "alice@example.com") -> str:
    return mint_token(SECRET, subject=subject, scope=scope, ttl=HOUR)  # type: ignore[arg-type]


class Admin:
    """An HTTP client of one gateway's admin API with one token."""

    def __init__(self, gateway: Gateway, token: str) -> None:
        self.gateway = gateway
        self.client = httpx.Client(
            base_url=f"{gateway.url}/admin/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.request(method, path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.post(path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.patch(path, **kwargs)

    def close(self) -> None:
        self.client.close()

    def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.client.request(method, path, **kwargs)
        assert response.is_success, response.text
        return response.json()


def _generate(gateway: Gateway, key: str, model: str = "llama3.2") -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/api/generate",
        json={"model": model, "prompt": "hi", "stream": False},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


@pytest.fixture
def admin_gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(admin_jwt_secret=SECRET)


@pytest.fixture
def admin(admin_gateway: Gateway) -> Iterator[Admin]:
    client = Admin(admin_gateway, _token())
    yield client
    client.close()


def test_the_admin_api_does_not_exist_until_a_token_source_is_configured(
    gateway: Gateway,
) -> None:
    for method, path in [("GET", "/keys"), ("POST", "/keys"), ("GET", "/openapi.json")]:
        response = httpx.request(
            method,
            f"{gateway.url}/admin/v1{path}",
            headers={"Authorization": f"Bearer {_token()}"},
        )
        assert response.status_code == 404, path
        assert response.json()["error"]["message"] == "not found"


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_create_then_use_update_rotate_and_revoke_a_key(admin: Admin) -> None:
    gateway = admin.gateway
    created = admin.ok("POST", "/keys", json={"name": "app", "models": ["llama3.2"], "rpm": 50})
    key_id, secret = created["key"]["id"], created["secret"]

    assert created["key"]["status"] == "active"
    assert created["key"]["rpm"] == 50
    assert _generate(gateway, secret).status_code == 200
    assert _generate(gateway, secret, model="qwen2.5:7b").status_code == 403

    updated = admin.ok("PATCH", f"/keys/{key_id}", json={"models": None, "name": "app2"})
    assert (updated["name"], updated["models"], updated["rpm"]) == ("app2", None, 50)
    assert _generate(gateway, secret, model="qwen2.5:7b").status_code == 200

    rotated = admin.ok("POST", f"/keys/{key_id}/rotate", json={"grace_seconds": 600})
    new_secret = rotated["secret"]
    assert rotated["key"]["rotation_grace_until"] is not None
    assert _generate(gateway, secret).status_code == 200  # the grace period
    assert _generate(gateway, new_secret).status_code == 200

    admin.ok("POST", f"/keys/{key_id}/rotate")  # no grace: both earlier secrets end now
    assert _generate(gateway, secret).status_code == 401
    assert _generate(gateway, new_secret).status_code == 401

    revoked = admin.ok("POST", f"/keys/{key_id}/revoke")
    assert revoked["status"] == "revoked"
    assert admin.ok("GET", f"/keys/{key_id}")["status"] == "revoked"
    refused = admin.post(f"/keys/{key_id}/rotate")
    assert refused.status_code == 422
    assert "revoked" in refused.json()["error"]["message"]


def test_the_secret_is_shown_once_and_never_listed(admin: Admin) -> None:
    created = admin.ok("POST", "/keys", json={"name": "app"})
    secret = created["secret"]

    listing = admin.get("/keys").text
    one = admin.get(f"/keys/{created['key']['id']}").text
    audit = admin.get("/audit").text

    for text in (listing, one, audit):
        assert secret not in text
        # gw_<id>_<secret>: the secret part may itself hold "_" (URL-safe base64)
        assert secret.split("_", 2)[2] not in text
        assert "secret_hash" not in text


def test_list_filters_and_pages(admin: Admin) -> None:
    ids = [admin.ok("POST", "/keys", json={"name": f"team-{n}"})["key"]["id"] for n in range(5)]
    admin.ok("POST", f"/keys/{ids[0]}/revoke")
    admin.ok("POST", "/keys", json={"name": "other", "models": ["qwen3"]})

    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"name": "TEAM", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = admin.ok("GET", "/keys", params=params)
        seen += [key["id"] for key in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert seen == ids
    revoked = admin.ok("GET", "/keys", params={"status": "revoked"})["data"]
    assert [key["id"] for key in revoked] == [ids[0]]
    for_qwen = admin.ok("GET", "/keys", params={"model": "qwen3", "name": "other"})["data"]
    assert [key["name"] for key in for_qwen] == ["other"]
    assert admin.get("/keys", params={"cursor": "not-a-cursor"}).status_code == 422
    assert admin.get("/keys", params={"status": "sleepy"}).status_code == 422
    assert admin.get("/keys", params={"limit": 0}).status_code == 422


def test_the_audit_trail_names_the_token_subject_and_address(admin: Admin) -> None:
    key_id = admin.ok("POST", "/keys", json={"name": "app"})["key"]["id"]
    admin.ok("PATCH", f"/keys/{key_id}", json={"tpm": 1000})
    admin.ok("POST", f"/keys/{key_id}/revoke")

    entries = admin.ok("GET", "/audit", params={"key_id": key_id})["data"]
    updates = admin.ok("GET", "/audit", params={"action": "update"})["data"]
    mine = {"actor": "alice@example.com"}
    first = admin.ok("GET", "/audit", params={**mine, "limit": 1})
    rest = admin.ok("GET", "/audit", params={**mine, "cursor": first["next_cursor"]})

    assert [entry["action"] for entry in entries] == ["create", "update", "revoke"]
    assert {entry["actor"] for entry in entries} == {"alice@example.com"}
    assert {entry["source"] for entry in entries} == {"127.0.0.1"}
    assert updates[0]["changes"] == {"tpm": {"before": None, "after": 1000}}
    assert [entry["id"] for entry in first["data"] + rest["data"]] == [e["id"] for e in entries]
    assert admin.get("/audit", params={"action": "delete"}).status_code == 422


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": ""},
        {"name": "x" * 201},
        {"name": "app", "models": []},
        {"name": "app", "rpm": -1},
        {"name": "app", "rpm": "5"},
        {"name": "app", "manage_models": 1},
        {"name": "app", "expires_at": "2030-01-01T00:00:00"},  # no zone
        {"name": "app", "owner": "bob"},  # unknown field
    ],
)
def test_a_bad_create_is_a_422_in_the_openai_error_shape_and_creates_nothing(
    admin: Admin, body: dict[str, Any]
) -> None:
    response = admin.post("/keys", json=body)

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert admin.ok("GET", "/audit", params={"actor": "alice@example.com"})["data"] == []


def test_a_patch_changes_only_what_it_sends_and_refuses_bad_values(admin: Admin) -> None:
    expires = (datetime.now(UTC) + HOUR).isoformat()
    created = admin.ok("POST", "/keys", json={"name": "app", "rpm": 5, "expires_at": expires})
    key_id = created["key"]["id"]

    assert admin.patch(f"/keys/{key_id}", json={"rpm": "many"}).status_code == 422
    assert admin.patch(f"/keys/{key_id}", json={"name": None}).status_code == 422
    assert admin.patch("/keys/000000000000", json={"rpm": 1}).status_code == 404
    unchanged = admin.ok("PATCH", f"/keys/{key_id}", json={})
    cleared = admin.ok("PATCH", f"/keys/{key_id}", json={"expires_at": None, "rpm": None})

    assert unchanged == {**created["key"], "last_used_at": unchanged["last_used_at"]}
    assert (cleared["expires_at"], cleared["rpm"], cleared["name"]) == (None, None, "app")


def test_a_read_token_reads_but_cannot_change(admin: Admin, request: pytest.FixtureRequest) -> None:
    key_id = admin.ok("POST", "/keys", json={"name": "app"})["key"]["id"]
    reader = Admin(admin.gateway, _token("read", subject="auditor"))
    request.addfinalizer(reader.close)

    assert reader.get("/keys").status_code == 200
    assert reader.get(f"/keys/{key_id}").status_code == 200
    assert reader.get("/audit").status_code == 200
    assert reader.get("/openapi.json").status_code == 200
    for method, path in [
        ("POST", "/keys"),
        ("PATCH", f"/keys/{key_id}"),
        ("POST", f"/keys/{key_id}/revoke"),
        ("POST", f"/keys/{key_id}/rotate"),
    ]:
        response = reader.request(method, path, json={"name": "x"})
        assert response.status_code == 403, path
        assert "admin scope" in response.json()["error"]["message"]
    assert admin.ok("GET", f"/keys/{key_id}")["status"] == "active"


def test_openapi_lists_the_admin_routes_to_admin_tokens_only(admin: Admin) -> None:
    document = admin.ok("GET", "/openapi.json")
    anonymous = httpx.get(f"{admin.gateway.url}/admin/v1/openapi.json")

    assert {"/admin/v1/keys", "/admin/v1/keys/{key_id}/rotate", "/admin/v1/audit"} <= set(
        document["paths"]
    )
    assert not any(path.startswith("/api/") for path in document["paths"])
    assert document["security"] == [{"adminToken": []}]
    create = document["paths"]["/admin/v1/keys"]["post"]["responses"]
    assert "ErrorBody" in create["422"]["content"]["application/json"]["schema"]["$ref"]
    assert {"401", "403"} <= set(create)
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")


def test_app_keys_and_admin_tokens_each_open_only_their_own_door(admin: Admin) -> None:
    gateway = admin.gateway
    with_app_key = httpx.get(f"{gateway.url}/admin/v1/keys", headers=gateway.headers())
    with_token = _generate(gateway, _token())

    assert with_app_key.status_code == 401
    assert "API keys cannot open the admin API" in with_app_key.json()["error"]["message"]
    assert with_token.status_code == 401
    assert "admin tokens cannot open the generation routes" in with_token.json()["error"]


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (mint_token("x" * 40, subject="eve", scope="admin", ttl=HOUR), "signature"),
        (
            mint_token(SECRET, subject="eve", scope="admin", ttl=HOUR, now=LONG_AGO),
            "expired",
        ),
        ("e30.e30.", "malformed"),  # {} . {} with no signature
        ("a" * 9000, "too large"),
        ("not a jwt", "malformed"),
    ],
)
def test_bad_tokens_are_refused_with_401_and_never_logged(
    admin: Admin, caplog: pytest.LogCaptureFixture, token: str, message: str
) -> None:
    caplog.set_level(logging.INFO)

    response = httpx.get(
        f"{admin.gateway.url}/admin/v1/keys", headers={"Authorization": f"Bearer {token}"}
    )

    assert response.status_code == 401
    assert message in response.json()["error"]["message"]
    assert 'error="invalid_token"' in response.headers["www-authenticate"]
    assert token not in caplog.text
    assert token[:40] not in caplog.text


def test_missing_or_doubled_credentials_are_refused(admin: Admin) -> None:
    url = f"{admin.gateway.url}/admin/v1/keys"
    token = _token()

    missing = httpx.get(url)
    basic = httpx.get(url, headers={"Authorization": "Basic YWRtaW46YWRtaW4="})
    doubled = httpx.get(
        url, headers=[("Authorization", f"Bearer {token}"), ("Authorization", f"Bearer {token}")]
    )

    assert [r.status_code for r in (missing, basic, doubled)] == [401, 401, 401]
    assert "missing admin token" in missing.json()["error"]["message"]


def test_a_body_not_sent_as_json_is_refused(admin: Admin) -> None:
    # A page in a browser can post a form across origins without a preflight; the API reads
    # only JSON bodies, so such a post cannot create a key even with a token.
    response = admin.post(
        "/keys",
        content=b'{"name": "from-a-form"}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )

    assert response.status_code == 422
    assert admin.ok("GET", "/keys", params={"name": "from-a-form"})["data"] == []

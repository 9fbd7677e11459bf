"""Attacks on the admin API over a real loopback gateway, each one a finding of the review of
issue 13 that was fixed: what an anonymous client, an app key holder or a `read` token could do.

The JWT attack set proper is in tests/auth/test_admin_jwt.py and
tests/api/admin/test_admin_api.py; here are the attacks that got through before their fix, so
each test failed then.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.testing.stack import gateway_process
from tests.api.admin.test_admin_api import SECRET, Admin, _token, admin, admin_gateway
from tests.support.stack import Emulator, Gateway

__all__ = ["admin", "admin_gateway"]  # fixtures, imported so pytest finds them here


@pytest.fixture
def reader(admin_gateway: Gateway) -> Iterator[Admin]:
    client = Admin(admin_gateway, _token("read", "bob@example.com"))
    yield client
    client.close()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _forge(claims: dict[str, Any], secret: str = "not-the-secret") -> str:  # noqa: S107
    """An HS256 token with any claims (signed with `secret`, by default not the gateway's)."""
    header = _b64(b'{"alg":"HS256"}')
    signing_input = f"{header}.{_b64(json.dumps(claims).encode())}"
    signature = hmac.new(secret.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


# --- an anonymous client -----------------------------------------------------------------------


def test_an_admin_body_is_not_read_past_the_admin_body_limit(admin_gateway: Gateway) -> None:
    # Even with a valid token, a body is read within 1 MiB: before the limit the gateway held
    # 1.3 GB of RSS for one 400 MB post. (An anonymous body is not read at all: its token is
    # checked first, tests/limits/test_address_limits.py.)
    def body() -> Iterator[bytes]:
        yield b'{"name": "'
        for _ in range(64):  # 64 MiB, chunked: no Content-Length to refuse it by
            yield b"a" * (1024 * 1024)
        yield b'"}'

    token = _token()
    response = httpx.post(
        f"{admin_gateway.url}/admin/v1/keys",
        content=body(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        timeout=60,
    )
    # A declared length is refused before a byte of the body is read (only the head is sent).
    host, port = admin_gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /admin/v1/keys HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {token}\r\n".encode()
            + b"Content-Length: 1000000000000\r\n\r\n"
        )
        declared = sock.recv(4096)

    assert response.status_code == 413, response.text
    assert declared.startswith(b"HTTP/1.1 413 "), declared
    assert response.json()["error"]["message"].startswith("request body is larger than")


def test_an_unsigned_token_with_a_huge_integer_time_is_a_401_not_a_500(
    admin_gateway: Gateway,
) -> None:
    # `math.isfinite(10**400)` raises OverflowError: before the fix, anyone got a 500 (and a
    # traceback in the log) with a token that needs no signature to reach that check.
    now = int(time.time())
    base = {"iss": "llm-gateway", "aud": "llm-gateway-admin", "sub": "x", "scope": "admin"}
    for name in ("exp", "nbf", "iat"):
        claims = {**base, "iat": now, "nbf": now, "exp": now + 60, name: 10**400}
        response = httpx.get(
            f"{admin_gateway.url}/admin/v1/keys",
            headers={"Authorization": f"Bearer {_forge(claims)}"},
        )
        assert response.status_code == 401, (name, response.text)
        assert response.json()["error"]["message"] == "malformed token"


def _nested(depth: int, kind: str) -> str:
    """A JSON list (`[[...]]`) or object (`{"a":{"a":...}}`) nested `depth` levels."""
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def _raw_token(header: str, claims: str) -> str:
    """A token of any header and claims text, with a signature that verifies nothing."""
    return f"{_b64(header.encode())}.{_b64(claims.encode())}.{_b64(b'x' * 32)}"


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize(
    ("header", "claims"),
    [
        # About 1,000 levels (what fits in the 8 KiB a token may have) made jose's own
        # `json.loads` of the claims raise RecursionError: a 500 and a traceback, for anyone.
        ('{"alg":"HS256"}', '{"exp":EXP,"x":' + _nested(1000, "list") + "}"),
        ('{"alg":"HS256"}', '{"exp":EXP,"sub":' + _nested(980, "object") + "}"),
        ('{"alg":"HS256"}', '{"exp":EXP,"aud":' + _nested(1000, "list") + "}"),
        ('{"alg":"HS256"}', '{"exp":EXP,"scope":' + _nested(400, "list") + "}"),
        ('{"alg":"HS256","x":' + _nested(1000, "list") + "}", '{"exp":EXP,"sub":"a"}'),
        ('{"alg":"HS256","crit":' + _nested(990, "object") + "}", '{"exp":EXP}'),
    ],
)
def test_a_token_with_deeply_nested_json_is_a_401_not_a_500(
    admin_gateway: Gateway, caplog: pytest.LogCaptureFixture, header: str, claims: str
) -> None:
    caplog.set_level(logging.INFO)
    token = _raw_token(header, claims.replace("EXP", str(int(time.time()) + 60)))
    assert len(token) <= 8 * 1024  # within the size limit: the parser sees it

    response = httpx.get(
        f"{admin_gateway.url}/admin/v1/keys",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )

    assert response.status_code == 401, response.text
    assert response.json()["error"]["message"] == "malformed token"
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert 'error="invalid_token"' in response.headers["www-authenticate"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert "Traceback" not in caplog.text


@pytest.mark.processes
def test_x_forwarded_for_does_not_write_the_audit_source_without_trusted_proxies(
    emulator: Emulator, tmp_path: Path
) -> None:
    # `gateway serve` runs uvicorn, whose proxy headers default to on and trust 127.0.0.1:
    # before the fix, any client reaching the gateway over loopback (a sidecar, a TCP proxy)
    # wrote the address it liked into the audit trail and the access log, although
    # GATEWAY_TRUSTED_PROXIES was empty.
    env = {"GATEWAY_UPSTREAM_URL": emulator.url, "GATEWAY_ADMIN_JWT_SECRET": SECRET}
    with gateway_process(tmp_path, env) as gateway:
        admin = httpx.Client(
            base_url=f"{gateway.url}/admin/v1",
            headers={"Authorization": f"Bearer {_token()}", "X-Forwarded-For": "203.0.113.9"},
        )
        with admin:
            created = admin.post("/keys", json={"name": "spoofed"})
            assert created.status_code == 201, created.text
            entries = admin.get("/audit").json()["data"]
        log = gateway.log_tail(200)

    assert [entry["source"] for entry in entries] == ["127.0.0.1"]
    assert "203.0.113.9" not in log


# --- a read token ------------------------------------------------------------------------------


def _cursor(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("path", "params"),
    [
        # Times whose conversion to UTC leaves datetime's range (OverflowError).
        ("/audit", {"since": "0001-01-01T00:00:00+14:00"}),
        ("/audit", {"until": "9999-12-31T23:59:59-14:00"}),
        ("/keys", {"cursor": _cursor(["0001-01-01T00:00:00+14:00", "a"])}),
        ("/keys", {"cursor": _cursor(["9999-12-31T23:59:59-14:00", "a"])}),
        ("/usage", {"until": "0001-01-01"}),  # the default window starts before year 1
        # An audit cursor beyond SQLite's and PostgreSQL's 64-bit integers.
        ("/audit", {"cursor": "9" * 30}),
    ],
)
def test_out_of_range_queries_are_a_422_not_a_500(
    reader: Admin, path: str, params: dict[str, str]
) -> None:
    response = reader.get(path, params=params)

    assert response.status_code == 422, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_an_audit_page_of_the_largest_size_is_served(admin: Admin, reader: Admin) -> None:
    # The route asks the store for one entry more than the page to know whether another
    # follows; at the largest page size that was one more than the store allowed: a 500.
    admin.ok("POST", "/keys", json={"name": "one"})

    page = reader.ok("GET", "/audit", params={"limit": 1000})

    # The fixture's key (created by the gateway's own code) and this one.
    assert [entry["action"] for entry in page["data"]] == ["create", "create"]
    assert page["next_cursor"] is None


# --- an admin token: what it writes is later printed to operators ------------------------------


@pytest.mark.parametrize(
    "body",
    [
        # A name or model printed raw by `gateway keys list` in an operator's terminal: ANSI
        # escapes recolour or erase it, a newline forges a row, a bidi override reorders it.
        {"name": "ok\x1b[2K\x1b[1Gadmin-key  all  0  0  0  yes"},
        {"name": "ok\nforged-row"},
        {"name": "ok\u202eeliah"},
        {"name": "a", "models": ["llama3.2\x1b[8m"]},
        # Bounds: 1,000 names of at most 200 characters (the usage table's model column).
        {"name": "a", "models": [""]},
        {"name": "a", "models": ["m" * 201]},
        {"name": "a", "models": [f"m{i}" for i in range(1001)]},
        # An expiry whose conversion to UTC leaves datetime's range: a 500 before.
        {"name": "a", "expires_at": "9999-12-31T23:59:59-14:00"},
        {"name": "a", "expires_at": "0001-01-01T00:00:00+14:00"},
    ],
)
@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_names_models_and_expiries_that_would_corrupt_output_are_refused(
    admin: Admin, body: dict[str, Any]
) -> None:
    created = admin.post("/keys", json=body)
    key_id = admin.gateway.key_id
    patched = admin.patch(f"/keys/{key_id}", json={k: v for k, v in body.items() if k != "name"})
    if "name" in body and len(body) == 1:
        patched = admin.patch(f"/keys/{key_id}", json=body)

    assert created.status_code == 422, created.text
    assert patched.status_code == 422, patched.text
    assert [key["id"] for key in admin.ok("GET", "/keys")["data"]] == [key_id]

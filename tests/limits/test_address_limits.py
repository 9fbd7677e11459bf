"""Per-address budgets of failed authentications (`gateway.limits.address`), over real sockets.

A client address that fails to authenticate more than its budget in a minute gets 429 with
`Retry-After` for its further failures, in its surface's error format, while other addresses and
every valid key (from the same address too: clients behind one NAT) are served as before. Two
source addresses are real ones (a client socket bound to 127.0.0.2), or `X-Forwarded-For`
hops behind a trusted proxy; the budget is shared by two `gateway serve` workers through Redis.
"""

from __future__ import annotations

import http.client
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.testing.stack import ManagedProcess, create_key
from tests.api.admin.test_admin_api import SECRET, _token
from tests.serve.test_workers import DEADLINE, two_workers, worker_pids
from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.stack import Gateway

__all__ = ["two_workers"]  # a fixture, imported so pytest finds it here

OTHER = "127.0.0.2"  # a second real source address: all of 127/8 is local on Linux
GENERATE = {"model": MODEL, "prompt": "hi", "stream": False}


@pytest.fixture
def clients() -> Iterator[dict[str, httpx.Client]]:
    """HTTP clients whose sockets are bound to 127.0.0.1 and to 127.0.0.2."""
    made = {
        source: httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30)
        for source in ("127.0.0.1", OTHER)
    }
    yield made
    for client in made.values():
        client.close()


def _wrong_secret(key: str) -> str:
    """The key of an existing id with another secret."""
    return key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")


def _failures(gateway: Gateway) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """One request of each kind of failed authentication: (method, path, headers)."""
    return [
        ("POST", "/api/generate", []),  # no key
        ("POST", "/v1/chat/completions", [("Authorization", "Bearer gw_nope")]),  # malformed
        ("POST", "/api/generate", [("Authorization", f"Bearer {_wrong_secret(gateway.key)}")]),
        ("GET", "/v1/models", [("X-API-Key", "gw_0123456789abcdef_" + "x" * 43)]),  # unknown
        ("GET", "/api/tags", [("Authorization", "Bearer eyJhbGciOi.eyJzdWIi.c2ln")]),  # a JWT
        ("GET", "/api/ps", [("X-API-Key", "gw_a"), ("X-API-Key", "gw_b")]),  # repeated: 400
    ]


def _send(client: httpx.Client, base: str, method: str, path: str, headers: Any) -> httpx.Response:
    body = GENERATE if method == "POST" else None
    return client.request(method, f"{base}{path}", json=body, headers=headers)


def _assert_limited(response: httpx.Response, path: str) -> None:
    """A per-address 429 with `Retry-After`, in the error format of `path`'s surface."""
    assert response.status_code == 429, (path, response.text)
    assert 1 <= int(response.headers["Retry-After"]) <= 60
    error = response.json()["error"]
    if path.startswith("/api/"):  # Ollama's {"error": "..."}
        assert isinstance(error, str)
        message = error
    else:  # OpenAI's error object (the /v1 surface and the admin API)
        assert error["type"] == "rate_limit_error"
        message = error["message"]
    assert message.startswith("too many failed authentications from this address")


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_failures_from_one_address_get_429_while_another_and_every_valid_key_are_served(
    make_gateway, clients, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.ratelimit")
    gateway = make_gateway(auth_failures_per_minute=6)
    # Keys of several clients behind the flooding address, two with limits of their own.
    keys = [gateway.key] + [gateway.create_key(f"nat-{n}", rpm=3)[1] for n in range(2)]
    flooder, neighbour = clients["127.0.0.1"], clients[OTHER]
    failures = _failures(gateway)

    answers = [
        (path, _send(flooder, gateway.url, method, path, headers))
        for _ in range(3)
        for method, path, headers in failures
    ]

    assert [r.status_code for _, r in answers[:6]] == [401, 401, 401, 401, 401, 400]
    for path, response in answers[6:]:  # every kind of failure, on both surfaces
        _assert_limited(response, path)
    # Every valid key is served from the flooding address, its own limits untouched.
    for key in keys:
        served = flooder.post(
            f"{gateway.url}/api/generate", json=GENERATE, headers={"Authorization": f"Bearer {key}"}
        )
        assert served.status_code == 200, served.text
        if key != gateway.key:
            assert served.headers["X-RateLimit-Remaining"] == "2"
    # The other address has a budget of its own, and its keys are served too.
    method, path, headers = failures[2]
    assert _send(neighbour, gateway.url, method, path, headers).status_code == 401
    served = neighbour.get(f"{gateway.url}/v1/models", headers=gateway.headers())
    assert served.status_code == 200, served.text

    text = gateway.metrics_text()
    assert metric_value(text, "gateway_address_limited_total", budget="api") == 12
    assert metric_value(text, "gateway_address_limited_total", budget="admin") == 0
    logged = [r.getMessage() for r in caplog.records if "failed authentications" in r.getMessage()]
    assert len(logged) == 1, logged  # once in the window, not once per refusal
    assert "127.0.0.1" in logged[0]
    assert "gw_" not in caplog.text  # no credential in any log line


def test_the_address_behind_a_trusted_proxy_is_counted_and_a_forged_one_is_not(
    make_gateway, clients
) -> None:
    gateway = make_gateway(auth_failures_per_minute=3, trusted_proxies=["127.0.0.1/32"])
    proxy, direct = clients["127.0.0.1"], clients[OTHER]
    wrong = {"Authorization": f"Bearer {_wrong_secret(gateway.key)}"}

    def tags(client: httpx.Client, forwarded: str | None, headers: dict[str, str]) -> int:
        extra = {} if forwarded is None else {"X-Forwarded-For": forwarded}
        url = f"{gateway.url}/api/tags"
        return client.get(url, headers={**headers, **extra}).status_code

    # Through the trusted proxy: each client its own budget, by its X-Forwarded-For hop.
    assert [tags(proxy, "203.0.113.5", wrong) for _ in range(4)] == [401, 401, 401, 429]
    assert tags(proxy, "203.0.113.6", wrong) == 401
    # What the client wrote further left is not believed: the proxy's hop names it.
    assert tags(proxy, "203.0.113.6, 203.0.113.5", wrong) == 429
    assert tags(proxy, "203.0.113.5", gateway.headers()) == 200  # its valid key still works
    # IPv6 clients are counted by their /64.
    assert [tags(proxy, f"2001:db8::{n}", wrong) for n in range(1, 5)] == [401, 401, 401, 429]
    assert tags(proxy, "2001:db8:0:1::1", wrong) == 401
    # A peer that is not a trusted proxy cannot name another address to escape its budget.
    forged = [tags(direct, f"198.51.100.{n}", wrong) for n in range(4)]
    assert forged == [401, 401, 401, 429]


def test_a_failing_limit_storage_leaves_each_failure_its_own_answer(make_gateway) -> None:
    # Nothing listens on port 1: every storage call fails at once. The request is refused
    # either way, so its 401 is kept (not a 500, not a 503 from the fail-closed policy).
    gateway = make_gateway(
        rate_limit_storage="redis://127.0.0.1:1/0",
        rate_limit_fail_open=False,
        auth_failures_per_minute=1,
    )
    wrong = {"Authorization": f"Bearer {_wrong_secret(gateway.key)}"}

    statuses = [httpx.get(f"{gateway.url}/api/tags", headers=wrong).status_code for _ in range(3)]

    assert statuses == [401, 401, 401]
    assert httpx.get(f"{gateway.url}/api/tags", headers=gateway.headers()).status_code == 200
    text = gateway.metrics_text()
    assert metric_value(text, "gateway_rate_limit_storage_errors_total") >= 3
    assert metric_value(text, "gateway_address_limited_total") == 0


def test_addresses_are_counted_by_ipv4_address_and_ipv6_slash_64() -> None:
    from gateway.limits.address import address_bucket

    assert address_bucket("192.0.2.7") == "192.0.2.7"
    assert address_bucket("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_bucket("2001:db8::1") == address_bucket("2001:db8::ffff:1") == "2001:db8::/64"
    assert address_bucket("2001:db8:0:1::1") == "2001:db8:0:1::/64"
    assert address_bucket("unix-socket") == "unix-socket"


def test_the_admin_api_has_a_tighter_budget_of_its_own(
    make_gateway, clients, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = make_gateway(
        admin_jwt_secret=SECRET, auth_failures_per_minute=6, admin_auth_failures_per_minute=3
    )
    caplog.set_level(logging.INFO)
    client = clients["127.0.0.1"]
    admin = f"{gateway.url}/admin/v1"
    refused = [
        client.get(f"{admin}/keys"),  # no token
        client.get(f"{admin}/keys", headers={"Authorization": "Bearer eyJ.e30.x"}),
        client.post(f"{admin}/keys", json={"name": "x"}, headers=gateway.headers()),  # a gw_ key
        client.get(f"{admin}/usage", headers={"Authorization": "Bearer not-a-token"}),
        client.post(f"{admin}/keys", json={"name": "x"}),
    ]

    assert [r.status_code for r in refused[:3]] == [401, 401, 401]
    for response in refused[3:]:
        _assert_limited(response, "/admin/v1/keys")  # the admin API's OpenAI-style object
    # A valid admin token from the same address is served.
    valid = {"Authorization": f"Bearer {_token()}"}
    assert client.get(f"{admin}/keys", headers=valid).status_code == 200
    created = client.post(f"{admin}/keys", json={"name": "after"}, headers=valid)
    assert created.status_code == 201, created.text
    # The API keys' budget is apart: admin failures did not spend it.
    wrong = {"Authorization": f"Bearer {_wrong_secret(gateway.key)}"}
    assert client.get(f"{gateway.url}/api/tags", headers=wrong).status_code == 401
    text = gateway.metrics_text()
    assert metric_value(text, "gateway_address_limited_total", budget="admin") == 2
    assert metric_value(text, "gateway_address_limited_total", budget="api") == 0
    # A warning per 401; past the budget one line a minute, not one per request sent.
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("admin API refused" in m for m in warnings) == 3, warnings
    assert sum("answering its failures with 429" in m for m in warnings) == 1, warnings


def _head_only(
    gateway: Gateway, path: str, authorization: str | None = None, method: str = "POST"
) -> bytes:
    """Send a request head announcing a body, send none of it, and return the answer.

    An answer means the gateway decided without reading the body (a read would wait for it).
    """
    host, port = gateway.url.removeprefix("http://").split(":")
    auth = b"" if authorization is None else f"Authorization: {authorization}\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=DEADLINE) as sock:
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n".encode()
            + auth
            + b"Content-Length: 500000\r\n\r\n"
        )
        try:
            return sock.recv(4096)
        except TimeoutError:
            return b"no answer: the gateway waited for the body"


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_admin_requests_are_refused_before_their_body_is_read(make_gateway) -> None:
    off = make_gateway()
    on = make_gateway(admin_jwt_secret=SECRET)

    assert _head_only(off, "/admin/v1/keys").startswith(b"HTTP/1.1 404 ")
    assert _head_only(off, "/admin/v1/keys", f"Bearer {_token()}").startswith(b"HTTP/1.1 404 ")
    assert _head_only(on, "/admin/v1/keys").startswith(b"HTTP/1.1 401 ")
    token = "Bearer eyJhbGciOiJIUzI1NiJ9.e30.c2ln"
    forged = _head_only(on, "/admin/v1/keys/abc", token, method="PATCH")
    assert forged.startswith(b"HTTP/1.1 401 ")
    assert _head_only(on, "/admin/v1/keys", f"Bearer {on.key}").startswith(b"HTTP/1.1 401 ")
    # The same holds on every API route that takes a body (they all read it after the key).
    for path in (
        "/api/generate",
        "/api/create",
        "/v1/chat/completions",
        "/v1/files",
        "/v1/batches",
    ):
        assert _head_only(on, path).startswith(b"HTTP/1.1 401 "), path


# --- two workers sharing the budget through Redis ----------------------------------------------


def _worker_of(connection: http.client.HTTPConnection, port: int, pids: set[int]) -> int | None:
    """The pid of the worker that holds the server side of `connection` (from /proc)."""
    assert connection.sock is not None
    client_port = connection.sock.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == client_port:
            inode = fields[9]
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def _one_connection_per_worker(
    gateway: ManagedProcess, source: str
) -> list[http.client.HTTPConnection]:
    """Kept-alive connections from `source`, one held by each of the two workers."""
    host, port = gateway.url.removeprefix("http://").split(":")
    pids = worker_pids(gateway)
    held: dict[int, http.client.HTTPConnection] = {}
    for _ in range(100):
        connection = http.client.HTTPConnection(
            host, int(port), timeout=DEADLINE, source_address=(source, 0)
        )
        connection.request("GET", "/healthz")  # answered: a worker has accepted it
        connection.getresponse().read()
        pid = _worker_of(connection, int(port), pids)
        if pid is None or pid in held:
            connection.close()
        else:
            held[pid] = connection
        if len(held) == 2:
            return list(held.values())
    pytest.fail("100 connections did not reach both workers")


def _get(connection: http.client.HTTPConnection, path: str, key: str) -> tuple[int, str | None]:
    connection.request("GET", path, headers={"Authorization": f"Bearer {key}"})
    response = connection.getresponse()
    response.read()
    return response.status, response.getheader("Retry-After")


@pytest.mark.processes
def test_two_workers_share_one_budget_through_redis(two_workers) -> None:
    gateway, key = two_workers(auth_failures_per_minute="6", keepalive_timeout="120")
    other_key = str(create_key(gateway.extra_env, "behind-the-same-nat")["key"])
    flooder = _one_connection_per_worker(gateway, "127.0.0.1")
    neighbour = _one_connection_per_worker(gateway, OTHER)
    wrong = _wrong_secret(key)

    # Failures alternate between the workers: counted alone, each would allow 6 (12 in all).
    answers = [_get(flooder[n % 2], "/api/tags", wrong) for n in range(12)]

    assert [status for status, _ in answers] == [401] * 6 + [429] * 6
    assert all(1 <= int(retry or 0) <= 60 for _, retry in answers[6:])
    for connection in flooder:  # every valid key, on either worker, from the same address
        assert _get(connection, "/api/tags", key)[0] == 200
        assert _get(connection, "/api/tags", other_key)[0] == 200
    for connection in neighbour:  # the other address: its own budget, and served
        assert _get(connection, "/api/tags", wrong)[0] == 401
        assert _get(connection, "/api/tags", key)[0] == 200
    text = httpx.get(f"{gateway.url}/metrics", timeout=DEADLINE).text
    assert metric_value(text, "gateway_address_limited_total", budget="api") == 6
    for connection in flooder + neighbour:
        connection.close()

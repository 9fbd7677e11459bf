"""The door of a real `gateway serve` process (gateway.serve.door), over raw sockets.

Silent and slow clients are closed, oversized heads get 431, the connection cap and an
address's share of it answer 503 and free up again, idle kept-alive connections end, and none
of it cuts a stream whose request has arrived. Time bounds are loose (several times the
configured timeout): what is checked is that the close happens, not how fast.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.serve.server import RESERVED_FDS, door_limits
from gateway.settings import Settings
from gateway.testing.stack import ManagedProcess, create_key, gateway_process
from tests.support.client import MODEL, stream_generation
from tests.support.metrics import metric_value
from tests.support.sockets import read_response, read_until_closed
from tests.support.stack import Emulator

GET = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"


@contextmanager
def _gateway(tmp_path: Path, emulator: Emulator, **env: str) -> Iterator[ManagedProcess]:
    """`gateway serve` in front of the emulator; `env` keys are `GATEWAY_` settings."""
    variables = {"GATEWAY_SHUTDOWN_DRAIN": "0"}  # each test stops its process at once
    variables |= {f"GATEWAY_{name.upper()}": value for name, value in env.items()}
    with gateway_process(tmp_path, {"GATEWAY_UPSTREAM_URL": emulator.url, **variables}) as gateway:
        yield gateway


def _connect(gateway: ManagedProcess, source: str | None = None) -> socket.socket:
    """A connection to `gateway`, from the loopback address `source` (Linux takes any 127/8)."""
    host, port = gateway.url.removeprefix("http://").split(":")
    bind = (source, 0) if source else None
    return socket.create_connection((host, int(port)), timeout=10, source_address=bind)


def _refused(gateway: ManagedProcess, reason: str) -> float:
    """`gateway_door_refused_total{reason}` as `gateway`'s `/metrics` says now."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return metric_value(text, "gateway_door_refused_total", reason=reason)


def _healthy(sock: socket.socket) -> None:
    sock.sendall(GET)
    status, _, _ = read_response(sock)
    assert status == 200


@pytest.mark.processes
def test_a_connection_that_sends_nothing_is_closed(emulator: Emulator, tmp_path: Path):
    with _gateway(tmp_path, emulator, header_timeout="0.5") as gateway, _connect(gateway) as sock:
        assert read_until_closed(sock, within=5) == b""


@pytest.mark.processes
def test_a_slowloris_head_is_cut_by_the_header_deadline(emulator: Emulator, tmp_path: Path):
    with _gateway(tmp_path, emulator, header_timeout="0.5") as gateway, _connect(gateway) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: ")
        deadline = time.monotonic() + 10
        closed = False
        while not closed and time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.2)
            if readable:
                closed = True
                break
            try:
                sock.sendall(b"a")  # one byte every 0.2 s: always something new, never the end
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed, "the server kept a head that never ends"
        answer = read_until_closed(sock, within=5)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"connection: close" in answer.lower()
        assert _refused(gateway, "head_timeout") == 1


@pytest.mark.processes
def test_a_head_over_the_size_cap_gets_431(emulator: Emulator, tmp_path: Path):
    with _gateway(tmp_path, emulator, max_header_bytes="8192") as gateway:
        with _connect(gateway) as sock:
            sock.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: g\r\nX-Fits: " + b"a" * 6000 + b"\r\n\r\n"
            )
            assert read_response(sock)[0] == 200
        with _connect(gateway) as sock:
            sock.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: g\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
            )
            status, headers, body = read_response(sock)
            assert status == 431
            assert headers["connection"] == "close"
            assert "too large" in json.loads(body)["error"]
            assert read_until_closed(sock, within=5) == b""
        assert _refused(gateway, "head_too_large") == 1
        assert _refused(gateway, "head_timeout") == 0


@pytest.mark.processes
def test_an_endless_header_is_cut_after_the_cap(emulator: Emulator, tmp_path: Path):
    with (
        _gateway(tmp_path, emulator, max_header_bytes="8192") as gateway,
        _connect(gateway) as sock,
    ):

        def send_forever() -> None:  # 64 MiB unless the server stops it
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: g\r\nX-Endless: ")
                for _ in range(1024):
                    sock.sendall(b"a" * 65536)
            except OSError:
                pass

        sender = threading.Thread(target=send_forever, daemon=True)
        sender.start()
        answer = read_until_closed(sock, within=10)
        assert answer.startswith(b"HTTP/1.1 431 ")
        sender.join(10)


@pytest.mark.processes
def test_too_many_header_fields_get_431(emulator: Emulator, tmp_path: Path):
    def request(fields: int, upgrade: bytes = b"") -> bytes:
        lines = b"".join(b"X-F%d: v\r\n" % i for i in range(fields))
        return b"GET /healthz HTTP/1.1\r\nHost: g\r\n" + upgrade + lines + b"\r\n"

    with _gateway(tmp_path, emulator, max_headers="20") as gateway:
        with _connect(gateway) as sock:
            sock.sendall(request(15))
            assert read_response(sock)[0] == 200
        with _connect(gateway) as sock:
            sock.sendall(request(30))
            status, headers, _ = read_response(sock)
            assert status == 431
            assert headers["connection"] == "close"
        with _connect(gateway) as sock:  # a WebSocket handshake cut short is not upgraded
            websocket = (
                b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            )
            sock.sendall(request(30, websocket))
            assert read_response(sock)[0] == 431


@pytest.mark.processes
def test_over_the_connection_cap_new_clients_are_refused_until_one_leaves(
    emulator: Emulator, tmp_path: Path
):
    env = {"max_client_connections": "3", "header_timeout": "30", "keepalive_timeout": "30"}
    env["max_client_connections_per_address"] = "0"  # every connection comes from 127.0.0.1
    with _gateway(tmp_path, emulator, **env) as gateway:
        held: list[socket.socket] = []
        deadline = time.monotonic() + 10
        while len(held) < 3:  # the readiness probe's connection may not be gone yet
            sock = _connect(gateway)
            sock.sendall(GET)
            if read_response(sock)[0] == 200:
                held.append(sock)
            else:
                sock.close()
                assert time.monotonic() < deadline, "could not open 3 connections"
                time.sleep(0.1)
        try:
            with _connect(gateway) as extra:
                status, headers, body = read_response(extra)  # before sending anything
                assert status == 503
                assert headers["connection"] == "close"
                assert headers["retry-after"] == "1"
                assert "too many open connections" in json.loads(body)["error"]
                assert read_until_closed(extra, within=5) == b""
            for sock in held:  # the connections already in still work
                _healthy(sock)
            held.pop().close()
            deadline = time.monotonic() + 10
            while True:  # the server notices the close a moment later
                with _connect(gateway) as sock:
                    sock.sendall(GET)
                    if read_response(sock)[0] == 200:
                        break
                assert time.monotonic() < deadline, "no room after a client left"
                time.sleep(0.1)
            # The refused one, and any of the opening loop's that found no room either.
            assert _refused(gateway, "connections") >= 1
            assert _refused(gateway, "connections_per_address") == 0
        finally:
            for sock in held:
                sock.close()


def _hold(gateway: ManagedProcess, source: str, count: int) -> list[socket.socket]:
    """`count` kept-alive connections from `source`, each proven in by a 200.

    A refusal is retried for a while: the readiness probe's connection may not be gone yet.
    """
    held: list[socket.socket] = []
    deadline = time.monotonic() + 10
    while len(held) < count:
        sock = _connect(gateway, source)
        sock.sendall(GET)
        if read_response(sock)[0] == 200:
            held.append(sock)
        else:
            sock.close()
            assert time.monotonic() < deadline, f"could not open {count} connections"
            time.sleep(0.1)
    return held


def _refused_as_one_address(sock: socket.socket, share: int) -> None:
    """`sock` is answered 503 over its address's share, before it sends a whole head."""
    status, headers, body = read_response(sock)
    assert status == 503
    assert headers["connection"] == "close"
    assert headers["retry-after"] == "1"
    message = f"too many open connections from this address ({share}); try again later"
    assert json.loads(body)["error"] == message


@pytest.mark.processes
def test_one_address_cannot_take_every_connection(emulator: Emulator, tmp_path: Path):
    """An anonymous client from one address holding its share and reopening half-sent heads
    (the attack that held all of GATEWAY_MAX_CLIENT_CONNECTIONS) leaves room for the others."""
    env = {"max_client_connections": "40", "max_client_connections_per_address": "10"}
    env |= {"header_timeout": "30", "keepalive_timeout": "30"}
    with _gateway(tmp_path, emulator, **env) as gateway:
        held = _hold(gateway, "127.0.0.1", 10)
        flood: list[socket.socket] = []
        try:
            with _connect(gateway, "127.0.0.1") as eleventh:  # before sending anything
                _refused_as_one_address(eleventh, 10)
                assert read_until_closed(eleventh, within=5) == b""
            for _ in range(45):  # more than the process cap, each with a byte of a head
                sock = _connect(gateway, "127.0.0.1")
                flood.append(sock)
                sock.sendall(b"G")
            for sock in flood:
                _refused_as_one_address(sock, 10)
            with _connect(gateway, "127.0.0.2") as other:  # another client is served
                _healthy(other)
                _healthy(other)
            for sock in held:  # the first address's own connections still work
                _healthy(sock)
            log = gateway.log_path.read_text()
            assert log.count("client 127.0.0.1 holds 10 open connections") == 1  # not 46
            with _connect(gateway, "127.0.0.3") as sock:  # counted in full, logged once
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n")
                text = read_until_closed(sock, within=5).decode()
            refused = metric_value(
                text, "gateway_door_refused_total", reason="connections_per_address"
            )
            assert refused == 46
            held.pop().close()
            deadline = time.monotonic() + 10
            while True:  # its share frees up once the server notices the close
                with _connect(gateway, "127.0.0.1") as sock:
                    sock.sendall(GET)
                    if read_response(sock)[0] == 200:
                        break
                assert time.monotonic() < deadline, "no room after a connection of 127.0.0.1 left"
                time.sleep(0.1)
        finally:
            for sock in held + flood:
                sock.close()


@pytest.mark.processes
def test_a_trusted_proxy_has_no_share_of_its_own(emulator: Emulator, tmp_path: Path):
    """A reverse proxy carries many clients: its connections count against the process cap
    only, while any other address keeps its share."""
    env = {"max_client_connections": "40", "max_client_connections_per_address": "2"}
    env |= {"header_timeout": "30", "keepalive_timeout": "30"}
    env["trusted_proxies"] = '["127.0.0.1"]'
    with _gateway(tmp_path, emulator, **env) as gateway:
        held = _hold(gateway, "127.0.0.1", 8)
        try:
            held += _hold(gateway, "127.0.0.2", 2)
            with _connect(gateway, "127.0.0.2") as third:
                _refused_as_one_address(third, 2)
            held += _hold(gateway, "127.0.0.1", 4)  # the proxy is still let in
        finally:
            for sock in held:
                sock.close()


@pytest.mark.processes
def test_an_idle_kept_alive_connection_is_closed(emulator: Emulator, tmp_path: Path):
    env = {"keepalive_timeout": "0.5", "header_timeout": "30"}
    with _gateway(tmp_path, emulator, **env) as gateway, _connect(gateway) as sock:
        _healthy(sock)
        # uvicorn's own default would be 5 s: closed well before proves the setting applies.
        assert read_until_closed(sock, within=3) == b""


@pytest.mark.processes
def test_a_kept_alive_connection_may_idle_longer_than_the_header_timeout(
    emulator: Emulator, tmp_path: Path
):
    env = {"keepalive_timeout": "30", "header_timeout": "0.5"}
    with _gateway(tmp_path, emulator, **env) as gateway, _connect(gateway) as sock:
        _healthy(sock)
        time.sleep(1.5)  # idle between requests is the keep-alive timeout's to judge
        _healthy(sock)


def _post_head(key: str, length: int) -> bytes:
    return (
        f"POST /v1/generate HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


@pytest.mark.processes
def test_a_stalled_body_gets_408_and_a_slow_one_is_served(emulator: Emulator, tmp_path: Path):
    emulator.config.tokens = 3
    with _gateway(tmp_path, emulator, body_timeout="0.5") as gateway:
        key = str(create_key(gateway.extra_env, "k")["key"])
        body = json.dumps({"model": MODEL, "prompt": "x", "stream": False}).encode()
        with _connect(gateway) as sock:
            sock.sendall(_post_head(key, len(body)))
            for i in range(0, len(body), 10):  # slower overall than the timeout, never idle as long
                sock.sendall(body[i : i + 10])
                time.sleep(0.1)
            assert read_response(sock)[0] == 200
        with _connect(gateway) as sock:
            sock.sendall(_post_head(key, len(body)) + body[:10])
            answer = read_until_closed(sock, within=5)
            assert answer.startswith(b"HTTP/1.1 408 ")
            assert b"connection: close" in answer.lower()
        assert _refused(gateway, "body_timeout") == 1


@pytest.mark.processes
def test_a_stream_may_last_longer_than_the_header_and_body_timeouts(
    emulator: Emulator, tmp_path: Path
):
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 40  # about 2 s, four times each timeout
    env = {"header_timeout": "0.5", "body_timeout": "0.5", "keepalive_timeout": "0.5"}
    with _gateway(tmp_path, emulator, **env) as gateway:
        key = str(create_key(gateway.extra_env, "k")["key"])
        started = time.monotonic()
        lines: list[dict[str, Any]] = []
        assert stream_generation(gateway.url, key, lines) == 200
        assert time.monotonic() - started > 1.0
        assert lines[-1]["done"] is True
        assert "error" not in lines[-1]


@pytest.mark.processes
def test_a_slow_head_on_a_kept_alive_connection_is_cut_too(emulator: Emulator, tmp_path: Path):
    env = {"keepalive_timeout": "30", "header_timeout": "0.5"}
    with _gateway(tmp_path, emulator, **env) as gateway, _connect(gateway) as sock:
        _healthy(sock)
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next head begins, and never ends
        answer = read_until_closed(sock, within=5)
        assert answer.startswith(b"HTTP/1.1 408 ")


def test_the_connection_cap_is_fitted_to_the_open_files_limit():
    settings = Settings(max_client_connections=1000, max_connections=256)
    assert door_limits(settings, open_files=1024).max_connections == 1024 - 256 - RESERVED_FDS
    assert door_limits(settings, open_files=1_048_576).max_connections == 1000
    unset = Settings(max_client_connections=0, max_connections=256)
    assert door_limits(unset, open_files=4096).max_connections == 4096 - 256 - RESERVED_FDS


def test_an_address_share_is_a_quarter_of_the_cap_unless_set():
    settings = Settings(max_client_connections=1000, max_connections=256)
    assert door_limits(settings, open_files=1_048_576).max_connections_per_address == 250
    # Fitted to the open-files limit first: a quarter of the cap in force.
    assert door_limits(settings, open_files=1024).max_connections_per_address == (
        (1024 - 256 - RESERVED_FDS) // 4
    )
    for value in (0, 7):
        chosen = Settings(max_client_connections_per_address=value)
        assert door_limits(chosen, open_files=1_048_576).max_connections_per_address == value
    trusted = Settings(trusted_proxies=["10.0.0.0/8", "::1"])
    assert [str(n) for n in door_limits(trusted, open_files=4096).trusted_proxies] == [
        "10.0.0.0/8",
        "::1/128",
    ]


@pytest.mark.processes
def test_door_refusals_answer_in_the_dialect_of_the_path(emulator: Emulator, tmp_path: Path):
    """431 and both 408s name the path in the request line: the OpenAI API gets OpenAI's error
    object (its SDKs read `error.message`), `/v1/messages` Anthropic's, Ollama's paths
    `{"error": "..."}`."""

    def error(answer: bytes) -> object:
        return json.loads(answer.partition(b"\r\n\r\n")[2])["error"]

    big = b"X-Big: " + b"a" * 20000 + b"\r\n\r\n"
    with _gateway(
        tmp_path, emulator, max_header_bytes="8192", header_timeout="0.5", body_timeout="0.5"
    ) as gateway:
        key = str(create_key(gateway.extra_env, "k")["key"]).encode()
        for path, shape in [
            (b"/v1/chat/completions", "openai"),
            (b"/v1/chat/completions?x=1", "openai"),
            (b"/v1/messages?beta=true", "anthropic"),
            (b"/api/chat", "ollama"),
            (b"/v1/chat", "ollama"),
        ]:
            with _connect(gateway) as sock:  # too large
                sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: g\r\n" + big)
                body = error(read_until_closed(sock, within=5))
            with _connect(gateway) as sock:  # a head that stops before its end
                sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: g\r\nX-Slow: a")
                head_late = error(read_until_closed(sock, within=10))
            with _connect(gateway) as sock:  # a body that stops
                sock.sendall(
                    b"POST "
                    + path
                    + b" HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer "
                    + key
                    + b"\r\nContent-Length: 50\r\n\r\n{"
                )
                body_late = error(read_until_closed(sock, within=10))
            for value, status, words in [
                (body, 431, "too large"),
                (head_late, 408, "request head"),
                (body_late, 408, "body stopped"),
            ]:
                if shape == "openai":
                    assert isinstance(value, dict), (path, status, value)
                    assert words in value["message"]
                    assert value["type"] == "invalid_request_error"
                elif shape == "anthropic":  # {"type": "error", "error": {"type", "message"}}
                    assert isinstance(value, dict), (path, status, value)
                    assert words in value["message"]
                    kind = "request_too_large" if status == 431 else "invalid_request_error"
                    assert value["type"] == kind
                else:
                    assert isinstance(value, str), (path, status, value)
                    assert words in value


class _Peer:
    """A transport that only names its peer (`get_extra_info("peername")`)."""

    def __init__(self, peer: object) -> None:
        self.peer = peer

    def get_extra_info(self, name: str) -> object:
        return self.peer if name == "peername" else None


def test_an_address_share_groups_ipv6_by_64_and_passes_over_proxies_and_unix_sockets():
    from gateway.serve.tallies import shared_address as _shared_address

    trusted = tuple(
        Settings(trusted_proxies=["10.0.0.0/8", "2001:db8:ffff::/48"]).trusted_proxy_networks
    )

    def share(peer: object) -> str | None:
        return _shared_address(_Peer(peer), trusted)  # type: ignore[arg-type]

    assert share(("192.0.2.7", 5000)) == "192.0.2.7"
    assert share(("2001:db8:1:2::1", 5000, 0, 0)) == share(("2001:db8:1:2:ffff::9", 1, 0, 0))
    assert share(("2001:db8:1:2::1", 5000, 0, 0)) == "2001:db8:1:2::/64"
    assert share(("2001:db8:1:3::1", 5000, 0, 0)) == "2001:db8:1:3::/64"
    assert share(("::ffff:192.0.2.7", 5000, 0, 0)) == "192.0.2.7"  # a dual-stack socket
    assert share(("10.1.2.3", 5000)) is None  # a trusted proxy
    assert share(("::ffff:10.1.2.3", 5000, 0, 0)) is None
    assert share(("2001:db8:ffff:1::1", 5000, 0, 0)) is None
    assert share("") is None  # a Unix socket's peer

"""Request bodies held at once are bounded per process and per key (issue 29, body budget).

Over real sockets: raw connections send a large part of a body and hold back the rest, as a
slow or malicious client would. Past its share a key is refused (429, in its client's error
format, with `Retry-After`) while another key's requests are served; past the process budget any
key is refused (503); the bytes held (`gateway_buffered_body_bytes`) return to zero once the
held connections close; and `gateway serve` with the default settings does not grow by the
bodies one key holds (measured: ~64 MiB for four held where the code before the budget grew
~360 MiB for 24). Before the budget every held body was kept in memory without bound.
"""

from __future__ import annotations

import asyncio
import json
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import httpx
import pytest

from gateway.testing.stack import create_key, gateway_process
from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.sockets import read_response
from tests.support.stack import Emulator, Gateway

KIB = 1024
MIB = 1024 * KIB
#: Each held body: announced 900 KiB, of which 800 KiB of prompt are sent.
DECLARED = 900 * KIB
SENT = 800 * KIB
PREFIX = b'{"model":"' + MODEL.encode() + b'","prompt":"'
#: The bytes a held body charges: what was sent of it, never what was declared.
HELD = len(PREFIX) + SENT
DEADLINE = 30.0


def _budget_gateway(make_gateway: Callable[..., Gateway], total: int, per_key: int) -> Gateway:
    return make_gateway(
        max_body_bytes=1 * MIB,
        max_buffered_body_bytes=total,
        max_buffered_body_bytes_per_key=per_key,
    )


def _connect(gw: Gateway) -> socket.socket:
    host, _, port = gw.url.removeprefix("http://").partition(":")
    sock = socket.create_connection((host, int(port)), timeout=DEADLINE)
    return sock


def _hold(gw: Gateway, key: str, path: str = "/api/generate") -> socket.socket:
    """A connection that declared `DECLARED` bytes and sent `SENT` of them; still open."""
    sock = _connect(gw)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {DECLARED}\r\n\r\n"
    ).encode()
    body = b'{"model":"' + MODEL.encode() + b'","prompt":"' + b"a" * SENT
    with suppress(OSError):  # refused at once and closed by the gateway: the answer is readable
        sock.sendall(head + body)
    return sock


def _hold_chunked(gw: Gateway, key: str, path: str) -> socket.socket:
    """A chunked body: its first chunk (`SENT` bytes) sent, the rest held back."""
    sock = _connect(gw)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = b'{"model":"' + MODEL.encode() + b'","prompt":"' + b"a" * SENT
    with suppress(OSError):
        sock.sendall(head + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    return sock


def _answered(socks: list[socket.socket], count: int) -> list[socket.socket]:
    """The first `count` of `socks` the gateway answers (within `DEADLINE`), the rest silent."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        ready: list[socket.socket] = []
        deadline = time.monotonic() + DEADLINE
        while len(ready) < count and (left := deadline - time.monotonic()) > 0:
            for event, _ in selector.select(left):
                selector.unregister(event.fileobj)
                ready.append(event.fileobj)  # type: ignore[arg-type]
    assert len(ready) == count, f"{len(ready)} of {len(socks)} connections answered, not {count}"
    return ready


def _held_bytes(gw: Gateway) -> float:
    return metric_value(gw.metrics_text(), "gateway_buffered_body_bytes")


def _wait_held(gw: Gateway, expected: float) -> None:
    deadline = time.monotonic() + DEADLINE
    while (held := _held_bytes(gw)) != expected:
        assert time.monotonic() < deadline, f"bytes held {held}, expected {expected}"
        time.sleep(0.05)


@contextmanager
def _closing() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _generate(gw: Gateway, key: str, prompt: str = "hi") -> httpx.Response:
    return httpx.post(
        f"{gw.url}/api/generate",
        headers=gw.headers(key),
        json={"model": MODEL, "prompt": prompt, "stream": False},
        timeout=DEADLINE,
    )


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_key_holding_bodies_is_refused_past_its_share_while_others_are_served(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = _budget_gateway(make_gateway, total=16 * MIB, per_key=2 * MIB)
    _, other = gw.create_key("other")
    with ExitStack() as stack:
        socks = stack.enter_context(_closing())
        # Eight connections hold bodies: two fit the key's 2 MiB share, six are refused.
        socks.extend(_hold(gw, gw.key) for _ in range(8))
        for sock in _answered(socks, 6):
            status, headers, body = read_response(sock, DEADLINE)
            assert status == 429, body
            assert int(headers["retry-after"]) > 0
            assert set(json.loads(body)) == {"error"}  # Ollama's format on /api/*
        _wait_held(gw, 2 * HELD)
        # A chunked body on /v1 is charged as its chunks arrive too: refused at its first chunk.
        chunked = _hold_chunked(gw, gw.key, "/v1/chat/completions")
        socks.append(chunked)
        status, headers, body = read_response(chunked, DEADLINE)
        assert status == 429, body
        assert "retry-after" in headers
        error = json.loads(body)["error"]
        assert error["type"]  # the OpenAI error object on /v1/*
        assert error["message"]
        assert _held_bytes(gw) == 2 * HELD  # refusals took nothing
        # Another key: small and large bodies served while the first key holds its share.
        assert _generate(gw, other).status_code == 200
        assert _generate(gw, other, "b" * (700 * KIB)).status_code == 200
        assert _held_bytes(gw) == 2 * HELD  # the served requests gave their bytes back
    # The held connections hung up mid-body: every byte is given back.
    _wait_held(gw, 0)
    assert _generate(gw, gw.key, "c" * (700 * KIB)).status_code == 200
    _wait_held(gw, 0)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_past_the_process_budget_any_key_is_refused_with_503_and_the_budget_returns(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = _budget_gateway(make_gateway, total=2 * MIB, per_key=2 * MIB)
    _, second = gw.create_key("second")
    with ExitStack() as stack:
        socks = stack.enter_context(_closing())
        socks.extend(_hold(gw, gw.key) for _ in range(2))
        _wait_held(gw, 2 * HELD)
        # The second key is within its share but the process is not: 503, retry later.
        refused = _hold(gw, second)
        socks.append(refused)
        status, headers, body = read_response(refused, DEADLINE)
        assert status == 503, body
        assert int(headers["retry-after"]) > 0
        assert set(json.loads(body)) == {"error"}
        chunked = _hold_chunked(gw, second, "/v1/completions")
        socks.append(chunked)
        status, headers, body = read_response(chunked, DEADLINE)
        assert status == 503, body
        assert "retry-after" in headers
        assert json.loads(body)["error"]["message"]
        # A small body still fits what is left.
        assert _generate(gw, second).status_code == 200
    _wait_held(gw, 0)
    assert _generate(gw, second, "d" * (700 * KIB)).status_code == 200
    _wait_held(gw, 0)


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


async def _hold_many(
    url: str, key: str, count: int, size: int, pid: int
) -> tuple[list[tuple[int, bytes]], float]:
    """`count` connections each declare `size` + 100 bytes and send `size`. Returns the answers
    that came (status, body) once every send is done or stuck, and how much the process `pid`
    grew meanwhile (MiB, measured with the connections still open)."""
    host, _, port = url.removeprefix("http://").partition(":")
    before = _rss_mib(pid)
    streams = [await asyncio.open_connection(host, int(port)) for _ in range(count)]
    head = (
        f"POST /api/generate HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {size + 100}\r\n\r\n"
    ).encode()

    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(head + b'{"model":"' + MODEL.encode() + b'","prompt":"' + b"a" * size)
        with suppress(OSError, TimeoutError):  # a refused body is neither read nor wanted
            await asyncio.wait_for(writer.drain(), DEADLINE)

    try:
        await asyncio.gather(*(send(writer) for _, writer in streams))
        answers = []
        for reader, _ in streams:
            with suppress(TimeoutError, asyncio.IncompleteReadError):
                head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1.0)
                length = int(head_bytes.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                answers.append((int(head_bytes.split()[1]), await reader.readexactly(length)))
        return answers, _rss_mib(pid) - before
    finally:
        for _, writer in streams:
            writer.close()
            with suppress(OSError):
                await writer.wait_closed()


@pytest.mark.processes
def test_held_bodies_of_one_key_do_not_grow_the_gateway_process(
    tmp_path: Path, emulator: Emulator
) -> None:
    """The attack review's trigger on `gateway serve` with the default settings: one key's 24
    connections each send 15 MiB of a body. Before the budget the process grew by all of them
    (~360 MiB); now four fit the key's 64 MiB share and the others are refused at once."""
    env = {"GATEWAY_UPSTREAM_URL": emulator.url, "GATEWAY_SHUTDOWN_DRAIN": "0"}
    with gateway_process(tmp_path, env) as gateway:
        assert gateway.process is not None
        key = str(create_key(gateway.extra_env, "k")["key"])
        answers, grown = asyncio.run(
            _hold_many(gateway.url, key, 24, 15 * MIB, gateway.process.pid)
        )
        assert len(answers) == 20, [status for status, _ in answers]
        assert {status for status, _ in answers} == {429}
        # Four bodies of 15 MiB are held; generous room for the rest (buffers, allocator).
        assert grown < 200, f"the gateway grew by {grown:.0f} MiB"


def _announce(gw: Gateway, key: str, sent: bytes) -> socket.socket:
    """A connection that declared `DECLARED` bytes and sent only `sent` of them; still open."""
    sock = _connect(gw)
    head = (
        f"POST /api/generate HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {DECLARED}\r\n\r\n"
    ).encode()
    sock.sendall(head + sent)
    return sock


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_a_declared_body_charges_only_what_arrives(
    make_gateway: Callable[..., Gateway],
) -> None:
    """Declaring large bodies and sending a few bytes of each does not fill the budget: before,
    the declared `Content-Length` was charged up front, and four keys' 16 connections held the
    whole budget with 100 bytes each, every other key's bodies refused with 503."""
    gw = _budget_gateway(make_gateway, total=2 * MIB, per_key=2 * MIB)
    _, other = gw.create_key("other")
    with ExitStack() as stack:
        socks = stack.enter_context(_closing())
        socks.extend(_announce(gw, gw.key, PREFIX) for _ in range(6))  # 6 x 900 KiB declared
        _wait_held(gw, 6 * len(PREFIX))
        assert _generate(gw, other, "b" * (700 * KIB)).status_code == 200
        assert _generate(gw, gw.key, "c" * (700 * KIB)).status_code == 200


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_trickled_body_is_cut_at_the_minimum_pace(make_gateway: Callable[..., Gateway]) -> None:
    """A body that keeps arriving, but slower than `GATEWAY_BODY_MIN_BYTES_PER_SECOND` after
    the grace (`GATEWAY_BODY_TIMEOUT`), gets 408 and gives its bytes back: before, a byte
    within every body timeout held its charge for as long as the client liked."""
    gw = make_gateway(
        max_body_bytes=1 * MIB,
        body_timeout=2.0,
        body_min_bytes_per_second=64 * KIB,
    )
    sock = _announce(gw, gw.key, PREFIX)
    try:
        _wait_held(gw, len(PREFIX))
        # A byte every half second: within the body timeout, far below the pace.
        status = 0
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"a")
            except OSError:
                break
            sock.settimeout(0.5)
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break
            except TimeoutError:
                continue
        status, _, body = read_response(sock, DEADLINE)
        assert status == 408, body
        assert b"bytes per second" in body
    finally:
        sock.close()
    _wait_held(gw, 0)

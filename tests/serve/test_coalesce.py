"""A response's head goes out with its first body bytes, in one write (gateway.serve.coalesce).

Over a real uvicorn server and socket: the writes the protocol makes are recorded under the
head-holding transport, so what is checked is what reached the kernel, one `write` at a time.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from gateway.serve.coalesce import CoalescingHttpToolsProtocol, HeadHoldingTransport
from gateway.testing.server import LoopbackServer

WRITES: list[tuple[float, bytes]] = []


class RecordingTransport:
    """Records each write reaching the real transport, with its time."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append((time.monotonic(), bytes(data)))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class RecordingProtocol(CoalescingHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(RecordingTransport(transport))  # type: ignore[arg-type]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    pause = float(scope["path"].strip("/") or 0)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    if pause:
        await asyncio.sleep(pause)  # the body is not ready: the head must not wait for it
    await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"second\n", "more_body": False})


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        return answer


@pytest.fixture(scope="module")
def server() -> Any:
    with LoopbackServer(app, http=RecordingProtocol) as running:
        yield running


def test_head_and_first_body_bytes_share_one_write(server: LoopbackServer) -> None:
    WRITES.clear()
    answer = _get(server.port, "/0")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"first\n" in answer
    assert b"second\n" in answer
    first_write = WRITES[0][1]
    assert first_write.startswith(b"HTTP/1.1 200 OK\r\n")
    assert first_write.endswith(b"6\r\nfirst\n\r\n")  # the chunked first body message
    assert b"".join(data for _, data in WRITES) == answer


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_head_whose_body_is_late_is_sent_at_once(server: LoopbackServer) -> None:
    WRITES.clear()
    _get(server.port, "/0.5")
    (head_time, head), (body_time, body) = WRITES[:2]
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert head.endswith(b"\r\n\r\n")
    assert body.startswith(b"6\r\nfirst")
    # Written on its own, long before the body the app produced half a second later.
    assert body_time - head_time > 0.3


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


@pytest.mark.anyio
async def test_close_sends_a_held_head_first() -> None:
    fake = FakeTransport()
    held = HeadHoldingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert fake.writes == []
    held.close()
    assert fake.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    assert fake.closed
    await asyncio.sleep(0)  # the end-of-iteration flush finds nothing left to send
    assert len(fake.writes) == 1
    assert held.get_extra_info("peername") == "info:peername"  # the rest is the transport's


@pytest.mark.anyio
async def test_body_writes_pass_straight_through() -> None:
    fake = FakeTransport()
    held = HeadHoldingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"5\r\nhello\r\n")
    assert fake.writes == [b"5\r\nhello\r\n"]


class Cycle:
    """What `BodyWriter` reads of uvicorn's cycle: a chunked response under way."""

    def __init__(self, transport: object) -> None:
        self.transport = transport
        self.disconnected = False
        self.response_complete = False


@pytest.mark.anyio
async def test_the_push_path_writes_past_the_proxy_once_the_head_went_out() -> None:
    from gateway.serve.writer import BodyWriter

    fake = FakeTransport()
    held = HeadHoldingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert held.bare() is held  # a head is held: writes must go through the proxy
    proxied: list[bytes] = []
    write = held.write

    def counted(data: bytes) -> None:
        proxied.append(data)
        write(data)

    held.write = counted  # type: ignore[method-assign]
    cycle = Cycle(held)
    writer = BodyWriter(cycle)
    writer.write(b"one")
    writer.write(b"two")
    writer.write(b"three")
    # The first piece took the held head along; the others reached the socket's transport.
    assert proxied == [b"3\r\none\r\n"]
    assert held.bare() is fake
    assert fake.writes == [
        b"HTTP/1.1 200 OK\r\n\r\n3\r\none\r\n",
        b"3\r\ntwo\r\n",
        b"5\r\nthree\r\n",
    ]
    fake.closed = True
    writer.write(b"lost")  # a closing transport is not written to, directly either
    cycle.response_complete = True
    fake.closed = False
    writer.write(b"late")  # nor is a completed response's
    assert len(fake.writes) == 3

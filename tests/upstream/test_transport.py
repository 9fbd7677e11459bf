"""AiohttpTransport over real loopback sockets: what it sends, its pool, and its error map.

Each test runs a small asyncio TCP server that answers with exact bytes (or misbehaves), so
the transport's behaviour is checked against the wire, not a mock.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from http.cookiejar import CookieJar, DefaultCookiePolicy

import anyio
import httpx
import pytest

from gateway.upstream.transport import AiohttpTransport

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """Serve `handler` on a loopback port; yields (base URL, one entry per accepted connection)."""
    connections: list[int] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """Read one request: (head, body), the body by its Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


async def read_into(response: httpx.Response, received: list[bytes]) -> None:
    """Append each piece of the body to `received` (kept when the read fails part-way)."""
    async for piece in response.aiter_bytes():
        received.append(piece)


CHUNKED_OK = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
    b"set-cookie: session=tenant-a\r\ntransfer-encoding: chunked\r\n\r\n"
    b'8\r\n{"a":1}\n\r\n8\r\n{"b":2}\n\r\n0\r\n\r\n'
)


def _by_name(url: str) -> str:
    """The URL with `localhost` for the IP: cookie jars refuse cookies from bare IPs."""
    return url.replace("127.0.0.1", "localhost")


def client(url: str, *, max_connections: int = 4, **timeouts: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_connections, keepalive_expiry=30)
    timeout = httpx.Timeout(**({"timeout": 5.0} | timeouts))
    return httpx.AsyncClient(
        base_url=url,
        transport=AiohttpTransport(limits),
        timeout=timeout,
        trust_env=False,
        # as the gateway's client (gateway.upstream.client): httpx keeps no cookie, so any
        # cookie on the wire would come from aiohttp's session
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
    )


async def test_sends_the_request_as_given_and_streams_the_answer():
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(CHUNKED_OK)
        await writer.drain()
        await reader.read()  # keep the connection until the client closes it

    async with serving(handler) as (url, _), client(url) as http:
        request = http.build_request(
            "POST",
            "/api/generate",
            content=b'{"model":"m"}',
            headers={"host": "localhost:11434", "x-request-id": "r1", "user-agent": "gw"},
        )
        response = await http.send(request, stream=True)
        pieces = [piece async for piece in response.aiter_bytes()]
        await response.aclose()
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    assert b"".join(pieces) == b'{"a":1}\n{"b":2}\n'
    head, body = seen[0]
    assert body == b'{"model":"m"}'
    lines = head.lower().split(b"\r\n")
    assert lines[0] == b"post /api/generate http/1.1"
    assert b"host: localhost:11434" in lines
    assert b"x-request-id: r1" in lines
    assert b"user-agent: gw" in lines
    assert b"content-length: 13" in lines
    assert sum(line.startswith(b"content-length") for line in lines) == 1


async def test_a_body_read_to_its_end_keeps_the_connection_and_no_cookie_is_kept():
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head, _ = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            heads.append(head)
            writer.write(CHUNKED_OK)
            await writer.drain()

    async with serving(handler) as (url, connections), client(_by_name(url)) as http:
        for _ in range(3):
            response = await http.post("/api/generate", content=b"{}")
            assert response.content == b'{"a":1}\n{"b":2}\n'
    assert len(heads) == 3
    assert len(connections) == 1  # one connection, reused
    assert not any(b"cookie" in head.lower() for head in heads)


async def test_a_response_closed_early_discards_its_connection():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nx\n\r\n")
        await writer.drain()
        await reader.read()

    async with serving(handler) as (url, connections), client(url) as http:
        for _ in range(2):
            response = await http.send(http.build_request("POST", "/"), stream=True)
            async for _piece in response.aiter_bytes():
                break
            await response.aclose()
        await asyncio.sleep(0.05)
    assert len(connections) == 2


async def test_refused_connection_is_a_connect_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with client(f"http://127.0.0.1:{port}") as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/")


async def test_close_before_the_status_line_is_a_remote_protocol_error():
    async def handler(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with serving(handler) as (url, _), client(url) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")


async def test_garbage_instead_of_http_is_a_remote_protocol_error():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()

    async with serving(handler) as (url, _), client(url) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")


async def test_a_body_cut_off_mid_stream_is_a_read_error():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n8\r\n{"a":1}\n\r\n')
        await writer.drain()

    async with serving(handler) as (url, _), client(url) as http:
        response = await http.send(http.build_request("POST", "/"), stream=True)
        received: list[bytes] = []
        with pytest.raises(httpx.ReadError):
            await read_into(response, received)
        await response.aclose()
    assert b"".join(received) == b'{"a":1}\n'


async def test_a_silent_server_is_a_read_timeout():
    async def handler(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async with serving(handler) as (url, _), client(url, read=0.2) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/")


async def test_no_free_connection_within_the_pool_timeout_is_a_pool_timeout():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with (
        serving(handler) as (url, connections),
        client(url, max_connections=1, pool=0.2) as http,
    ):
        held = await http.send(http.build_request("POST", "/"), stream=True)
        with pytest.raises(httpx.PoolTimeout):
            await http.get("/")
        await held.aclose()  # gives the slot back: the next request gets through
        second = await http.send(http.build_request("POST", "/"), stream=True)
        await second.aclose()
    assert len(connections) == 2


async def test_a_malformed_chunk_fails_the_read_at_once_instead_of_hanging():
    # aiohttp's C parser closes the connection on a bad chunk-size line without failing the
    # body; the transport's close watch must turn that into a ReadError (found by attack).
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n8\r\n{"a":1}\n\r\n')
        await writer.drain()
        await asyncio.sleep(0.1)  # the response is streaming when the bad line comes
        writer.write(b"ZZZ-not-a-size\r\nxx\r\n")
        await writer.drain()
        await asyncio.sleep(30)  # keeps its end open: only the parse error can end the read

    async with serving(handler) as (url, _), client(url, read=30.0) as http:
        response = await http.send(http.build_request("POST", "/"), stream=True)
        received: list[bytes] = []
        with anyio.fail_after(5):  # far below the 30 s read timeout
            with pytest.raises(httpx.ReadError):
                await read_into(response, received)
        await response.aclose()
    assert b"".join(received) == b'{"a":1}\n'


async def test_the_connection_is_reused_after_many_responses_without_a_close_watch_left():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            head, _ = CHUNKED_OK.split(b"0\r\n\r\n")
            writer.write(head)
            await writer.drain()
            await asyncio.sleep(0.005)  # still streaming when the client gets the headers
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    transport = AiohttpTransport(httpx.Limits(max_connections=2, keepalive_expiry=30))
    async with (
        serving(handler) as (url, connections),
        httpx.AsyncClient(base_url=url, transport=transport) as http,
    ):
        for _ in range(20):
            assert (await http.post("/", content=b"{}")).status_code == 200
        protocols = list(transport._watched)  # the watch's own bookkeeping
        assert len(protocols) == 1
        closed = protocols[0].closed
        assert closed is not None
        # only the permanent exception retriever stays; every response's watch is gone
        assert len(closed._callbacks) == 1
    assert len(connections) == 1


class CountingGauge:
    def __init__(self) -> None:
        self.value = 0
        self.peak = 0

    def inc(self) -> None:
        self.value += 1
        self.peak = max(self.peak, self.value)

    def dec(self) -> None:
        self.value -= 1


async def test_the_in_use_gauge_follows_open_responses_and_failures():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await reader.read()

    gauge = CountingGauge()
    transport = AiohttpTransport(httpx.Limits(max_connections=2), gauge)
    async with (
        serving(handler) as (url, _),
        httpx.AsyncClient(base_url=url, transport=transport, timeout=5.0) as http,
    ):
        first = await http.send(http.build_request("POST", "/"), stream=True)
        second = await http.send(http.build_request("POST", "/"), stream=True)
        assert gauge.value == 2
        await first.aclose()
        await first.aclose()  # closing twice gives back one hold only
        assert gauge.value == 1
        await second.aclose()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{probe.getsockname()[1]}"
    async with httpx.AsyncClient(transport=AiohttpTransport(httpx.Limits(), gauge)) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(refused)
    assert gauge.value == 0
    assert gauge.peak == 2

"""The upstream transports over real loopback sockets: what they send, their pool, their error map.

Every test runs on both transports `GATEWAY_UPSTREAM_HTTP_CLIENT` may name besides httpx's own
(`AiohttpTransport`, `HttptoolsTransport`): they keep one contract. Each test runs a small asyncio
TCP server that answers with exact bytes (or misbehaves), so the transport's behaviour is
checked against the wire, not a mock.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path

import anyio
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.upstream.httptools_transport import PAUSE_BYTES, HttptoolsTransport, ResponseBody
from gateway.upstream.transport import AiohttpTransport

pytestmark = pytest.mark.anyio

Transport = type[AiohttpTransport] | type[HttptoolsTransport]


@pytest.fixture(params=[AiohttpTransport, HttptoolsTransport], ids=["aiohttp", "httptools"])
def transport_type(request: pytest.FixtureRequest) -> Transport:
    """Each transport in turn."""
    return request.param


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


def client(
    url: str, transport_type: Transport, *, max_connections: int = 4, **timeouts: float
) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_connections, keepalive_expiry=30)
    timeout = httpx.Timeout(**({"timeout": 5.0} | timeouts))
    return httpx.AsyncClient(
        base_url=url,
        transport=transport_type(limits),
        timeout=timeout,
        trust_env=False,
        # as the gateway's client (gateway.upstream.client): httpx keeps no cookie, so any
        # cookie on the wire would come from the transport (aiohttp's session)
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
    )


async def test_sends_the_request_as_given_and_streams_the_answer(transport_type):
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(CHUNKED_OK)
        await writer.drain()
        await reader.read()  # keep the connection until the client closes it

    async with serving(handler) as (url, _), client(url, transport_type) as http:
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


async def test_a_body_read_to_its_end_keeps_the_connection_and_no_cookie_is_kept(transport_type):
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

    async with (
        serving(handler) as (url, connections),
        client(_by_name(url), transport_type) as http,
    ):
        for _ in range(3):
            response = await http.post("/api/generate", content=b"{}")
            assert response.content == b'{"a":1}\n{"b":2}\n'
    assert len(heads) == 3
    assert len(connections) == 1  # one connection, reused
    assert not any(b"cookie" in head.lower() for head in heads)


async def test_a_response_closed_early_discards_its_connection(transport_type):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nx\n\r\n")
        await writer.drain()
        await reader.read()

    async with serving(handler) as (url, connections), client(url, transport_type) as http:
        for _ in range(2):
            response = await http.send(http.build_request("POST", "/"), stream=True)
            async for _piece in response.aiter_bytes():
                break
            await response.aclose()
        await asyncio.sleep(0.05)
    assert len(connections) == 2


async def test_refused_connection_is_a_connect_error(transport_type):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with client(f"http://127.0.0.1:{port}", transport_type) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/")


async def test_close_before_the_status_line_is_a_remote_protocol_error(transport_type):
    async def handler(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with serving(handler) as (url, _), client(url, transport_type) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")


async def test_garbage_instead_of_http_is_a_remote_protocol_error(transport_type):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()

    async with serving(handler) as (url, _), client(url, transport_type) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")


async def test_a_body_cut_off_mid_stream_is_a_read_error(transport_type):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n8\r\n{"a":1}\n\r\n')
        await writer.drain()

    async with serving(handler) as (url, _), client(url, transport_type) as http:
        response = await http.send(http.build_request("POST", "/"), stream=True)
        received: list[bytes] = []
        with pytest.raises(httpx.ReadError):
            await read_into(response, received)
        await response.aclose()
    assert b"".join(received) == b'{"a":1}\n'


async def test_a_silent_server_is_a_read_timeout(transport_type):
    async def handler(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async with serving(handler) as (url, _), client(url, transport_type, read=0.2) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/")


async def test_no_free_connection_within_the_pool_timeout_is_a_pool_timeout(transport_type):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with (
        serving(handler) as (url, connections),
        client(url, transport_type, max_connections=1, pool=0.2) as http,
    ):
        held = await http.send(http.build_request("POST", "/"), stream=True)
        with pytest.raises(httpx.PoolTimeout):
            await http.get("/")
        await held.aclose()  # gives the slot back: the next request gets through
        second = await http.send(http.build_request("POST", "/"), stream=True)
        await second.aclose()
    assert len(connections) == 2


async def test_a_malformed_chunk_fails_the_read_at_once_instead_of_hanging(transport_type):
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

    async with serving(handler) as (url, _), client(url, transport_type, read=30.0) as http:
        response = await http.send(http.build_request("POST", "/"), stream=True)
        received: list[bytes] = []
        with anyio.fail_after(5):  # far below the 30 s read timeout
            with pytest.raises(httpx.ReadError):
                await read_into(response, received)
        await response.aclose()
    assert b"".join(received) == b'{"a":1}\n'


async def streaming_keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request on the connection, still streaming when the client gets the head."""
    while True:
        try:
            await read_request(reader)
        except asyncio.IncompleteReadError:
            return
        head, _ = CHUNKED_OK.split(b"0\r\n\r\n")
        writer.write(head)
        await writer.drain()
        await asyncio.sleep(0.005)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def test_the_connection_is_reused_after_many_streamed_responses(transport_type):
    transport = transport_type(httpx.Limits(max_connections=2, keepalive_expiry=30))
    async with (
        serving(streaming_keep_alive) as (url, connections),
        httpx.AsyncClient(base_url=url, transport=transport) as http,
    ):
        for _ in range(20):
            assert (await http.post("/", content=b"{}")).status_code == 200
    assert len(connections) == 1


async def test_aiohttp_leaves_no_close_watch_after_many_responses():
    # AiohttpTransport's own bookkeeping: each response watches its connection's close
    transport = AiohttpTransport(httpx.Limits(max_connections=2, keepalive_expiry=30))
    async with (
        serving(streaming_keep_alive) as (url, connections),
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


async def test_the_in_use_gauge_follows_open_responses_and_failures(transport_type):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await reader.read()

    gauge = CountingGauge()
    transport = transport_type(httpx.Limits(max_connections=2), gauge)
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
    async with httpx.AsyncClient(transport=transport_type(httpx.Limits(), gauge)) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(refused)
    assert gauge.value == 0
    assert gauge.peak == 2


def answering(*answers: bytes, then_close: bool = False) -> Handler:
    """A handler that reads one request per answer and sends the answers in turn."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(answer)
            await writer.drain()
        if not then_close:
            await reader.read()

    return handler


async def test_informational_answers_are_skipped(transport_type):
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    )
    async with serving(answering(answer)) as (url, _), client(url, transport_type) as http:
        response = await http.get("/")
    assert response.status_code == 200
    assert "link" not in response.headers
    assert response.content == b"ok"


async def test_a_body_without_a_length_is_read_to_the_close(transport_type):
    answers = (
        b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nhello, ",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nhello, ",
    )
    for answer in answers:

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(answer)  # noqa: B023 - awaited within the iteration
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(b"world")

        async with serving(handler) as (url, connections), client(url, transport_type) as http:
            first = await http.get("/")
            second = await http.get("/")
        assert first.content == second.content == b"hello, world"
        assert len(connections) == 2  # the close ended the first body: no reuse


async def test_head_204_and_304_answers_have_no_body_and_the_next_request_works(transport_type):
    answers = (
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n",  # to HEAD: the length is announced
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    )

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head, _ = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(answers[int(head.split(b" ")[1].strip(b"/"))])
            await writer.drain()

    async with serving(handler) as (url, _), client(url, transport_type) as http:
        with anyio.fail_after(5):  # an announced length that never comes must not be awaited
            assert (await http.head("/0")).content == b""
            assert (await http.get("/1")).status_code == 204
            assert (await http.get("/2")).content == b""
            assert (await http.get("/3")).content == b"ok"


async def test_connection_close_from_the_server_is_honoured(transport_type):
    answer = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
    # the server keeps its end open: only the header says the connection is done
    async with (
        serving(answering(answer)) as (url, connections),
        client(url, transport_type) as http,
    ):
        assert (await http.get("/")).content == b"ok"
        assert (await http.get("/")).content == b"ok"
    assert len(connections) == 2


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-%d: y\r\n" % i for i in range(300)) + b"\r\n",
        b"HTTP/1.1 200 OK\r\nx-long: " + b"y" * 200_000 + b"\r\n\r\n",
    ],
    ids=["many-headers", "long-header"],
)
async def test_an_oversize_answer_head_is_a_remote_protocol_error(transport_type, head):
    async with serving(answering(head)) as (url, _), client(url, transport_type) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/")


def stale_after_first_answer(requests: list[bytes]) -> Handler:
    """Answer the first connection's first request, then close it on its next one, unanswered;
    answer every request on later connections."""
    accepted: list[int] = []
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        first = len(accepted) == 1
        answered = 0
        while True:
            try:
                head, _ = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            requests.append(head)
            if first and answered == 1:
                return  # the request crossed the server's close of an idle connection
            writer.write(ok)
            await writer.drain()
            answered += 1

    return handler


async def test_a_reused_connection_closed_before_answering_is_retried_on_a_new_one(
    transport_type,
):
    requests: list[bytes] = []
    async with (
        serving(stale_after_first_answer(requests)) as (url, connections),
        client(url, transport_type) as http,
    ):
        assert (await http.get("/")).content == b"ok"
        assert (await http.get("/")).content == b"ok"
    assert len(requests) == 3
    assert len(connections) == 2


async def test_httptools_retries_a_post_a_reused_connection_dropped_unanswered():
    # aiohttp retries only idempotent methods; the relay would retry the POST itself
    requests: list[bytes] = []
    async with (
        serving(stale_after_first_answer(requests)) as (url, connections),
        client(url, HttptoolsTransport) as http,
    ):
        assert (await http.post("/", content=b"{}")).content == b"ok"
        assert (await http.post("/", content=b"{}")).content == b"ok"
    assert len(requests) == 3
    assert len(connections) == 2


async def test_httptools_does_not_retry_a_new_connection_closed_unanswered():
    requests: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        requests.append(head)

    async with serving(handler) as (url, _), client(url, HttptoolsTransport) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post("/", content=b"{}")
    assert len(requests) == 1


async def test_httptools_drops_an_idle_connection_the_server_closed():
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        closed.set()

    transport = HttptoolsTransport(httpx.Limits(max_connections=2, keepalive_expiry=30))
    async with (
        serving(handler) as (url, connections),
        httpx.AsyncClient(base_url=url, transport=transport) as http,
    ):
        assert (await http.get("/")).content == b"ok"
        idle = transport._pool._idle  # the pool's own bookkeeping
        assert sum(map(len, idle.values())) == 1
        await closed.wait()
        with anyio.fail_after(5):
            # its close arrives: it leaves the pool (which has no event to wait for)
            while any(idle.values()):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert (await http.get("/")).content == b"ok"
    assert len(connections) == 2


async def test_httptools_pauses_reading_while_the_reader_is_behind():
    size = 64 * 2**20  # more than the loopback socket buffers hold
    written: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        piece = b"x" * 2**20
        for _ in range(size // len(piece)):
            writer.write(piece)
            await writer.drain()
            written.append(len(piece))
        await reader.read()

    transport = HttptoolsTransport(httpx.Limits(max_connections=1))
    async with serving(handler) as (url, _):
        response = await transport.handle_async_request(httpx.Request("GET", url))
        body = response.stream
        assert isinstance(body, ResponseBody)
        with anyio.fail_after(10):
            # the reader reads nothing: the buffer fills, then reading pauses
            while not body._paused:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # time in which an unpaused connection would read on
        assert body._buffered <= 2 * PAUSE_BYTES
        assert sum(written) < size  # the server is held back too
        received = 0
        with anyio.fail_after(30):
            async for piece in body:
                received += len(piece)
        await body.aclose()
        await transport.aclose()
    assert received == size


async def test_httptools_a_diverted_body_goes_from_the_connection_to_the_sink_and_back():
    go = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\none\r\n")
        for piece in (b"two", b"six"):
            await go.wait()
            go.clear()
            writer.write(b"3\r\n%b\r\n" % piece)
        await go.wait()
        writer.write(b"0\r\n\r\n")
        await reader.read()

    class Sink:
        def __init__(self) -> None:
            self.pieces: list[bytes] = []
            self.ended = False

        def body(self, piece: bytes) -> None:
            self.pieces.append(piece)

        def end(self) -> None:
            self.ended = True

        def fail(self, exc: Exception) -> None:
            raise AssertionError(exc)

    transport = HttptoolsTransport(httpx.Limits(max_connections=1))
    async with serving(handler) as (url, _):
        response = await transport.handle_async_request(httpx.Request("GET", url))
        body = response.stream
        assert isinstance(body, ResponseBody)
        buffered = body.body
        calls: list[bytes] = []

        def counted(piece: bytes) -> None:  # the answer's own `body`, from here on
            calls.append(piece)
            buffered(piece)

        body.body = counted  # type: ignore[method-assign]
        await asyncio.sleep(0.05)  # `one` arrived and is buffered
        sink = Sink()
        body.divert(sink)
        assert sink.pieces == [b"one"]
        go.set()
        with anyio.fail_after(5):
            while len(sink.pieces) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert sink.pieces == [b"one", b"two"]
        assert calls == []  # the connection called the sink itself
        body.divert(None)  # detached: the body is buffered for a reader again
        go.set()
        with anyio.fail_after(5):
            assert await body.__anext__() == b"six"
        assert calls == [b"six"]
        assert sink.pieces == [b"one", b"two"]
        go.set()
        with anyio.fail_after(5):
            with pytest.raises(StopAsyncIteration):
                await body.__anext__()
        assert not sink.ended
        await body.aclose()
        await transport.aclose()


async def test_httptools_refuses_a_line_break_in_a_request_header():
    async with serving(answering()) as (url, _), client(url, HttptoolsTransport) as http:
        with pytest.raises(httpx.LocalProtocolError):
            await http.get("/", headers={"x-note": "a\r\nx-injected: 1"})


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for `localhost` signed by its own key: (certificate, key) PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_httptools_speaks_tls_and_checks_the_certificate_against_the_system_trust(
    tmp_path, monkeypatch
):
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await answering(answer)(reader, writer)
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=context)
    url = f"https://localhost:{server.sockets[0].getsockname()[1]}"
    try:
        async with client(url, HttptoolsTransport) as http:  # not trusted: refused
            with pytest.raises(httpx.ConnectError):
                await http.get("/")
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the system trust, as OpenSSL reads it
        async with client(url, HttptoolsTransport) as http:
            assert (await http.get("/")).content == b"ok"
    finally:
        server.close()

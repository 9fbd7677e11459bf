"""`HttptoolsTransport`: httpx's client API over the gateway's own HTTP/1.1 client.

Why: measured side by side, it costs less CPU per relayed request than httpx over aiohttp
(`gateway.upstream.transport`; docs/performance.md, issue 27). httpx stays the gateway's client
API (requests, responses, timeouts, the transports tests inject); the bytes on the wire go
through asyncio Protocols that httptools parses (`gateway.upstream.http1`).

The contract is `AiohttpTransport`'s (tests/upstream/test_transport.py runs on both):

- errors: refused or unresolvable `ConnectError`, a slow connect `ConnectTimeout`, no pool lease
  within the pool timeout `PoolTimeout`, a read longer than the request's `read` timeout
  `ReadTimeout` (waiting for the head too), a close before the status line or a malformed head
  `RemoteProtocolError`, a body cut off or a malformed chunk `ReadError` at once (never a hang);
- the pool: at most `max_connections` responses open at once (the lease is held from the
  request until the response is closed), idle connections expire after `keepalive_expiry`; a
  response read to its end gives its connection back, one closed early closes it; the in-use
  gauge follows the leases; no cookie is ever stored (the transport has no jar);
- the request goes as given: its headers in order and spelling (`Host` from the URL unless
  given, as httpx sets it), `Content-Length` from the body, which is read whole before sending
  (as over aiohttp; `gateway.api.ollama.manage` streams blob uploads with its own client).

A stale keep-alive connection (the server closed it while it was idle) leaves the pool when its
close arrives. When the close crosses the request instead (the server closed a reused
connection before any byte of the answer), the request is sent once more, at once, on a new
connection: the server answered nothing, so nothing of the answer is lost or doubled. The relay
would retry that `RemoteProtocolError` itself (`gateway.relay.retry`), after a backoff and
spending one of its tries; a failure on the new connection goes to it unchanged, so a request
is retried here at most once, and only for this race.

The body: each piece the parser hands over is appended to the response's buffer and wakes the
one waiting reader (one future per wait; no wait when data is buffered); a read takes every
piece arrived since the last one, joined. Over `PAUSE_BYTES` unread, the connection stops
reading the socket until the reader catches up (backpressure to the upstream). The relay's push
path (`gateway.relay.push`) may instead divert the body (`ResponseBody.divert`): what is buffered,
then every later piece, its end or its failure go to the push path's sink from the connection's
callbacks, and the push path pauses and resumes the reading itself.

Over ~300 lines for one reason: `ResponseBody` is one answer's state (head, pieces, end, failure,
the pause) that its connection feeds and that two readers take from (httpx's reads and the push
path's sink); split, each would reach into the other's state.
"""

from __future__ import annotations

import asyncio
import re
from typing import Protocol

import httpx

from gateway.upstream.http1 import Connection, ConnectionPool, Gauge

#: Unread body bytes above which the connection stops reading its socket.
PAUSE_BYTES = 256 * 1024

#: Methods that send `Content-Length: 0` when they have no body (as httpx's own transport).
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

#: Bytes that would end a header line early: request smuggling if sent.
_LINE_BREAK = re.compile(rb"[\r\n\x00]")

_DEFAULT_PORTS = {"http": 80, "https": 443}


class HttptoolsTransport(httpx.AsyncBaseTransport):
    """An httpx transport (HTTP/1.1, no proxy) on a `gateway.upstream.http1.ConnectionPool`.

    Args:
        limits: `max_connections` bounds the responses open at once (None: unbounded);
            `max_keepalive_connections` the idle connections; `keepalive_expiry` is the idle
            connection lifetime in seconds.
        in_use: A gauge (prometheus-client child, or anything with `inc`/`dec`) kept equal to
            the responses open now, each holding a pool lease.
    """

    def __init__(self, limits: httpx.Limits, in_use: Gauge | None = None) -> None:
        self._pool = ConnectionPool(limits, in_use)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` and return its response with the body not read yet.

        Raises:
            httpx.UnsupportedProtocol: the URL is neither http nor https.
            httpx.LocalProtocolError: a header holds a line break.
            httpx.PoolTimeout, httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout,
            httpx.RemoteProtocolError: see the module docstring.
        """
        url = request.url
        port = url.port or _DEFAULT_PORTS.get(url.scheme)
        if port is None:
            raise httpx.UnsupportedProtocol(f"not an http or https URL: {url.scheme!r}")
        origin = (url.scheme, url.host, port)
        data = _encode(request, await request.aread())
        timeout = request.extensions.get("timeout", {})
        await self._pool.lease(timeout.get("pool"))
        body: ResponseBody | None = None
        try:
            connection = await self._pool.connection(origin, timeout.get("connect"))
            body = ResponseBody(self._pool, timeout.get("read"))
            try:
                await body.start(connection, data, head_only=request.method == "HEAD")
            except httpx.RemoteProtocolError:
                if not connection.reused or connection.received:
                    raise
                # A reused connection the server closed before answering: once, anew.
                connection = await self._pool.connection(origin, timeout.get("connect"), fresh=True)
                body = ResponseBody(self._pool, timeout.get("read"))
                await body.start(connection, data, head_only=request.method == "HEAD")
        except BaseException:
            if body is not None:
                body.close()  # closes the connection if the answer was under way; ends the lease
            else:
                self._pool.end_lease()
            raise
        return httpx.Response(
            status_code=body.status,
            headers=body.headers,
            stream=body,
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": body.reason},
        )

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self._pool.aclose()


class BodySink(Protocol):
    """Where a diverted body goes (`gateway.relay.push.BodySink`, the relay's push path)."""

    def body(self, piece: bytes) -> None:
        """A piece of the body."""
        ...

    def end(self) -> None:
        """The body ended."""
        ...

    def fail(self, exc: Exception) -> None:
        """The body failed (an `httpx.TransportError`)."""
        ...


class ResponseBody(httpx.AsyncByteStream):
    """One answer: the `gateway.upstream.http1.Answer` its connection feeds, read as httpx's stream.

    Closing it gives the pool lease back, and closes the connection if the answer had not ended.
    """

    def __init__(self, pool: ConnectionPool, read_timeout: float | None) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self._pool = pool
        self._read_timeout = read_timeout
        self._loop = asyncio.get_running_loop()
        self._connection: Connection | None = None  # while the answer is under way
        self._pieces: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._ended = False
        self._error: httpx.TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._sink: BodySink | None = None  # the relay's push path, once diverted

    async def start(self, connection: Connection, request: bytes, *, head_only: bool) -> None:
        """Send `request` on `connection` and wait for the answer's head.

        Raises:
            httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError: as it failed.
        """
        self._connection = connection
        connection.send(request, self, head_only=head_only)
        while not self.status:
            if self._error is not None:
                raise self._error
            await self._wait()

    # gateway.upstream.http1.Answer

    def head(self, status: int, headers: list[tuple[bytes, bytes]], reason: bytes) -> None:  # noqa: D102
        self.status, self.headers, self.reason = status, headers, reason
        self._wake()

    def body(self, piece: bytes) -> None:  # noqa: D102
        sink = self._sink
        if sink is not None:
            sink.body(piece)
            return
        self._pieces.append(piece)
        self._buffered += len(piece)
        if self._buffered > PAUSE_BYTES and not self._paused and self._connection is not None:
            self._paused = True
            self._connection.pause_reading()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def end(self) -> None:  # noqa: D102
        self._ended = True
        self._connection = None  # back in the pool, or closed: no longer this answer's
        self._wake()
        if self._sink is not None:
            self._sink.end()

    def fail(self, exc: httpx.TransportError) -> None:  # noqa: D102
        self._error = exc
        self._connection = None
        self._wake()
        if self._sink is not None:
            self._sink.fail(exc)

    # gateway.relay.push.Divertible: the relay's push path

    def divert(self, sink: BodySink | None) -> None:
        """Give what is buffered, then every later piece and the end, to `sink`; None detaches.

        Once diverted, nothing is buffered and reading is paused only by `pause_reading`.
        """
        self._sink = sink
        if self._connection is not None:  # later pieces straight from the connection
            self._connection.send_body_to(sink.body if sink is not None else None)
        if sink is None:
            return
        pieces, self._pieces, self._buffered = self._pieces, [], 0
        if self._paused:
            self._paused = False
            self.resume_reading()
        for piece in pieces:
            if self._sink is not sink:  # the sink detached itself (the answer ended)
                return
            sink.body(piece)
        if self._sink is not sink:
            return
        if self._error is not None:
            sink.fail(self._error)
        elif self._ended:
            sink.end()

    def pause_reading(self) -> None:
        """Stop reading the upstream's socket (the push path's backpressure)."""
        if self._connection is not None:
            self._connection.pause_reading()

    def resume_reading(self) -> None:
        """Read the upstream's socket again."""
        if self._connection is not None:
            self._connection.resume_reading()

    # httpx.AsyncByteStream

    def __aiter__(self) -> ResponseBody:
        return self

    async def __anext__(self) -> bytes:
        """Every piece arrived since the last read, joined; waits when none has.

        Raises:
            StopAsyncIteration: the body ended (or the stream was closed).
            httpx.ReadTimeout: nothing arrived within the request's read timeout.
            httpx.ReadError: the connection closed or broke before the body ended.
        """
        while True:
            pieces = self._pieces
            if pieces:
                self._pieces = []
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    if self._connection is not None:
                        self._connection.resume_reading()
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
            if self._error is not None:
                raise self._error
            if self._ended or self._closed:
                raise StopAsyncIteration
            await self._wait()

    async def aclose(self) -> None:
        """Close the stream (see the class docstring)."""
        self.close()

    def close(self) -> None:
        """`aclose`, for callers outside a coroutine; once, later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        connection, self._connection = self._connection, None
        if connection is not None:  # closed early: the rest of its answer cannot be reused
            connection.abandon()
        self._pool.end_lease()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        if self._read_timeout is None:
            await waiter
            return
        timer = self._loop.call_later(self._read_timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("upstream sent nothing within the read timeout"))


def _encode(request: httpx.Request, body: bytes) -> bytes:
    """The request as it goes on the wire: request line, headers as given, the body's length.

    Raises:
        httpx.LocalProtocolError: the method or a header holds CR, LF or NUL.
    """
    method = request.method.encode("ascii")
    lines = [b"%s %s HTTP/1.1\r\n" % (method, request.url.raw_path)]
    fields = [method]
    for name, value in request.headers.raw:
        lower = name.lower()
        if lower == b"content-length" or lower == b"transfer-encoding":
            continue  # the body is sent whole, with its own length
        lines.append(b"%s: %s\r\n" % (name, value))
        fields += (name, value)
    if _LINE_BREAK.search(b"".join(fields)):
        raise httpx.LocalProtocolError("a request header holds a line break", request=request)
    if body or request.method in _BODY_METHODS:
        lines.append(b"Content-Length: %d\r\n" % len(body))
    lines += (b"\r\n", body)
    return b"".join(lines)

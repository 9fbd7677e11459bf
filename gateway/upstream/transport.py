"""`AiohttpTransport`: httpx's client API over aiohttp's connection pool and C HTTP parser.

Why: on the relay's hot path the upstream client reads one small chunk per token. Measured side
by side as the load generator's client, against the same emulator at 16 streams
(docs/performance.md, "What changed since the first run", item 3), httpx's own transport
(httpcore + h11) cost 222 µs of CPU per chunk, httpx over aiohttp 104 µs, aiohttp alone 81 µs
and a raw asyncio protocol 43 µs. httpx stays the gateway's client API (requests, responses,
timeouts, the transports tests inject); only the bytes on the wire go through aiohttp.
It is no longer the default (`GATEWAY_UPSTREAM_HTTP_CLIENT=aiohttp` selects it): the gateway's
own client, `gateway.upstream.httptools_transport`, keeps this contract for about 15 % less
CPU per relayed request (docs/performance.md, issue 27).

Not the `httpx-aiohttp` package: its exception map turns a refused connection and a dropped
one into `httpx.ConnectTimeout`, which would break the relay's retry and error rules
(`gateway.relay.exchange`). This transport maps aiohttp's errors onto the httpx exceptions the
relay classifies:

| aiohttp                                        | httpx                    |
|------------------------------------------------|--------------------------|
| `ClientConnectorError` (refused, DNS, TLS)     | `ConnectError`           |
| `ConnectionTimeoutError`                       | `ConnectTimeout`         |
| no pool slot within the pool timeout           | `PoolTimeout`            |
| `SocketTimeoutError` (a read took too long)    | `ReadTimeout`            |
| `ServerDisconnectedError`, malformed answer    | `RemoteProtocolError`    |
| `ClientPayloadError`, `ClientOSError`, other   | `ReadError`              |

A malformed body (a bad chunk-size line) makes aiohttp's C parser close the connection without
failing the body stream, so a read would wait forever (its `sock_read` timer is dropped too).
Each response therefore watches its connection: when the connection closes before the body
ended, the reader gets what was received, then `ReadError`.

The pool: at most `max_connections` responses open at once (an `anyio.Semaphore`, held from the
request until the response is closed; waiting longer than the pool timeout raises
`PoolTimeout`), and idle keep-alive connections expire after `keepalive_expiry` seconds. A
response read to its end returns its connection to the pool; one closed early discards it.
Cookies are never stored (`DummyCookieJar`), as with the httpx client (`gateway.upstream.client`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Protocol

import aiohttp
import anyio
import httpx
from aiohttp.client_proto import ResponseHandler

from gateway.upstream.http1 import acquire_within

#: Request headers aiohttp must not add on its own; httpx already set what is wanted.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport (plain HTTP/1.1, no proxy) on one `aiohttp.ClientSession`.

    Args:
        limits: `max_connections` bounds the responses open at once (None: unbounded);
            `keepalive_expiry` is the idle connection lifetime in seconds.
        in_use: A gauge (prometheus-client child, or anything with `inc`/`dec`) kept equal to
            the responses open now, each holding a pooled connection.

    The session is made on the first request, inside the running event loop, and closed by
    `aclose()`.
    """

    def __init__(self, limits: httpx.Limits, in_use: _Gauge | None = None) -> None:
        self._limits = limits
        self._in_use = in_use or _NoGauge()
        self._session: aiohttp.ClientSession | None = None
        self._slots = anyio.Semaphore(limits.max_connections) if limits.max_connections else None
        # Connections whose `closed` future already has `_retrieve` (see `_closed_future`).
        self._watched: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    def _open_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=0,  # the semaphore bounds the connections
            keepalive_timeout=self._limits.keepalive_expiry or 0,
        )
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            trust_env=False,
            skip_auto_headers=_SKIP_AUTO_HEADERS,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` and return its response with the body not read yet.

        Raises:
            httpx.PoolTimeout, httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout,
            httpx.RemoteProtocolError, httpx.ReadError: see the module docstring.
        """
        if self._session is None:
            self._session = self._open_session()
        timeout = request.extensions.get("timeout", {})
        slot = await self._take_slot(timeout.get("pool"))
        try:
            with _mapped_errors():
                answer = await self._session.request(
                    request.method,
                    str(request.url),
                    headers=[
                        (name, value)
                        for name, value in request.headers.multi_items()
                        if name != "content-length"  # aiohttp sets it from the body
                    ],
                    data=await request.aread() or None,
                    allow_redirects=False,
                    compress=False,
                    timeout=aiohttp.ClientTimeout(
                        total=None,
                        sock_connect=timeout.get("connect"),
                        sock_read=timeout.get("read"),
                    ),
                )
        except BaseException:
            slot.release()
            raise
        return httpx.Response(
            status_code=answer.status,
            headers=answer.raw_headers,
            stream=_ResponseStream(answer, slot, self._closed_future(answer)),
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    def _closed_future(self, answer: aiohttp.ClientResponse) -> asyncio.Future[None] | None:
        """The future that ends when `answer`'s connection closes; None if it is gone already."""
        connection = answer.connection
        protocol = connection.protocol if connection is not None else None
        closed = protocol.closed if protocol is not None else None
        if protocol is not None and closed is not None and protocol not in self._watched:
            # `closed` may end with an exception long after every response is gone (a reset
            # idle connection); retrieve it so asyncio does not log it as never retrieved.
            closed.add_done_callback(_retrieve)
            self._watched.add(protocol)
        return closed

    async def _take_slot(self, pool_timeout: float | None) -> _Slot:
        if self._slots is not None:
            await acquire_within(self._slots, pool_timeout)
        self._in_use.inc()
        return _Slot(self._slots, self._in_use)

    async def aclose(self) -> None:
        """Close every pooled connection."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class _ResponseStream(httpx.AsyncByteStream):
    """The response body as aiohttp delivers it; closing it gives back the pool slot.

    It watches the connection (`closed`, None when the connection is gone already): if the
    connection closes before the body ended, what was received is still read, then `ReadError`.
    """

    def __init__(
        self,
        answer: aiohttp.ClientResponse,
        slot: _Slot,
        closed: asyncio.Future[None] | None,
    ) -> None:
        self._answer = answer
        self._slot = slot
        self._closed = closed
        self._broken = False
        self._done = False
        if closed is None:
            self._connection_closed(None)
        else:
            closed.add_done_callback(self._connection_closed)

    def _connection_closed(self, _: asyncio.Future[None] | None) -> None:
        body = self._answer.content
        if not body.is_eof() and body.exception() is None:
            self._broken = True
            body.feed_eof()  # wakes the reader; __aiter__ then raises

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped_errors():
            async for piece in self._answer.content.iter_any():
                yield piece
        if self._broken:
            raise httpx.ReadError("upstream closed the connection before the body ended")

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        if self._closed is not None:  # a kept-alive connection goes on to other responses
            self._closed.remove_done_callback(self._connection_closed)
        # release() keeps the connection when the body was read to its end, else closes it.
        self._answer.release()
        self._slot.release()


class _Gauge(Protocol):
    def inc(self) -> None: ...
    def dec(self) -> None: ...


class _NoGauge:
    def inc(self) -> None:
        """Count nothing."""

    def dec(self) -> None:
        """Count nothing."""


class _Slot:
    """One response's hold on the pool: the semaphore (if bounded) and the in-use gauge."""

    def __init__(self, semaphore: anyio.Semaphore | None, in_use: _Gauge) -> None:
        self._semaphore = semaphore
        self._in_use = in_use

    def release(self) -> None:
        """Give the hold back (once per slot)."""
        if self._semaphore is not None:
            self._semaphore.release()
        self._in_use.dec()


def _retrieve(closed: asyncio.Future[None]) -> None:
    """Mark a connection's close exception as seen (it is expected, not a bug)."""
    if not closed.cancelled():
        closed.exception()


@contextmanager
def _mapped_errors() -> Iterator[None]:
    """Re-raise aiohttp's exceptions as the httpx ones in the module docstring's table."""
    try:
        yield
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc) or "connection failed") from exc
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc) or "connect timed out") from exc
    except aiohttp.SocketTimeoutError as exc:
        raise httpx.ReadTimeout(str(exc) or "read timed out") from exc
    except (
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientResponseError,
        aiohttp.http_exceptions.HttpProcessingError,  # a malformed answer, raised unwrapped
    ) as exc:
        raise httpx.RemoteProtocolError(str(exc) or "server disconnected") from exc
    except aiohttp.ClientError as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

"""`AiohttpTransport`: httpx's client API over aiohttp's connection pool and C HTTP parser.

Why: on the relay's hot path the upstream client reads one small chunk per token. Measured side
by side as the load generator's client, against the same emulator at 16 streams
(docs/performance.md, "The upstream HTTP client"), httpx's own transport (httpcore + h11) cost
222 µs of CPU per chunk, httpx over aiohttp 104 µs, aiohttp alone 81 µs and a raw asyncio
protocol 43 µs. httpx stays the gateway's client API (requests, responses, timeouts, the
transports tests inject); only the bytes on the wire go through aiohttp.

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
| `ServerDisconnectedError`, bad status line     | `RemoteProtocolError`    |
| `ClientPayloadError`, `ClientOSError`, other   | `ReadError`              |

The pool: at most `max_connections` responses open at once (an `anyio.Semaphore`, held from the
request until the response is closed; waiting longer than the pool timeout raises
`PoolTimeout`), and idle keep-alive connections expire after `keepalive_expiry` seconds. A
response read to its end returns its connection to the pool; one closed early discards it.
Cookies are never stored (`DummyCookieJar`), as with the httpx client (`gateway.upstream.client`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import aiohttp
import anyio
import httpx

#: Request headers aiohttp must not add on its own; httpx already set what is wanted.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport (plain HTTP/1.1, no proxy) on one `aiohttp.ClientSession`.

    Args:
        limits: `max_connections` bounds the responses open at once (None: unbounded);
            `keepalive_expiry` is the idle connection lifetime in seconds.

    The session is made on the first request, inside the running event loop, and closed by
    `aclose()`.
    """

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = limits
        self._session: aiohttp.ClientSession | None = None
        self._slots = anyio.Semaphore(limits.max_connections) if limits.max_connections else None

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
            if slot is not None:
                slot.release()
            raise
        return httpx.Response(
            status_code=answer.status,
            headers=answer.raw_headers,
            stream=_ResponseStream(answer, slot),
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def _take_slot(self, pool_timeout: float | None) -> anyio.Semaphore | None:
        if self._slots is None:
            return None
        try:
            with anyio.fail_after(pool_timeout):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("no free upstream connection within the pool timeout") from exc
        return self._slots

    async def aclose(self) -> None:
        """Close every pooled connection."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class _ResponseStream(httpx.AsyncByteStream):
    """The response body as aiohttp delivers it; closing it gives back the pool slot."""

    def __init__(self, answer: aiohttp.ClientResponse, slot: anyio.Semaphore | None) -> None:
        self._answer = answer
        self._slot = slot

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped_errors():
            async for piece in self._answer.content.iter_any():
                yield piece

    async def aclose(self) -> None:
        slot, self._slot = self._slot, None
        if slot is None:
            return
        # release() keeps the connection when the body was read to its end, else closes it.
        self._answer.release()
        slot.release()


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
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientResponseError) as exc:
        raise httpx.RemoteProtocolError(str(exc) or "server disconnected") from exc
    except aiohttp.ClientError as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

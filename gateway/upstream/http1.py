"""HTTP/1.1 connections to upstreams and their pool: asyncio Protocols, answers parsed by httptools.

Why: per relayed chunk, aiohttp's client runs its StreamReader, `iter_any` and the gateway's
stream wrapper; a bare asyncio Protocol parsed by httptools (llhttp, the parser uvicorn serves
with) costs about a quarter less of the floor relay's CPU (docs/performance.md, "Can a Python
data plane reach 2x nginx? (issue 27)", row b). The httpx transport on top is
`gateway.upstream.httptools_transport`.

A `Connection` carries one request at a time (no pipelining). The request is written whole; the
parser's callbacks, run inside `data_received` with no coroutine per piece, hand the answer to
an `Answer`: `head` once the status line and headers arrived, `body` for each de-chunked piece,
then `end` or `fail`. The httpx transport's answer buffers the pieces for one reader; a relay may
one day be an `Answer` itself and write each piece on at once (as `benchmarks/relays.py`'s
`protocols` variant does).

The answer's framing is llhttp's: `Content-Length`, `Transfer-Encoding: chunked`, or until the
connection closes (HTTP/1.0, or no length). 1xx answers are skipped; 204 and 304 have no body.
An answer to HEAD ends with its head, and its connection is closed: llhttp cannot be told that a
HEAD's announced length will not come. A head longer than `MAX_HEAD_BYTES` or with more than
`MAX_HEADERS` fields is refused (llhttp itself bounds neither). A connection is kept alive when
the answer was read to its end and the server allows it (HTTP/1.1 without `Connection: close`).

Failures are httpx's exceptions, as the relay classifies them (`gateway.upstream.errors`):
refused, unresolvable or TLS-failed connects are `ConnectError`, a connect slower than its
timeout `ConnectTimeout`, no free lease within the pool timeout `PoolTimeout`; a close before the
head or a malformed head is `RemoteProtocolError`; a close before the body ended (what a
malformed chunk does too) is `ReadError`.

`ConnectionPool`: at most `max_connections` leases at once (held by a request from send until
its response is closed), idle connections per origin (most recent first) that expire after
`keepalive_expiry` seconds, and a closed idle connection leaves the pool when it closes
(`connection_lost`), so it is not handed out again.

Over ~300 lines for one reason: a connection and its pool hand each other the connection's life
(the pool makes it, takes it back when an answer ends, forgets it when it closes, which only the
connection's callbacks know); split, each half would hold the other's invariants.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Protocol

import anyio
import anyio.to_thread
import httptools
import httpx

#: Most bytes of one answer's head (status line, headers, and 1xx heads before it).
MAX_HEAD_BYTES = 64 * 1024

#: Most header fields of one answer's head.
MAX_HEADERS = 128

Origin = tuple[str, str, int]
"""(scheme, host, port) of an upstream."""


class Answer(Protocol):
    """Where a `Connection` hands one answer, from its parser's callbacks (no coroutine)."""

    def head(self, status: int, headers: list[tuple[bytes, bytes]], reason: bytes) -> None:
        """The status line and the header fields (raw names and values) arrived."""

    def body(self, piece: bytes) -> None:
        """A piece of the de-chunked body arrived."""

    def end(self) -> None:
        """The answer is complete; the connection is back in the pool, or closed."""

    def fail(self, exc: httpx.TransportError) -> None:
        """The connection failed or closed before the answer ended."""


class Gauge(Protocol):
    """A gauge (prometheus-client child, or anything with `inc`/`dec`)."""

    def inc(self) -> None:
        """Add one."""

    def dec(self) -> None:
        """Take one away."""


class NoGauge:
    """A gauge that counts nothing."""

    def inc(self) -> None:
        """Count nothing."""

    def dec(self) -> None:
        """Count nothing."""


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to an upstream; its answers parsed by httptools.

    Attributes:
        origin: Where it is connected.
        reused: It carried an answer before the present one.
        received: A byte of the present answer arrived.
        idle_since: `time.monotonic()` when it last went back to the pool.
    """

    def __init__(self, pool: ConnectionPool, origin: Origin) -> None:
        self.origin = origin
        self.reused = False
        self.received = False
        self.idle_since = 0.0
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._answer: Answer | None = None
        self._body_to: Callable[[bytes], None] = _nowhere  # the answer's `body`, or its sink's
        self._head_only = False
        self._headed = False  # the present answer's head arrived
        self._informational = False  # the message being parsed is a 1xx
        self._keep_alive = False
        self._paused = False  # reading the socket is paused
        self._head_bytes = 0
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []

    @property
    def usable(self) -> bool:
        """Whether it is open (not closed or closing)."""
        return self._transport is not None and not self._transport.is_closing()

    def send(self, request: bytes, answer: Answer, *, head_only: bool = False) -> None:
        """Write a whole request (head and body); its answer goes to `answer`.

        Args:
            request: The request's bytes as they go on the wire.
            answer: Where the answer goes; `fail` at once if the connection closed already.
            head_only: The request is HEAD: the answer ends with its head.
        """
        self._answer = answer
        self._body_to = answer.body
        self._head_only = head_only
        self.received = self._headed = False
        self._head_bytes = 0
        if self._transport is None:
            self._fail(httpx.RemoteProtocolError("upstream closed the connection"))
            return
        self._transport.write(request)

    def send_body_to(self, target: Callable[[bytes], None] | None) -> None:
        """Give the present answer's body pieces to `target` instead of its `body` (None: back).

        Why: the relay's push path takes each piece in the upstream's read callback
        (`ResponseBody.divert`); calling it from here saves a Python call per piece.
        """
        if self._answer is not None:
            self._body_to = target if target is not None else self._answer.body

    def pause_reading(self) -> None:
        """Stop reading the socket (the answer's reader is behind)."""
        if not self._paused and self._transport is not None and not self._transport.is_closing():
            self._paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        """Read the socket again."""
        if self._paused and self._transport is not None and not self._transport.is_closing():
            self._paused = False
            self._transport.resume_reading()

    def abandon(self) -> None:
        """Close it mid-answer, telling the answer nothing (its reader went away)."""
        self._answer = None
        self.close()

    def close(self) -> None:
        """Close it; an answer in progress fails when the close completes."""
        if self._transport is not None:
            self._transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self._transport = transport  # type: ignore[assignment]  # TCP; uvloop's: no subclass

    def data_received(self, data: bytes) -> None:  # noqa: D102
        if self._answer is None:  # bytes nothing asked for would garble the next answer
            self.close()
            return
        self.received = True
        if not self._headed:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("upstream switched protocols"))
        except httptools.HttpParserCallbackError as exc:  # a callback below refused the answer
            cause = exc.__context__
            if isinstance(cause, httpx.TransportError):
                self._fail(cause)
            else:
                self._fail(self._malformed(exc))
        except httptools.HttpParserError as exc:
            self._fail(self._malformed(exc))
        else:
            if not self._headed and self._head_bytes > MAX_HEAD_BYTES and self._answer is not None:
                message = f"upstream's answer head is over {MAX_HEAD_BYTES} bytes"
                self._fail(httpx.RemoteProtocolError(message))

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._transport = None
        self._pool.discard(self)
        answer, self._answer = self._answer, None
        if answer is None:
            return
        if not self._headed:
            answer.fail(httpx.RemoteProtocolError("upstream closed the connection unanswered"))
        elif exc is None and self._body_until_close():
            answer.end()  # a body without a length ends when the connection does
        else:
            answer.fail(httpx.ReadError("upstream closed the connection before the body ended"))

    # httptools callbacks

    def on_message_begin(self) -> None:  # noqa: D102
        if self._answer is None:
            raise httpx.RemoteProtocolError("upstream sent a second answer")
        self._headers = []
        self._reason = b""

    def on_status(self, reason: bytes) -> None:  # noqa: D102
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:  # noqa: D102
        self._headers.append((name, value))
        if len(self._headers) > MAX_HEADERS:
            raise httpx.RemoteProtocolError(f"upstream's answer has over {MAX_HEADERS} headers")

    def on_headers_complete(self) -> None:  # noqa: D102
        status = self._parser.get_status_code()
        if status < 200:  # 100 Continue, 103 Early Hints: the answer is still to come
            self._informational = True
            return
        answer = self._answer
        if answer is None:
            return
        self._headed = True
        self._keep_alive = self._parser.should_keep_alive()
        answer.head(status, self._headers, self._reason)
        if self._head_only:
            self._answer = None
            self.close()
            answer.end()

    def on_body(self, body: bytes) -> None:  # noqa: D102
        if self._answer is not None:
            self._body_to(body)

    def on_message_complete(self) -> None:  # noqa: D102
        if self._informational:
            self._informational = False
            return
        answer, self._answer = self._answer, None
        if answer is None:
            return
        self.reused = True
        if self._keep_alive:
            self.resume_reading()  # the answer's reader may have paused it
            self._pool.release(self)
        else:
            self.close()
        answer.end()

    def _fail(self, exc: httpx.TransportError) -> None:
        answer, self._answer = self._answer, None
        self.close()
        if answer is not None:
            answer.fail(exc)

    def _malformed(self, exc: Exception) -> httpx.TransportError:
        if self._headed:
            return httpx.ReadError(f"upstream sent a malformed body: {exc}")
        return httpx.RemoteProtocolError(f"upstream sent a malformed answer: {exc}")

    def _body_until_close(self) -> bool:
        """Whether the answer's body has no length: it ends when the connection closes."""
        for name, value in self._headers:
            lower = name.lower()
            if lower == b"content-length":
                return False
            if lower == b"transfer-encoding" and value.lower().rstrip().endswith(b"chunked"):
                return False
        return True


def _nowhere(piece: bytes) -> None:
    """No answer is under way: `on_body` checks before it calls."""


async def acquire_within(leases: anyio.Semaphore, pool_timeout: float | None) -> None:
    """Take one of a pool's `leases`, waiting at most `pool_timeout` seconds (None: no limit).

    Both upstream transports bound their connections this way (`ConnectionPool.lease`, and
    `gateway.upstream.transport.AiohttpTransport`), with httpx's error for a pool that stays full.

    Raises:
        httpx.PoolTimeout: none was free in time.
    """
    try:
        leases.acquire_nowait()  # no checkpoint (an event-loop turn) when one is free
    except anyio.WouldBlock:
        try:
            with anyio.fail_after(pool_timeout):
                await leases.acquire()
        except TimeoutError as exc:
            message = "no free upstream connection within the pool timeout"
            raise httpx.PoolTimeout(message) from exc


class ConnectionPool:
    """Keep-alive `Connection`s to upstream origins, and the leases that bound them.

    Args:
        limits: `max_connections` bounds the leases held at once (None: unbounded);
            `max_keepalive_connections` the idle connections per origin (None: unbounded);
            `keepalive_expiry` is the idle lifetime in seconds (None: no expiry).
        in_use: A gauge kept equal to the leases held now.
    """

    def __init__(self, limits: httpx.Limits, in_use: Gauge | None = None) -> None:
        self._leases = anyio.Semaphore(limits.max_connections) if limits.max_connections else None
        self._in_use = in_use or NoGauge()
        self._max_idle = limits.max_keepalive_connections
        self._expiry = limits.keepalive_expiry
        self._idle: dict[Origin, list[Connection]] = {}
        self._open: set[Connection] = set()
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._tls: ssl.SSLContext | None = None

    async def lease(self, pool_timeout: float | None) -> None:
        """Take a lease, waiting at most `pool_timeout` seconds (None: no limit).

        Raises:
            httpx.PoolTimeout: none was free in time.
        """
        if self._leases is not None:
            await acquire_within(self._leases, pool_timeout)
        self._in_use.inc()

    def end_lease(self) -> None:
        """Give a lease back (once per `lease`)."""
        if self._leases is not None:
            self._leases.release()
        self._in_use.dec()

    async def connection(
        self, origin: Origin, connect_timeout: float | None, *, fresh: bool = False
    ) -> Connection:
        """An idle connection to `origin` (unless `fresh`), else a new one.

        Args:
            origin: Where to.
            connect_timeout: Seconds a new connection may take (TCP and TLS), None: no limit.
            fresh: Connect anew even when one is idle.

        Raises:
            httpx.ConnectError: refused, unresolvable, or the TLS handshake failed.
            httpx.ConnectTimeout: connecting took longer than `connect_timeout`.
        """
        idle = None if fresh else self._idle.get(origin)
        if idle:
            now = time.monotonic()
            while idle:
                connection = idle.pop()
                if connection.usable and not self._expired(connection, now):
                    return connection
                connection.close()
        return await self._connect(origin, connect_timeout)

    def release(self, connection: Connection) -> None:
        """Take back a connection whose answer ended (kept alive)."""
        idle = self._idle.setdefault(connection.origin, [])
        if self._max_idle is not None and len(idle) >= self._max_idle:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)
        if self._sweep_timer is None and self._expiry is not None:
            loop = asyncio.get_running_loop()
            self._sweep_timer = loop.call_later(self._expiry, self._sweep)

    def discard(self, connection: Connection) -> None:
        """Forget a closed connection."""
        self._open.discard(connection)
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)

    async def aclose(self) -> None:
        """Close every connection, idle or in use (answers in progress fail)."""
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        for connection in list(self._open):
            connection.close()
        self._idle.clear()
        await asyncio.sleep(0)  # the transports close on the next turn of the loop

    async def _connect(self, origin: Origin, connect_timeout: float | None) -> Connection:
        scheme, host, port = origin
        tls = await self._tls_context() if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            with anyio.fail_after(connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: Connection(self, origin), host, port, ssl=tls
                )
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            raise httpx.ConnectTimeout(f"timed out connecting to {host}:{port}") from exc
        except OSError as exc:  # refused, unreachable, DNS (gaierror), TLS (SSLError)
            raise httpx.ConnectError(str(exc) or f"cannot connect to {host}:{port}") from exc
        self._open.add(connection)
        return connection

    async def _tls_context(self) -> ssl.SSLContext:
        """The system's trust store, as aiohttp's (`SSL_CERT_FILE`, `SSL_CERT_DIR` apply).

        Made once, in a thread: loading the certificates reads files.
        """
        if self._tls is None:
            tls = await anyio.to_thread.run_sync(ssl.create_default_context)
            tls.set_alpn_protocols(["http/1.1"])
            self._tls = tls
        return self._tls

    def _expired(self, connection: Connection, now: float) -> bool:
        return self._expiry is not None and now - connection.idle_since >= self._expiry

    def _sweep(self) -> None:
        """Close the idle connections past their expiry; come back while any is idle."""
        self._sweep_timer = None
        now = time.monotonic()
        for origin, idle in self._idle.items():
            fresh = [c for c in idle if c.usable and not self._expired(c, now)]
            for connection in idle:
                if connection not in fresh:
                    connection.close()
            self._idle[origin] = fresh
        if self._expiry is not None and any(self._idle.values()):
            loop = asyncio.get_running_loop()
            self._sweep_timer = loop.call_later(self._expiry, self._sweep)

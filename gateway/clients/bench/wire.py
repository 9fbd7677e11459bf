# ruff: noqa: ASYNC109 (each call takes its own timeout: a per-request limit is the contract)
"""The load generator's HTTP/1.1 client: keep-alive connections parsed by httptools.

Owns `Connection` (one keep-alive HTTP/1.1 connection on an asyncio protocol, with httptools
(llhttp, C) parsing the answer and handing its de-chunked body to a sink as it arrives),
`request_bytes` (a whole request, built once), `connect` (open a connection, with a timeout,
over TLS for `https`) and `fetch` (one small request on a fresh connection, for the checks
before a run). Both `gateway bench` and the gateway's own overhead benchmark (`benchmarks/`) measure
with it: the load generator must not be the bottleneck, and httpx's streaming read costs about
four times as much CPU per chunk (`python -m benchmarks.load --client httpx` to compare).

Nothing here logs or formats a request: the request bytes carry the API key.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from typing import cast

import httptools

Sink = Callable[[bytes], None]
"""Takes each piece of a response body (de-chunked) as it arrives."""

#: Bytes a response's status line and headers may take. httptools sets no limit and keeps a
#: header's pieces until it ends, so an endless header would grow memory for as long as it
#: lasts; real model servers send well under 2 KiB.
MAX_HEAD = 64 * 1024


def request_bytes(
    method: str,
    host: str,
    port: int,
    path: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """The whole HTTP/1.1 request: request line, `Host`, `headers`, `Content-Length`, body.

    Built once per distinct request and written as is, so a stream costs no header formatting.
    """
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method not in {"GET", "HEAD"}:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time (httptools parser).

    Attributes:
        transport: The TCP (or TLS) transport, None until connected.
        status: The status of the current (or last) answer, 0 before its status line.
        retry_after: The answer's `Retry-After` in seconds (RFC 9110 section 10.2.3, the
            delay-seconds form; an HTTP date is ignored), or None.
        reusable: The connection may carry another request (no error, no close, keep-alive).
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.sink: Sink = lambda _: None
        self.status = 0
        self.retry_after: float | None = None
        self.reusable = True
        self._head = 0  # bytes received before the headers ended: at most MAX_HEAD
        self._headers_done = False
        self._framed = False  # the answer has a Content-Length or a Transfer-Encoding

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = cast(asyncio.Transport, transport)  # TCP; uvloop's is no subclass

    def data_received(self, data: bytes) -> None:  # noqa: D102
        try:
            if self.parser is not None:
                self.parser.feed_data(data)
                if not self._headers_done:
                    self._head += len(data)
                    if self._head > MAX_HEAD:
                        raise httptools.HttpParserError(
                            f"response head longer than {MAX_HEAD} bytes"
                        )
        except (httptools.HttpParserError, ValueError) as exc:
            self.reusable = False
            self._finish(exc)
            self.close()  # what the server sends next would go on piling up in the parser

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self.reusable = False
        if exc is None and self._headers_done and not self._framed:
            # Neither Content-Length nor Transfer-Encoding: the body ends when the connection
            # closes (RFC 9112 section 6.3, item 8), and llhttp is never told it did.
            self._finish(None)
            return
        self._finish(exc or ConnectionResetError("connection closed by the server"))

    def on_header(self, name: bytes, value: bytes) -> None:  # noqa: D102 - httptools callbacks
        if len(name) == 11 and name.lower() == b"retry-after" and value.strip().isdigit():
            self.retry_after = float(value.strip()[:6])  # at most 999999 s; capped by the caller
        elif name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:  # noqa: D102 - httptools callbacks
        assert self.parser is not None  # noqa: S101
        self.status = self.parser.get_status_code()
        self._headers_done = True

    def on_body(self, body: bytes) -> None:  # noqa: D102
        self.sink(body)

    def on_message_complete(self) -> None:  # noqa: D102
        assert self.parser is not None  # noqa: S101
        self.reusable = self.reusable and self.parser.should_keep_alive()
        self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None) if exc is None else waiter.set_exception(exc)

    async def send(self, request: bytes, sink: Sink, *, timeout: float | None = None) -> int:
        """Send `request`, feed its body to `sink` as it arrives; return the status.

        Args:
            request: The whole request (`request_bytes`).
            sink: Takes each body piece; `self.status` is set before its first call.
            timeout: Seconds the whole answer may take (None: no limit). On expiry the
                connection is closed (its answer cannot be resumed) and TimeoutError raised.

        Raises:
            TimeoutError: no end of the answer within `timeout`.
            ConnectionError: the connection failed or the server closed it mid-answer.
            httptools.HttpParserError: the answer is not HTTP, or its status line and headers
                pass `MAX_HEAD` bytes.
        """
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection closed")
        self.parser = httptools.HttpResponseParser(self)
        self.sink = sink
        self.status = 0
        self.retry_after = None
        self._head, self._headers_done, self._framed = 0, False, False
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            if timeout is None:
                await waiter
            else:
                await asyncio.wait_for(waiter, timeout)
        except BaseException:
            self.close()  # cancelled or timed out: the rest of the answer would poison reuse
            raise
        return self.status

    def stop(self) -> None:
        """End the current answer now (the reader failed it): `send` returns, the link closes.

        What the server would send next cannot change the record, and reading it until the
        timeout would keep a worker (and the server) busy for nothing.
        """
        self.reusable = False
        self._finish(None)
        self.close()

    def close(self) -> None:
        """Close the connection; it is no longer reusable."""
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


async def connect(host: str, port: int, *, tls: bool = False, timeout: float = 10.0) -> Connection:
    """Open a `Connection` to `host:port` (over TLS with the system's trust store if `tls`).

    Raises:
        TimeoutError: not connected within `timeout` seconds.
        OSError: the connection failed (refused, unreachable, TLS handshake).
    """
    loop = asyncio.get_running_loop()
    context = ssl.create_default_context() if tls else None
    opening = loop.create_connection(
        Connection, host, port, ssl=context, server_hostname=host if tls else None
    )
    _, connection = await asyncio.wait_for(opening, timeout)
    return connection


async def fetch(
    host: str,
    port: int,
    method: str,
    path: str,
    *,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    tls: bool = False,
    timeout: float = 10.0,
    limit: int = 4 << 20,
) -> tuple[int, bytes]:
    """One request on a fresh connection; return the status and the body (up to `limit` bytes).

    Raises:
        TimeoutError: not connected or not answered within `timeout` seconds.
        OSError: the connection failed.
        httptools.HttpParserError: the answer is not HTTP.
    """
    connection = await connect(host, port, tls=tls, timeout=timeout)
    received = bytearray()

    def sink(piece: bytes) -> None:
        if len(received) < limit:
            received.extend(piece[: limit - len(received)])

    try:
        request = request_bytes(method, host, port, path, body, headers)
        status = await connection.send(request, sink, timeout=timeout)
    finally:
        connection.close()
    return status, bytes(received)

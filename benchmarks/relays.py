"""The data plane architectures `benchmarks.dataplane` measures: one bare relay each.

Like `benchmarks.floor` (row a), each relay forwards a request to the upstream and copies the
answer's body back as it arrives: no auth, limits, metering, deadlines or disconnect watching.
They differ only in how the bytes cross the process:

- `uvicorn-raw` (b): uvicorn (httptools, as `gateway serve`) with a plain ASGI app, and for
  the upstream leg `Upstream`: a keep-alive pool of asyncio Protocols whose answers httptools
  (llhttp) parses, handed to the app's coroutine through a `Feed`.
- `protocols` (c): no ASGI and no coroutine per chunk. `RelayServer` is an asyncio Protocol
  parsing the client's request with httptools; the upstream connection's parser callbacks write
  each piece straight to the client's transport, chunked by hand.
- `granian-rsgi`, `granian-asgi` (d): granian (a Rust HTTP server, PyPI wheels) with its RSGI
  interface, and with ASGI running the app of b; `Upstream` on the upstream leg.
- `floor` (a) on another event loop: `benchmarks.floor.build_app` (uvicorn + aiohttp).

`python -m benchmarks.relays VARIANT --port P --upstream URL [--loop uvloop|asyncio]` serves
`floor`, `uvicorn-raw`, `protocols`, `protocols-sse` (`TranslatingRelay`: the SSE translation
of `/v1/chat/completions` on top of c) or `protocols-sse-orjson` (the same with orjson);
granian serves the other two from its own command line (`granian --interface rsgi --factory
benchmarks.relays:granian_rsgi`, the upstream in `DATAPLANE_UPSTREAM`). Nothing here imports
the project (only httptools, uvloop and, per variant, uvicorn, aiohttp, orjson or granian), so
a scratch virtualenv holding granian can run it with this tree on `PYTHONPATH`.

Simplifications every variant shares, as the floor: one request at a time per connection (no
pipelining), the answer's `content-type` is the only header relayed, an upstream failure closes
the client's connection. `protocols` alone relays backpressure (a slow client pauses reading
the upstream) and drops the upstream connection when the client goes away: both cost nothing
per chunk, they are callbacks that run only when a buffer crosses its mark or a socket closes.

Over ~300 lines for one reason: the four relays share the upstream client (`Upstream`,
`UpstreamConnection`, `Feed`), and the evidence is that they differ only in the server leg.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools

UPSTREAM_ENV = "DATAPLANE_UPSTREAM"
"""The upstream base URL of the granian variants (granian builds the app from a factory)."""

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class Answer(Protocol):
    """Where an `UpstreamConnection` hands one answer, from parser callbacks (no coroutine)."""

    def head(self, status: int, content_type: bytes) -> None:
        """The status line and headers arrived."""

    def body(self, piece: bytes) -> None:
        """A piece of the de-chunked body arrived."""

    def end(self) -> None:
        """The answer is complete (the connection is back in the pool)."""

    def fail(self, exc: BaseException) -> None:
        """The connection failed or closed before the answer ended."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to the upstream, its answers parsed by httptools."""

    def __init__(self, pool: Upstream) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: Answer | None = None
        self.content_type = b"application/octet-stream"

    def send(self, request: bytes, answer: Answer) -> None:
        """Write a whole request; its answer goes to `answer`."""
        assert self.transport is not None  # noqa: S101 - only connected ones are handed out
        self.parser = httptools.HttpResponseParser(self)
        self.answer = answer
        self.transport.write(request)

    def abandon(self) -> None:
        """Close it mid-answer (the client went away): its rest could not be reused."""
        self.answer = None
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = transport  # type: ignore[assignment] - TCP; uvloop's is no subclass

    def data_received(self, data: bytes) -> None:  # noqa: D102
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)
            self.abandon()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self.transport = None
        self.pool.discard(self)
        self._fail(exc or ConnectionResetError("upstream closed the connection"))

    def on_header(self, name: bytes, value: bytes) -> None:  # noqa: D102 - httptools callbacks
        if len(name) == 12 and name.lower() == b"content-type":
            self.content_type = value

    def on_headers_complete(self) -> None:  # noqa: D102
        if self.answer is not None:
            self.answer.head(self.parser.get_status_code(), self.content_type)

    def on_body(self, body: bytes) -> None:  # noqa: D102
        if self.answer is not None:
            self.answer.body(body)

    def on_message_complete(self) -> None:  # noqa: D102
        answer, self.answer = self.answer, None
        if self.parser.should_keep_alive():
            self.pool.release(self)
        elif self.transport is not None:
            self.transport.close()
        if answer is not None:
            answer.end()

    def _fail(self, exc: BaseException) -> None:
        answer, self.answer = self.answer, None
        if answer is not None:
            answer.fail(exc)


class Upstream:
    """A keep-alive pool of `UpstreamConnection`s to one upstream (`http://host:port`)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.idle: list[UpstreamConnection] = []
        # The emulator, like Ollama, refuses a non-loopback Host: send the upstream's own.
        self._host_header = f"Host: {self.host}:{self.port}\r\n".encode()

    def request(self, method: bytes, path: bytes, body: bytes) -> bytes:
        """The whole upstream request: request line, Host, content headers, body."""
        head = b"%s %s HTTP/1.1\r\n%s" % (method, path, self._host_header)
        if body:
            head += b"Content-Type: application/json\r\n"
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body

    def take(self) -> UpstreamConnection | None:
        """An idle connection, or None (then `connect`)."""
        return self.idle.pop() if self.idle else None

    async def connect(self) -> UpstreamConnection:
        """A new connection (raises OSError when the upstream refuses it)."""
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            lambda: UpstreamConnection(self), self.host, self.port
        )
        return connection

    async def open(self, method: bytes, path: bytes, body: bytes, answer: Answer) -> None:
        """Send a request on an idle or new connection; its answer goes to `answer`."""
        connection = self.take() or await self.connect()
        connection.send(self.request(method, path, body), answer)

    def release(self, connection: UpstreamConnection) -> None:
        """Take a connection whose answer ended back."""
        self.idle.append(connection)

    def discard(self, connection: UpstreamConnection) -> None:
        """Forget a closed connection."""
        if connection in self.idle:
            self.idle.remove(connection)


class Feed:
    """An `Answer` a coroutine reads: pieces pile up until `next` takes them, one wake-up each."""

    def __init__(self) -> None:
        self.status = 0
        self.content_type = b""
        self.pieces: list[bytes] = []
        self.done = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def head(self, status: int, content_type: bytes) -> None:  # noqa: D102 - Answer
        self.status, self.content_type = status, content_type
        self._wake()

    def body(self, piece: bytes) -> None:  # noqa: D102
        self.pieces.append(piece)
        self._wake()

    def end(self) -> None:  # noqa: D102
        self.done = True
        self._wake()

    def fail(self, exc: BaseException) -> None:  # noqa: D102
        self.error, self.done = exc, True
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    async def started(self) -> tuple[int, bytes]:
        """The answer's status and content type (raises what failed the connection)."""
        while not self.status and not self.done:
            await self._wait()
        if self.error is not None:
            raise self.error
        return self.status, self.content_type

    async def next(self) -> bytes | None:
        """Every piece arrived since the last call, joined; None at the end."""
        while not self.pieces and not self.done:
            await self._wait()
        if self.pieces:
            pieces, self.pieces = self.pieces, []
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if self.error is not None:
            raise self.error
        return None


def asgi_raw(upstream_url: str) -> ASGIApp:
    """Variant b's ASGI app (and granian-asgi's): `Upstream` on the upstream leg."""
    upstream = Upstream(upstream_url)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # nothing to open: the pool connects on demand
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        feed = Feed()
        await upstream.open(scope["method"].encode(), scope["path"].encode(), body, feed)
        status, content_type = await feed.started()
        start = {"status": status, "headers": [(b"content-type", content_type)]}
        await send({"type": "http.response.start", **start})
        while (piece := await feed.next()) is not None:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def granian_asgi() -> ASGIApp:
    """The `--factory` target for variant d with ASGI: `asgi_raw` on `UPSTREAM_ENV`."""
    return asgi_raw(os.environ[UPSTREAM_ENV])


def granian_rsgi() -> Callable[[Any, Any], Awaitable[None]]:
    """The `--factory` target for variant d with RSGI (granian's own interface).

    RSGI hands the app the request body in one await and a response stream whose
    `send_bytes` goes to granian's Rust side: no ASGI message dicts.
    """
    upstream = Upstream(os.environ[UPSTREAM_ENV])

    async def app(scope: Any, protocol: Any) -> None:
        body = await protocol()
        feed = Feed()
        await upstream.open(scope.method.encode(), scope.path.encode(), body, feed)
        status, content_type = await feed.started()
        stream = protocol.response_stream(status, [("content-type", content_type.decode())])
        while (piece := await feed.next()) is not None:
            await stream.send_bytes(piece)

    return app


class RelayServer(asyncio.Protocol):
    """Variant c: one client connection, relayed from parser callbacks on both legs.

    The request is parsed by httptools; when it is complete an idle upstream connection is
    taken (a task connects only when none is idle) and this object is its `Answer`: every
    upstream piece is written to the client's transport at once, chunk-framed by hand.
    """

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.connection: UpstreamConnection | None = None  # the answer in progress
        self.url = b""
        self.pieces: list[bytes] = []
        self.keep_alive = True
        self.started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:  # noqa: D102
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102, ARG002 - any cause
        self.transport = None
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.abandon()

    def pause_writing(self) -> None:  # noqa: D102 - the client reads slower than we get
        if self.connection is not None and self.connection.transport is not None:
            self.connection.transport.pause_reading()

    def resume_writing(self) -> None:  # noqa: D102
        if self.connection is not None and self.connection.transport is not None:
            self.connection.transport.resume_reading()

    def on_url(self, url: bytes) -> None:  # noqa: D102 - httptools callbacks
        self.url += url

    def on_body(self, body: bytes) -> None:  # noqa: D102
        self.pieces.append(body)

    def on_message_complete(self) -> None:  # noqa: D102
        method, path, body = self.parser.get_method(), self.url, b"".join(self.pieces)
        self.url, self.pieces = b"", []
        self.keep_alive = self.parser.should_keep_alive()
        self.started = False
        request = self.upstream.request(method, path, body)
        connection = self.upstream.take()
        if connection is None:
            asyncio.get_running_loop().create_task(self._connect_and_send(request))
        else:
            self.connection = connection
            connection.send(request, self)

    async def _connect_and_send(self, request: bytes) -> None:
        try:
            connection = await self.upstream.connect()
        except OSError as exc:
            self.fail(exc)
            return
        self.connection = connection
        connection.send(request, self)

    def head(self, status: int, content_type: bytes) -> None:  # noqa: D102 - Answer
        self.started = True
        phrase = HTTPStatus(status).phrase.encode()
        self._write(
            b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n"
            % (status, phrase, content_type)
        )

    def body(self, piece: bytes) -> None:  # noqa: D102
        self._write(b"%x\r\n%b\r\n" % (len(piece), piece))

    def end(self) -> None:  # noqa: D102
        self.connection = None
        self._write(b"0\r\n\r\n")
        if not self.keep_alive:
            self._close()

    def fail(self, exc: BaseException) -> None:  # noqa: D102, ARG002 - a 502 either way
        self.connection = None
        if not self.started:
            self._write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
        self._close()  # mid-body: the unfinished chunked body tells the client

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


Codec = tuple[Callable[[bytes], Any], Callable[[Any], bytes]]
"""Decode one NDJSON line, encode one event."""

STDLIB_JSON: Codec = (json.loads, lambda event: json.dumps(event).encode())


class TranslatingRelay(RelayServer):
    """Variant c plus the gateway's per-chunk work on `/v1/chat/completions` (row `protocols-sse`).

    The upstream is asked `/api/chat` (Ollama NDJSON) and each line becomes an OpenAI
    `chat.completion.chunk` event, decoded and encoded with the standard library's `json` as
    the gateway does; the `done` line becomes the finish event and `data: [DONE]`. What this
    row costs over `protocols` is the translation's share of a per-chunk budget nginx never pays.
    `codec` decodes a line and encodes an event (orjson's for row `protocols-sse-orjson`).
    """

    def __init__(self, upstream: Upstream, codec: Codec = STDLIB_JSON) -> None:
        super().__init__(upstream)
        self.codec = codec
        self.rest = b""

    def head(self, status: int, content_type: bytes) -> None:  # noqa: D102
        self.rest = b""
        super().head(status, b"text/event-stream" if status == 200 else content_type)

    def body(self, piece: bytes) -> None:  # noqa: D102
        *lines, self.rest = (self.rest + piece).split(b"\n")
        loads, dumps = self.codec
        events = []
        for line in lines:
            if not line.strip():
                continue
            data = loads(line)
            done = bool(data.get("done"))
            delta = {} if done else {"content": data["message"]["content"]}
            choice = {"index": 0, "delta": delta, "finish_reason": "stop" if done else None}
            event = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0}
            event |= {"model": data["model"], "choices": [choice]}
            events.append(b"data: " + dumps(event) + b"\n\n")
            if done:
                events.append(b"data: [DONE]\n\n")
        if events:
            super().body(b"".join(events))


async def serve_protocols(
    port: int, upstream_url: str, relay: Callable[[Upstream], RelayServer]
) -> None:
    """Serve variant c (`relay`: `RelayServer` or `TranslatingRelay`) on 127.0.0.1:`port`."""
    upstream = Upstream(upstream_url)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: relay(upstream), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve one variant on 127.0.0.1 until stopped."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.relays", description=__doc__)
    variants = ["floor", "uvicorn-raw", "protocols", "protocols-sse", "protocols-sse-orjson"]
    parser.add_argument("variant", choices=variants)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="upstream base URL")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args(argv)
    upstream = args.upstream.rstrip("/")
    if args.variant.startswith("protocols"):
        relay: Callable[[Upstream], RelayServer] = RelayServer
        if args.variant == "protocols-sse":
            relay = TranslatingRelay
        elif args.variant == "protocols-sse-orjson":
            import orjson  # a compiled JSON codec (Rust), in the project's dev lock

            relay = partial(TranslatingRelay, codec=(orjson.loads, orjson.dumps))
        serving = serve_protocols(args.port, upstream, relay)
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(serving)
        else:
            asyncio.run(serving)
        return 0
    import uvicorn

    if args.variant == "floor":
        from benchmarks.floor import build_app

        app: Any = build_app(upstream)
    else:
        app = asgi_raw(upstream)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop=args.loop,
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

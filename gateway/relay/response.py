"""The response of a generation: connects upstream, relays the answer, and always finishes.

Pure ASGI, not a `StreamingResponse` subclass. One watcher task per request
(`gateway.relay.disconnect`) listens for `http.disconnect` from the wait for an upstream slot to
the last chunk, and cancels the request's cancel scope: a client that goes away cancels the
upstream request at once, even while the upstream is silent (field failure F-13). The same
scope is what a shutdown's deadline cancels (`gateway.lifecycle`).

Until the first byte is sent, a failure is raised as a `GatewayError`, which the app's error
handlers turn into a real status in the client's dialect; after it, the stream ends with one
error chunk in the client's format (the surface's `Codec`: an NDJSON `{"error": ...}` line,
reference section 4.3, or an SSE error event). A client that reads nothing for
`GATEWAY_IDLE_TIMEOUT` (the server's flow control holds a write that long) is treated as gone:
its stream is closed and its slot freed. The outcome is recorded exactly once; a
`BackgroundTask` would be skipped on disconnect (STYLE section 5).

Once its head is sent, a stream takes the push path when it can (`gateway.relay.push`: the server
put the connection's writer in the scope, and the upstream body calls back): every chunk is then
relayed inside the upstream's read callback, and this task only waits for the end; otherwise
(tests' in-process transports, other servers, other upstream clients) it pulls each batch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

import anyio
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway.context import ending
from gateway.errors import ServiceUnavailableError
from gateway.lifecycle import Lifecycle
from gateway.neutral import Chunk, Outcome
from gateway.relay.deadline import IdleDeadline
from gateway.relay.disconnect import watch_disconnect
from gateway.relay.push import WRITER, ClientStalledError, Writer
from gateway.relay.surface import Codec
from gateway.upstream.dialects.base import TextEvent

logger = logging.getLogger("gateway.relay")

JSON = b"application/json; charset=utf-8"

#: Status for a request whose client left before any byte was sent (nginx's convention; it is
#: only logged and counted, nobody is left to read it).
CLIENT_CLOSED_REQUEST = 499


class Stream(Protocol):
    """An open upstream answer, as the response reads it (`gateway.relay.exchange.Exchange`)."""

    @property
    def outcome(self) -> Outcome | None:
        """None while running; then how the upstream's answer ended (`completed`, ...)."""
        ...

    def batches(self) -> AsyncGenerator[list[Chunk], None]:
        """The answer's chunks, one batch per upstream read; never raises an upstream fault."""
        ...

    def divertible(self) -> bool:
        """Whether `push` can relay the rest of the answer (`gateway.relay.push`)."""
        ...

    async def push(
        self,
        deliver: Callable[[list[Chunk]], None],
        writer: Writer,
        client_idle: float,
        tick: Callable[[float], None] | None = None,
        text_event: TextEvent | None = None,
    ) -> None:
        """Deliver each batch from upstream callbacks (`Exchange.push`); raises no upstream fault.

        Raises:
            ClientStalledError: the client read nothing for `client_idle` seconds.
        """
        ...


class Run(Protocol):
    """An admitted request, as the response drives it (`gateway.relay.generation.Generation`).

    The response knows this much of the engine and nothing more, so that the modules of the
    relay import each other in one direction only (`gateway.relay`).
    """

    @property
    def headers(self) -> dict[str, str]:
        """Extra response headers (the key's rate-limit headers)."""
        ...

    @property
    def streams(self) -> bool:
        """The client asked for a stream rather than one object."""
        ...

    @property
    def observe(self) -> Callable[[Chunk], None]:
        """What each chunk passes through just before the client gets it (the meter)."""
        ...

    tick: Callable[[float], None] | None
    """All `observe` does with an in-between chunk with text (`Generation.tick`), or None."""

    async def connect(self) -> Stream:
        """Open the upstream answer (upstream choice, slot, failover).

        Raises:
            GatewayError: no upstream answered; nothing was sent to the client yet.
        """
        ...

    async def collect(self, codec: Codec) -> bytes:
        """The whole answer of the stream `connect` opened, as one JSON object.

        Raises:
            GatewayError: the answer failed or is too large; nothing was sent yet.
        """
        ...

    async def finish(self, outcome: Outcome, status: int | None = None) -> None:
        """Release what the request holds and record it (shielded; once)."""
        ...


class RelayResponse(Response):
    """Run a `Generation` and send its answer: streamed unbuffered, or one JSON object.

    A `Response` subclass only so that FastAPI passes it through untouched; it renders itself.

    Args:
        generation: The admitted request (`Run`: a `gateway.relay.generation.Generation`).
        codec: Writes the answer in the client's format (`gateway.relay.surface.Codec`).
        lifecycle: Its stop signal ends the request; a running stream ends with an error chunk.
        idle_timeout: Seconds a client may read nothing before its stream is closed
            (`GATEWAY_IDLE_TIMEOUT`).
    """

    def __init__(
        self, generation: Run, codec: Codec, lifecycle: Lifecycle, *, idle_timeout: float
    ) -> None:
        self.status_code = 200
        self.background = None
        self.generation = generation
        self.codec = codec
        self.lifecycle = lifecycle
        self.idle_timeout = idle_timeout
        self.raw_headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in generation.headers.items()
        ]
        self.exchange: Stream | None = None
        self.started = False
        self.client_gone = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Connect, relay, finish; see the module docstring.

        Raises:
            GatewayError: the request failed before its first byte was sent.
        """
        generation = self.generation
        error: Exception | None = None
        try:
            with anyio.CancelScope() as cancel, self.lifecycle.ends_with(cancel):
                watcher = watch_disconnect(receive, cancel, self._client_left)
                try:
                    await self._respond(send, (scope.get("extensions") or {}).get(WRITER))
                except OSError:  # the server could not write: the client is gone
                    self.client_gone = True
                except Exception as exc:  # recorded by the finish below, then re-raised
                    error = exc
                finally:
                    watcher.cancel()
        except BaseException:  # cancelled from outside (the server's own shutdown), or a bug
            stopped = self.lifecycle.stopped and not self.client_gone
            outcome = self.exchange.outcome if self.exchange is not None else None
            await generation.finish(
                ending(outcome, shutdown=stopped),
                None if self.started else 503 if stopped else CLIENT_CLOSED_REQUEST,
            )
            raise
        if error is not None:
            status = getattr(error, "status_code", 500)
            await generation.finish(getattr(error, "outcome", "error"), status)
            raise error
        await self._end(send)

    async def _respond(self, send: Send, writer: Writer | None) -> None:
        exchange = self.exchange = await self.generation.connect()
        stall = IdleDeadline()  # a client that reads nothing must not hold its slot forever
        limit = self.idle_timeout

        async def write(message: Message) -> None:
            await stall.wait(send(message), limit)

        try:
            await self._relay(exchange, write, writer)
        except (TimeoutError, ClientStalledError):
            self.client_gone = True
            logger.warning("client read nothing for %g s; its stream is closed", limit)
        finally:
            stall.close()

    async def _relay(self, exchange: Stream, write: Send, writer: Writer | None) -> None:
        """Send the answer: the codec's stream as chunks come, or one JSON object.

        A stream goes on the push path (`gateway.relay.push`) when the server gave the
        connection's `writer` and the upstream body can call back; else each batch is pulled
        and sent through ASGI.

        Raises:
            TimeoutError, ClientStalledError: the client read nothing for
                `GATEWAY_IDLE_TIMEOUT` (flow control kept a write waiting that long).
            GatewayError: the `stream:false` answer failed before anything was sent.
        """
        if not self.generation.streams:
            content = await self.generation.collect(self.codec)
            length = str(len(content)).encode()
            headers = [(b"content-type", JSON), (b"content-length", length), *self.raw_headers]
            self.started = True
            await write({"type": "http.response.start", "status": 200, "headers": headers})
            await write({"type": "http.response.body", "body": content, "more_body": False})
            return
        observe = self.generation.observe
        encode = self.codec.encode
        self.started = True
        headers = [(b"content-type", self.codec.media_type), *self.raw_headers]
        await write({"type": "http.response.start", "status": 200, "headers": headers})
        if writer is not None and writer.ready() and exchange.divertible():

            def deliver(batch: list[Chunk]) -> None:
                for chunk in batch:
                    observe(chunk)
                body = encode(batch)
                if body:
                    writer.write(body)

            text_event = None if self.codec.writes_raw else self.codec.text_event
            tick = self.generation.tick if self.codec.writes_raw or text_event else None
            await exchange.push(deliver, writer, self.idle_timeout, tick, text_event)
            await write({"type": "http.response.body", "body": b"", "more_body": False})
            return
        async with contextlib.aclosing(exchange.batches()) as batches:
            async for batch in batches:
                for chunk in batch:
                    observe(chunk)
                # The chunks one upstream read completed go out in one write.
                body = encode(batch)
                if body:
                    await write({"type": "http.response.body", "body": body, "more_body": True})
        await write({"type": "http.response.body", "body": b"", "more_body": False})

    async def _end(self, send: Send) -> None:
        """Finish after the relay: completed, cut short by the client, or by a shutdown.

        Raises:
            ServiceUnavailableError: a shutdown's deadline came before the first byte.
        """
        generation = self.generation
        stopped = self.lifecycle.stopped and not self.client_gone
        outcome = self.exchange.outcome if self.exchange is not None else None
        if not self.started:
            if stopped:
                await generation.finish("shutdown", 503)
                raise ServiceUnavailableError(
                    "gateway is shutting down", headers={"Retry-After": "1", "Connection": "close"}
                )
            # The client left before the first byte; nobody reads this, the log shows it.
            await generation.finish("client_disconnect", CLIENT_CLOSED_REQUEST)
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                await send({"type": "http.response.start", "status": CLIENT_CLOSED_REQUEST})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if stopped and outcome is None:
            # Recorded first: a client that reads nothing can hold the error chunk's write
            # until the server cancels this task, and the request must still be counted.
            await generation.finish(ending(outcome, shutdown=stopped))
            await self._end_with_error(send, "gateway is shutting down")
            return
        await generation.finish(ending(outcome, shutdown=stopped))

    async def _end_with_error(self, send: Send, message: str) -> None:
        """Send one final error chunk and end the body (reference section 4.3).

        Shielded, but for at most `idle_timeout` seconds: a client that reads nothing must not
        hold the task (and a shutdown) longer than any other write may.
        """
        with anyio.move_on_after(self.idle_timeout, shield=True), contextlib.suppress(OSError):
            line = self.codec.encode([Chunk.failure(message)])
            await send({"type": "http.response.body", "body": line, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _client_left(self) -> None:
        self.client_gone = True

"""The streaming NDJSON response: relays chunks as they arrive and closes the upstream on exit.

Pure ASGI, not a `StreamingResponse` subclass: it always listens for `http.disconnect` while it
sends, whatever ASGI spec version the server reports (Starlette only does so below 2.4), so a
client that goes away cancels the upstream request at once even while the upstream is silent
(field failure F-13). Its `finally` closes the upstream and records the outcome; a
`BackgroundTask` would be skipped on disconnect (STYLE section 5).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from contextlib import aclosing

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.lifecycle import Lifecycle
from gateway.relay.exchange import Exchange
from gateway.relay.meter import RequestMeter
from gateway.upstream.dialect import Chunk

NDJSON = "application/x-ndjson"


class RelayStreamResponse(Response):
    """Stream an `Exchange` to the client as NDJSON, one line per chunk, unbuffered.

    A `Response` subclass only so that FastAPI passes it through untouched; it renders itself.

    Args:
        exchange: An opened exchange (its first chunk is ready).
        meter: The request's meter; observes each chunk just before it is sent.
        headers: Extra response headers (for example `X-Request-ID`).
        on_finish: Awaited once with the outcome after the stream ended; closes the upstream,
            releases what the request held and records its metrics.
        lifecycle: Ends the stream with an error line when a shutdown's deadline comes.
    """

    def __init__(
        self,
        exchange: Exchange,
        meter: RequestMeter,
        headers: dict[str, str],
        on_finish: Callable[[str], Awaitable[None]],
        lifecycle: Lifecycle,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.exchange = exchange
        self.meter = meter
        self.on_finish = on_finish
        self.raw_headers = [(b"content-type", NDJSON.encode())] + [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in headers.items()
        ]
        self.lifecycle = lifecycle
        self.client_gone = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: ARG002
        """Run the relay; see the module docstring."""
        try:
            async with anyio.create_task_group() as group:
                with self.lifecycle.ends_with(group.cancel_scope):
                    group.start_soon(self._watch_disconnect, receive, group.cancel_scope)
                    try:
                        await self._relay(send)
                    except OSError:  # the server could not write: the client is gone
                        self.client_gone = True
                    group.cancel_scope.cancel()
            if self.lifecycle.stopped and not self.client_gone and self.exchange.outcome is None:
                await self._end_with_error(send, "gateway is shutting down")
        finally:
            await self.exchange.aclose()
            outcome = self.exchange.outcome
            if outcome is None:
                outcome = (
                    "shutdown"
                    if self.lifecycle.stopped and not self.client_gone
                    else "client_disconnect"
                )
            await self.on_finish(outcome)

    async def _relay(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        observe = self.meter.observe
        async with aclosing(self.exchange.batches()) as batches:
            async for batch in batches:
                for chunk in batch:
                    observe(chunk)
                # The chunks one upstream read completed go out in one write.
                body = batch[0].line if len(batch) == 1 else b"".join([c.line for c in batch])
                await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _end_with_error(self, send: Send, message: str) -> None:
        """Send one final error line and end the body (reference section 4.3)."""
        with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
            line = Chunk.error(message).line
            await send({"type": "http.response.body", "body": line, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.client_gone = True
                scope.cancel()
                return

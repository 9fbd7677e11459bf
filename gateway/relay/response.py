"""The streaming NDJSON response: relays chunks as they arrive and closes the upstream on exit.

Pure ASGI, not a `StreamingResponse` subclass: it always listens for `http.disconnect` while it
sends, whatever ASGI spec version the server reports (Starlette only does so below 2.4), so a
client that goes away cancels the upstream request at once even while the upstream is silent
(field failure F-13). Its `finally` closes the upstream and records the outcome; a
`BackgroundTask` would be skipped on disconnect (STYLE section 5).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import aclosing

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.relay.exchange import Exchange
from gateway.relay.meter import RequestMeter

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
    """

    def __init__(
        self,
        exchange: Exchange,
        meter: RequestMeter,
        headers: dict[str, str],
        on_finish: Callable[[str], Awaitable[None]],
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
        self.client_gone = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: ARG002
        """Run the relay; see the module docstring."""
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch_disconnect, receive, group.cancel_scope)
                try:
                    await self._relay(send)
                except OSError:  # the server could not write: the client is gone
                    self.client_gone = True
                group.cancel_scope.cancel()
        finally:
            await self.exchange.aclose()
            await self.on_finish(self.exchange.outcome or "client_disconnect")

    async def _relay(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async with aclosing(self.exchange.stream()) as chunks:
            async for chunk in chunks:
                self.meter.observe(chunk)
                await send({"type": "http.response.body", "body": chunk.line, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.client_gone = True
                scope.cancel()
                return

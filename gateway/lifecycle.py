"""Graceful shutdown: the drain state shared by `gateway serve` and the app.

On SIGTERM or SIGINT the server first drains: it keeps listening for
`GATEWAY_SHUTDOWN_DRAIN` seconds while `/readyz` answers 503 and new generation requests get
503 with `Retry-After` and `Connection: close`, so a load balancer takes the replica out of
rotation. Then it stops accepting connections and lets in-flight requests finish for up to
`GATEWAY_SHUTDOWN_TIMEOUT` seconds; a stream still running then ends with one final
`{"error": "gateway is shutting down"}` line (outcome `shutdown`) and the process exits.
"""

from __future__ import annotations

import asyncio


class Lifecycle:
    """Whether the process is draining, and the signal that ends the streams still running."""

    def __init__(self) -> None:
        self.draining = False
        self._stop: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._stop is None:
            self._stop = asyncio.Event()
        return self._stop

    def stop_streams(self) -> None:
        """End every stream still running (call from the event loop's thread)."""
        self.draining = True
        self._event().set()

    async def wait_stop(self) -> None:
        """Return when the streams still running must end."""
        await self._event().wait()

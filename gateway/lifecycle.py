"""Graceful shutdown: the drain state shared by `gateway serve` and the app.

On SIGTERM or SIGINT the server first drains: it keeps listening for
`GATEWAY_SHUTDOWN_DRAIN` seconds while `/readyz` answers 503 and new generation requests get
503 with `Retry-After` and `Connection: close`, so a load balancer takes the replica out of
rotation. Then it stops accepting connections and lets in-flight requests finish for up to
`GATEWAY_SHUTDOWN_TIMEOUT` seconds; a stream still running then ends with one final
`{"error": "gateway is shutting down"}` line (outcome `shutdown`) and the process exits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio


class Lifecycle:
    """Whether the process is draining, and the signal that ends the streams still running.

    Each running stream registers its cancel scope (`ends_with`) instead of keeping a task of
    its own that waits for the signal: a task per stream costs memory and a wake-up per stream
    at shutdown (docs/performance.md, "Memory" under "What still costs the time").

    Attributes:
        draining: New generation requests are refused (`/readyz` answers 503).
        stopped: The streams still running have been told to end.
    """

    def __init__(self) -> None:
        self.draining = False
        self.stopped = False
        self._scopes: set[anyio.CancelScope] = set()

    def stop_streams(self) -> None:
        """End every stream still running (call from the event loop's thread)."""
        self.draining = True
        self.stopped = True
        for scope in list(self._scopes):
            scope.cancel()

    @contextmanager
    def ends_with(self, scope: anyio.CancelScope) -> Iterator[None]:
        """Cancel `scope` when the streams must end (at once if they already must)."""
        if self.stopped:
            scope.cancel()
        self._scopes.add(scope)
        try:
            yield
        finally:
            self._scopes.discard(scope)

"""The process-wide budget of request-body bytes held in memory at once (issue 29).

Each request body the gateway reads is buffered whole (`gateway.wire.body.read_body`) and its
bytes, then its parse, live until the request ends. Without a bound on their sum, one key with
the default limits (in-flight unlimited) could open hundreds of connections that each send most
of a 16 MiB body and hold back the rest, and take gigabytes. `BodyBudget` bounds that sum
(`GATEWAY_MAX_BUFFERED_BODY_BYTES`) and each key's part of it
(`GATEWAY_MAX_BUFFERED_BODY_BYTES_PER_KEY`), so one key cannot take the whole budget from others.

A body is charged as its bytes are announced or arrive: the declared `Content-Length` at once
(before anything is read), a chunked body chunk by chunk. A request refused a charge fails at
once, never waits: 429 past the key's share (its own bodies are the cause), 503 past the process
budget; both with `Retry-After`. The charge is given back when the request ends, however it ends
(answered, refused, the client gone mid-body): `BodyBudgetMiddleware` releases it after the app
returns for the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import Gauge
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.context import request_context
from gateway.errors import RateLimitedError, ServiceUnavailableError

RETRY_AFTER_SECONDS = "5"
"""`Retry-After` of a refused charge: held bodies finish or time out within seconds
(`GATEWAY_BODY_TIMEOUT` between two pieces)."""


class BodyBudget:
    """Bytes of request bodies held now, in total and per key, within fixed bounds.

    Args:
        total: Most bytes held at once by the process (bytes, > 0).
        per_key: Most bytes one key may hold at once (bytes; capped at `total`).
        gauge: Set to the bytes held after each change (None: not exported).
        grace: Seconds a body may take before its pace counts (`GATEWAY_BODY_TIMEOUT`).
        min_rate: Slowest average pace after the grace, in bytes per second
            (`GATEWAY_BODY_MIN_BYTES_PER_SECOND`): a body holding a charge must keep moving.
    """

    def __init__(
        self,
        total: int,
        per_key: int,
        gauge: Gauge | None = None,
        *,
        grace: float = 30.0,
        min_rate: int = 64 * 1024,
    ) -> None:
        self.total = total
        self.per_key = min(per_key, total)
        self.grace = grace
        self.min_rate = min_rate
        self.held = 0
        self._by_key: dict[str, int] = {}
        self._gauge = gauge

    def take(self, key: str | None, size: int) -> None:
        """Charge `size` bytes to `key` (None: only the process budget applies, e.g. admin).

        Raises:
            RateLimitedError: the key would hold more than its share (429, `Retry-After`).
            ServiceUnavailableError: the process would hold more than its budget (503,
                `Retry-After`).
        """
        if key is not None and self._by_key.get(key, 0) + size > self.per_key:
            raise RateLimitedError(
                "this API key is already sending as many request body bytes as it may hold at "
                f"once ({self.per_key}); retry when its other requests are done",
                headers={"Retry-After": RETRY_AFTER_SECONDS},
            )
        if self.held + size > self.total:
            raise ServiceUnavailableError(
                "the gateway is receiving too many request bodies at once; retry shortly",
                headers={"Retry-After": RETRY_AFTER_SECONDS},
            )
        self.held += size
        if key is not None:
            self._by_key[key] = self._by_key.get(key, 0) + size
        self._publish()

    def give(self, key: str | None, size: int) -> None:
        """Give back `size` bytes charged to `key` by `take`."""
        self.held -= size
        if key is not None:
            left = self._by_key.get(key, 0) - size
            if left > 0:
                self._by_key[key] = left
            else:
                self._by_key.pop(key, None)  # no entry per idle key: the map stays small
        self._publish()

    def held_by(self, key: str) -> int:
        """Bytes `key` holds now."""
        return self._by_key.get(key, 0)

    def _publish(self) -> None:
        if self._gauge is not None:
            self._gauge.set(self.held)


@dataclass
class BodyHold:
    """One request's charge against the budget: bytes taken so far, and for which key."""

    budget: BodyBudget
    key: str | None = None
    size: int = field(default=0)

    def take(self, key: str | None, size: int) -> None:
        """Charge `size` more bytes to the request (raises as `BodyBudget.take`)."""
        if size <= 0:
            return
        if self.size and key != self.key:  # one request, one key: never split a charge
            key = self.key
        self.budget.take(key, size)
        self.key = key
        self.size += size

    def release(self) -> None:
        """Give back everything the request took (idempotent)."""
        if self.size:
            self.budget.give(self.key, self.size)
            self.size = 0


def hold_of(scope: Scope) -> BodyHold | None:
    """The request's `BodyHold`, or None outside `BodyBudgetMiddleware` (no accounting)."""
    hold = request_context(scope).body_hold
    return hold if isinstance(hold, BodyHold) else None


class BodyBudgetMiddleware:
    """Gives each HTTP request a `BodyHold`, released when the app is done with the request.

    Done means the whole response sent, or any error or cancellation.

    Args:
        app: The ASGI app inside.
        budget: The process's `BodyBudget`.
    """

    def __init__(self, app: ASGIApp, budget: BodyBudget) -> None:
        self.app = app
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request with its hold; release the hold however the request ends."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hold = BodyHold(self.budget)
        request_context(scope).body_hold = hold
        try:
            await self.app(scope, receive, send)
        finally:
            hold.release()

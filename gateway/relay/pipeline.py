"""The flow of one generation request, from a checked body to the finished response.

read and check the body -> the key's model allow-list -> per-key limits (RPM, TPM, in-flight)
-> choose an upstream (gateway.upstream.pool) -> its slot (bounded queue) -> open the exchange
(retries, first-byte deadline; on failure the next upstream) ->
stream NDJSON, or aggregate for `stream:false` -> finish: metrics, TPM charge, slots back.
While waiting (for a slot or the first byte) the client going away cancels everything at once.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from fastapi import Request, Response
from starlette.types import Receive

from gateway.auth.principal import Principal
from gateway.errors import (
    ForbiddenError,
    GatewayError,
    ServiceUnavailableError,
    UpstreamError,
)
from gateway.lifecycle import Lifecycle
from gateway.metrics import ALL_KEYS, Metrics
from gateway.ratelimit.limiter import Admission, KeyLimiter
from gateway.relay.aggregate import Aggregator
from gateway.relay.body import parse_body, read_body
from gateway.relay.exchange import Exchange
from gateway.relay.meter import RequestMeter
from gateway.relay.response import RelayStreamResponse
from gateway.settings import Settings
from gateway.upstream.dialect import Route, encode_json
from gateway.upstream.headers import upstream_request_headers
from gateway.upstream.pool import Upstream, UpstreamPool

T = TypeVar("T")

#: Status for a request whose client left before any byte was sent (nginx's convention; it is
#: only logged and counted, nobody is left to read it).
CLIENT_CLOSED_REQUEST = 499


class ClientDisconnectedError(Exception):
    """The client closed the connection before the response started."""


@dataclass(frozen=True)
class Relay:
    """The app-wide services a generation request needs (built once by the lifespan)."""

    settings: Settings
    metrics: Metrics
    pool: UpstreamPool
    limiter: KeyLimiter
    lifecycle: Lifecycle

    async def handle(self, request: Request, principal: Principal, route: Route) -> Response:
        """Serve one `/v1/generate` or `/v1/chat` request (see the module docstring).

        Raises:
            GatewayError: every refusal or upstream failure before the first byte.
        """
        state: dict[str, Any] = request.scope.setdefault("state", {})
        if self.lifecycle.draining:
            raise ServiceUnavailableError(
                "gateway is shutting down", headers={"Retry-After": "1", "Connection": "close"}
            )
        raw = await read_body(request, self.settings.max_body_bytes)
        body = parse_body(raw, route, max_depth=self.settings.max_json_depth)
        model = body["model"]
        state["model"] = model
        if not principal.allows_model(model):
            raise ForbiddenError(f"this API key may not use model '{model}'")
        admission = await self.limiter.admit(principal)
        meter = RequestMeter(
            metrics=self.metrics,
            route=f"/v1/{route}",
            model=self.pool.label(model),
            key=principal.name if self.settings.metrics_per_key else ALL_KEYS,
            arrival=state.get("arrival", time.perf_counter()),
        )
        ending = _Ending(self, state, meter, admission)
        headers = upstream_request_headers(
            request.headers.items(), request_id=state.get("request_id", "-")
        )
        try:
            exchange = await self._connect(request, route, body, headers, ending)
            if body.get("stream", True):
                return RelayStreamResponse(
                    exchange, meter, admission.headers, ending.finish, self.lifecycle
                )
            result = await _until_disconnect(request.receive, lambda: _collect(exchange, meter))
        except ClientDisconnectedError:
            await ending.finish("client_disconnect", CLIENT_CLOSED_REQUEST)
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except BaseException as exc:
            await ending.finish(getattr(exc, "outcome", "error"), getattr(exc, "status_code", 500))
            raise
        await ending.finish("completed")
        content = encode_json(result)
        return Response(
            content, headers=admission.headers, media_type="application/json; charset=utf-8"
        )

    async def _connect(
        self,
        request: Request,
        route: Route,
        body: dict[str, Any],
        headers: dict[str, str],
        ending: _Ending,
    ) -> Exchange:
        """Open an exchange with the best upstream, failing over to the next ones.

        An upstream that fails before the first byte (after its own retries) is left for the
        next choice: unreachable, timed out, 5xx, or its queue full. A 4xx is the client's and
        is raised at once.

        Raises:
            GatewayError: the last upstream's failure, or 503 when none is available.
        """
        tried: set[str] = set()
        last: GatewayError | None = None
        while (upstream := self.pool.choose(str(body["model"]), tried)) is not None:
            if tried:
                self.metrics.upstream_failovers.inc()
            tried.add(upstream.name)
            ending.meter.upstream_timings = upstream.dialect.reports_timings
            exchange = Exchange(
                client=upstream.generation,
                dialect=upstream.dialect,
                route=route,
                body=body,
                headers=headers,
                settings=self.settings,
                meter=ending.meter,
            )
            ending.use(upstream, exchange)

            async def slot_then_open(exchange: Exchange = exchange) -> None:
                await ending.take_slot()
                await exchange.open()

            try:
                # One watcher for both waits: a task group per request, not two.
                await _until_disconnect(request.receive, slot_then_open)
            except (UpstreamError, ServiceUnavailableError) as exc:
                if exc.status_code < 500:
                    raise
                # An overloaded upstream (its queue, Ollama's 503) is not a broken one.
                broken = isinstance(exc, UpstreamError) and exc.status_code != 503
                await ending.release(healthy=False if broken else None)
                last = exc
                continue
            return exchange
        if last is not None:
            raise last
        cooldown = str(max(int(self.settings.circuit_cooldown), 1))
        raise ServiceUnavailableError(
            "no upstream is available: all are down or out of rotation",
            headers={"Retry-After": cooldown},
        )


class _Ending:
    """Everything a request must give back or record when it ends, exactly once."""

    def __init__(
        self, relay: Relay, state: dict[str, Any], meter: RequestMeter, admission: Admission
    ) -> None:
        self.relay = relay
        self.state = state
        self.meter = meter
        self.admission = admission
        self.upstream: Upstream | None = None
        self.exchange: Exchange | None = None
        self.holds_slot = False
        self.done = False

    def use(self, upstream: Upstream, exchange: Exchange) -> None:
        """Make `upstream` (just chosen, so counted in flight) and its `exchange` current."""
        self.upstream, self.exchange = upstream, exchange

    async def take_slot(self) -> None:
        """Wait for the current upstream's slot (the caller watches for the client leaving)."""
        assert self.upstream is not None  # noqa: S101
        self.holds_slot = await self.upstream.slots.acquire()

    async def release(self, healthy: bool | None) -> None:
        """Give the current upstream back: close the exchange, free the slot, tell the pool."""
        with anyio.CancelScope(shield=True):
            if self.exchange is not None:
                await self.exchange.aclose()
            if self.upstream is not None:
                if self.holds_slot:
                    self.upstream.slots.release()
                self.relay.pool.finished(self.upstream, healthy)
        self.holds_slot = False
        self.upstream = self.exchange = None

    async def finish(self, outcome: str, status: int | None = None) -> None:
        """Release the upstream, charge tokens, record metrics (shielded); once."""
        if self.done:
            return
        self.done = True
        healthy = {"completed": True, "client_error": True, "upstream_error": False}.get(outcome)
        if outcome == "timeout":
            healthy = False
        with anyio.CancelScope(shield=True):
            await self.release(healthy)
            summary = self.meter.finish(outcome, status)
            tokens = self.meter.input_tokens + self.meter.output_tokens
            await self.relay.limiter.release(self.admission, tokens)
        self.state["summary"] = summary


async def _collect(exchange: Exchange, meter: RequestMeter) -> dict[str, Any]:
    """Aggregate the whole stream for `stream:false` (reference section 2.4).

    Raises:
        GatewayError: the upstream failed mid-answer; nothing was sent yet, so the client gets a
            real status and the partial text is discarded, as Ollama does.
    """
    aggregator = Aggregator()
    async with aclosing(exchange.batches()) as batches:
        async for batch in batches:
            for chunk in batch:
                meter.observe(chunk)
                if not chunk.is_error:
                    aggregator.add(chunk)
    if exchange.failure is not None:
        raise exchange.failure
    return aggregator.result()


async def _until_disconnect(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    """Run `work` while watching for the client to go away; cancel it if it does.

    The body has been read already, so the next ASGI message can only be `http.disconnect`.

    Raises:
        ClientDisconnectedError: the client disconnected first (field failure F-13 a, b).
    """
    gone = False
    results: list[T] = []
    errors: list[Exception] = []

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(watch, group.cancel_scope)
        try:
            results.append(await work())
        except Exception as exc:  # re-raised below, unwrapped by the task group
            errors.append(exc)
        group.cancel_scope.cancel()
    if errors:
        raise errors[0]
    if gone:
        raise ClientDisconnectedError
    return results[0]

"""The flow of one generation request, from a checked body to the finished response.

read and check the body -> the key's model allow-list -> per-key limits (RPM, TPM, in-flight)
-> an upstream slot (bounded queue) -> open the upstream exchange (first-byte deadline) ->
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
import httpx
from fastapi import Request, Response
from starlette.types import Receive

from gateway.auth.principal import Principal
from gateway.errors import ForbiddenError, ServiceUnavailableError
from gateway.lifecycle import Lifecycle
from gateway.metrics import ALL_KEYS, Metrics
from gateway.ratelimit.limiter import Admission, KeyLimiter
from gateway.ratelimit.slots import UpstreamSlots
from gateway.relay.aggregate import Aggregator
from gateway.relay.body import parse_body, read_body
from gateway.relay.exchange import Exchange
from gateway.relay.meter import RequestMeter
from gateway.relay.response import RelayStreamResponse
from gateway.settings import Settings
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.dialect import Dialect, Route, encode_json
from gateway.upstream.headers import upstream_request_headers

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
    client: httpx.AsyncClient
    dialect: Dialect
    metrics: Metrics
    catalog: ModelCatalog
    limiter: KeyLimiter
    slots: UpstreamSlots
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
            model=self.catalog.label(model),
            key=principal.name if self.settings.metrics_per_key else ALL_KEYS,
            arrival=state.get("arrival", time.perf_counter()),
            upstream_timings=self.dialect.reports_timings,
        )
        exchange = Exchange(
            client=self.client,
            dialect=self.dialect,
            route=route,
            body=body,
            headers=upstream_request_headers(
                request.headers.items(), request_id=state.get("request_id", "-")
            ),
            settings=self.settings,
            meter=meter,
        )
        ending = _Ending(self, state, exchange, meter, admission)
        try:
            ending.holds_slot = await _until_disconnect(request.receive, self.slots.acquire)
            await _until_disconnect(request.receive, exchange.open)
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


class _Ending:
    """Everything a request must give back or record when it ends, exactly once."""

    def __init__(
        self,
        relay: Relay,
        state: dict[str, Any],
        exchange: Exchange,
        meter: RequestMeter,
        admission: Admission,
    ) -> None:
        self.relay = relay
        self.state = state
        self.exchange = exchange
        self.meter = meter
        self.admission = admission
        self.holds_slot = False
        self.done = False

    async def finish(self, outcome: str, status: int | None = None) -> None:
        """Close the upstream, release the slot, charge tokens, record metrics (shielded)."""
        if self.done:
            return
        self.done = True
        with anyio.CancelScope(shield=True):
            await self.exchange.aclose()
            if self.holds_slot:
                self.relay.slots.release()
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
    async with aclosing(exchange.stream()) as chunks:
        async for chunk in chunks:
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

"""The app-facing API: `POST /v1/generate`, `POST /v1/chat`, `GET /v1/models`.

Flow of a generation: authenticate (router dependency) -> read and check the body -> check the
key's model allow-list -> open the upstream exchange (first-byte deadline, watching for the
client going away) -> stream NDJSON, or aggregate for `stream:false` -> record metrics.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

import anyio
import httpx
from fastapi import APIRouter, Depends, Request, Response
from starlette.types import Receive

from gateway.auth.dependencies import PrincipalDep, require_principal
from gateway.auth.principal import Principal
from gateway.deps import CatalogDep, ClientDep, DialectDep, MetricsDep, SettingsDep
from gateway.errors import ForbiddenError, UpstreamUnavailableError
from gateway.metrics import ALL_KEYS
from gateway.relay.aggregate import Aggregator
from gateway.relay.body import parse_body, read_body
from gateway.relay.exchange import Exchange
from gateway.relay.meter import RequestMeter
from gateway.relay.response import RelayStreamResponse
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.dialect import Dialect, Route
from gateway.upstream.headers import upstream_request_headers

router = APIRouter(prefix="/v1", dependencies=[Depends(require_principal)])

T = TypeVar("T")

#: Status for a request whose client left before any byte was sent (nginx's convention; it is
#: only logged and counted, nobody is left to read it).
CLIENT_CLOSED_REQUEST = 499


class ClientDisconnectedError(Exception):
    """The client closed the connection before the response started."""


@router.post("/generate")
async def generate(
    request: Request,
    principal: PrincipalDep,
    settings: SettingsDep,
    client: ClientDep,
    dialect: DialectDep,
    metrics: MetricsDep,
    catalog: CatalogDep,
) -> Response:
    """Generate a completion (Ollama /api/generate body and answer)."""
    relay = _Relay(request, principal, settings, client, dialect, metrics, catalog)
    return await relay.handle("generate")


@router.post("/chat")
async def chat(
    request: Request,
    principal: PrincipalDep,
    settings: SettingsDep,
    client: ClientDep,
    dialect: DialectDep,
    metrics: MetricsDep,
    catalog: CatalogDep,
) -> Response:
    """Chat with a model (Ollama /api/chat body and answer)."""
    relay = _Relay(request, principal, settings, client, dialect, metrics, catalog)
    return await relay.handle("chat")


@router.get("/models")
async def list_models(principal: PrincipalDep, catalog: CatalogDep) -> dict[str, Any]:
    """List the models this key may use (OpenAI list shape)."""
    try:
        models = await catalog.models(refresh=True)
    except (httpx.HTTPError, ValueError) as exc:
        raise UpstreamUnavailableError("could not list the upstream's models") from exc
    data = [
        {"id": m.id, "object": "model", "created": m.created, "owned_by": m.owned_by or "gateway"}
        for m in models
        if principal.allows_model(m.id)
    ]
    return {"object": "list", "data": data}


class _Relay:
    """Serves one generation request; see the module docstring for the flow."""

    def __init__(
        self,
        request: Request,
        principal: Principal,
        settings: Any,
        client: httpx.AsyncClient,
        dialect: Dialect,
        metrics: Any,
        catalog: ModelCatalog,
    ) -> None:
        self.request = request
        self.principal = principal
        self.settings = settings
        self.client = client
        self.dialect = dialect
        self.metrics = metrics
        self.catalog = catalog
        self.state: dict[str, Any] = request.scope.setdefault("state", {})

    async def handle(self, route: Route) -> Response:
        raw = await read_body(self.request, self.settings.max_body_bytes)
        body = parse_body(raw, route, max_depth=self.settings.max_json_depth)
        model = body["model"]
        self.state["model"] = model
        if not self.principal.allows_model(model):
            raise ForbiddenError(f"this API key may not use model '{model}'")
        meter = RequestMeter(
            metrics=self.metrics,
            route=f"/v1/{route}",
            model=await self.catalog.label(model),
            key=self.principal.name if self.settings.metrics_per_key else ALL_KEYS,
            arrival=self.state.get("arrival", time.perf_counter()),
            upstream_timings=self.dialect.reports_timings,
        )
        exchange = Exchange(
            client=self.client,
            dialect=self.dialect,
            route=route,
            body=body,
            headers=upstream_request_headers(
                self.request.headers.items(), request_id=self.state.get("request_id", "-")
            ),
            settings=self.settings,
            meter=meter,
        )
        try:
            await _until_disconnect(self.request.receive, exchange.open)
            if body.get("stream", True):
                return RelayStreamResponse(exchange, meter, {}, self._log)
            result = await _until_disconnect(
                self.request.receive, lambda: _collect(exchange, meter)
            )
        except ClientDisconnectedError:
            await exchange.aclose()
            self._log(meter.finish("client_disconnect", CLIENT_CLOSED_REQUEST))
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except BaseException as exc:
            await exchange.aclose()
            outcome = getattr(exc, "outcome", "error")
            self._log(meter.finish(outcome, getattr(exc, "status_code", 500)))
            raise
        await exchange.aclose()
        self._log(meter.finish("completed"))
        content = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()
        return Response(content, media_type="application/json; charset=utf-8")

    def _log(self, summary: dict[str, Any]) -> None:
        """Hand the request's numbers to the access log middleware."""
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

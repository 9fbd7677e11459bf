"""`create_app`: builds the FastAPI app: routers, middleware, error handlers and `/metrics`.

The services its requests use are opened and closed by the lifespan (`gateway.lifespan`).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import httpx
from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from gateway import __version__
from gateway.api.admin.oidc import router as admin_oidc_router
from gateway.api.admin.page import router as admin_page_router
from gateway.api.admin.routes import router as admin_router
from gateway.api.anthropic.routes import generation_routes as anthropic_routes
from gateway.api.anthropic.routes import router as anthropic_router
from gateway.api.batch.routes import router as batch_router
from gateway.api.handlers import register_error_handlers
from gateway.api.health import router as health_router
from gateway.api.middleware.access import AccessMiddleware, UnexpectedErrorMiddleware
from gateway.api.middleware.cors import GatewayCORSMiddleware
from gateway.api.ollama import manage, models
from gateway.api.ollama.routes import generation_routes as ollama_routes
from gateway.api.openai.routes import generation_routes as openai_routes
from gateway.api.openai.routes import router as openai_router
from gateway.api.relayed import RelayedRoutes
from gateway.api.responses.routes import generation_routes as responses_routes
from gateway.api.responses.routes import router as responses_router
from gateway.deps import GatewayState
from gateway.lifecycle import Lifecycle
from gateway.lifespan import open_services
from gateway.metering.metrics import Metrics
from gateway.settings import Settings
from gateway.tracing.middleware import TracingMiddleware
from gateway.tracing.provider import open_tracing
from gateway.wire.budget import BodyBudget, BodyBudgetMiddleware

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter


#: `FastAPI(telemetry=...)`: the gateway's own tracing is the one (`gateway.tracing`).
_NO_FASTAPI_TELEMETRY: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
    # `FASTAPI_OTEL_AUTO_CONFIGURE=true` (with an OTLP endpoint) would set up exporters at start.
    "auto_configure": False,
}


def create_app(
    settings: Settings | None = None,
    *,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    lifecycle: Lifecycle | None = None,
    span_exporter: SpanExporter | None = None,
    metrics: Metrics | None = None,
) -> FastAPI:
    """Build the gateway app.

    Args:
        settings: Configuration; None reads `GATEWAY_*` variables and `.env`.
        upstream_transport: An httpx transport for the upstream client (tests).
        lifecycle: The drain state shared with `gateway serve` (`gateway.lifecycle`); None
            makes one that only the app itself can change.
        span_exporter: Export trace spans there (tests: the SDK's `InMemorySpanExporter`),
            tracing on whatever the settings say; None: `open_tracing` decides
            (`gateway.tracing.provider`).
        metrics: The metrics to record into and export at `/metrics`; None makes them.
            `gateway serve` passes the ones its door counts into (`gateway.serve.server`).

    Returns:
        The app. Its lifespan (`gateway.lifespan`) opens one client per upstream, the key
        store (bringing the database to this code's schema: `gateway.db.migrate`) and the usage
        sink on the store's database, and closes them on shutdown (the sink after writing what
        is pending).
    """
    settings = settings or Settings()
    lifecycle = lifecycle or Lifecycle()
    metrics = metrics or Metrics()
    # Built here, not in the lifespan: the middleware below exists only when tracing is on.
    tracing = open_tracing(settings, exporter=span_exporter)

    def lifespan(_: FastAPI) -> AbstractAsyncContextManager[GatewayState]:
        return open_services(
            settings,
            metrics=metrics,
            lifecycle=lifecycle,
            tracing=tracing,
            upstream_transport=upstream_transport,
        )

    app = FastAPI(
        title="LLM gateway",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,  # a redirect would be built from the client's Host header
        # FastAPI's own OpenTelemetry (0.165) would trace, meter and log every request as soon
        # as any global provider is set (`opentelemetry-instrument`, a library): spans beside
        # the gateway's (`gateway.tracing`), unhandled exceptions' messages and stack traces
        # in logs (which may quote a body), and three provider look-ups on every request.
        telemetry=_NO_FASTAPI_TELEMETRY,
    )
    register_error_handlers(app, metrics, metrics_per_key=settings.metrics_per_key)
    generation = [*ollama_routes, *openai_routes, *responses_routes, *anthropic_routes]
    app.router.routes.extend(generation)
    app.include_router(openai_router)
    app.include_router(responses_router)
    app.include_router(anthropic_router)
    app.include_router(batch_router)
    for router in (models.public_router, models.router, manage.router):
        app.include_router(router)
    app.include_router(health_router)
    app.include_router(admin_router)
    app.include_router(admin_oidc_router)
    app.include_router(admin_page_router)
    app.add_route("/metrics", metrics.endpoint, methods=["GET"], include_in_schema=False)
    # Added innermost first. AccessMiddleware stamps and logs every request, the preflights the
    # CORS layer answers included; that layer adds its headers to every response inside it:
    # the error handlers' and UnexpectedErrorMiddleware's 500, which is why that sits inside.
    # Innermost: the generation routes' POSTs, past FastAPI's own layers (`RelayedRoutes`);
    # inside the body budget, whose charge is released once the app is done with a request.
    budget = BodyBudget(
        settings.max_buffered_body_bytes,
        settings.max_buffered_body_bytes_per_key,
        metrics.buffered_body_bytes,
        grace=settings.body_timeout,
        min_rate=settings.body_min_bytes_per_second,
    )
    app.add_middleware(RelayedRoutes, routes=generation, handlers=app.exception_handlers)
    app.add_middleware(BodyBudgetMiddleware, budget=budget)
    app.add_middleware(UnexpectedErrorMiddleware, rejections=metrics)
    if settings.cors_origins:
        app.add_middleware(GatewayCORSMiddleware, allow_origins=settings.cors_origins)
    if tracing is not None:  # inside AccessMiddleware: the request id is known
        app.add_middleware(TracingMiddleware, tracing=tracing)
    app.add_middleware(AccessMiddleware, trusted_proxies=settings.trusted_proxy_networks)
    return app

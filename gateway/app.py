"""`create_app`: builds the FastAPI app, its lifespan resources and its wiring."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import httpx
from fastapi import FastAPI

from gateway import __version__
from gateway.api.admin.routes import router as admin_router
from gateway.api.batch.routes import ENDPOINTS as BATCH_ENDPOINTS
from gateway.api.batch.routes import router as batch_router
from gateway.api.health import router as health_router
from gateway.api.middleware.access import AccessMiddleware, UnexpectedErrorMiddleware
from gateway.api.middleware.cors import GatewayCORSMiddleware
from gateway.api.ollama import manage, models
from gateway.api.ollama.routes import generation_routes as ollama_routes
from gateway.api.openai.routes import generation_routes as openai_routes
from gateway.api.openai.routes import router as openai_router
from gateway.auth.authenticator import KeyAuthenticator
from gateway.auth.jwt import AdminTokenVerifier
from gateway.batch.batches import BatchStore
from gateway.batch.files import FileStore
from gateway.batch.finalize import Finalizer
from gateway.batch.queue import LineQueue
from gateway.batch.runner import BatchRunner
from gateway.deps import GatewayState
from gateway.errors import register_error_handlers
from gateway.keys.store import KeyStore
from gateway.lifecycle import Lifecycle
from gateway.limits.address import AddressLimiter
from gateway.limits.limiter import KeyLimiter, build_storage, close_storage
from gateway.metering.metrics import Metrics
from gateway.metering.usage import open_usage
from gateway.relay.pipeline import Relay
from gateway.settings import Settings
from gateway.tracing.middleware import TracingMiddleware
from gateway.tracing.provider import open_tracing
from gateway.upstream.pool import open_pool
from gateway.wire.budget import BodyBudget, BodyBudgetMiddleware

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter


def create_app(
    settings: Settings | None = None,
    *,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    lifecycle: Lifecycle | None = None,
    span_exporter: SpanExporter | None = None,
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

    Returns:
        The app. Its lifespan opens one client per upstream, the key store (bringing the
        database to this code's schema: `gateway.db.migrate`) and the usage sink on the store's
        database, and closes them on shutdown (the sink after writing what is pending).
    """
    settings = settings or Settings()
    lifecycle = lifecycle or Lifecycle()
    metrics = Metrics()
    # Built here, not in the lifespan: the middleware below exists only when tracing is on.
    tracing = open_tracing(settings, exporter=span_exporter)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[GatewayState]:
        store = KeyStore.from_url(settings.database_url)
        try:
            await store.create_schema(auto_upgrade=settings.database_auto_upgrade)
            await store.warm_up()
        except BaseException:
            await store.close()  # a refused database leaves no connection open
            raise
        limit_storage = build_storage(settings)
        async with AsyncExitStack() as stack:
            # Closed last, in this order: the usage sink's final flush (below) needs the store.
            stack.push_async_callback(close_storage, limit_storage)
            stack.push_async_callback(store.close)
            if tracing is not None:  # closed after the last request's spans have ended
                stack.push_async_callback(tracing.aclose)
            pool = await open_pool(settings, metrics, stack, upstream_transport)
            # Left when the lifespan ends, after uvicorn finished the in-flight requests: the
            # last summaries are in, and the sink writes them before the store closes.
            usage = await stack.enter_async_context(
                open_usage(
                    store.engine,
                    metrics.registry,
                    enabled=settings.usage_enabled,
                    flush_seconds=settings.usage_flush_seconds,
                    max_rows=settings.usage_max_pending_rows,
                )
            )
            admin_verifier = AdminTokenVerifier.from_settings(settings)
            if admin_verifier is not None:
                stack.push_async_callback(admin_verifier.aclose)
            limiter = KeyLimiter(limit_storage, settings, metrics)
            stack.push_async_callback(limiter.aclose)
            relay = Relay(
                settings=settings,
                metrics=metrics,
                pool=pool,
                limiter=limiter,
                lifecycle=lifecycle,
                usage=usage,
                tracing=tracing,
            )
            files = FileStore(store.engine, settings.batch_storage_dir or None)
            batches = BatchStore(store.engine)
            runner = None
            if settings.batch_worker:
                runner = BatchRunner(
                    LineQueue(store.engine),
                    Finalizer(store.engine, files),
                    store,
                    relay,
                    BATCH_ENDPOINTS,
                    metrics,
                )
            async with anyio.create_task_group() as background:
                for upstream in pool.upstreams:
                    background.start_soon(upstream.monitor.run)
                background.start_soon(limiter.run)
                if runner is not None:
                    background.start_soon(runner.run)
                yield GatewayState(
                    settings=settings,
                    authenticator=KeyAuthenticator(
                        store,
                        ttl=settings.key_cache_seconds,
                        last_used_interval=settings.last_used_interval,
                    ),
                    address_limiter=AddressLimiter(limit_storage, settings, metrics),
                    metrics=metrics,
                    pool=pool,
                    relay=relay,
                    lifecycle=lifecycle,
                    keys=store,
                    admin_verifier=admin_verifier,
                    files=files,
                    batches=batches,
                    batch_runner=runner,
                )
                if runner is not None:
                    await runner.stop()
                background.cancel_scope.cancel()

    app = FastAPI(
        title="LLM gateway",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,  # a redirect would be built from the client's Host header
    )
    register_error_handlers(app)
    app.router.routes.extend([*ollama_routes, *openai_routes])
    app.include_router(openai_router)
    app.include_router(batch_router)
    for router in (models.public_router, models.router, manage.router):
        app.include_router(router)
    app.include_router(health_router)
    app.include_router(admin_router)
    app.add_route("/metrics", metrics.endpoint, methods=["GET"], include_in_schema=False)
    # Added innermost first. AccessMiddleware stamps and logs every request, the preflights the
    # CORS layer answers included; that layer adds its headers to every response inside it:
    # the error handlers' and UnexpectedErrorMiddleware's 500, which is why that sits inside.
    # Innermost: each request's body charge is released once the app is done with it.
    budget = BodyBudget(
        settings.max_buffered_body_bytes,
        settings.max_buffered_body_bytes_per_key,
        metrics.buffered_body_bytes,
        grace=settings.body_timeout,
        min_rate=settings.body_min_bytes_per_second,
    )
    app.add_middleware(BodyBudgetMiddleware, budget=budget)
    app.add_middleware(UnexpectedErrorMiddleware)
    if settings.cors_origins:
        app.add_middleware(GatewayCORSMiddleware, allow_origins=settings.cors_origins)
    if tracing is not None:  # inside AccessMiddleware: the request id is known
        app.add_middleware(TracingMiddleware, tracing=tracing)
    app.add_middleware(AccessMiddleware, trusted_proxies=settings.trusted_proxy_networks)
    return app

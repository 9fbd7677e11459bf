"""The app's lifespan: opens the services in order, yields them as a `GatewayState`, closes them.

Order of opening: the key store (bringing the database to this code's schema), the limit
storage, tracing, one client per upstream (`open_pool`), the usage sink, the admin token
verifier and the web page's single sign-on client, the key limiter, the relay, the batch tables
and runner; then the background tasks (upstream monitors, the limiter's loop, the batch
runner). Closing runs backwards: the runner hands its lines back first, the usage sink writes
what is pending before the key store closes, and the limit storage closes last.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import httpx

from gateway.api.batch.routes import ENDPOINTS as BATCH_ENDPOINTS
from gateway.auth.authenticator import KeyAuthenticator
from gateway.auth.jwt import AdminTokenVerifier
from gateway.auth.oidc import OidcClient
from gateway.batch.batches import BatchStore
from gateway.batch.files import FileStore
from gateway.batch.finalize import Finalizer
from gateway.batch.queue import LineQueue
from gateway.batch.runner import BatchRunner
from gateway.deps import GatewayState
from gateway.keys.store import KeyStore
from gateway.lifecycle import Lifecycle
from gateway.limits.address import AddressLimiter
from gateway.limits.limiter import KeyLimiter
from gateway.limits.storage import build_storage, close_storage
from gateway.metering.metrics import Metrics
from gateway.metering.usage import open_usage
from gateway.policies import AuthFailurePolicy, BatchPolicy, LimitPolicy, PoolPolicy
from gateway.relay.pipeline import Relay
from gateway.settings import Settings
from gateway.tracing.spans import Tracing
from gateway.upstream.pool import open_pool


@asynccontextmanager
async def open_services(
    settings: Settings,
    *,
    metrics: Metrics,
    lifecycle: Lifecycle,
    tracing: Tracing | None,
    upstream_transport: httpx.AsyncBaseTransport | None,
) -> AsyncIterator[GatewayState]:
    """Open every service the app's requests use; close them when the block ends.

    Args:
        settings: The app's configuration.
        metrics: The app's metrics (built with the app: `/metrics` is mounted before start-up).
        lifecycle: The drain state shared with `gateway serve`.
        tracing: The app's tracing, closed here after the last request's spans ended; None
            when tracing is off.
        upstream_transport: An httpx transport for the upstream clients (tests).

    Yields:
        The state Starlette copies into each request's `request.state` (`gateway.deps`).

    Raises:
        Whatever the database raises at start-up (unreachable, a schema it will not upgrade):
        the key store is closed first, so a refused start-up leaves no connection open.
    """
    store = KeyStore.from_url(settings.database_url)
    try:
        await store.create_schema(auto_upgrade=settings.database_auto_upgrade)
        await store.warm_up()
    except BaseException:
        await store.close()  # a refused database leaves no connection open
        raise
    limits = LimitPolicy.of(settings)
    limit_storage = build_storage(limits)
    async with AsyncExitStack() as stack:
        # Closed last, in this order: the usage sink's final flush (below) needs the store.
        stack.push_async_callback(close_storage, limit_storage)
        stack.push_async_callback(store.close)
        if tracing is not None:  # closed after the last request's spans have ended
            stack.push_async_callback(tracing.aclose)
        pool = await open_pool(PoolPolicy.of(settings), metrics, stack, upstream_transport)
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
        admin_oidc = OidcClient.from_settings(settings)  # the web page's single sign-on
        if admin_oidc is not None:
            stack.push_async_callback(admin_oidc.aclose)
        limiter = KeyLimiter(limit_storage, limits, metrics)
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
                BatchPolicy.of(settings),
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
                address_limiter=AddressLimiter(
                    limit_storage, AuthFailurePolicy.of(settings), metrics
                ),
                metrics=metrics,
                pool=pool,
                relay=relay,
                lifecycle=lifecycle,
                keys=store,
                admin_verifier=admin_verifier,
                admin_oidc=admin_oidc,
                files=files,
                batches=batches,
                batch_runner=runner,
            )
            if runner is not None:
                await runner.stop()
            background.cancel_scope.cancel()

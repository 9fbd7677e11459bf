"""Async dependency getters for the lifespan state, and their `Annotated` aliases.

The lifespan (`gateway.lifespan`) yields a `GatewayState`; Starlette copies it into each request's
`request.state`. Handlers reach it only through these getters (STYLE section 4).
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import Depends, Request

from gateway.auth.authenticator import KeyAuthenticator
from gateway.auth.jwt import AdminTokenVerifier
from gateway.auth.oidc import OidcClient
from gateway.batch.batches import BatchStore
from gateway.batch.files import FileStore
from gateway.batch.runner import BatchRunner
from gateway.keys.store import KeyStore
from gateway.lifecycle import Lifecycle
from gateway.limits.address import AddressLimiter
from gateway.metering.metrics import Metrics
from gateway.relay.pipeline import Relay
from gateway.settings import Settings
from gateway.upstream.pool import UpstreamPool


class GatewayState(TypedDict):
    """What the lifespan opens and closes."""

    settings: Settings
    authenticator: KeyAuthenticator
    address_limiter: AddressLimiter
    metrics: Metrics
    pool: UpstreamPool
    relay: Relay
    lifecycle: Lifecycle
    keys: KeyStore
    admin_verifier: AdminTokenVerifier | None
    admin_oidc: OidcClient | None
    files: FileStore
    batches: BatchStore
    batch_runner: BatchRunner | None


async def get_settings(request: Request) -> Settings:
    """Return the app's settings."""
    settings: Settings = request.state.settings
    return settings


async def get_authenticator(request: Request) -> KeyAuthenticator:
    """Return the key authenticator (the key store behind its cache)."""
    authenticator: KeyAuthenticator = request.state.authenticator
    return authenticator


async def get_address_limiter(request: Request) -> AddressLimiter:
    """Return the per-address budget of failed authentications."""
    limiter: AddressLimiter = request.state.address_limiter
    return limiter


async def get_keys(request: Request) -> KeyStore:
    """Return the key store (the admin API's; app requests go through the authenticator)."""
    keys: KeyStore = request.state.keys
    return keys


async def get_metrics(request: Request) -> Metrics:
    """Return the app's metrics."""
    metrics: Metrics = request.state.metrics
    return metrics


async def get_relay(request: Request) -> Relay:
    """Return the relay (the services a generation request needs)."""
    relay: Relay = request.state.relay
    return relay


async def get_lifecycle(request: Request) -> Lifecycle:
    """Return the drain state."""
    lifecycle: Lifecycle = request.state.lifecycle
    return lifecycle


async def get_pool(request: Request) -> UpstreamPool:
    """Return the upstream pool."""
    pool: UpstreamPool = request.state.pool
    return pool


SettingsDep = Annotated[Settings, Depends(get_settings)]
AuthenticatorDep = Annotated[KeyAuthenticator, Depends(get_authenticator)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
KeysDep = Annotated[KeyStore, Depends(get_keys)]
RelayDep = Annotated[Relay, Depends(get_relay)]
PoolDep = Annotated[UpstreamPool, Depends(get_pool)]
LifecycleDep = Annotated[Lifecycle, Depends(get_lifecycle)]

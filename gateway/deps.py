"""Async dependency getters for the lifespan state, and their `Annotated` aliases.

The lifespan (`gateway.app`) yields a `GatewayState`; Starlette copies it into each request's
`request.state`. Handlers reach it only through these getters (STYLE section 4).
"""

from __future__ import annotations

from typing import Annotated, TypedDict

import httpx
from fastapi import Depends, Request

from gateway.keys.store import KeyStore
from gateway.lifecycle import Lifecycle
from gateway.metrics import Metrics
from gateway.relay.pipeline import Relay
from gateway.settings import Settings
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.dialect import Dialect
from gateway.upstream.monitor import UpstreamMonitor


class GatewayState(TypedDict):
    """What the lifespan opens and closes."""

    settings: Settings
    client: httpx.AsyncClient
    store: KeyStore
    metrics: Metrics
    dialect: Dialect
    catalog: ModelCatalog
    monitor: UpstreamMonitor
    relay: Relay
    lifecycle: Lifecycle


async def get_settings(request: Request) -> Settings:
    """Return the app's settings."""
    settings: Settings = request.state.settings
    return settings


async def get_client(request: Request) -> httpx.AsyncClient:
    """Return the shared upstream client."""
    client: httpx.AsyncClient = request.state.client
    return client


async def get_store(request: Request) -> KeyStore:
    """Return the key store."""
    store: KeyStore = request.state.store
    return store


async def get_metrics(request: Request) -> Metrics:
    """Return the app's metrics."""
    metrics: Metrics = request.state.metrics
    return metrics


async def get_dialect(request: Request) -> Dialect:
    """Return the upstream dialect."""
    dialect: Dialect = request.state.dialect
    return dialect


async def get_catalog(request: Request) -> ModelCatalog:
    """Return the upstream model catalog."""
    catalog: ModelCatalog = request.state.catalog
    return catalog


async def get_monitor(request: Request) -> UpstreamMonitor:
    """Return the upstream monitor."""
    monitor: UpstreamMonitor = request.state.monitor
    return monitor


async def get_relay(request: Request) -> Relay:
    """Return the relay (the services a generation request needs)."""
    relay: Relay = request.state.relay
    return relay


async def get_lifecycle(request: Request) -> Lifecycle:
    """Return the drain state."""
    lifecycle: Lifecycle = request.state.lifecycle
    return lifecycle


SettingsDep = Annotated[Settings, Depends(get_settings)]
ClientDep = Annotated[httpx.AsyncClient, Depends(get_client)]
KeyStoreDep = Annotated[KeyStore, Depends(get_store)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
DialectDep = Annotated[Dialect, Depends(get_dialect)]
CatalogDep = Annotated[ModelCatalog, Depends(get_catalog)]
MonitorDep = Annotated[UpstreamMonitor, Depends(get_monitor)]
RelayDep = Annotated[Relay, Depends(get_relay)]
LifecycleDep = Annotated[Lifecycle, Depends(get_lifecycle)]

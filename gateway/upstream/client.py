"""The one shared httpx client per app, with explicit timeouts and pool limits (STYLE section 5)."""

from __future__ import annotations

from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx

from gateway.metrics import Metrics
from gateway.settings import Settings, UpstreamSpec
from gateway.upstream.transport import AiohttpTransport


def upstream_timeout(settings: Settings) -> httpx.Timeout:
    """Return httpx's per-socket-operation timeouts for upstream calls, in seconds.

    httpx's read timeout applies to every socket read, including the wait for the response
    headers, which Ollama sends only with the first token (reference section 1). It is set to
    the longer of the first-byte and idle timeouts as a backstop; the relay enforces each of the
    two precisely with its own deadline.
    """
    read = max(settings.first_byte_timeout, settings.idle_timeout)
    return httpx.Timeout(
        connect=settings.connect_timeout,
        read=read,
        write=settings.idle_timeout,
        pool=settings.connect_timeout,
    )


def upstream_default_headers(spec: UpstreamSpec) -> dict[str, str]:
    """Headers on every upstream call (generation, model list, readiness probe).

    `Host` defaults to the upstream URL's host:port (httpx derives it), which passes Ollama's
    loopback Host gate (reference section 6.8); the upstream's `host_header`
    (`GATEWAY_UPSTREAM_HOST_HEADER`) overrides it.
    `Authorization` carries the gateway's own upstream credential, if one is configured.
    `Accept-Encoding: identity` spares decompressing token streams.
    """
    headers = {"accept-encoding": "identity", "user-agent": "llm-gateway"}
    if spec.host_header:
        headers["host"] = spec.host_header
    if spec.api_key is not None:
        headers["authorization"] = f"Bearer {spec.api_key.get_secret_value()}"
    return headers


def build_upstream_client(
    spec: UpstreamSpec,
    settings: Settings,
    transport: httpx.AsyncBaseTransport | None = None,
    metrics: Metrics | None = None,
) -> httpx.AsyncClient:
    """Build the upstream client: base URL, timeouts, pool limits; never `timeout=None`.

    Args:
        spec: The upstream (URL, credential, Host override).
        settings: Gateway settings (timeouts in seconds, `max_connections`).
        transport: A transport for tests (for example `httpx.MockTransport`); None uses the
            one `GATEWAY_UPSTREAM_HTTP_CLIENT` names (`AiohttpTransport` by default).
        metrics: Where the aiohttp transport keeps `gateway_upstream_connections_in_use`.

    Returns:
        An `httpx.AsyncClient` the app's lifespan closes.
    """
    limits = httpx.Limits(
        max_connections=settings.max_connections,
        max_keepalive_connections=settings.max_connections,
        keepalive_expiry=30.0,
    )
    return httpx.AsyncClient(
        base_url=spec.base,
        # Never keep upstream cookies: one client serves every tenant, and a cookie set by an
        # upstream or a proxy in front of it would be replayed on everyone's requests.
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
        headers=upstream_default_headers(spec),
        timeout=upstream_timeout(settings),
        limits=limits,
        transport=transport or _default_transport(spec, settings, limits, metrics),
        follow_redirects=False,
        trust_env=False,
    )


def _default_transport(
    spec: UpstreamSpec, settings: Settings, limits: httpx.Limits, metrics: Metrics | None
) -> httpx.AsyncBaseTransport:
    """Return the transport `GATEWAY_UPSTREAM_HTTP_CLIENT` names: aiohttp (default) or httpcore.

    aiohttp costs half the CPU per relayed chunk (`gateway.upstream.transport`).
    """
    if settings.upstream_http_client == "aiohttp":
        in_use = metrics.upstream_connections_in_use.labels(spec.name) if metrics else None
        return AiohttpTransport(limits, in_use)
    return httpx.AsyncHTTPTransport(limits=limits)

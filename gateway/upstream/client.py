"""The one shared httpx client per app, with explicit timeouts and pool limits (STYLE section 5)."""

from __future__ import annotations

import httpx

from gateway.settings import Settings


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


def build_upstream_client(
    settings: Settings, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """Build the upstream client: base URL, timeouts, pool limits; never `timeout=None`.

    Args:
        settings: Gateway settings (upstream URL, timeouts in seconds, `max_connections`).
        transport: A transport for tests (for example `httpx.MockTransport`); None uses a
            real `AsyncHTTPTransport`.

    Returns:
        An `httpx.AsyncClient` the app's lifespan closes.
    """
    limits = httpx.Limits(
        max_connections=settings.max_connections,
        max_keepalive_connections=settings.max_connections,
        keepalive_expiry=30.0,
    )
    return httpx.AsyncClient(
        base_url=settings.upstream_base,
        timeout=upstream_timeout(settings),
        limits=limits,
        transport=transport or httpx.AsyncHTTPTransport(limits=limits),
        follow_redirects=False,
        trust_env=False,
    )

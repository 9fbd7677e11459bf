"""Routes that hand their requests to the relay: one pipeline, many names.

They are plain Starlette routes that call the same getters FastAPI would inject: FastAPI's
dependency solver and its request wrapper cost about 60 µs of CPU per request
(docs/performance.md), on the path every token's TTFT waits for. Errors raised in them go
through the app's error handlers like any other route's.
"""

from __future__ import annotations

from fastapi import Request, Response
from starlette.routing import Route

from gateway.api.auth import require_principal
from gateway.deps import get_authenticator, get_relay
from gateway.relay.surface import Endpoint


def relayed(path: str, endpoint: Endpoint) -> Route:
    """A POST route at `path` that hands its requests to the relay with `endpoint`."""

    async def handle(request: Request) -> Response:
        principal = await require_principal(request, await get_authenticator(request))
        return await (await get_relay(request)).handle(request, principal, endpoint)

    handle.__name__ = handle.__qualname__ = path.strip("/").replace("/", "_")
    return Route(path, handle, methods=["POST"])

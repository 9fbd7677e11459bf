"""The admin API's request bodies: read only for a valid token, and within a small limit.

FastAPI reads a route's body before it runs the route's dependencies, so before the admin token
would be checked: an anonymous client could make the gateway buffer and parse a body only to be
told 401 (or 404 with the admin API off). `BoundedBodyRoute` (the admin router's `route_class`)
therefore checks first that the admin API exists (404) and the token (401, 429 past the
address's budget: `gateway.api.admin.auth`), then reads the body itself with
`gateway.wire.body.read_body` (413 past `MAX_ADMIN_BODY_BYTES`, by the declared
`Content-Length` at once) and hands FastAPI a request that replays those bytes. A refused
request's body is never read.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message

from gateway.api.admin.auth import get_verifier, require_admin_identity
from gateway.wire.body import read_body

MAX_ADMIN_BODY_BYTES = 1024 * 1024
"""Largest admin request body: a key with the longest allow-list the store accepts (1,000
model names of 200 characters) fits five times over."""


class BoundedBodyRoute(APIRoute):
    """An `APIRoute` whose body is read within `MAX_ADMIN_BODY_BYTES` before FastAPI sees it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, behind the token check and the bounded read.

        Raises:
            gateway.errors.NotFoundError: the admin API is off (404).
            gateway.errors.UnauthorizedError: no valid admin token (401; 429 past the budget).
            gateway.errors.PayloadTooLargeError: the body is larger than the limit (413).
            gateway.errors.ClientClosedRequestError: the client left while sending it.
        """
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            await require_admin_identity(request, await get_verifier(request))
            body = await read_body(request, MAX_ADMIN_BODY_BYTES)
            replayed = False

            async def receive() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await request.receive()  # after the body: the disconnect, if any

            return await handler(Request(request.scope, receive))

        return bounded

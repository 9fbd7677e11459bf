"""Routes that hand their requests to the relay: one pipeline, many names, and their fast path.

They are plain Starlette routes that call the same getters FastAPI would inject: FastAPI's
dependency solver and its request wrapper cost about 60 µs of CPU per request
(docs/performance.md), on the path every token's TTFT waits for.

`RelayedRoutes`, the innermost middleware, sends a `POST` to one of these paths straight to its
route's handler: past FastAPI's own layers (`ExceptionMiddleware`, `AsyncExitStackMiddleware`
and the router's matching and request wrapper), which these routes use nothing of and which
cost about 0.1 ms of CPU per request (docs/performance.md, "Per request"). Every layer of
the gateway's own stays around it: the access log, tracing, CORS, the unexpected-error 500 and
the body budget (`gateway.app`). An error the handler raises is rendered by the handler the app
registered for it (`gateway.api.handlers`), as Starlette's `ExceptionMiddleware` would; any
other method or path goes through the app as before (a `GET` gets the router's 405).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import Request, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

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


class RelayedRoutes:
    """Pure ASGI: runs a `POST` to a relayed route's path without FastAPI's layers.

    Args:
        app: The app inside (FastAPI's stack and router), for every other request.
        routes: The plain `POST` routes to serve directly (`relayed`, and the other surfaces'
            generation routes); each path without parameters. They stay in the app's router
            too, which answers their other methods (405) and names them in `route_label`.
        handlers: The app's exception handlers by exception class (`FastAPI.exception_handlers`,
            filled by `register_error_handlers`); read when an error is raised.
    """

    def __init__(
        self,
        app: ASGIApp,
        routes: Sequence[Route],
        handlers: Mapping[Any, Callable[[Request, Exception], Any]],
    ) -> None:
        self.app = app
        self.routes = {route.path: route for route in routes if route.methods == {"POST"}}
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the route's handler and its response; render what it raises before the start."""
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        # What the router would have noted: `route_label` reads the matched route from here.
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        request = Request(scope, receive, send)
        response: Response | None = None
        try:
            response = await route.endpoint(request)
            await response(scope, receive, send)
        except Exception as exc:
            handler = self._handler(exc)
            # A response that has sent its start cannot send another (a `RelayResponse` raises
            # only before its first byte): the unexpected-error middleware logs what is left.
            if handler is None or getattr(response, "started", False):
                raise
            answer = await handler(request, exc)
            await answer(scope, receive, send)

    def _handler(self, exc: Exception) -> Callable[[Request, Exception], Any] | None:
        """The registered handler of `exc`'s nearest class, as Starlette looks it up."""
        for cls in type(exc).__mro__:
            handler = self.handlers.get(cls)
            if handler is not None:
                return handler
        return None

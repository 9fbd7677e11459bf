"""`route_label`: the route a request matched, as the bounded `route` value of metrics and logs.

A label must never be the raw path: every distinct value is a new Prometheus series and a new
value in the log's `route` field, and a client chooses the path freely (`/v1/<anything>`). The
label is the matched route's path template (`/v1/models/{model}`, never `/v1/models/llama3`), so
the set of values is the app's route table plus `other`, whatever clients send.

How the matched route is found, for both kinds of route the app holds:

- FastAPI's `APIRoute` puts itself in the scope (`scope["route"]`) when it matches, its path with
  the router's prefix included;
- a plain Starlette `Route` (the generation routes, kept plain for speed: `gateway.api.relayed`)
  leaves only its endpoint (`scope["endpoint"]`) under the router FastAPI runs, so the label is
  the path of the app's route that holds that endpoint and matches the request.

Both also hold for a method that the route does not accept (a 405: a partial match). Anything the
router did not match, and a request answered before the router ran (a CORS preflight), is
`other`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import Scope

#: The `route` label of a request that matched no route.
OTHER_ROUTE = "other"

#: A path parameter's converter (`{model:path}`): left out of labels, `{model}` names it.
_CONVERTER = re.compile(r"\{(\w+):\w+\}")


def _template(path: str) -> str:
    """`path` with its parameters' converters dropped: `/v1/models/{model}`."""
    return _CONVERTER.sub(r"{\1}", path) if ":" in path else path


def route_label(scope: Scope) -> str:
    """The path template of the route that matched the request, or `OTHER_ROUTE`.

    Args:
        scope: The request's ASGI scope, after the router has run (an error handler, or a
            middleware once the app has returned).

    Returns:
        A path template from the app's route table (`/v1/chat`, `/v1/models`), or `other`;
        never the request's own path.
    """
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return _template(path)
    endpoint = scope.get("endpoint")
    if endpoint is None:
        return OTHER_ROUTE
    # Only routes with this endpoint are tried (one, unless two paths share a handler), and
    # `matches` picks the one this path matched when they do.
    for route in getattr(scope.get("router"), "routes", ()):
        if getattr(route, "endpoint", None) is endpoint and route.matches(scope)[0] != Match.NONE:
            path = getattr(route, "path", None)
            return _template(path) if isinstance(path, str) else OTHER_ROUTE
    return OTHER_ROUTE


#: The methods a 405's `Allow` may name: RFC 9110's and PATCH (RFC 5789), but CONNECT and TRACE.
_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(scope: Scope, routes: Sequence[BaseRoute]) -> list[str]:
    """Every method `routes` accept on `scope`'s path, sorted: a 405's `Allow`.

    RFC 9110 section 15.5.6: a 405 lists the target's supported methods. Starlette's router
    answers with the methods of the first route whose path matched, and a path served by two
    routes (`GET` and `POST /v1/files`, one route each) listed only one of them. Each method
    is asked of the routes' public `matches`, so FastAPI's included routers are asked too.

    Args:
        scope: The request's ASGI scope.
        routes: The app's routes (`app.router.routes`).
    """
    allowed = []
    for method in _METHODS:
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in routes):
            allowed.append(method)
    return allowed

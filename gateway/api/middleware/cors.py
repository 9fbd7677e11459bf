"""CORS for browser apps on other sites: the gateway's policy on Starlette's `CORSMiddleware`.

Off unless `GATEWAY_CORS_ORIGINS` lists origins. Starlette's middleware does the protocol (the
Fetch standard's "CORS protocol"; MDN, "Cross-Origin Resource Sharing"): it answers preflights
itself, so a preflight never needs an API key, adds `Access-Control-Allow-Origin: <origin>` and
`Vary: Origin` to every response for a listed origin, error responses included, and touches only
the start of a response, so streams pass through unbuffered. `GatewayCORSMiddleware` sets the
gateway's policy and changes two things:

- only the API gets CORS (`/v1/`, `/api/`). `/metrics`, `/healthz` and `/readyz` never do: they
  are meant for the private network (docs/security.md), and a CORS header would let any listed
  site (with `*`: any site) read them through the browser of a visitor inside that network;
- a preflight from an origin not listed gets Starlette's 400 `Disallowed CORS origin` without
  any `Access-Control-*` header (Starlette would still send the allowed methods and headers).

Credentials mode is never on: the gateway authenticates with a key the app sends in a header,
not with cookies, so `Access-Control-Allow-Credentials` is never sent, with `*` neither.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

#: Paths that get CORS: the app-facing API, today's `/v1/` and the Ollama-shaped `/api/`.
API_PREFIXES = ("/v1/", "/api/")

#: Methods a listed origin may use (OPTIONS is the preflight itself).
ALLOWED_METHODS = ("GET", "POST", "DELETE", "HEAD")

#: Request headers a listed origin may send: the gateway's two key headers
#: (`gateway.api.auth.presented_key`), `X-Request-ID`, and what the Ollama and OpenAI
#: browser SDKs add (the list Ollama itself allows, server/routes.go; the OpenAI SDK's
#: `x-stainless-*` headers failed preflights, ollama/ollama#4388). The gateway forwards none
#: of them upstream except `User-Agent` (`gateway.upstream.headers`). Starlette adds the
#: CORS-safelisted ones (`Accept`, `Accept-Language`, `Content-Language`, `Content-Type`).
ALLOWED_HEADERS = (
    "Authorization",
    "Content-Type",
    "X-API-Key",
    "X-Request-ID",
    "Accept",
    "User-Agent",
    "X-Requested-With",
    "OpenAI-Beta",
    "X-Stainless-Arch",
    "X-Stainless-Async",
    "X-Stainless-Custom-Poll-Interval",
    "X-Stainless-Helper-Method",
    "X-Stainless-Lang",
    "X-Stainless-OS",
    "X-Stainless-Package-Version",
    "X-Stainless-Poll-Helper",
    "X-Stainless-Retry-Count",
    "X-Stainless-Runtime",
    "X-Stainless-Runtime-Version",
    "X-Stainless-Timeout",
)

#: Response headers a script may read besides the safelisted ones (`Content-Type`, ...): the
#: request id, and the limit headers of a 429 or 503 (`gateway.limits.limiter`). Named one by
#: one: `Access-Control-Expose-Headers` has no prefix wildcard.
EXPOSED_HEADERS = (
    "X-Request-ID",
    "Retry-After",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
    "X-RateLimit-Tokens-Limit",
    "X-RateLimit-Tokens-Remaining",
    "X-RateLimit-Tokens-Reset",
)

#: Seconds a browser may cache a preflight's answer (Chromium caps it at 7200).
MAX_AGE = 600


class GatewayCORSMiddleware(CORSMiddleware):
    """Starlette's `CORSMiddleware` with the gateway's policy; see the module docstring.

    Args:
        app: The ASGI app.
        allow_origins: `GATEWAY_CORS_ORIGINS`: exact origins, or `*` for any.
    """

    def __init__(self, app: ASGIApp, allow_origins: Sequence[str]) -> None:
        super().__init__(
            app,
            allow_origins=allow_origins,
            allow_methods=ALLOWED_METHODS,
            allow_headers=ALLOWED_HEADERS,
            allow_credentials=False,
            expose_headers=EXPOSED_HEADERS,
            max_age=MAX_AGE,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Apply CORS to the API's paths; pass every other request through untouched."""
        if scope["type"] == "http" and scope["path"].startswith(API_PREFIXES):
            await super().__call__(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def preflight_response(self, request_headers: Headers) -> Response:
        """Starlette's answer, without the policy's headers when the origin is not listed."""
        response = super().preflight_response(request_headers)
        if not self.is_allowed_origin(request_headers["origin"]):
            for name in [n for n in response.headers if n.startswith("access-control-")]:
                del response.headers[name]
        return response

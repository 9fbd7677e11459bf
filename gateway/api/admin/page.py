"""The admin web page: `/admin/` and its assets under `/admin/ui/` (docs/admin.md#the-web-page).

The page is static: one HTML file, ES modules in plain JavaScript and one stylesheet, shipped in
the package (`gateway/api/admin/ui/`), which talk to `/admin/v1` with the token the user signs in
with. Nothing is rendered on the server, so no stored value ever reaches this module.

- Served exactly when the admin API is on (the router's `get_verifier` dependency: 404 otherwise,
  like every `/admin` path).
- Only the files named in `ASSETS` are served: a path parameter is looked up in that mapping, never
  joined to a directory, so no request can reach another file.
- Every page and asset carries a strict Content-Security-Policy (no inline script or style, nothing
  from another origin, no framing: CSP Level 3, W3C), `X-Frame-Options: DENY` for browsers that
  predate `frame-ancestors` (RFC 7034), `nosniff` (so a module is run only as JavaScript),
  `Referrer-Policy: no-referrer`; the HTML is `no-store`, the assets `no-cache` with an ETag
  (revalidated on each load, so an upgrade is never mixed with a cached older module).
- URLs are relative (`/admin` redirects to `admin/`), so the page works behind a reverse proxy
  that adds a path prefix.
- `HEAD` is answered like `GET` without the body (RFC 9110 §9.3.2: the server drops it), so a
  monitor or a proxy's health check can probe the page.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from types import MappingProxyType
from typing import Final

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from gateway.api.admin.auth import get_verifier
from gateway.errors import NotFoundError

#: The policy of every page and asset; `connect-src 'self'` covers `/admin/v1` and `/admin/oidc`.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = MappingProxyType(
    {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
)

_JS = "text/javascript; charset=utf-8"  # RFC 9239
#: The files under /admin/ui/ and their media types: nothing else is served.
ASSETS: Final = MappingProxyType(
    {
        "app.js": _JS,
        "api.js": _JS,
        "session.js": _JS,
        "signin.js": _JS,
        "dom.js": _JS,
        "chart.js": _JS,
        "keys.js": _JS,
        "usage.js": _JS,
        "live.js": _JS,
        "audit.js": _JS,
        "app.css": "text/css; charset=utf-8",
        "favicon.svg": "image/svg+xml",
    }
)
_PAGE = "index.html"

router = APIRouter(prefix="/admin", dependencies=[Depends(get_verifier)], include_in_schema=False)


def _read(name: str) -> bytes:
    """The bytes of a file of the page, from the installed package."""
    return (resources.files("gateway.api.admin") / "ui" / name).read_bytes()


@router.api_route("", methods=["GET", "HEAD"])
async def admin_root() -> Response:
    """Redirect to the page; a relative `Location` keeps a proxy's prefix (RFC 9110 §10.2.2)."""
    return RedirectResponse("admin/", status_code=308)


@router.api_route("/", methods=["GET", "HEAD"])
async def page() -> Response:
    """The page (never cached: it names the modules the browser loads)."""
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-store"}
    return Response(_read(_PAGE), media_type="text/html; charset=utf-8", headers=headers)


@router.api_route("/ui/{name}", methods=["GET", "HEAD"])
async def asset(name: str, request: Request) -> Response:
    """One file of `ASSETS`, revalidated by its ETag (RFC 9110 §8.8.3, §13.1.2).

    Raises:
        NotFoundError: for any name not in `ASSETS`.
    """
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFoundError("not found")
    body = _read(name)
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-cache", "ETag": etag}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=media_type, headers=headers)

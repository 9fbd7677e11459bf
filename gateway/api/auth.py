"""`require_principal`: the router-level dependency that authenticates every app request."""

from __future__ import annotations

import hmac
import logging
from typing import Annotated

from fastapi import Depends, Request

from gateway.auth.principal import Principal
from gateway.context import request_context
from gateway.deps import AuthenticatorDep, get_address_limiter
from gateway.errors import BadRequestError, GatewayError, UnauthorizedError
from gateway.keys.store import InvalidKeyError

logger = logging.getLogger("gateway.auth")


def presented_key(request: Request) -> str | None:
    """Return the key from `Authorization: Bearer <key>` (RFC 6750), else from `X-API-Key`.

    A non-Bearer `Authorization` (for example a proxy's Basic credentials) is ignored. A request
    that carries more than one credential is refused rather than resolved: a proxy in front and
    the gateway could otherwise pick different ones (the first or the last header), and a log or
    an audit would name a key other than the one that was used.

    Raises:
        BadRequestError: two `Authorization` or two `X-API-Key` headers, or a Bearer key and a
            different `X-API-Key` (400).
    """
    authorizations = request.headers.getlist("authorization")
    api_keys = request.headers.getlist("x-api-key")
    if len(authorizations) > 1 or len(api_keys) > 1:
        raise BadRequestError("send one API key: the request has repeated credential headers")
    bearer: str | None = None
    if authorizations:
        scheme, _, credentials = authorizations[0].partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            bearer = credentials.strip()
    api_key = api_keys[0].strip() if api_keys else ""
    # Constant time: the two values may be a real key and a guess at it.
    if bearer and api_key and not hmac.compare_digest(bearer.encode(), api_key.encode()):
        raise BadRequestError("send one API key: Authorization and X-API-Key differ")
    return bearer or api_key or None


async def require_principal(request: Request, authenticator: AuthenticatorDep) -> Principal:
    """Authenticate the request's API key and return its principal.

    The principal is also kept in the request's `RequestContext` (`gateway.context`): the
    error handlers label refusals with it, the access log and the body budget use its id.
    Each failure spends the client address's budget (`gateway.limits.address`); a valid key
    is never counted there, nor refused by it.

    Raises:
        UnauthorizedError: the key is missing, malformed, unknown, revoked or expired (401).
        BadRequestError: repeated credential headers (400, `presented_key`).
        RateLimitedError: any of these failures from an address past its budget (429).
    """
    try:
        key = presented_key(request)
    except BadRequestError as exc:
        raise await _failed(request, exc) from None
    if key is None:
        raise await _failed(
            request, UnauthorizedError("missing API key: send Authorization: Bearer <key>")
        )
    try:
        record = await authenticator.authenticate(key)
    except InvalidKeyError as exc:
        logger.info("rejected API key: %s", exc.reason)
        if exc.reason == "malformed" and _looks_like_jwt(key):
            raise await _failed(
                request,
                UnauthorizedError("admin tokens cannot open the generation routes: use an API key"),
            ) from exc
        raise await _failed(request, UnauthorizedError(str(exc))) from exc
    principal = Principal.from_record(record)  # every field, the permission included
    request_context(request.scope).principal = principal
    return principal


async def _failed(request: Request, error: GatewayError) -> GatewayError:
    """`error`, or a 429 once the client's address has spent its budget of failures."""
    limiter = await get_address_limiter(request)
    return await limiter.failed(request.scope, "api", error)


def _looks_like_jwt(credential: str) -> bool:
    """A compact JWS (RFC 7515 section 7.1): three base64url parts, the header a JSON object."""
    return credential.startswith("eyJ") and credential.count(".") == 2


PrincipalDep = Annotated[Principal, Depends(require_principal)]

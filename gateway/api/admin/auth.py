"""Who may call the admin API: the router-level dependencies that check the admin token.

- The whole API answers 404 until an admin token source is configured
  (`GATEWAY_ADMIN_JWT_SECRET` or a JWKS): an unconfigured gateway shows no admin surface.
- A request needs `Authorization: Bearer <JWT>`, verified by `gateway.auth.jwt`. An app key
  (`gw_...`) is refused with 401 before any JWT parsing: app keys never open the admin API.
- Both are checked before the body is read (`gateway.api.admin.body`), and every refused token
  spends the client address's admin budget (`GATEWAY_ADMIN_AUTH_FAILURES_PER_MINUTE`; past
  it, 429: `gateway.limits.address`). A valid token is never refused by that budget.
- `read` tokens may list and get keys, read usage and the audit trail; every change needs
  `admin`. A valid token without the needed scope gets 403.

Refusals are logged with their reason and the client's address, never with the token.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, Request

from gateway.auth.identity import AdminAuthError, AdminIdentity, Scope
from gateway.auth.jwt import AdminTokenVerifier
from gateway.context import request_context
from gateway.deps import get_address_limiter
from gateway.errors import ForbiddenError, GatewayError, NotFoundError, UnauthorizedError
from gateway.keys.apikey import KEY_PREFIX
from gateway.keys.audit import Actor
from gateway.wire.address import client_address

logger = logging.getLogger("gateway.admin")

_CHALLENGE = 'Bearer realm="llm-gateway-admin"'
#: RFC 6750 section 3.1: a token was sent and refused.
_INVALID = _CHALLENGE + ', error="invalid_token"'


async def get_verifier(request: Request) -> AdminTokenVerifier:
    """Return the admin token verifier.

    Raises:
        NotFoundError: when no admin token source is configured (the API does not exist).
    """
    verifier: AdminTokenVerifier | None = request.state.admin_verifier
    if verifier is None:
        raise NotFoundError("not found")
    return verifier


VerifierDep = Annotated[AdminTokenVerifier, Depends(get_verifier)]


async def require_admin_identity(request: Request, verifier: VerifierDep) -> AdminIdentity:
    """Verify the request's admin token and return who it names.

    Verified once per request: `BoundedBodyRoute` calls this before it reads the body, and the
    router's dependency then gets the identity it left in the request's `RequestContext`.

    Raises:
        UnauthorizedError: no token, several, an app key, or a token `gateway.auth.jwt`
            refuses (401 with `WWW-Authenticate: Bearer`, RFC 6750 section 3).
        RateLimitedError: any of those from a client address past its budget of failures
            (429, `gateway.limits.address`).
        ForbiddenError: a valid token that grants no admin scope.
    """
    context = request_context(request.scope)
    known = context.admin
    if isinstance(known, AdminIdentity):
        return known
    authorizations = request.headers.getlist("authorization")
    if len(authorizations) != 1:
        reason = "missing admin token" if not authorizations else "send one Authorization header"
        raise await _refused(request, reason)
    scheme, _, token = authorizations[0].partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise await _refused(request, "missing admin token: send Authorization: Bearer <token>")
    if token.startswith(KEY_PREFIX):
        reason = "API keys cannot open the admin API: use an admin token"
        raise await _refused(request, reason, _INVALID)
    try:
        identity = await verifier.verify(token)
    except AdminAuthError as exc:
        if exc.status == 403:
            _log_refusal(request, exc.message)
            raise ForbiddenError(exc.message) from None
        raise await _refused(request, exc.message, exc.www_authenticate) from None
    context.admin = identity
    return identity


IdentityDep = Annotated[AdminIdentity, Depends(require_admin_identity)]


def _scope_checker(scope: Scope) -> object:
    async def check(request: Request, identity: IdentityDep) -> Actor:
        try:
            identity.require(scope)
        except AdminAuthError as exc:
            _log_refusal(request, exc.message)
            raise ForbiddenError(
                f"this action needs a token with the {scope} scope",
                headers={"WWW-Authenticate": exc.www_authenticate},
            ) from None
        settings = request.state.settings
        return Actor(
            identity.subject, client_address(request.scope, settings.trusted_proxy_networks)
        )

    return check


ReaderDep = Annotated[Actor, Depends(_scope_checker("read"))]
"""A `read` or `admin` token; the actor it names."""
AdminDep = Annotated[Actor, Depends(_scope_checker("admin"))]
"""An `admin` token; the actor the audit trail records."""


async def _refused(request: Request, reason: str, challenge: str = _CHALLENGE) -> GatewayError:
    """The 401 for `reason`, or a 429 once the client's address has spent its admin budget.

    Each 401 is logged; past the budget only the address limiter's one line a minute is, so an
    anonymous client cannot write a warning per request it sends.
    """
    limiter = await get_address_limiter(request)
    refusal = UnauthorizedError(reason, challenge=challenge)
    answer = await limiter.failed(request.scope, "admin", refusal)
    if answer is refusal:
        _log_refusal(request, reason)
    return answer


def _log_refusal(request: Request, reason: str) -> None:
    settings = request.state.settings
    logger.warning(
        "admin API refused %s from %s: %s",
        request.url.path.encode("unicode_escape").decode(),
        client_address(request.scope, settings.trusted_proxy_networks),
        reason,
    )

"""Who may call the admin API: the router-level dependencies that check the admin token.

- The whole API answers 404 until an admin token source is configured
  (`GATEWAY_ADMIN_JWT_SECRET` or a JWKS): an unconfigured gateway shows no admin surface.
- A request needs `Authorization: Bearer <JWT>`, verified by `gateway.auth.jwt`. An app key
  (`gw_...`) is refused with 401 before any JWT parsing: app keys never open the admin API.
- `read` tokens may list and get keys, read usage and the audit trail; every change needs
  `admin`. A valid token without the needed scope gets 403.

Refusals are logged with their reason and the client's address, never with the token.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, Request

from gateway.access import client_address
from gateway.auth.apikey import KEY_PREFIX
from gateway.auth.identity import AdminAuthError, AdminIdentity, Scope
from gateway.auth.jwt import AdminTokenVerifier
from gateway.errors import ForbiddenError, NotFoundError, UnauthorizedError
from gateway.keys.audit import Actor

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

    Raises:
        UnauthorizedError: no token, several, an app key, or a token `gateway.auth.jwt`
            refuses (401 with `WWW-Authenticate: Bearer`, RFC 6750 section 3).
        ForbiddenError: a valid token that grants no admin scope.
    """
    authorizations = request.headers.getlist("authorization")
    if len(authorizations) != 1:
        reason = "missing admin token" if not authorizations else "send one Authorization header"
        raise _refused(request, reason)
    scheme, _, token = authorizations[0].partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _refused(request, "missing admin token: send Authorization: Bearer <token>")
    if token.startswith(KEY_PREFIX):
        raise _refused(request, "API keys cannot open the admin API: use an admin token", _INVALID)
    try:
        identity = await verifier.verify(token)
    except AdminAuthError as exc:
        if exc.status == 403:
            _log_refusal(request, exc.message)
            raise ForbiddenError(exc.message) from None
        raise _refused(request, exc.message, exc.www_authenticate) from None
    request.scope.setdefault("state", {})["admin_subject"] = identity.subject
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


def _refused(request: Request, reason: str, challenge: str = _CHALLENGE) -> UnauthorizedError:
    _log_refusal(request, reason)
    return UnauthorizedError(reason, challenge=challenge)


def _log_refusal(request: Request, reason: str) -> None:
    settings = request.state.settings
    logger.warning(
        "admin API refused %s from %s: %s",
        request.url.path.encode("unicode_escape").decode(),
        client_address(request.scope, settings.trusted_proxy_networks),
        reason,
    )

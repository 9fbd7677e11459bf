"""`require_principal`: the router-level dependency that authenticates every app request."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, Request

from gateway.auth.principal import Principal
from gateway.deps import AuthenticatorDep
from gateway.errors import UnauthorizedError
from gateway.keys.store import InvalidKeyError

logger = logging.getLogger("gateway.auth")


def presented_key(request: Request) -> str | None:
    """Return the key from `Authorization: Bearer <key>` (RFC 6750), else from `X-API-Key`.

    A non-Bearer `Authorization` (for example a proxy's Basic credentials) is ignored.
    """
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    api_key = request.headers.get("x-api-key", "").strip()
    return api_key or None


async def require_principal(request: Request, authenticator: AuthenticatorDep) -> Principal:
    """Authenticate the request's API key and return its principal.

    The principal is also stored in `request.state.principal` (the rate limiter keys on it).

    Raises:
        UnauthorizedError: the key is missing, malformed, unknown, revoked or expired (401).
    """
    key = presented_key(request)
    if key is None:
        raise UnauthorizedError("missing API key: send Authorization: Bearer <key>")
    try:
        record = await authenticator.authenticate(key)
    except InvalidKeyError as exc:
        logger.info("rejected API key: %s", exc.reason)
        raise UnauthorizedError(str(exc)) from exc
    principal = Principal(
        record.id,
        record.name,
        record.models,
        rpm=record.rpm,
        tpm=record.tpm,
        max_concurrent=record.max_concurrent,
    )
    request.state.principal = principal  # the error handlers label refusals with it
    request.scope.setdefault("state", {})["key_id"] = record.id
    return principal


PrincipalDep = Annotated[Principal, Depends(require_principal)]

"""Single sign-on on the admin web page: `GET /admin/oidc/config`, `POST /admin/oidc/token`.

Both are public (the page has no token yet) and, like all of `/admin`, answer 404 while the
admin API is off. `config` tells the page where to send the user (or `{"enabled": false}`
without `GATEWAY_ADMIN_OIDC_CLIENT_ID`); `token` exchanges the code the page got back for the
provider's tokens (`gateway.auth.oidc`), checks the ID token's nonce, verifies the token that
opens the admin API with the admin verifier (`gateway.auth.jwt`, exactly as `/admin/v1` will)
and answers it with its expiry, subject and scopes.

Before the provider is asked, the body is read within `MAX_TOKEN_REQUEST_BYTES`, its
`redirect_uri` must be one of `GATEWAY_ADMIN_OIDC_REDIRECT_URIS` (so a code phished through
another URL a loosely registered client allows cannot be redeemed here), and the client
address must be within its admin budget (`gateway.limits.address`): an address past it is
answered 429 without a call to the provider, a valid sign-in too, until the minute has passed.
At most `MAX_CONCURRENT_EXCHANGES` exchanges run at once per process (503 past it, not queued).
A refused exchange (the provider refused the code, or the token failed a check) spends the
budget, as a refused token does on `/admin/v1`; a provider that fails (502) spends none, so a
provider outage does not lock users out. Codes, verifiers and tokens are never logged; refusals
are logged with their reason while the address is within its budget, then once a minute.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from gateway.api.admin.auth import VerifierDep, get_verifier
from gateway.auth.identity import AdminAuthError
from gateway.auth.jwt import unverified_claims
from gateway.auth.oidc import OidcBusyError, OidcClient, OidcRefusedError, OidcUnavailableError
from gateway.deps import get_address_limiter
from gateway.errors import (
    BadRequestError,
    ForbiddenError,
    GatewayError,
    NotFoundError,
    ServiceUnavailableError,
    UnauthorizedError,
    UnprocessableError,
)
from gateway.neutral import Outcome
from gateway.settings import page_redirect_uri
from gateway.wire.address import client_address
from gateway.wire.body import read_body

logger = logging.getLogger("gateway.admin")

router = APIRouter(
    prefix="/admin/oidc", dependencies=[Depends(get_verifier)], include_in_schema=False
)

MAX_TOKEN_REQUEST_BYTES = 16 * 1024
"""Largest `POST /admin/oidc/token` body: a long code (Entra ID's: ~1.5 KiB) fits many times."""
_CHALLENGE = 'Bearer realm="llm-gateway-admin", error="invalid_token"'
_NO_SCOPE = (
    "token grants no admin scope: you signed in, but the identity provider lists you in none "
    "of the groups or roles this gateway maps to admin or read; ask its administrators to add you"
)
_NO_STORE = {"Cache-Control": "no-store"}  # RFC 6749 section 5.1, for a response with a token
_BUSY_RETRY_SECONDS = 2


class IdentityProviderError(GatewayError):
    """The identity provider cannot be reached or answers with what is not OpenID (502)."""

    status_code = 502
    outcome: Outcome = "error"


class TokenRequest(BaseModel):
    """`POST /admin/oidc/token`: what the page got back from the provider, and its PKCE secret."""

    model_config = ConfigDict(extra="forbid")

    code: StrictStr = Field(min_length=1, max_length=4096)
    # RFC 7636 section 4.1: 43 to 128 characters of [A-Za-z0-9-._~].
    code_verifier: StrictStr = Field(pattern=r"^[A-Za-z0-9._~-]{43,128}$")
    redirect_uri: StrictStr = Field(min_length=1, max_length=2048)
    nonce: StrictStr = Field(min_length=1, max_length=512)


def _oidc(request: Request) -> OidcClient:
    oidc: OidcClient | None = request.state.admin_oidc
    if oidc is None:
        raise NotFoundError("single sign-on is not configured (GATEWAY_ADMIN_OIDC_CLIENT_ID)")
    return oidc


@router.get("/config")
async def oidc_config(request: Request) -> JSONResponse:
    """Where the admin page sends the user to sign in, or `{"enabled": false}`."""
    oidc: OidcClient | None = request.state.admin_oidc
    if oidc is None:
        return JSONResponse({"enabled": False}, headers={"Cache-Control": "no-cache"})
    try:
        metadata = await oidc.metadata()
    except OidcUnavailableError as exc:
        logger.warning("admin SSO: the identity provider's discovery failed: %s", exc)
        raise IdentityProviderError(str(exc)) from None
    answer = {
        "enabled": True,
        "authorization_endpoint": metadata.authorization_endpoint,
        "end_session_endpoint": metadata.end_session_endpoint,
        "client_id": oidc.client_id,
        "scope": oidc.scope,
        "token": oidc.token_kind,
        "redirect_uris": list(oidc.redirect_uris),
    }
    return JSONResponse(answer, headers={"Cache-Control": "no-cache"})


@router.post("/token")
async def oidc_token(request: Request, verifier: VerifierDep) -> JSONResponse:
    """Exchange the page's authorization code for an admin token."""
    oidc = _oidc(request)
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise UnprocessableError(
            "invalid request: send a JSON body (Content-Type: application/json)"
        )
    asked = _token_request(await read_body(request, MAX_TOKEN_REQUEST_BYTES))
    if page_redirect_uri(asked.redirect_uri) not in {
        page_redirect_uri(uri) for uri in oidc.redirect_uris
    }:
        raise UnprocessableError(
            "invalid request: redirect_uri is not this gateway's admin page (one of "
            "GATEWAY_ADMIN_OIDC_REDIRECT_URIS, which GET admin/oidc/config lists)"
        )
    # Before the provider is asked: an address past its budget costs the provider nothing.
    limiter = await get_address_limiter(request)
    spent = await limiter.over_budget(request.scope, "admin")
    if spent is not None:
        raise spent
    try:
        tokens = await oidc.exchange(asked.code, asked.code_verifier, asked.redirect_uri)
    except OidcBusyError as exc:
        retry = {"Retry-After": str(_BUSY_RETRY_SECONDS)}
        raise ServiceUnavailableError(str(exc), headers=retry) from None
    except OidcRefusedError as exc:
        raise await _refused(request, BadRequestError(str(exc))) from None
    except OidcUnavailableError as exc:
        logger.warning("admin SSO: the identity provider's token endpoint failed: %s", exc)
        raise IdentityProviderError(str(exc)) from None
    access = oidc.token_kind == "access_token"  # noqa: S105 - a mode name, not a secret
    bearer = tokens.access_token if access else tokens.id_token
    if bearer is None:
        raise IdentityProviderError("the identity provider answered without an access token")
    try:
        oidc.check_id_token(tokens.id_token, asked.nonce)
        identity = await verifier.verify(bearer)
    except AdminAuthError as exc:
        if exc.status == 403:
            _log(request, "admin SSO sign-in refused", exc.message)
            raise ForbiddenError(_NO_SCOPE) from None
        refusal = UnauthorizedError(exc.message, challenge=_CHALLENGE)
        raise await _refused(request, refusal) from None
    scopes = sorted(identity.scopes)
    _log(
        request,
        "admin SSO sign-in",
        f"{identity.subject!r} with {' and '.join(scopes)}",
        logging.INFO,
    )
    answer: dict[str, Any] = {
        "token": bearer,
        "expires_at": int(unverified_claims(bearer)["exp"]),  # verified just above
        "subject": identity.subject,
        "scopes": scopes,
    }
    return JSONResponse(answer, headers=_NO_STORE)


def _token_request(body: bytes) -> TokenRequest:
    """The parsed body, with a redirect URI that can be the admin page's (`.../admin/`)."""
    try:
        asked = TokenRequest.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise UnprocessableError(f"invalid request: {where} {first.get('msg', '')}") from None
    # The configured list is checked by the caller; these first checks say what is wrong with
    # a URI that cannot be any admin page's.
    page = urlsplit(asked.redirect_uri)
    if page.scheme not in {"http", "https"} or not page.hostname or page.fragment:
        raise UnprocessableError("invalid request: redirect_uri must be an http(s) URL")
    if not page.path.endswith("/admin/"):
        raise UnprocessableError(
            "invalid request: redirect_uri must be the admin page's URL (https://<gateway>/admin/)"
        )
    return asked


async def _refused(request: Request, error: GatewayError) -> GatewayError:
    """`error`, or a 429 once the client's address has spent its admin budget.

    The refusal is logged with its reason only within the budget: past it the limiter logs
    the address once a minute, so a client cannot fill the log.
    """
    limiter = await get_address_limiter(request)
    answer = await limiter.failed(request.scope, "admin", error, valid_served=False)
    if answer is error:
        _log(request, "admin SSO sign-in refused", error.message)
    return answer


def _log(request: Request, what: str, detail: str, level: int = logging.WARNING) -> None:
    settings = request.state.settings
    logger.log(
        level,
        "%s from %s: %s",
        what,
        client_address(request.scope, settings.trusted_proxy_networks),
        detail.encode("unicode_escape").decode(),
    )

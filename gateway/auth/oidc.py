"""Single sign-on for the admin web page: the gateway's side of the OpenID Connect code flow.

Owns `OidcClient`. The page (a public client in the browser) sends the user to the provider's
authorization endpoint with PKCE (RFC 7636) and gets a code back; the gateway then
- reads the provider's discovery document, `<issuer>/.well-known/openid-configuration` (OpenID
  Connect Discovery 1.0 section 4), server-side: its `issuer` must be exactly the configured
  one (section 4.3), its endpoints https (http only on loopback); cached like the JWKS
  (`GATEWAY_ADMIN_JWKS_CACHE_SECONDS`), at most one fetch per
  `GATEWAY_ADMIN_JWKS_MIN_REFRESH_SECONDS` after a failure, the last good one kept;
- exchanges the code at the token endpoint (RFC 6749 section 4.1.3, with the page's
  `code_verifier`, RFC 7636 section 4.5; `client_secret_basic`, RFC 6749 section 2.3.1, for
  a confidential client);
- checks the ID token's `nonce` against the page's (OpenID Connect Core 1.0 section 3.1.3.7,
  item 11), and that it names this issuer and client (items 2 and 3).

Verifying the token that becomes the page's bearer token is `gateway.auth.jwt`'s job, as for
any admin token. Codes, verifiers and tokens are never logged nor put in an error message.

Over ~300 lines for one reason: `OidcClient` is the code flow's client side, and its steps share
state: the exchange needs the cached discovery document's token endpoint, `check_id_token` the
configured issuer and client id, and every request goes through one bounded `_request`; the error
classes are what its callers answer.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeGuard
from urllib.parse import quote, urlsplit

import anyio
import httpx

from gateway.auth.identity import AdminAuthError
from gateway.auth.jwt import check_id_token_client, unverified_claims, unverified_header
from gateway.settings import Settings
from gateway.wire.json import parse_json

__all__ = [
    *("MAX_CONCURRENT_EXCHANGES", "OidcBusyError", "OidcClient", "OidcError"),
    *("OidcRefusedError", "OidcUnavailableError"),
    *("ProviderMetadata", "TokenSet"),
]

DISCOVERY_PATH = "/.well-known/openid-configuration"
TIMEOUT = httpx.Timeout(10.0, connect=5.0)
"""Per request to the provider: 5 s to connect, 10 s for each read and write."""
TOTAL_SECONDS = 15.0
"""Longest a request to the provider may take, first byte to last."""
MAX_ANSWER_BYTES = 64 * 1024
"""Largest discovery document or token response read (real ones: 1 to 8 KiB)."""
MAX_CONCURRENT_EXCHANGES = 8
"""Most code exchanges one process runs at once (each may wait `TOTAL_SECONDS` on the provider);
past it `exchange` refuses at once (`OidcBusyError`) rather than queue. Sign-ins are rare: eight
at once is a crowd, and the cap keeps a flood of made-up codes from holding the gateway's
connections and the provider's attention."""
MAX_ERROR_CHARS = 200
"""Longest `error` or `error_description` of the provider's repeated to the client."""


class OidcError(Exception):
    """Single sign-on failed; the message is safe to show the client."""


class OidcUnavailableError(OidcError):
    """The provider could not be reached, or answered with something that is not OpenID (502)."""


class OidcBusyError(OidcError):
    """`MAX_CONCURRENT_EXCHANGES` exchanges are already running in this process (503)."""


class OidcRefusedError(OidcError):
    """The provider's token endpoint refused the code (RFC 6749 section 5.2; the client's 400).

    Attributes:
        error: The provider's `error` code (`invalid_grant`, ...), printable ASCII, bounded.
        description: Its `error_description`, the same way, or "".
    """

    def __init__(self, error: str, description: str) -> None:
        self.error = error
        self.description = description
        text = f"the identity provider refused the sign-in: {error}"
        super().__init__(f"{text}: {description}" if description else text)


@dataclass(frozen=True)
class ProviderMetadata:
    """What the gateway uses of the provider's discovery document (all absolute URLs)."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    end_session_endpoint: str | None


@dataclass(frozen=True)
class TokenSet:
    """The tokens the token endpoint answered with (RFC 6749 section 5.1; OIDC Core 3.1.3.3)."""

    id_token: str
    access_token: str | None


def usable_url(url: object) -> TypeGuard[str]:
    """Whether `url` is an absolute https URL, or http on a loopback host (as the JWKS URL)."""
    if not isinstance(url, str) or len(url) > 2048 or not url.isprintable():
        return False
    parts = urlsplit(url)
    loopback = parts.hostname in {"localhost", "127.0.0.1", "::1"}
    return bool(parts.hostname) and (
        parts.scheme == "https" or (parts.scheme == "http" and loopback)
    )


def printable(text: object, limit: int = MAX_ERROR_CHARS) -> str:
    """`text` as printable ASCII (RFC 6749 section 5.2's set for `error`), at most `limit` long."""
    if not isinstance(text, str):
        return ""
    return "".join(char if " " <= char <= "~" else "?" for char in text[:limit])


class OidcClient:
    """The gateway's OpenID Connect client for the admin web page; build it with `from_settings`.

    Args:
        issuer: The provider's issuer (`GATEWAY_ADMIN_JWT_ISSUER`).
        client_id: The page's client id.
        client_secret: A confidential client's secret, or None (public client).
        scope: The scopes the page asks for.
        redirect_uris: The page's URLs (`GATEWAY_ADMIN_OIDC_REDIRECT_URIS`), as configured.
        token: Which token becomes the page's bearer token.
        http: The client for the provider's endpoints; closed by `aclose`.
        cache_seconds: How long a discovery document is used before it is fetched again.
        min_refresh_seconds: Fewest seconds between two fetches after one failed.
        clock: Monotonic seconds (tests step their own).
    """

    def __init__(
        self,
        *,
        issuer: str,
        client_id: str,
        client_secret: str | None,
        scope: str,
        redirect_uris: tuple[str, ...] = (),
        token: Literal["id_token", "access_token"],
        http: httpx.AsyncClient,
        cache_seconds: float,
        min_refresh_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.issuer = issuer
        self.client_id = client_id
        self.scope = scope
        self.redirect_uris = redirect_uris
        self.token_kind = token
        self._secret = client_secret
        self._http = http
        self._cache_seconds = cache_seconds
        self._min_refresh_seconds = min_refresh_seconds
        self._clock = clock
        self._metadata: ProviderMetadata | None = None
        self._loaded_at: float | None = None
        self._failed_at: float | None = None
        self._failure = ""
        self._lock = anyio.Lock()
        self._exchanges = anyio.Semaphore(MAX_CONCURRENT_EXCHANGES)

    @classmethod
    def from_settings(cls, settings: Settings) -> Self | None:
        """The client the settings describe, or None without `GATEWAY_ADMIN_OIDC_CLIENT_ID`.

        Nothing is fetched here: the discovery document is read on first use, so a provider
        that is down at start does not stop the gateway.
        """
        if settings.admin_oidc_client_id is None or settings.admin_jwt_issuer is None:
            return None
        secret = settings.admin_oidc_client_secret
        return cls(
            issuer=settings.admin_jwt_issuer,
            client_id=settings.admin_oidc_client_id,
            client_secret=None if secret is None else secret.get_secret_value(),
            scope=" ".join(settings.admin_oidc_scopes.split()),
            redirect_uris=tuple(settings.admin_oidc_redirect_uris),
            token=settings.admin_oidc_token,
            http=httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False),
            cache_seconds=settings.admin_jwks_cache_seconds,
            min_refresh_seconds=settings.admin_jwks_min_refresh_seconds,
        )

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._http.aclose()

    async def metadata(self) -> ProviderMetadata:
        """The provider's endpoints, from the cache or fetched now.

        Raises:
            OidcUnavailableError: the document cannot be fetched (now, or at the last try less
                than `min_refresh_seconds` ago) and none was fetched before, or it is not a
                discovery document of the configured issuer.
        """
        now = self._clock()
        fresh = self._loaded_at is not None and now - self._loaded_at < self._cache_seconds
        if fresh and self._metadata is not None:
            return self._metadata
        async with self._lock:
            now = self._clock()
            if self._loaded_at is not None and now - self._loaded_at < self._cache_seconds:
                pass  # another request fetched it while this one waited
            elif self._failed_at is None or now - self._failed_at >= self._min_refresh_seconds:
                try:
                    self._metadata = _parse_discovery(self.issuer, await self._fetch_discovery())
                    self._loaded_at, self._failed_at = self._clock(), None
                except OidcUnavailableError as exc:
                    self._failed_at, self._failure = self._clock(), str(exc)
            if self._metadata is not None:
                return self._metadata  # the last good document while the provider fails
            raise OidcUnavailableError(self._failure)

    async def exchange(self, code: str, code_verifier: str, redirect_uri: str) -> TokenSet:
        """Exchange an authorization code for tokens at the provider's token endpoint.

        Args:
            code: The code the provider gave the page.
            code_verifier: The page's PKCE verifier for it.
            redirect_uri: The redirect URI the page sent the user to the provider with.

        Returns:
            The ID token and the access token (if any), not yet verified.

        Raises:
            OidcBusyError: `MAX_CONCURRENT_EXCHANGES` exchanges are running (nothing is sent).
            OidcRefusedError: the provider answered 4xx with an OAuth error (a wrong, used or
                expired code, a wrong verifier or redirect URI, a client not allowed).
            OidcUnavailableError: the provider cannot be reached, or answered otherwise.
        """
        try:
            self._exchanges.acquire_nowait()
        except anyio.WouldBlock:
            raise OidcBusyError(
                "too many sign-ins are being completed at once; try again in a few seconds"
            ) from None
        try:
            return await self._exchange(code, code_verifier, redirect_uri)
        finally:
            self._exchanges.release()

    async def _exchange(self, code: str, code_verifier: str, redirect_uri: str) -> TokenSet:
        metadata = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": code_verifier,
        }
        headers = {"Accept": "application/json"}
        if self._secret is None:
            form["client_id"] = self.client_id  # RFC 6749 section 4.1.3: a public client
        else:
            # RFC 6749 section 2.3.1: each part form-urlencoded, then Basic (RFC 7617).
            pair = f"{quote(self.client_id, safe='')}:{quote(self._secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        status, body = await self._request("POST", metadata.token_endpoint, form, headers)
        answer = _json_object(body)
        if 400 <= status < 500 and answer is not None and isinstance(answer.get("error"), str):
            raise OidcRefusedError(
                printable(answer["error"], 64), printable(answer.get("error_description"))
            )
        if status != 200 or answer is None:
            raise OidcUnavailableError(f"the identity provider's token endpoint answered {status}")
        id_token, access_token = answer.get("id_token"), answer.get("access_token")
        if not isinstance(id_token, str) or not id_token:
            raise OidcUnavailableError(
                "the identity provider answered without an ID token (is openid among the scopes?)"
            )
        return TokenSet(id_token, access_token if isinstance(access_token, str) else None)

    def check_id_token(self, id_token: str, nonce: str) -> None:
        """Check the ID token's `nonce`, `iss`, `aud` and `azp` (OIDC Core 3.1.3.7, items 11, 2-5).

        Its signature is not checked here: it came straight from the token endpoint over TLS
        (item 6); in `id_token` mode `gateway.auth.jwt` verifies it as the bearer token.

        Raises:
            AdminAuthError: 401 for a token that is not for this sign-in.
        """
        claims = unverified_claims(id_token)
        sent = claims.get("nonce")
        if not isinstance(sent, str) or not secrets.compare_digest(sent.encode(), nonce.encode()):
            raise AdminAuthError(401, "the ID token's nonce is not the sign-in's")
        if claims.get("iss") != self.issuer:
            raise AdminAuthError(401, "wrong issuer")
        audiences = claims.get("aud")
        audiences = [audiences] if isinstance(audiences, str) else audiences
        if not isinstance(audiences, list) or self.client_id not in audiences:
            raise AdminAuthError(401, "wrong audience")
        check_id_token_client(unverified_header(id_token), claims, self.client_id)

    async def _fetch_discovery(self) -> bytes:
        url = self.issuer.rstrip("/") + DISCOVERY_PATH  # Discovery 1.0 section 4.1
        status, body = await self._request("GET", url, None, {"Accept": "application/json"})
        if status != 200:
            raise OidcUnavailableError(f"the identity provider's discovery answered {status}")
        return body

    async def _request(
        self, method: str, url: str, form: dict[str, str] | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """One request to the provider within `TOTAL_SECONDS` and `MAX_ANSWER_BYTES`."""
        try:
            with anyio.fail_after(TOTAL_SECONDS):
                async with self._http.stream(method, url, data=form, headers=headers) as response:
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > MAX_ANSWER_BYTES:
                            raise OidcUnavailableError(
                                f"the identity provider's answer is over {MAX_ANSWER_BYTES} bytes"
                            )
                    return response.status_code, bytes(body)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise OidcUnavailableError(
                f"the identity provider cannot be reached ({type(exc).__name__})"
            ) from None


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        document = parse_json(body, max_depth=16, max_values=10_000)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _parse_discovery(issuer: str, body: bytes) -> ProviderMetadata:
    """The endpoints of a discovery document, if it is one of `issuer` (Discovery 1.0 4.3)."""
    document = _json_object(body)
    if document is None:
        raise OidcUnavailableError("the identity provider's discovery document is not JSON")
    if document.get("issuer") != issuer:
        raise OidcUnavailableError(
            "the identity provider's discovery document names another issuer than "
            "GATEWAY_ADMIN_JWT_ISSUER (OpenID Connect Discovery 1.0 section 4.3)"
        )
    authorize, token = document.get("authorization_endpoint"), document.get("token_endpoint")
    end_session = document.get("end_session_endpoint")
    if not (usable_url(authorize) and usable_url(token)):
        raise OidcUnavailableError(
            "the identity provider's discovery document lacks an https authorization or token "
            "endpoint"
        )
    if not usable_url(end_session):
        end_session = None  # optional (RP-Initiated Logout 1.0): the page then only forgets
    return ProviderMetadata(issuer, str(authorize), str(token), end_session)

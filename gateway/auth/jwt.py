"""Admin authentication: verify the JWTs that open `/admin/v1`, and mint the gateway's own.

The only module that imports python-jose (STYLE 7), so a switch to another JWT library is one
file. Two kinds of token are accepted, and the token's header picks exactly one of them:
- `HS256`, signed with `GATEWAY_ADMIN_JWT_SECRET`, as `mint_token` (`gateway admin token`)
  makes them: `iss` and `aud` fixed by the gateway (`ISSUER`, `AUDIENCE`), a `scope` claim of
  `admin` or `read`, at most `MAX_TTL` long;
- `RS*`/`ES*` from an identity provider, verified against its JWKS (`gateway.auth.jwks`) with the
  configured issuer and audience, the scopes mapped from a claim holding groups or roles. With
  single sign-on on the web page in `id_token` mode (`GATEWAY_ADMIN_OIDC_TOKEN`), the audience
  may also be the page's client id: the provider's ID tokens for the page carry it (OpenID
  Connect Core 1.0 section 2, `aud`), as the Kubernetes API server accepts ID tokens whose
  `aud` is its `--oidc-client-id`.

Every check that can be made on the raw text comes first (size, shape, header), then the header's
`alg` is matched against the allow-list of the key type (never the token's choice), then jose
verifies with exactly that one algorithm and that one key, requiring `exp`, `iss`, `aud` and
`sub`. `jku`, `x5u`, `jwk` and `x5c` headers are never read; `crit` is refused (RFC 7515 4.1.11:
extensions the gateway does not understand). Error messages never contain the token.

`AdminIdentity`, `AdminAuthError` and `Scope` live in `gateway.auth.identity` (no jose there) and
are re-exported here, so callers need only this module.

Over ~300 lines for one reason: `AdminTokenVerifier` runs both kinds of token through one
ordered chain of checks (`_parse`, `_signing_key`, `_decode`, `_claims_error`,
`_mapped_scopes`), and this is the only module that imports python-jose, so `mint_token` is here.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import secrets
import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import httpx
from jose import ExpiredSignatureError, JWTError, jwk, jws, jwt
from jose.backends.base import Key
from jose.exceptions import JWKError, JWSError, JWTClaimsError

from gateway.auth.identity import SCOPES, AdminAuthError, AdminIdentity, Scope
from gateway.auth.jwks import FETCH_TIMEOUT, JwksCache
from gateway.settings import Settings
from gateway.wire.json import parse_json

__all__ = [
    *("AUDIENCE", "ISSUER", "MAX_TTL", "SCOPES", "AdminAuthError", "AdminIdentity"),
    *("AdminTokenVerifier", "Scope", "check_id_token_client", "mint_token"),
    *("unverified_claims", "unverified_header"),
]

ISSUER = "llm-gateway"
"""The `iss` of the tokens the gateway mints (and requires of HS256 tokens)."""
AUDIENCE = "llm-gateway-admin"
"""The `aud` of the tokens the gateway mints: admin tokens of no other system are accepted."""
MAX_TTL = timedelta(hours=24)
"""Longest lifetime of an HS256 token: a leaked one cannot be revoked (only the secret can be
changed, which logs every admin out), so its harm is bounded by its lifetime."""
MAX_TOKEN_CHARS = 8 * 1024
"""Longest token accepted, checked before any decoding (IdP tokens with many groups: ~4 KiB)."""
MAX_SUBJECT_CHARS = 200
MAX_CLAIMS_DEPTH = 32
"""Deepest nesting of a token's header or claims (an IdP's role claims: 3 or 4 levels)."""
MAX_CLAIMS_VALUES = 10_000
"""Most JSON values in a token's header or claims (an 8 KiB token holds fewer anyway)."""
_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_KEY_TYPES = {"RS": "RSA", "ES": "EC"}
_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}


def _clean(text: str) -> str:
    """`text` with only printable characters, at most `MAX_SUBJECT_CHARS` long.

    What `str.isprintable` refuses goes: controls, line separators, and the invisible format
    characters (bidi overrides and isolates, zero-width ones, the byte-order mark) that make a
    subject read differently from what it is, in the audit trail as in a log.
    """
    if not text.isprintable():
        text = "".join(char for char in text if char.isprintable())
    return text[:MAX_SUBJECT_CHARS].strip()


def mint_token(
    secret: str, *, subject: str, scope: Scope, ttl: timedelta, now: datetime | None = None
) -> str:
    """Mint an HS256 admin token that `AdminTokenVerifier` accepts with the same secret.

    Args:
        secret: `GATEWAY_ADMIN_JWT_SECRET` (the settings have refused weak ones).
        subject: Who the token is for; the audit trail records it.
        scope: `admin` or `read`.
        ttl: Lifetime, more than 0 and at most `MAX_TTL`.
        now: Issue time (default: now); `iat` and `nbf`.

    Returns:
        The compact JWT: claims `iss`, `aud`, `sub`, `scope`, `iat`, `nbf`, `exp`, `jti`.

    Raises:
        ValueError: on an unknown scope, a lifetime out of bounds, or a subject that is blank,
            longer than 200 characters or holds control characters.
    """
    if scope not in SCOPES:
        raise ValueError(f"scope must be admin or read, not {scope!r}")
    if not timedelta(0) < ttl <= MAX_TTL:
        raise ValueError("an admin token lives more than 0 s and at most 24 hours")
    if not subject or _clean(subject) != subject:
        raise ValueError(f"subject must be 1 to {MAX_SUBJECT_CHARS} printable characters")
    issued = int((now or datetime.now(UTC)).timestamp())
    claims = {
        **{"iss": ISSUER, "aud": AUDIENCE, "sub": subject, "scope": scope},
        **{"iat": issued, "nbf": issued, "exp": issued + int(ttl.total_seconds())},
        "jti": secrets.token_urlsafe(16),
    }
    return jwt.encode(claims, secret, algorithm="HS256")


#: Latest time claim accepted (year 9999): an integer beyond it is no time, and one beyond a
#: float's range would make `math.isfinite` (and every later comparison with a float) raise.
_MAX_TIME = 253_402_300_799


def _is_time(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) <= _MAX_TIME


def _segment(text: str) -> Any:
    """A token's header or claims segment (base64url JSON), parsed within bounds."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        return parse_json(raw, max_depth=MAX_CLAIMS_DEPTH, max_values=MAX_CLAIMS_VALUES)
    except (binascii.Error, ValueError):  # JsonLimitError is a ValueError
        raise AdminAuthError(401, "malformed token") from None


def _structure(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The unverified header and claims, checked only for size and shape (JSON objects).

    All that is said of a token before its signature is checked: `token too large` or
    `malformed token`, so that a forged token learns nothing of how far it got.
    """
    if len(token) > MAX_TOKEN_CHARS:
        raise AdminAuthError(401, "token too large")
    if not _SHAPE.fullmatch(token):
        raise AdminAuthError(401, "malformed token")
    # Parsed here, within bounds, before jose parses them again: the segments are the sender's
    # JSON, and a deeply nested one would raise RecursionError inside jose (a 500).
    header, claims = (_segment(part) for part in token.split(".")[:2])
    if not isinstance(header, dict) or not isinstance(header.get("alg"), str):
        raise AdminAuthError(401, "malformed token")
    if not isinstance(claims, dict):
        raise AdminAuthError(401, "malformed token")
    return header, claims


def _parse(token: str) -> dict[str, Any]:
    """The unverified header, after the checks of the header and claims that need no key."""
    header, claims = _structure(token)
    _check_claims(header, claims)
    return header


def _check_claims(header: Mapping[str, Any], claims: Mapping[str, Any]) -> None:
    """The rules of a token's header and time claims that jose does not enforce (or mishandles)."""
    if "crit" in header:
        raise AdminAuthError(401, "token uses an unsupported critical header")
    if "exp" not in claims:
        raise AdminAuthError(401, "token lacks exp")
    if not all(_is_time(claims[name]) for name in ("exp", "nbf", "iat") if name in claims):
        raise AdminAuthError(401, "malformed token")


def unverified_claims(token: str) -> dict[str, Any]:
    """A token's claims, parsed within the same bounds as `verify`, its signature NOT checked.

    For claims a caller needs of a token that is verified elsewhere, or that it received
    straight from the provider's token endpoint over TLS (OpenID Connect Core 1.0 section
    3.1.3.7, item 6): an ID token's `nonce`, a verified token's `exp`.

    Raises:
        AdminAuthError: 401 (`token too large`, `malformed token`, `token lacks exp`, ...) for
            what `verify` would refuse before looking at a key.
    """
    _parse(token)
    claims: dict[str, Any] = _segment(token.split(".")[1])
    return claims


_ACCESS_TOKEN_TYPES = frozenset({"at+jwt", "application/at+jwt"})
"""Header `typ` values of a JWT access token (RFC 9068 section 2.1), compared in lower case."""


def check_id_token_client(
    header: Mapping[str, Any], claims: Mapping[str, Any], client_id: str
) -> None:
    """Refuse a token that is not an ID token issued to `client_id`.

    OpenID Connect Core 1.0 section 3.1.3.7, items 4 and 5: an ID token with several audiences
    should name its authorized party (`azp`), and an `azp` present must be the client's own id;
    so a token the provider issued to another client that merely lists this one in `aud` is not
    the page's. And an access token is no ID token even with the client id in `aud`: one typed
    `at+jwt` in its header (RFC 9068 section 2.1), or with the claim `typ: Bearer` (Keycloak's
    access tokens; its ID tokens say `ID`).

    Args:
        header: The token's JOSE header.
        claims: Its claims (`aud` already known to hold `client_id`).
        client_id: The admin page's client id.

    Raises:
        AdminAuthError: 401 `not an ID token` or `ID token issued to another client (azp)`.
    """
    typ = header.get("typ")
    if (isinstance(typ, str) and typ.lower() in _ACCESS_TOKEN_TYPES) or claims.get(
        "typ"
    ) == "Bearer":
        raise AdminAuthError(401, "not an ID token (an access token of the identity provider)")
    audiences = claims.get("aud")
    several = isinstance(audiences, list) and len(audiences) > 1
    azp = claims.get("azp")
    if (azp is None and several) or (azp is not None and azp != client_id):
        raise AdminAuthError(401, "ID token issued to another client (azp)")


def unverified_header(token: str) -> dict[str, Any]:
    """A token's JOSE header, parsed as `unverified_claims` parses its claims (nothing verified).

    Raises:
        AdminAuthError: 401 as `unverified_claims`.
    """
    return _parse(token)


def _signed(token: str, key: Key, alg: str) -> None:
    """Check the signature alone, before any claim is judged (jose checks it again with them).

    Raises:
        AdminAuthError: 401 `token signature invalid`.
    """
    try:
        jws.verify(token, key, algorithms=[alg])
    except (JWSError, JWTError, TypeError, ValueError):
        raise AdminAuthError(401, "token signature invalid") from None


def _fits(key: Mapping[str, Any], alg: str) -> bool:
    """Whether a JWKS key may verify `alg`: matching key type, curve, and `alg` if it names one."""
    if key.get("kty") != _KEY_TYPES.get(alg[:2]) or key.get("alg", alg) != alg:
        return False
    return alg not in _CURVES or key.get("crv") == _CURVES[alg]


class AdminTokenVerifier:
    """Verifies admin tokens; build it with `from_settings`.

    Args:
        secret: The HS256 secret, or None (HS256 tokens refused).
        jwks: The identity provider's keys, or None (RS/ES tokens refused).
        algorithms: Algorithms accepted with JWKS keys.
        issuer: The `iss` JWKS tokens must carry.
        audience: The `aud` JWKS tokens must carry.
        scope_claim: Dotted path of the claim whose values grant scopes.
        admin_values: Claim values that grant `admin`.
        read_values: Claim values that grant `read`.
        leeway: Seconds of clock skew allowed on `exp`, `nbf` and `iat`.
        http: A client the verifier created and closes in `aclose`.
        client_id: The web page's OpenID Connect client id in `id_token` mode: JWKS tokens
            whose `aud` holds it are accepted too (the page's ID tokens); None: only
            `audience`.
    """

    def __init__(
        self,
        *,
        secret: str | None,
        jwks: JwksCache | None,
        algorithms: Collection[str] = ("RS256", "ES256"),
        issuer: str | None = None,
        audience: str | None = None,
        scope_claim: str = "scope",
        admin_values: Collection[str] = (),
        read_values: Collection[str] = (),
        leeway: float = 30.0,
        http: httpx.AsyncClient | None = None,
        client_id: str | None = None,
    ) -> None:
        self._hmac: Key | None = None if secret is None else jwk.construct(secret, "HS256")
        self._jwks = jwks
        self._algorithms = frozenset(alg for alg in algorithms if alg[:2] in _KEY_TYPES)
        self._issuer = issuer
        self._audience = audience
        self._scope_path = scope_claim.split(".")
        self._admin_values = frozenset(admin_values)
        self._read_values = frozenset(read_values)
        self._leeway = leeway
        self._owned_http = http
        self._client_id = client_id

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Self | None:
        """Build the verifier the settings describe, or None when the admin API is off.

        Args:
            settings: The `GATEWAY_ADMIN_JWT*` and `GATEWAY_ADMIN_JWKS*` settings.
            http: Client for fetching a JWKS URL; default: one of the verifier's own (closed by
                `aclose`). A JWKS URL is first fetched on first use, so a provider that is down
                at start does not stop the gateway.
            clock: Monotonic seconds for the JWKS refresh policy (tests step their own).

        Raises:
            gateway.auth.jwks.JwksError: if `GATEWAY_ADMIN_JWKS_FILE` cannot be read or holds
                no JWKS.
        """
        secret = settings.admin_jwt_secret
        jwks: JwksCache | None = None
        owned: httpx.AsyncClient | None = None
        cache_seconds = settings.admin_jwks_cache_seconds
        min_refresh = settings.admin_jwks_min_refresh_seconds
        if settings.admin_jwks_file is not None:
            jwks = JwksCache.from_file(
                settings.admin_jwks_file,
                cache_seconds=cache_seconds,
                min_refresh_seconds=min_refresh,
                clock=clock,
            )
        elif settings.admin_jwks_url is not None:
            if http is None:
                http = owned = httpx.AsyncClient(timeout=FETCH_TIMEOUT)
            jwks = JwksCache.from_url(
                str(settings.admin_jwks_url),
                http,
                cache_seconds=cache_seconds,
                min_refresh_seconds=min_refresh,
                clock=clock,
            )
        if secret is None and jwks is None:
            return None
        id_tokens_off = settings.admin_oidc_token == "access_token"  # noqa: S105 - a mode name
        return cls(
            secret=None if secret is None else secret.get_secret_value(),
            jwks=jwks,
            algorithms=settings.admin_jwt_algorithms,
            issuer=settings.admin_jwt_issuer,
            audience=settings.admin_jwt_audience,
            scope_claim=settings.admin_jwt_scope_claim,
            admin_values=settings.admin_jwt_admin_values,
            read_values=settings.admin_jwt_read_values,
            leeway=settings.admin_jwt_leeway_seconds,
            http=owned,
            client_id=None if id_tokens_off else settings.admin_oidc_client_id,
        )

    async def aclose(self) -> None:
        """Close the HTTP client the verifier created (not one passed in)."""
        if self._owned_http is not None:
            await self._owned_http.aclose()

    async def verify(self, token: str) -> AdminIdentity:
        """Verify an admin token (the text after `Bearer `).

        Raises:
            AdminAuthError: 401 for any token that is not valid (the message says why:
                `token expired`, `wrong audience`, `unknown signing key`, ...); 403 `token
                grants no admin scope` for a valid token that maps to no scope.
        """
        header, unverified = _structure(token)
        alg = header["alg"]
        if alg == "HS256" and self._hmac is not None:
            _signed(token, self._hmac, alg)
            _check_claims(header, unverified)
            claims = self._decode(token, self._hmac, alg, ISSUER, AUDIENCE)
            if claims["exp"] - time.time() > MAX_TTL.total_seconds() + self._leeway:
                raise AdminAuthError(401, "token lifetime exceeds 24 hours")
            scope = claims.get("scope")
            values = scope.split() if isinstance(scope, str) else []
            return self._identity(claims, SCOPES.intersection(values))
        if alg in self._algorithms and self._jwks is not None:
            key = await self._signing_key(self._jwks, header, alg)
            _signed(token, key, alg)
            _check_claims(header, unverified)
            audience = self._expected_audience(token)
            claims = self._decode(token, key, alg, self._issuer, audience)
            if self._client_id is not None and audience == self._client_id != self._audience:
                # Admitted as an ID token for the page: it must be one, and the page's.
                check_id_token_client(header, claims, self._client_id)
            return self._identity(claims, self._mapped_scopes(claims))
        raise AdminAuthError(401, "algorithm not allowed")

    def _expected_audience(self, token: str) -> str | None:
        """The audience jose must find in `token`: the configured one, or the page's client id.

        The client id only for a token whose `aud` holds it and not the configured audience (an
        ID token for the page); jose then checks it after the signature, like any audience.
        """
        if self._client_id is None:
            return self._audience
        audiences = unverified_claims(token).get("aud")
        audiences = [audiences] if isinstance(audiences, str) else audiences
        if not isinstance(audiences, list) or self._audience in audiences:
            return self._audience
        return self._client_id if self._client_id in audiences else self._audience

    async def _signing_key(self, jwks: JwksCache, header: Mapping[str, Any], alg: str) -> Key:
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise AdminAuthError(401, "token names no signing key (kid)")
        found = await jwks.key(kid)
        if found is None:
            message = "unknown signing key" if jwks.loaded else "signing keys unavailable"
            raise AdminAuthError(401, message)
        if not _fits(found, alg):
            raise AdminAuthError(401, "algorithm not allowed for this signing key")
        try:
            return jwk.construct(dict(found), alg)
        except (JWKError, ValueError, TypeError):
            raise AdminAuthError(401, "unknown signing key") from None

    def _decode(
        self, token: str, key: Key, alg: str, issuer: str | None, audience: str | None
    ) -> dict[str, Any]:
        """Verify signature and claims with jose, with one algorithm and one key."""
        # jose's other `require_*` options fail with the JWTError of a bad signature, so the
        # presence of `aud` and `sub` is checked below (`iss` fails jose's issuer check).
        options = {"require_exp": True, "verify_at_hash": False, "leeway": self._leeway}
        try:
            claims = jwt.decode(
                token, key, algorithms=[alg], options=options, issuer=issuer, audience=audience
            )
        except ExpiredSignatureError:
            raise AdminAuthError(401, "token expired") from None
        except JWTClaimsError:
            # Raised only after the signature held, so the claims may be read to say why.
            raise self._claims_error(jwt.get_unverified_claims(token), issuer, audience) from None
        except JWTError:
            raise AdminAuthError(401, "token signature invalid") from None
        except (TypeError, ValueError, OverflowError):  # a claim jose cannot compare
            raise AdminAuthError(401, "malformed token") from None
        if "aud" not in claims:  # jose checks `aud` only when present
            raise AdminAuthError(401, "wrong audience")
        if claims.get("iat", 0) > time.time() + self._leeway:
            raise AdminAuthError(401, "token not yet valid (issued in the future)")
        return claims

    def _claims_error(
        self, claims: Mapping[str, Any], issuer: str | None, audience: str | None
    ) -> AdminAuthError:
        audiences = claims.get("aud")
        audiences = [audiences] if isinstance(audiences, str) else audiences
        if claims.get("nbf", 0) > time.time() + self._leeway:
            return AdminAuthError(401, "token not yet valid")
        if claims.get("iss") != issuer:
            return AdminAuthError(401, "wrong issuer")
        if not isinstance(audiences, list) or audience not in audiences:
            return AdminAuthError(401, "wrong audience")
        if not isinstance(claims.get("sub"), str):
            return AdminAuthError(401, "token lacks sub")
        return AdminAuthError(401, "token claims invalid")

    def _mapped_scopes(self, claims: Mapping[str, Any]) -> frozenset[Scope]:
        """Scopes granted by the configured claim's values (a space-separated string or a list)."""
        value: Any = claims
        for part in self._scope_path:
            value = value.get(part) if isinstance(value, Mapping) else None
        values = set(value.split() if isinstance(value, str) else [])
        if isinstance(value, list):
            values = {entry for entry in value if isinstance(entry, str)}
        granted: set[Scope] = set()
        if values & self._admin_values:
            granted.add("admin")
        if values & self._read_values:
            granted.add("read")
        return frozenset(granted)

    @staticmethod
    def _identity(claims: Mapping[str, Any], scopes: frozenset[Scope]) -> AdminIdentity:
        subject = _clean(claims["sub"]) if isinstance(claims.get("sub"), str) else ""
        if not subject:
            raise AdminAuthError(401, "token lacks sub")
        if not scopes:
            raise AdminAuthError(403, "token grants no admin scope")
        if "admin" in scopes:
            scopes = SCOPES
        jti, iss = claims.get("jti"), claims.get("iss")
        return AdminIdentity(
            subject=subject,
            scopes=scopes,
            issuer=iss if isinstance(iss, str) else None,
            token_id=_clean(jti) if isinstance(jti, str) else None,
            expires_at=_expiry(claims.get("exp")),
        )


def _expiry(exp: object) -> datetime | None:
    """The `exp` claim (NumericDate, RFC 7519 section 2) as a UTC time; None if unusable."""
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    try:
        return datetime.fromtimestamp(exp, UTC)
    except (OverflowError, OSError, ValueError):
        return None

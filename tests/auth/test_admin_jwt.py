"""`gateway.auth.jwt`: admin tokens, the JWT attack set, and JWKS from a file and a real server.

The identity provider is `gateway.testing.idp` (Keycloak-shaped); its JWKS is served by a real
uvicorn on a loopback port where a URL is tested. Time in the JWKS refresh policy is a fake
clock stepped by the test, so no assertion depends on the machine's speed.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth.jwks import MIN_REFRESH_SECONDS, JwksError
from gateway.auth.jwt import (
    AUDIENCE,
    ISSUER,
    AdminAuthError,
    AdminIdentity,
    AdminTokenVerifier,
    mint_token,
)
from gateway.settings import Settings
from gateway.testing.idp import IdentityProvider, b64url, forge, public_jwk
from gateway.testing.server import LoopbackServer

SECRET = secrets.token_urlsafe(48)
ADMIN_ROLE, READ_ROLE = "gateway-admin", "gateway-read"


class FakeClock:
    """Monotonic seconds the test steps by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def idp() -> IdentityProvider:
    """One realm with an RSA and an EC signing key (generating RSA keys takes a while)."""
    provider = IdentityProvider()
    provider.add_key("RS256")
    provider.add_key("ES256")
    return provider


@pytest.fixture(scope="module")
def attacker() -> IdentityProvider:
    """Someone else's keys: tokens they sign must never verify."""
    provider = IdentityProvider()
    provider.add_key("RS256")
    return provider


def _kid(idp: IdentityProvider, kty: str) -> str:
    return next(kid for kid in idp.keys if public_jwk(idp.keys[kid], kid)["kty"] == kty)


def _settings(idp: IdentityProvider, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "admin_jwt_issuer": idp.issuer,
        "admin_jwt_audience": idp.audience,
        "admin_jwt_scope_claim": "realm_access.roles",
        "admin_jwt_admin_values": [ADMIN_ROLE],
        "admin_jwt_read_values": [READ_ROLE],
        "admin_oidc_redirect_uris": ["https://gateway.example.com/admin/"],  # with a client id
    }
    return Settings(_env_file=None, **(values | overrides))  # type: ignore[call-arg]


@pytest.fixture
def jwks_file(idp: IdentityProvider, tmp_path: Path) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(idp.jwks()))
    return path


@pytest.fixture
def verifier(idp: IdentityProvider, jwks_file: Path) -> AdminTokenVerifier:
    """Both paths configured: the shared secret and the provider's JWKS file."""
    built = AdminTokenVerifier.from_settings(
        _settings(idp, admin_jwt_secret=SECRET, admin_jwks_file=jwks_file)
    )
    assert built is not None
    return built


async def _refused(verifier: AdminTokenVerifier, token: str) -> AdminAuthError:
    with pytest.raises(AdminAuthError) as caught:
        await verifier.verify(token)
    assert token not in str(caught.value)
    return caught.value


def _hs(claims: dict[str, Any], header: dict[str, Any] | None = None, key: bytes = b"") -> str:
    return forge(header or {"alg": "HS256", "typ": "JWT"}, claims, key or SECRET.encode())


def _gateway_claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "cli:ops", "scope": "admin"}
    return claims | {"iat": now, "nbf": now, "exp": now + 600} | overrides


# --- the gateway's own HS256 tokens ----------------------------------------------------------


@pytest.mark.anyio
async def test_minted_admin_token_grants_admin_and_read(verifier: AdminTokenVerifier) -> None:
    token = mint_token(SECRET, subject="cli:ops", scope="admin", ttl=timedelta(minutes=15))
    identity = await verifier.verify(token)
    assert identity.subject == "cli:ops"
    assert identity.scopes == {"admin", "read"}
    assert identity.issuer == ISSUER
    assert identity.token_id
    identity.require("admin")


@pytest.mark.anyio
async def test_minted_read_token_grants_read_only(verifier: AdminTokenVerifier) -> None:
    identity = await verifier.verify(
        mint_token(SECRET, subject="ci", scope="read", ttl=timedelta(minutes=5))
    )
    assert identity.scopes == {"read"}
    identity.require("read")
    with pytest.raises(AdminAuthError) as caught:
        identity.require("admin")
    assert (caught.value.status, caught.value.message) == (403, "token lacks the admin scope")
    assert 'error="insufficient_scope"' in caught.value.www_authenticate


def test_minted_token_carries_the_fixed_claims() -> None:
    now = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    token = mint_token(SECRET, subject="cli:ops", scope="read", ttl=timedelta(hours=2), now=now)
    header, payload, _ = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    assert json.loads(base64.urlsafe_b64decode(header + "=="))["alg"] == "HS256"
    issued = int(now.timestamp())
    assert claims.pop("jti")
    assert claims == {
        **{"iss": "llm-gateway", "aud": "llm-gateway-admin", "sub": "cli:ops", "scope": "read"},
        **{"iat": issued, "nbf": issued, "exp": issued + 7200},
    }


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ttl": timedelta(hours=25)}, "24 hours"),
        ({"ttl": timedelta(0)}, "more than 0"),
        ({"scope": "root"}, "admin or read"),
        ({"subject": ""}, "printable"),
        ({"subject": "evil\nINFO forged log line"}, "printable"),
        ({"subject": "x" * 201}, "printable"),
    ],
)
def test_mint_token_refuses_what_it_must_not_sign(kwargs: dict[str, Any], match: str) -> None:
    values: dict[str, Any] = {"subject": "cli:ops", "scope": "admin", "ttl": timedelta(minutes=1)}
    with pytest.raises(ValueError, match=match):
        mint_token(SECRET, **(values | kwargs))


@pytest.mark.anyio
async def test_subject_is_stripped_of_control_characters_and_capped(
    verifier: AdminTokenVerifier,
) -> None:
    identity = await verifier.verify(_hs(_gateway_claims(sub="ali\x1b[31mce\u202e" + "x" * 300)))
    assert identity.subject == "ali[31mce" + "x" * 191
    assert len(identity.subject) == 200


@pytest.mark.anyio
async def test_subject_loses_every_invisible_character(verifier: AdminTokenVerifier) -> None:
    # Zero-width characters, the byte-order mark, word joiner, soft hyphen, bidi isolates and a
    # tag character: `alice` that reads like `alice` but is another subject in the audit trail.
    hidden = "a\u2060l\ufeffi\u00adc\u2066e\u2069\U000e0041\u200b@example.com\u2028"
    identity = await verifier.verify(_hs(_gateway_claims(sub=hidden)))
    assert identity.subject == "alice@example.com"


def test_no_secret_and_no_jwks_means_the_admin_api_is_off() -> None:
    assert AdminTokenVerifier.from_settings(Settings(_env_file=None)) is None


# --- the attack set --------------------------------------------------------------------------


def _attacks(idp: IdentityProvider, attacker: IdentityProvider) -> dict[str, tuple[str, str]]:
    """Name -> (token, the message it must be refused with)."""
    rsa_kid = _kid(idp, "RSA")
    ec_kid = _kid(idp, "EC")
    evil_kid = next(iter(attacker.keys))
    evil_key = attacker.keys[evil_kid]
    evil_jwk = public_jwk(evil_key, evil_kid)
    good = idp.claims([ADMIN_ROLE])
    now = int(time.time())
    pem = (
        idp.keys[rsa_kid]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    rs256 = {"alg": "RS256", "typ": "JWT", "kid": rsa_kid}
    jku = "http://127.0.0.1:9/attacker/jwks.json"
    cases = {
        "alg none": (forge({"alg": "none", "kid": rsa_kid}, good, None), "algorithm not allowed"),
        "alg None": (forge({"alg": "None"}, _gateway_claims(), None), "algorithm not allowed"),
        "HS256 signed with the RSA public key PEM": (
            forge({"alg": "HS256", "kid": rsa_kid}, good, pem),
            "token signature invalid",
        ),
        "HS512 (not allowed)": (
            forge({"alg": "HS512", "kid": rsa_kid}, good, pem),
            "algorithm not allowed",
        ),
        "RS384 (not in the allow-list)": (
            forge({**rs256, "alg": "RS384"}, good, idp.keys[rsa_kid]),
            "algorithm not allowed",
        ),
        "RS256 naming the EC key": (
            forge({**rs256, "kid": ec_kid}, good, idp.keys[rsa_kid]),
            "algorithm not allowed for this signing key",
        ),
        "expired": (
            idp.token(rsa_kid, [ADMIN_ROLE], exp=now - 120, iat=now - 400),
            "token expired",
        ),
        "not yet valid": (idp.token(rsa_kid, [ADMIN_ROLE], nbf=now + 300), "token not yet valid"),
        "issued in the future": (
            idp.token(rsa_kid, [ADMIN_ROLE], iat=now + 300),
            "token not yet valid (issued in the future)",
        ),
        "wrong iss": (
            idp.token(rsa_kid, [ADMIN_ROLE], iss="https://sso.example.com/realms/other"),
            "wrong issuer",
        ),
        "no iss": (forge(rs256, _without(good, "iss"), idp.keys[rsa_kid]), "wrong issuer"),
        "wrong aud": (idp.token(rsa_kid, [ADMIN_ROLE], aud="another-app"), "wrong audience"),
        "no aud": (forge(rs256, _without(good, "aud"), idp.keys[rsa_kid]), "wrong audience"),
        "HS256 with the IdP's audience": (
            _hs(_gateway_claims(aud="llm-gateway")),
            "wrong audience",
        ),
        "missing exp": (forge(rs256, _without(good, "exp"), idp.keys[rsa_kid]), "token lacks exp"),
        "HS256 missing exp": (_hs(_without(_gateway_claims(), "exp")), "token lacks exp"),
        "exp as a string": (_hs(_gateway_claims(exp=str(now + 600))), "malformed token"),
        # A forged token learns nothing of its claims: the signature is checked first.
        "forged, missing exp": (
            _hs(_without(_gateway_claims(), "exp"), key=secrets.token_bytes(32)),
            "token signature invalid",
        ),
        "forged, exp as a string": (
            _hs(_gateway_claims(exp=str(now + 600)), key=secrets.token_bytes(32)),
            "token signature invalid",
        ),
        "forged RS256, missing exp": (
            forge(rs256, _without(good, "exp"), evil_key),
            "token signature invalid",
        ),
        "forged, crit header": (
            forge({**rs256, "crit": ["exp-override"], "exp-override": True}, good, evil_key),
            "token signature invalid",
        ),
        "exp as true": (_hs(_gateway_claims(exp=True)), "malformed token"),
        "missing sub": (forge(rs256, _without(good, "sub"), idp.keys[rsa_kid]), "token lacks sub"),
        "blank sub": (_hs(_gateway_claims(sub="\x00\x01")), "token lacks sub"),
        "HS256 living 48 hours": (
            _hs(_gateway_claims(exp=now + 48 * 3600)),
            "token lifetime exceeds 24 hours",
        ),
        "HS256 signed with another secret": (
            _hs(_gateway_claims(), key=secrets.token_bytes(32)),
            "token signature invalid",
        ),
        "payload changed after signing": (
            _tamper(idp.token(rsa_kid, [READ_ROLE])),
            "token signature invalid",
        ),
        "unknown kid": (attacker.token(evil_kid, [ADMIN_ROLE]), "unknown signing key"),
        "no kid": (
            forge({"alg": "RS256"}, good, idp.keys[rsa_kid]),
            "token names no signing key (kid)",
        ),
        "oversized": (
            forge(rs256, good | {"pad": "x" * 8192}, idp.keys[rsa_kid]),
            "token too large",
        ),
        "malformed base64": ("eyJhbGciOiJIUzI1NiJ9!.e30.c2ln", "malformed token"),
        "impossible base64 length": ("eyJhbGciOiJIUzI1NiJ9.e.c2ln", "malformed token"),
        "two segments": ("eyJhbGciOiJIUzI1NiJ9.e30", "malformed token"),
        "bad JSON header": (b64url(b'{"alg":') + ".e30.c2ln", "malformed token"),
        "header not an object": (b64url(b"[1]") + ".e30.c2ln", "malformed token"),
        "deeply nested JSON header": (b64url(b"[" * 6000) + ".e30.c2ln", "malformed token"),
        "bad JSON payload": (
            b64url(b'{"alg":"HS256"}') + "." + b64url(b"{x") + ".c2ln",
            "malformed token",
        ),
        "jku at the attacker's JWKS, attacker's kid": (
            forge({"alg": "RS256", "kid": evil_kid, "jku": jku}, good, evil_key),
            "unknown signing key",
        ),
        "jku at the attacker's JWKS, the IdP's kid": (
            forge({**rs256, "jku": jku}, good, evil_key),
            "token signature invalid",
        ),
        "x5u at the attacker's certificate": (
            forge({**rs256, "x5u": jku}, good, evil_key),
            "token signature invalid",
        ),
        "embedded jwk of the attacker": (
            forge({**rs256, "jwk": evil_jwk}, good, evil_key),
            "token signature invalid",
        ),
        "embedded jwk, its own kid": (
            forge({"alg": "RS256", "kid": evil_kid, "jwk": evil_jwk}, good, evil_key),
            "unknown signing key",
        ),
        "embedded x5c": (
            forge(
                {**rs256, "x5c": ["MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA"]}, good, evil_key
            ),
            "token signature invalid",
        ),
        "crit header": (
            forge(
                {**rs256, "crit": ["exp-override"], "exp-override": True}, good, idp.keys[rsa_kid]
            ),
            "token uses an unsupported critical header",
        ),
    }
    return cases


def _without(claims: dict[str, Any], name: str) -> dict[str, Any]:
    return {key: value for key, value in claims.items() if key != name}


def _tamper(token: str) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["realm_access"]["roles"].append(ADMIN_ROLE)
    return f"{header}.{b64url(json.dumps(claims).encode())}.{signature}"


@pytest.fixture(scope="module")
def attacks(idp: IdentityProvider, attacker: IdentityProvider) -> dict[str, tuple[str, str]]:
    return _attacks(idp, attacker)


ATTACK_NAMES = [
    "alg none",
    "alg None",
    "HS256 signed with the RSA public key PEM",
    "HS512 (not allowed)",
    "RS384 (not in the allow-list)",
    "RS256 naming the EC key",
    "expired",
    "not yet valid",
    "issued in the future",
    "wrong iss",
    "no iss",
    "wrong aud",
    "no aud",
    "HS256 with the IdP's audience",
    "missing exp",
    "HS256 missing exp",
    "exp as a string",
    "exp as true",
    "missing sub",
    "blank sub",
    "HS256 living 48 hours",
    "HS256 signed with another secret",
    "payload changed after signing",
    "unknown kid",
    "no kid",
    "oversized",
    "malformed base64",
    "impossible base64 length",
    "two segments",
    "bad JSON header",
    "header not an object",
    "deeply nested JSON header",
    "bad JSON payload",
    "jku at the attacker's JWKS, attacker's kid",
    "jku at the attacker's JWKS, the IdP's kid",
    "x5u at the attacker's certificate",
    "embedded jwk of the attacker",
    "embedded jwk, its own kid",
    "embedded x5c",
    "crit header",
    "forged, missing exp",
    "forged, exp as a string",
    "forged RS256, missing exp",
    "forged, crit header",
]


def test_the_attack_list_names_every_attack(attacks: dict[str, tuple[str, str]]) -> None:
    assert sorted(ATTACK_NAMES) == sorted(attacks)


@pytest.mark.anyio
@pytest.mark.parametrize("name", ATTACK_NAMES)
async def test_attack_is_refused_with_401_and_its_reason(
    name: str,
    attacks: dict[str, tuple[str, str]],
    verifier: AdminTokenVerifier,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token, message = attacks[name]
    caplog.set_level(logging.DEBUG)
    error = await _refused(verifier, token)
    assert (error.status, error.message) == (401, message)
    assert error.www_authenticate == (
        f'Bearer error="invalid_token", error_description="{message}"'
    )
    assert token not in caplog.text


@pytest.mark.anyio
async def test_hs256_is_refused_outright_without_the_secret(
    idp: IdentityProvider, jwks_file: Path
) -> None:
    """Key confusion: with only a JWKS configured, no HS256 token is even tried."""
    verifier = AdminTokenVerifier.from_settings(_settings(idp, admin_jwks_file=jwks_file))
    assert verifier is not None
    rsa_kid = _kid(idp, "RSA")
    pem = (
        idp.keys[rsa_kid]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    confused = forge({"alg": "HS256", "kid": rsa_kid}, idp.claims([ADMIN_ROLE]), pem)
    assert (await _refused(verifier, confused)).message == "algorithm not allowed"
    minted = mint_token(SECRET, subject="x", scope="admin", ttl=timedelta(minutes=1))
    assert (await _refused(verifier, minted)).message == "algorithm not allowed"


@pytest.mark.anyio
async def test_jwks_tokens_are_refused_without_a_jwks() -> None:
    idp = IdentityProvider()
    kid = idp.add_key("ES256")
    verifier = AdminTokenVerifier.from_settings(Settings(_env_file=None, admin_jwt_secret=SECRET))
    assert verifier is not None
    assert (await _refused(verifier, idp.token(kid, [ADMIN_ROLE]))).message == (
        "algorithm not allowed"
    )


@pytest.mark.anyio
async def test_a_small_clock_skew_is_tolerated(
    idp: IdentityProvider, verifier: AdminTokenVerifier
) -> None:
    now = int(time.time())
    kid = _kid(idp, "RSA")
    late = idp.token(kid, [ADMIN_ROLE], exp=now - 10, iat=now - 300)
    early = idp.token(kid, [ADMIN_ROLE], nbf=now + 10, iat=now + 10)
    assert (await verifier.verify(late)).subject
    assert (await verifier.verify(early)).subject


# --- identity-provider tokens from a JWKS file -----------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("kty", ["RSA", "EC"])
async def test_keycloak_tokens_from_a_jwks_file_grant_scopes_by_realm_role(
    kty: str, idp: IdentityProvider, verifier: AdminTokenVerifier
) -> None:
    kid = _kid(idp, kty)
    admin = await verifier.verify(idp.token(kid, [ADMIN_ROLE]))
    assert admin == AdminIdentity(
        subject="5f1c3e2a-8d4b-4c1e-9a7f-2b6d0e9c4a11",
        scopes=frozenset({"admin", "read"}),
        issuer=idp.issuer,
        token_id=admin.token_id,
        expires_at=admin.expires_at,
    )
    assert admin.expires_at is not None
    assert admin.expires_at > datetime.now(UTC)  # the token's `exp`, an aware UTC time
    assert (await verifier.verify(idp.token(kid, [READ_ROLE]))).scopes == {"read"}
    error = await _refused(verifier, idp.token(kid, ["developer"]))
    assert (error.status, error.message) == (403, "token grants no admin scope")
    assert 'error="insufficient_scope"' in error.www_authenticate


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("claim", "claims"),
    [
        ("roles", {"roles": ["Gateway.Admin", "Other"]}),  # Entra ID app roles
        ("groups", {"groups": ["staff", "Gateway.Admin"]}),  # Okta groups claim
        ("scp", {"scp": "User.Read Gateway.Admin"}),  # a space-separated string
        # Keycloak client roles
        (
            "resource_access.llm-gateway.roles",
            {"resource_access": {"llm-gateway": {"roles": ["Gateway.Admin"]}}},
        ),
        ("roles", {"roles": "Gateway.Admin"}),  # a string, split on spaces
        ("roles", {"roles": ["gateway.admin"]}),  # values match exactly, case included
        ("roles", {"roles": [["Gateway.Admin"]]}),  # not strings: ignored
        ("realm_access.roles.0", {}),  # a path through a list reaches nothing
    ],
)
async def test_the_scope_claim_is_a_dotted_path_to_a_list_or_a_string(
    claim: str, claims: dict[str, Any], idp: IdentityProvider, jwks_file: Path
) -> None:
    settings = _settings(
        idp,
        admin_jwks_file=jwks_file,
        admin_jwt_scope_claim=claim,
        admin_jwt_admin_values=["Gateway.Admin"],
    )
    verifier = AdminTokenVerifier.from_settings(settings)
    assert verifier is not None
    token = idp.token(_kid(idp, "RSA"), [], **claims)
    if claims and claims.get("roles") not in (["gateway.admin"], [["Gateway.Admin"]]):
        assert (await verifier.verify(token)).scopes == {"admin", "read"}
    else:
        assert (await _refused(verifier, token)).status == 403


def test_a_broken_jwks_file_stops_start_up(idp: IdentityProvider, tmp_path: Path) -> None:
    broken = tmp_path / "jwks.json"
    broken.write_text('{"kids": []}')
    with pytest.raises(JwksError, match="not a JWKS"):
        AdminTokenVerifier.from_settings(_settings(idp, admin_jwks_file=broken))
    with pytest.raises(JwksError, match="cannot read"):
        AdminTokenVerifier.from_settings(_settings(idp, admin_jwks_file=tmp_path / "missing"))


# --- identity-provider tokens from a JWKS URL ------------------------------------------------


@pytest.fixture
def served_idp() -> Iterator[tuple[IdentityProvider, str]]:
    """A fresh identity provider with one RSA key, its JWKS on a loopback port."""
    provider = IdentityProvider()
    provider.add_key("RS256")
    with LoopbackServer(provider.app) as server:
        yield provider, f"{server.url}{provider.jwks_path}"


def _url_verifier(
    idp: IdentityProvider, url: str, clock: FakeClock, http: httpx.AsyncClient | None = None
) -> AdminTokenVerifier:
    settings = _settings(idp, admin_jwks_url=url, admin_jwks_cache_seconds=300)
    verifier = AdminTokenVerifier.from_settings(settings, http=http, clock=clock)
    assert verifier is not None
    return verifier


@pytest.mark.anyio
async def test_rs256_and_es256_from_a_served_jwks(
    served_idp: tuple[IdentityProvider, str],
) -> None:
    idp, url = served_idp
    ec_kid = idp.add_key("ES256")
    verifier = _url_verifier(idp, url, FakeClock())  # its own HTTP client
    try:
        assert idp.fetches == 0  # nothing is fetched before the first token
        rsa_token = idp.token(_kid(idp, "RSA"), [ADMIN_ROLE])
        assert (await verifier.verify(rsa_token)).scopes == {"admin", "read"}
        assert (await verifier.verify(idp.token(ec_kid, [READ_ROLE]))).scopes == {"read"}
        assert idp.fetches == 1
    finally:
        await verifier.aclose()


@pytest.mark.anyio
async def test_key_rotation_at_the_identity_provider(
    served_idp: tuple[IdentityProvider, str],
) -> None:
    idp, url = served_idp
    clock = FakeClock()
    old = next(iter(idp.keys))
    async with httpx.AsyncClient() as http:
        verifier = _url_verifier(idp, url, clock, http)
        await verifier.verify(idp.token(old, [ADMIN_ROLE]))
        assert idp.fetches == 1

        new = idp.add_key("RS256")  # the provider rolls a new key in...
        clock.advance(MIN_REFRESH_SECONDS)
        assert (await verifier.verify(idp.token(new, [ADMIN_ROLE]))).subject
        assert idp.fetches == 2  # ...its unknown kid fetched the JWKS once

        idp.remove_key(old)  # ...and the old one out
        clock.advance(60)
        assert (await verifier.verify(idp.token(old, [ADMIN_ROLE]))).subject  # still cached
        assert idp.fetches == 2
        clock.advance(300)  # the cache expires: the next token loads the JWKS again
        assert (await _refused(verifier, idp.token(old, [ADMIN_ROLE]))).message == (
            "unknown signing key"
        )
        assert idp.fetches == 3
        assert (await verifier.verify(idp.token(new, [READ_ROLE]))).scopes == {"read"}
        assert idp.fetches == 3


@pytest.mark.anyio
async def test_random_kids_fetch_the_jwks_at_most_once_per_interval(
    served_idp: tuple[IdentityProvider, str], attacker: IdentityProvider
) -> None:
    idp, url = served_idp
    clock = FakeClock()
    evil = attacker.keys[next(iter(attacker.keys))]

    def random_kid_token() -> str:
        claims = idp.claims([ADMIN_ROLE])
        return forge({"alg": "RS256", "kid": secrets.token_hex(8)}, claims, evil)

    async with httpx.AsyncClient() as http:
        verifier = _url_verifier(idp, url, clock, http)
        for _ in range(20):
            await _refused(verifier, random_kid_token())
        assert idp.fetches == 1
        clock.advance(MIN_REFRESH_SECONDS - 1)
        for _ in range(20):
            await _refused(verifier, random_kid_token())
        assert idp.fetches == 1
        clock.advance(1)
        for _ in range(20):
            await _refused(verifier, random_kid_token())
        assert idp.fetches == 2


@pytest.mark.anyio
async def test_the_minimum_refresh_interval_is_a_setting(
    served_idp: tuple[IdentityProvider, str],
) -> None:
    idp, url = served_idp
    clock = FakeClock()
    old = next(iter(idp.keys))
    settings = _settings(idp, admin_jwks_url=url, admin_jwks_min_refresh_seconds=5)
    async with httpx.AsyncClient() as http:
        verifier = AdminTokenVerifier.from_settings(settings, http=http, clock=clock)
        assert verifier is not None
        await verifier.verify(idp.token(old, [ADMIN_ROLE]))
        new = idp.add_key("RS256")
        clock.advance(4)
        assert (await _refused(verifier, idp.token(new, [ADMIN_ROLE]))).message == (
            "unknown signing key"
        )
        assert idp.fetches == 1
        clock.advance(1)  # 5 s after the last load, not the default 30
        assert (await verifier.verify(idp.token(new, [ADMIN_ROLE]))).subject
        assert idp.fetches == 2


@pytest.mark.anyio
async def test_concurrent_unknown_kids_share_one_fetch(
    served_idp: tuple[IdentityProvider, str],
) -> None:
    idp, url = served_idp
    clock = FakeClock()
    new = idp.add_key("ES256")
    results: list[AdminIdentity] = []

    async with httpx.AsyncClient() as http:
        verifier = _url_verifier(idp, url, clock, http)

        async def verify() -> None:
            results.append(await verifier.verify(idp.token(new, [ADMIN_ROLE])))

        async with anyio.create_task_group() as tasks:
            for _ in range(25):
                tasks.start_soon(verify)
    assert len(results) == 25
    assert idp.fetches == 1


@pytest.mark.anyio
async def test_a_failing_jwks_keeps_the_last_good_keys(
    served_idp: tuple[IdentityProvider, str], caplog: pytest.LogCaptureFixture
) -> None:
    idp, url = served_idp
    clock = FakeClock()
    kid = next(iter(idp.keys))
    async with httpx.AsyncClient() as http:
        verifier = _url_verifier(idp, url, clock, http)
        await verifier.verify(idp.token(kid, [ADMIN_ROLE]))

        idp.failing = True
        new = idp.add_key("RS256")
        clock.advance(400)  # past the cache and the refresh interval
        token = idp.token(kid, [ADMIN_ROLE])
        assert (await verifier.verify(token)).subject  # the fetch failed: last good keys kept
        assert idp.fetches == 2
        unknown = idp.token(new, [ADMIN_ROLE])
        assert (await _refused(verifier, unknown)).message == "unknown signing key"
        assert idp.fetches == 2  # not asked again within the interval
    assert "status 503" in caplog.text
    assert "keeping the 1 keys" in caplog.text
    assert token not in caplog.text
    assert unknown not in caplog.text


@pytest.mark.anyio
async def test_a_jwks_url_down_at_start_refuses_tokens_then_recovers(
    served_idp: tuple[IdentityProvider, str],
) -> None:
    idp, url = served_idp
    clock = FakeClock()
    kid = next(iter(idp.keys))
    idp.failing = True
    async with httpx.AsyncClient() as http:
        verifier = _url_verifier(idp, url, clock, http)  # builds: nothing fetched yet
        error = await _refused(verifier, idp.token(kid, [ADMIN_ROLE]))
        assert (error.status, error.message) == (401, "signing keys unavailable")
        idp.failing = False
        clock.advance(MIN_REFRESH_SECONDS)
        assert (await verifier.verify(idp.token(kid, [ADMIN_ROLE]))).subject


@pytest.mark.anyio
async def test_an_unreachable_jwks_url_refuses_tokens_with_401() -> None:
    idp = IdentityProvider()
    kid = idp.add_key("ES256")
    with LoopbackServer(idp.app) as server:
        url = f"{server.url}{idp.jwks_path}"  # a port nobody listens on once stopped
    verifier = _url_verifier(idp, url, FakeClock())
    try:
        error = await _refused(verifier, idp.token(kid, [ADMIN_ROLE]))
        assert (error.status, error.message) == (401, "signing keys unavailable")
    finally:
        await verifier.aclose()


@pytest.mark.anyio
async def test_jku_is_never_fetched(
    idp: IdentityProvider, attacker: IdentityProvider, verifier: AdminTokenVerifier
) -> None:
    hits: list[str] = []

    async def attacker_jwks(request: Request) -> JSONResponse:
        hits.append(request.url.path)
        return JSONResponse(attacker.jwks())

    app = Starlette(routes=[Route("/jwks.json", attacker_jwks)])
    evil_kid = next(iter(attacker.keys))
    with LoopbackServer(app) as server:
        for header in ("jku", "x5u"):
            token = forge(
                {"alg": "RS256", "kid": evil_kid, header: f"{server.url}/jwks.json"},
                idp.claims([ADMIN_ROLE]),
                attacker.keys[evil_kid],
            )
            assert (await _refused(verifier, token)).message == "unknown signing key"
    assert hits == []


@pytest.mark.anyio
async def test_a_jwks_file_is_read_again_for_a_new_kid(tmp_path: Path) -> None:
    idp = IdentityProvider()
    old = idp.add_key("ES256")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(idp.jwks()))
    clock = FakeClock()
    verifier = AdminTokenVerifier.from_settings(_settings(idp, admin_jwks_file=path), clock=clock)
    assert verifier is not None
    assert (await verifier.verify(idp.token(old, [READ_ROLE]))).scopes == {"read"}

    new = idp.add_key("RS256")
    path.write_text(json.dumps(idp.jwks()))
    token = idp.token(new, [ADMIN_ROLE])
    assert (await _refused(verifier, token)).message == "unknown signing key"  # read at start
    clock.advance(MIN_REFRESH_SECONDS)
    assert (await verifier.verify(token)).scopes == {"admin", "read"}


@pytest.mark.anyio
async def test_an_oversized_jwks_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    idp = IdentityProvider()
    kid = idp.add_key("ES256")

    async def huge(_request: Request) -> JSONResponse:
        return JSONResponse(idp.jwks() | {"padding": "x" * 300_000})

    with LoopbackServer(Starlette(routes=[Route("/certs", huge)])) as server:
        verifier = _url_verifier(idp, f"{server.url}/certs", FakeClock())
        try:
            error = await _refused(verifier, idp.token(kid, [ADMIN_ROLE]))
        finally:
            await verifier.aclose()
    assert error.message == "signing keys unavailable"
    assert "larger than 262144 bytes" in caplog.text


def _hostile_jwks(idp: IdentityProvider, kid: str, kind: str) -> bytes:
    """The provider's JWKS, spoiled in one way a broken or hostile provider could."""
    document = idp.jwks()
    if kind == "nested list":  # past Python's recursion limit: RecursionError before the fix
        return json.dumps(document).encode()[:-1] + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    if kind == "nested object":
        deep = b'{"a":' * 3000 + b"1" + b"}" * 3000
        return json.dumps(document).encode()[:-1] + b', "x": ' + deep + b"}"
    key = next(entry for entry in document["keys"] if entry["kid"] == kid)
    if kind == "kty a list":  # unhashable: a TypeError in the type check before the fix
        key["kty"] = ["RSA"]
    elif kind == "n an object":
        key["n"] = {"a": key["n"]}
    return json.dumps(document).encode()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("nested list", "signing keys unavailable"),
        ("nested object", "signing keys unavailable"),
        ("kty a list", "unknown signing key"),
        ("n an object", "unknown signing key"),
    ],
)
async def test_a_hostile_jwks_refuses_tokens_with_401_not_an_exception(
    caplog: pytest.LogCaptureFixture, kind: str, reason: str
) -> None:
    idp = IdentityProvider()
    kid = idp.add_key("RS256")
    served = _hostile_jwks(idp, kid, kind)

    async def certs(_request: Request) -> Response:
        return Response(served, media_type="application/json")

    with LoopbackServer(Starlette(routes=[Route("/certs", certs)])) as server:
        verifier = _url_verifier(idp, f"{server.url}/certs", FakeClock())
        try:
            error = await _refused(verifier, idp.token(kid, [ADMIN_ROLE]))
        finally:
            await verifier.aclose()
    assert (error.status, error.message) == (401, reason)
    if reason == "signing keys unavailable":
        assert "is nested deeper than 16 levels" in caplog.text


def test_a_jwks_file_nested_too_deep_stops_start_up_with_a_clear_error(
    idp: IdentityProvider, tmp_path: Path
) -> None:
    path = tmp_path / "jwks.json"
    path.write_bytes(_hostile_jwks(idp, _kid(idp, "RSA"), "nested list"))
    with pytest.raises(JwksError, match="nested deeper than 16 levels"):
        AdminTokenVerifier.from_settings(_settings(idp, admin_jwks_file=path))


# --- ID tokens of the admin page's single sign-on (GATEWAY_ADMIN_OIDC_*) ----------------------

PAGE_CLIENT = "llm-gateway-admin-page"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mode", "audience", "outcome"),
    [
        ("id_token", PAGE_CLIENT, "admin"),  # an ID token for the page (OIDC Core 1.0 section 2)
        ("id_token", [PAGE_CLIENT, "other-app"], "admin"),
        ("id_token", "other-app", "wrong audience"),
        ("id_token", [], "wrong audience"),
        ("access_token", PAGE_CLIENT, "wrong audience"),  # access_token mode: the audience only
        ("access_token", "llm-gateway", "admin"),
    ],
)
async def test_id_tokens_for_the_page_open_the_api_only_in_id_token_mode(
    idp: IdentityProvider, jwks_file: Path, mode: str, audience: Any, outcome: str
) -> None:
    verifier = AdminTokenVerifier.from_settings(
        _settings(
            idp,
            admin_jwks_file=jwks_file,
            admin_oidc_client_id=PAGE_CLIENT,
            admin_oidc_token=mode,
        )
    )
    assert verifier is not None
    # Shaped like an ID token for the page (Keycloak's: `typ: ID`, `azp` the client).
    token = idp.token(_kid(idp, "RSA"), [ADMIN_ROLE], aud=audience, typ="ID", azp=PAGE_CLIENT)

    if outcome == "admin":
        assert (await verifier.verify(token)).scopes == {"admin", "read"}
    else:
        assert (await _refused(verifier, token)).message == outcome


@pytest.mark.anyio
async def test_an_id_token_for_the_page_keeps_every_other_check(
    idp: IdentityProvider, attacker: IdentityProvider, jwks_file: Path
) -> None:
    verifier = AdminTokenVerifier.from_settings(
        _settings(
            idp,
            admin_jwt_secret=SECRET,
            admin_jwks_file=jwks_file,
            admin_oidc_client_id=PAGE_CLIENT,
        )
    )
    assert verifier is not None
    kid = _kid(idp, "RSA")
    page = {"aud": PAGE_CLIENT, "typ": "ID", "azp": PAGE_CLIENT}
    wrong_issuer = idp.token(kid, [ADMIN_ROLE], **page, iss="https://evil.example")
    expired = idp.token(kid, [ADMIN_ROLE], **page, exp=int(time.time()) - 3600)
    no_role = idp.token(kid, ["staff"], **page)
    foreign = attacker.token(next(iter(attacker.keys)), [ADMIN_ROLE], **page)

    assert (await _refused(verifier, wrong_issuer)).message == "wrong issuer"
    assert (await _refused(verifier, expired)).message == "token expired"
    assert (await _refused(verifier, no_role)).status == 403
    assert (await _refused(verifier, foreign)).message == "unknown signing key"
    hs256 = _hs(_gateway_claims(aud=PAGE_CLIENT))  # the client id is no audience of HS256 tokens
    assert (await _refused(verifier, hs256)).message == "wrong audience"


_ANOTHER_CLIENT = "gateway-admin-cli"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("claims", "header_typ", "outcome"),
    [
        ({"aud": PAGE_CLIENT, "typ": "ID", "azp": PAGE_CLIENT}, "JWT", "admin"),
        ({"aud": PAGE_CLIENT, "typ": "ID"}, "JWT", "admin"),  # one audience: azp may be absent
        ({"aud": [PAGE_CLIENT], "typ": "ID"}, "JWT", "admin"),
        # OIDC Core 1.0 section 3.1.3.7 item 5: azp, when present, is the client's own id.
        ({"aud": PAGE_CLIENT, "typ": "ID", "azp": _ANOTHER_CLIENT}, "JWT", "another client"),
        # Item 4: several audiences and no azp: whose token is it?
        ({"aud": [PAGE_CLIENT, "other-app"], "typ": "ID"}, "JWT", "another client"),
        ({"aud": [PAGE_CLIENT, _ANOTHER_CLIENT], "azp": _ANOTHER_CLIENT}, "JWT", "another client"),
        # Access tokens that list the page's client in aud are not ID tokens.
        ({"aud": PAGE_CLIENT, "typ": "Bearer", "azp": PAGE_CLIENT}, "JWT", "not an ID token"),
        ({"aud": PAGE_CLIENT, "typ": "ID", "azp": PAGE_CLIENT}, "at+jwt", "not an ID token"),
        ({"aud": PAGE_CLIENT, "azp": PAGE_CLIENT}, "application/AT+JWT", "not an ID token"),
    ],
)
async def test_only_an_id_token_issued_to_the_page_opens_the_api_by_the_client_id(
    idp: IdentityProvider,
    jwks_file: Path,
    claims: dict[str, Any],
    header_typ: str,
    outcome: str,
) -> None:
    verifier = AdminTokenVerifier.from_settings(
        _settings(idp, admin_jwks_file=jwks_file, admin_oidc_client_id=PAGE_CLIENT)
    )
    assert verifier is not None
    kid = _kid(idp, "RSA")
    header = {"alg": "RS256", "typ": header_typ, "kid": kid}
    base = idp.claims([ADMIN_ROLE])
    del base["typ"], base["azp"]  # only what the case names
    token = forge(header, base | claims, idp.keys[kid])

    if outcome == "admin":
        assert (await verifier.verify(token)).scopes == {"admin", "read"}
    else:
        refused = await _refused(verifier, token)
        assert refused.status == 401
        assert outcome in refused.message


@pytest.mark.anyio
async def test_the_id_token_rules_do_not_touch_tokens_for_the_configured_audience(
    idp: IdentityProvider, jwks_file: Path
) -> None:
    # A Keycloak access token for GATEWAY_ADMIN_JWT_AUDIENCE: typ Bearer, azp another client.
    verifier = AdminTokenVerifier.from_settings(
        _settings(idp, admin_jwks_file=jwks_file, admin_oidc_client_id=PAGE_CLIENT)
    )
    assert verifier is not None
    token = idp.token(_kid(idp, "RSA"), [ADMIN_ROLE], aud=[idp.audience, PAGE_CLIENT])

    assert (await verifier.verify(token)).scopes == {"admin", "read"}

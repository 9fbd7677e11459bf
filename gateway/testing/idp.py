"""A stand-in identity provider for tests: Keycloak-shaped signing keys, JWKS and access tokens.

Owns `IdentityProvider`. It makes RSA and EC keys with `cryptography`, publishes their public
halves as Keycloak does (`GET /realms/<realm>/protocol/openid-connect/certs`, next to an
encryption key the gateway must skip), signs tokens shaped like Keycloak's access tokens (roles
in `realm_access.roles`), and forges tokens with any header and any key for attack tests. It
never imports python-jose, so it checks the verifier rather than mirroring it.

Serve `idp.app` with `gateway.testing.server.LoopbackServer`; `fetches` counts JWKS requests and
`failing` makes them answer 503.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from typing import Any, Literal

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SigningKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | bytes | None
"""What `forge` signs with: an RSA or P-256 key, HMAC secret bytes, or None (no signature)."""


def b64url(data: bytes) -> str:
    """Base64url without padding (RFC 7515 section 2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _uint(number: int, size: int | None = None) -> str:
    return b64url(number.to_bytes(size or (number.bit_length() + 7) // 8, "big"))


def public_jwk(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    """The public JWK of an RSA key (RS256) or a P-256 key (ES256), as Keycloak lists it."""
    if isinstance(key, rsa.RSAPrivateKey):
        numbers = key.public_key().public_numbers()
        fields = {"kty": "RSA", "alg": "RS256", "n": _uint(numbers.n), "e": _uint(numbers.e)}
    else:
        point = key.public_key().public_numbers()
        fields = {"kty": "EC", "alg": "ES256", "crv": "P-256"}
        fields |= {"x": _uint(point.x, 32), "y": _uint(point.y, 32)}
    return {"kid": kid, "use": "sig", **fields}


def forge(header: dict[str, Any], claims: dict[str, Any], key: SigningKey) -> str:
    """A compact JWS of `claims` with exactly `header`, signed per `header["alg"]` by `key`."""
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    data = signing_input.encode()
    if key is None:
        signature = b""
    elif isinstance(key, bytes):
        signature = hmac.new(key, data, hashlib.sha256).digest()
    elif isinstance(key, rsa.RSAPrivateKey):
        signature = key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    else:
        r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return f"{signing_input}.{b64url(signature)}"


class IdentityProvider:
    """A Keycloak realm in miniature.

    Args:
        realm: The realm's name; the issuer is `https://sso.example.com/realms/<realm>`.
        audience: The `aud` its tokens carry (Keycloak: the client id, via an audience mapper).
    """

    def __init__(self, realm: str = "acme", audience: str = "llm-gateway") -> None:
        self.issuer = f"https://sso.example.com/realms/{realm}"
        self.audience = audience
        self.jwks_path = f"/realms/{realm}/protocol/openid-connect/certs"
        self.keys: dict[str, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey] = {}
        """The published signing keys, by kid."""
        self._every_key = dict(self.keys)
        self.fetches = 0
        self.failing = False
        self.app = Starlette(routes=[Route(self.jwks_path, self._certs)])

    def add_key(self, kind: Literal["RS256", "ES256"] = "RS256") -> str:
        """Create and publish a new signing key; returns its `kid`."""
        key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
        if kind == "RS256":
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        else:
            key = ec.generate_private_key(ec.SECP256R1())
        kid = b64url(uuid.uuid4().bytes)
        self.keys[kid] = self._every_key[kid] = key
        return kid

    def remove_key(self, kid: str) -> None:
        """Stop publishing a key (rotated out); `token` can still sign with it."""
        del self.keys[kid]

    def jwks(self) -> dict[str, Any]:
        """The JWKS document: every signing key, plus an encryption key as Keycloak adds."""
        keys = [public_jwk(key, kid) for kid, key in self.keys.items()]
        encryption = {"kid": "enc-1", "kty": "RSA", "alg": "RSA-OAEP", "use": "enc"}
        return {"keys": [*keys, {**encryption, "n": "sXch", "e": "AQAB"}]}

    def claims(self, roles: list[str], /, *, lifetime: int = 300, **extra: Any) -> dict[str, Any]:
        """Claims shaped like a Keycloak access token; `extra` overrides or adds claims."""
        now = int(time.time())
        claims: dict[str, Any] = {
            **{"exp": now + lifetime, "iat": now, "jti": str(uuid.uuid4())},
            **{"iss": self.issuer, "aud": [self.audience, "account"], "typ": "Bearer"},
            **{"sub": "5f1c3e2a-8d4b-4c1e-9a7f-2b6d0e9c4a11", "azp": "gateway-admin-cli"},
            **{"preferred_username": "alice", "scope": "openid profile email"},
            "realm_access": {"roles": [*roles, "offline_access", "default-roles-acme"]},
        }
        return claims | extra

    def token(self, kid: str, roles: list[str], /, **extra: Any) -> str:
        """A token signed by the key `kid` (which may have been removed since)."""
        key = self._every_key[kid]
        alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
        return forge({"alg": alg, "typ": "JWT", "kid": kid}, self.claims(roles, **extra), key)

    async def _certs(self, _request: Request) -> Response:
        self.fetches += 1
        if self.failing:
            return Response("identity provider unavailable", status_code=503)
        return JSONResponse(self.jwks())

"""The test OpenID provider (oidc-provider-mock) in a process of its own, and a browser's part.

`start_oidc_provider` runs `tests/support/oidc_mock_app.py` with `.venv/oidc/bin/python`
(scripts/oidc-mock installs it from requirements/oidc-mock.txt) on a free loopback port and
registers `USERS`; the `oidc_provider` fixture (tests/conftest.py) hands a test the running
`OidcProvider`. Without `.venv/oidc` the tests that use it skip, naming the script; under CI
they fail instead.

`OidcProvider.sign_in` plays the browser of the authorization code flow (OpenID Connect Core
1.0 section 3.1) over real HTTP: it opens the authorization endpoint with PKCE (RFC 7636),
a state and a nonce, submits the provider's form as a user, and returns the code from the
redirect, as the admin page would receive it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gateway.testing.stack import ManagedProcess, free_port
from tests.support.servers import in_ci

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "oidc" / "bin" / "python"
"""The test provider's interpreter (Python 3.12+), made by scripts/oidc-mock."""
APP = Path(__file__).with_name("oidc_mock_app.py")

CLIENT_ID = "llm-gateway-admin-page"
"""The admin page's client id; the provider accepts any unregistered client."""
ADMIN_GROUP, READ_GROUP = "gateway-admins", "gateway-readers"
ADMIN_SUB, READER_SUB, NOBODY_SUB = "alice-admin", "bob-reader", "carol-nobody"
USERS: dict[str, dict[str, Any]] = {
    ADMIN_SUB: {"groups": [ADMIN_GROUP, "staff"], "email": "alice@example.com", "name": "Alice"},
    READER_SUB: {"groups": [READ_GROUP], "email": "bob@example.com", "name": "Bob"},
    NOBODY_SUB: {"groups": ["staff"], "email": "carol@example.com", "name": "Carol"},
}
"""The users the provider knows, by `sub`; their `groups` claim is in their ID tokens."""


def pkce_pair() -> tuple[str, str]:
    """A fresh PKCE `(code_verifier, code_challenge)`, S256 (RFC 7636 sections 4.1 and 4.2)."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass
class SignIn:
    """What the page holds after the provider sent the user back: the code and its secrets."""

    code: str
    code_verifier: str
    nonce: str
    redirect_uri: str

    def body(self, **changes: str) -> dict[str, str]:
        """The `POST /admin/oidc/token` body for this sign-in; `changes` replace fields."""
        fields = {
            "code": self.code,
            "code_verifier": self.code_verifier,
            "redirect_uri": self.redirect_uri,
            "nonce": self.nonce,
        }
        return fields | changes


@dataclass
class OidcProvider:
    """A running test provider: its issuer URL (its base URL too) and its process."""

    url: str
    process: ManagedProcess | None = field(default=None, repr=False)

    @property
    def issuer(self) -> str:
        return self.url

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/jwks"

    def set_user(self, sub: str, claims: dict[str, Any]) -> None:
        """Create or replace a user and the claims its tokens carry."""
        response = httpx.put(f"{self.url}/users/{sub}", json=claims, timeout=10)
        assert response.status_code == 204, response.text

    def gateway_settings(self, page_urls: str | list[str], **overrides: Any) -> dict[str, Any]:
        """`Settings` keyword arguments for a gateway that signs admins in with this provider.

        `page_urls` is the gateway's admin page URL (`http://127.0.0.1:<port>/admin/`), or
        several: `GATEWAY_ADMIN_OIDC_REDIRECT_URIS`. Pick the port first (`free_port`) and
        start the gateway on it.
        """
        values: dict[str, Any] = {
            "admin_jwks_url": self.jwks_url,
            "admin_jwt_issuer": self.issuer,
            "admin_jwt_audience": "llm-gateway",  # access tokens; the page's are ID tokens
            "admin_jwt_scope_claim": "groups",
            "admin_jwt_admin_values": [ADMIN_GROUP],
            "admin_jwt_read_values": [READ_GROUP],
            "admin_oidc_client_id": CLIENT_ID,
            "admin_oidc_redirect_uris": [page_urls] if isinstance(page_urls, str) else page_urls,
        }
        return values | overrides

    def gateway_env(self, page_urls: str | list[str]) -> dict[str, str]:
        """The same as `GATEWAY_*` variables, for a `gateway serve` process (on that port)."""
        return {
            f"GATEWAY_{name.upper()}": ",".join(value) if isinstance(value, list) else value
            for name, value in self.gateway_settings(page_urls).items()
        }

    def sign_in(
        self,
        sub: str,
        redirect_uri: str,
        *,
        client_id: str = CLIENT_ID,
        scope: str = "openid profile email",
    ) -> SignIn:
        """Run the browser's part of the code flow as `sub`; return the code and its secrets.

        `redirect_uri` is the admin page's URL (`<gateway>/admin/`); nothing is sent to it.
        """
        verifier, challenge = pkce_pair()
        state, nonce = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        query = {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "scope": scope,
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        endpoint = f"{self.url}/oauth2/authorize"
        with httpx.Client(timeout=10, follow_redirects=False) as browser:
            form = browser.get(endpoint, params=query)
            assert form.status_code == 200, form.text
            assert sub not in USERS or f'aria-label="Authorize as {sub}"' in form.text
            chosen = browser.post(endpoint, params=query, data={"sub": sub})
        assert chosen.status_code == 302, chosen.text
        location = chosen.headers["location"]
        assert location.startswith(redirect_uri), location
        returned = parse_qs(urlsplit(location).query)
        assert returned["state"] == [state]
        return SignIn(returned["code"][0], verifier, nonce, redirect_uri)


def require_oidc_python() -> Path:
    """The provider's interpreter; skips the test without it (fails under CI)."""
    if PYTHON.exists():
        return PYTHON
    message = f"the test OpenID provider is not installed ({PYTHON} is missing)"
    if in_ci():
        pytest.fail(f"{message}: scripts/oidc-mock must run first (CI is set: not a skip)")
    pytest.skip(f"{message}: run scripts/oidc-mock (needs Python 3.12+)")


@contextmanager
def start_oidc_provider(
    log_path: Path, *, token_max_age: float | None = None
) -> Iterator[OidcProvider]:
    """Start the test provider on a free loopback port with `USERS`; stop it on exit.

    Args:
        log_path: Where the provider's output goes.
        token_max_age: Seconds its ID and access tokens last (default: the provider's hour);
            short for a test of what happens when a sign-in expires.
    """
    python = require_oidc_python()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [str(python), str(APP), "--port", str(port)]
    if token_max_age is not None:
        argv += ["--token-max-age", str(token_max_age)]
    for sub, claims in USERS.items():  # buttons on the provider's form, for a real browser
        argv += ["--user-claims", json.dumps({"sub": sub, **claims})]
    ready = f"{url}/.well-known/openid-configuration"
    with ManagedProcess(
        "test OpenID provider", argv, url, ready, log_path=log_path, start_timeout=60
    ) as process:
        yield OidcProvider(url, process)

"""The test OpenID provider's process: oidc-provider-mock, plus the PKCE check it lacks.

Run by `tests.support.oidc` with `.venv/oidc/bin/python` (Python 3.12+ with
requirements/oidc-mock.txt installed: scripts/oidc-mock) as
`oidc_mock_app.py --port N [--token-max-age SECONDS] [--user-claims JSON ...]`; the suite
never imports it.
oidc-provider-mock 0.4 registers authlib's `OpenIDCode` extension but not `CodeChallenge`, so
it ignores `code_verifier`: a wrong one got tokens when tried. `PkceCheck`
wraps its WSGI app to do what a real provider does (RFC 7636 section 4.6): it remembers the
`code_challenge` of each authorization the provider grants, by the code it issues, and answers a
token request for that code whose `code_verifier` does not match with 400 `invalid_grant`
(RFC 6749 section 5.2), before the provider sees it.

Everything else is the provider's own: discovery at `/.well-known/openid-configuration`, issuer
`http://127.0.0.1:<port>`, RS256 ID tokens with the user's claims (`PUT /users/<sub>` sets them),
the authorization form (`POST` with `sub`; each `--user-claims` user is a button on it,
labelled `Authorize as <sub>`), nonces required (`require_nonce`), tokens that last an hour or
`--token-max-age` seconds (its `access_token_max_age`).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import oidc_provider_mock  # only in .venv/oidc: this file is run there, never imported
import uvicorn

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WsgiApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def _first(values: dict[str, list[str]], name: str) -> str | None:
    found = values.get(name)
    return found[0] if found else None


class PkceCheck:
    """WSGI middleware: RFC 7636 section 4.6 in front of a provider that does not check it."""

    def __init__(self, app: WsgiApp) -> None:
        self.app = app
        self.challenges: dict[str, tuple[str, str]] = {}
        self.lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        if path == "/oauth2/authorize" and method == "POST":
            return self._authorize(environ, start_response)
        if path == "/oauth2/token" and method == "POST":
            size = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(size)
            environ["wsgi.input"] = io.BytesIO(body)  # the provider reads it again
            form = parse_qs(body.decode("latin-1"))
            with self.lock:
                expected = self.challenges.get(_first(form, "code") or "")
            if expected is not None and not _matches(_first(form, "code_verifier"), *expected):
                answer = {"error": "invalid_grant", "error_description": "PKCE check failed"}
                data = json.dumps(answer).encode()
                headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
                start_response("400 Bad Request", [*headers, ("Cache-Control", "no-store")])
                return [data]
        return self.app(environ, start_response)

    def _authorize(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        query = parse_qs(environ.get("QUERY_STRING", ""))
        challenge = _first(query, "code_challenge")
        kind = _first(query, "code_challenge_method") or "plain"

        def remember(status: str, headers: list[tuple[str, str]], *args: Any) -> Any:
            location = next((v for k, v in headers if k.lower() == "location"), None)
            code = _first(parse_qs(urlsplit(location).query), "code") if location else None
            if code and challenge:
                with self.lock:
                    self.challenges[code] = (challenge, kind)
            return start_response(status, headers, *args)

        return self.app(environ, remember)


def _matches(verifier: str | None, challenge: str, kind: str) -> bool:
    if verifier is None:
        return False
    if kind == "S256":
        digest = hashlib.sha256(verifier.encode("ascii", "replace")).digest()
        verifier = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return secrets.compare_digest(verifier.encode(), challenge.encode())


def main() -> None:
    """Serve the provider on 127.0.0.1 at `--port` until stopped."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--token-max-age",
        type=float,
        default=3600.0,
        help="seconds the ID and access tokens last (their exp; default an hour)",
    )
    parser.add_argument(
        "--user-claims",
        action="append",
        default=[],
        help='a predefined user as JSON, {"sub": ..., <claims>} (a button on the form each)',
    )
    arguments = parser.parse_args()
    users = []
    for text in arguments.user_claims:
        claims = json.loads(text)
        users.append(oidc_provider_mock.User(sub=claims.pop("sub"), claims=claims))
    os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"  # plain http on loopback, as its own CLI does
    max_age = timedelta(seconds=arguments.token_max_age)
    provider = oidc_provider_mock.app(
        require_nonce=True, access_token_max_age=max_age, user_claims=users
    )
    app = PkceCheck(provider)
    uvicorn.run(app, interface="wsgi", host="127.0.0.1", port=arguments.port, log_level="warning")


if __name__ == "__main__":
    main()

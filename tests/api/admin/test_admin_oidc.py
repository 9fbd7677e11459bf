"""Single sign-on on the admin page, over real connections (`gateway.api.admin.oidc`).

A gateway on a loopback port, the test OpenID provider (oidc-provider-mock, its own process:
`tests.support.oidc`) and the code flow as the page runs it: the provider's form submitted as a
user, the code from its redirect posted to `/admin/oidc/token` with the PKCE verifier and the
nonce. The provider's ID tokens carry a `groups` claim; the gateway maps `gateway-admins` to
`admin` and `gateway-readers` to `read`.

The mock issues opaque access tokens, so `access_token` mode runs against a stand-in provider
made of `gateway.testing.idp` (JWT access tokens, a confidential client): the last section.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs

import anyio
import anyio.to_thread
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth.oidc import MAX_CONCURRENT_EXCHANGES
from gateway.testing.idp import IdentityProvider
from gateway.testing.server import LoopbackServer
from gateway.testing.stack import free_port
from tests.support.oidc import (
    ADMIN_SUB,
    CLIENT_ID,
    NOBODY_SUB,
    READER_SUB,
    OidcProvider,
    SignIn,
)
from tests.support.stack import Gateway

pytestmark = pytest.mark.processes

MakeGateway = Callable[..., Gateway]


def _page(gateway: Gateway) -> str:
    return f"{gateway.url}/admin/"


def _sso(make_gateway: MakeGateway, provider: OidcProvider, **overrides: Any) -> Gateway:
    """A gateway signing in with `provider`, its page URL (a setting) on a port picked first."""
    port = free_port()
    page = f"http://127.0.0.1:{port}/admin/"
    return make_gateway(port=port, **provider.gateway_settings(page, **overrides))


def _exchange(gateway: Gateway, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{gateway.url}/admin/oidc/token", json=body, timeout=30, **kwargs)


def _admin(gateway: Gateway, token: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.request(
        method, f"{gateway.url}/admin/v1{path}", headers=headers, timeout=30, **kwargs
    )


def _error(response: httpx.Response) -> str:
    message: str = response.json()["error"]["message"]
    return message


@pytest.fixture
def sso_gateway(make_gateway: MakeGateway, oidc_provider: OidcProvider) -> Gateway:
    """A gateway whose admin page signs in with the test provider (`id_token` mode)."""
    return _sso(make_gateway, oidc_provider)


def _sign_in(provider: OidcProvider, gateway: Gateway, sub: str) -> SignIn:
    return provider.sign_in(sub, _page(gateway))


# --- the page's configuration --------------------------------------------------------------


def test_config_tells_the_page_where_to_send_the_user(
    sso_gateway: Gateway, oidc_provider: OidcProvider
) -> None:
    response = httpx.get(f"{sso_gateway.url}/admin/oidc/config", timeout=30)

    assert response.status_code == 200, response.text
    assert response.json() == {
        "enabled": True,
        "authorization_endpoint": f"{oidc_provider.url}/oauth2/authorize",
        "end_session_endpoint": f"{oidc_provider.url}/oauth2/end_session",
        "client_id": CLIENT_ID,
        "scope": "openid profile email",
        "token": "id_token",
        "redirect_uris": [_page(sso_gateway)],
    }


def test_config_says_disabled_without_a_client_id_and_the_exchange_is_not_there(
    make_gateway: MakeGateway, oidc_provider: OidcProvider
) -> None:
    gateway = _sso(make_gateway, oidc_provider, admin_oidc_client_id=None)

    assert httpx.get(f"{gateway.url}/admin/oidc/config", timeout=30).json() == {"enabled": False}
    body = {"code": "x", "code_verifier": "v" * 43, "redirect_uri": _page(gateway), "nonce": "n"}
    assert _exchange(gateway, body).status_code == 404


def test_everything_under_admin_oidc_is_404_with_the_admin_api_off(gateway: Gateway) -> None:
    assert httpx.get(f"{gateway.url}/admin/oidc/config", timeout=30).status_code == 404
    body = {"code": "x", "code_verifier": "v" * 43, "redirect_uri": _page(gateway), "nonce": "n"}
    assert _exchange(gateway, body).status_code == 404


# --- the code flow, per group ----------------------------------------------------------------


def test_an_admin_signs_in_and_the_token_opens_writes(
    sso_gateway: Gateway, oidc_provider: OidcProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    sign_in = _sign_in(oidc_provider, sso_gateway, ADMIN_SUB)

    response = _exchange(sso_gateway, sign_in.body())

    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    answer = response.json()
    assert answer["subject"] == ADMIN_SUB
    assert answer["scopes"] == ["admin", "read"]
    assert time.time() < answer["expires_at"] <= time.time() + 3700
    token = answer["token"]
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["aud"] == [CLIENT_ID]  # the ID token: the bearer in id_token mode
    assert claims["exp"] == answer["expires_at"]

    created = _admin(sso_gateway, token, "POST", "/keys", json={"name": "from-sso"})
    assert created.status_code == 201, created.text
    audit = _admin(sso_gateway, token, "GET", "/audit").json()["data"]
    assert audit[-1]["actor"] == ADMIN_SUB  # the audit trail names the provider's user
    logged = caplog.text
    assert f"admin SSO sign-in from 127.0.0.1: '{ADMIN_SUB}' with admin and read" in logged
    assert sign_in.code not in logged
    assert sign_in.code_verifier not in logged
    assert token not in logged
    assert token.split(".")[2] not in logged


def test_a_reader_signs_in_and_reads_but_cannot_write(
    sso_gateway: Gateway, oidc_provider: OidcProvider
) -> None:
    response = _exchange(sso_gateway, _sign_in(oidc_provider, sso_gateway, READER_SUB).body())

    assert response.status_code == 200, response.text
    assert response.json()["scopes"] == ["read"]
    token = response.json()["token"]
    assert _admin(sso_gateway, token, "GET", "/keys").status_code == 200
    refused = _admin(sso_gateway, token, "POST", "/keys", json={"name": "nope"})
    assert refused.status_code == 403
    assert _error(refused) == "this action needs a token with the admin scope"


def test_a_user_in_neither_group_is_told_so(
    sso_gateway: Gateway, oidc_provider: OidcProvider
) -> None:
    response = _exchange(sso_gateway, _sign_in(oidc_provider, sso_gateway, NOBODY_SUB).body())

    assert response.status_code == 403, response.text
    assert response.json()["error"]["type"] == "permission_error"
    message = _error(response)
    assert message.startswith("token grants no admin scope: you signed in, but ")
    assert "none of the groups or roles this gateway maps to admin or read" in message


# --- refused exchanges ------------------------------------------------------------------------


def test_a_wrong_code_verifier_is_refused_by_the_provider(
    sso_gateway: Gateway, oidc_provider: OidcProvider
) -> None:
    sign_in = _sign_in(oidc_provider, sso_gateway, ADMIN_SUB)

    response = _exchange(sso_gateway, sign_in.body(code_verifier="w" * 64))

    assert response.status_code == 400, response.text
    assert _error(response) == (
        "the identity provider refused the sign-in: invalid_grant: PKCE check failed"
    )


def test_a_nonce_other_than_the_sign_ins_is_refused(
    sso_gateway: Gateway, oidc_provider: OidcProvider
) -> None:
    sign_in = _sign_in(oidc_provider, sso_gateway, ADMIN_SUB)

    response = _exchange(sso_gateway, sign_in.body(nonce="someone-elses-nonce"))

    assert response.status_code == 401, response.text
    assert _error(response) == "the ID token's nonce is not the sign-in's"
    assert response.headers["www-authenticate"].startswith("Bearer ")


def test_a_code_is_exchanged_once(sso_gateway: Gateway, oidc_provider: OidcProvider) -> None:
    sign_in = _sign_in(oidc_provider, sso_gateway, ADMIN_SUB)
    assert _exchange(sso_gateway, sign_in.body()).status_code == 200

    replayed = _exchange(sso_gateway, sign_in.body())

    assert replayed.status_code == 400, replayed.text
    assert _error(replayed).startswith("the identity provider refused the sign-in: invalid_grant")


def test_refused_exchanges_spend_the_address_budget(
    make_gateway: MakeGateway, oidc_provider: OidcProvider
) -> None:
    gateway = _sso(make_gateway, oidc_provider, admin_auth_failures_per_minute=2)
    page = _page(gateway)
    made_up = {"code": "made-up", "code_verifier": "v" * 43, "redirect_uri": page, "nonce": "n"}

    statuses = [_exchange(gateway, made_up).status_code for _ in range(3)]

    assert statuses == [400, 400, 429]
    # Past the budget even a valid sign-in waits: the provider is not asked until it passes.
    late = _exchange(gateway, _sign_in(oidc_provider, gateway, ADMIN_SUB).body())
    assert late.status_code == 429, late.text
    assert int(late.headers["retry-after"]) >= 1
    assert "a valid credential is served" not in _error(late)


def test_an_address_past_its_budget_does_not_reach_the_provider(
    make_gateway: MakeGateway, jwt_provider: JwtAccessTokenProvider
) -> None:
    gateway = _access_token_gateway(make_gateway, jwt_provider, admin_auth_failures_per_minute=2)
    body = {"code_verifier": "v" * 43, "redirect_uri": _page(gateway), "nonce": "the-nonce"}

    statuses = [_exchange(gateway, body | {"code": f"wrong-{n}"}).status_code for n in range(5)]
    good = _exchange(gateway, body | {"code": "good-code"})

    assert statuses == [400, 400, 429, 429, 429]
    assert good.status_code == 429
    assert "retry-after" in good.headers
    assert len(jwt_provider.requests) == 2  # the two counted failures; nothing after them


def test_exchanges_at_once_are_capped_and_the_next_is_told_to_retry(
    make_gateway: MakeGateway, jwt_provider: JwtAccessTokenProvider
) -> None:
    gateway = _access_token_gateway(make_gateway, jwt_provider)
    body = {"code_verifier": "v" * 43, "redirect_uri": _page(gateway), "nonce": "the-nonce"}
    assert _exchange(gateway, body | {"code": "good-code"}).status_code == 200  # keys loaded
    jwt_provider.requests.clear()
    jwt_provider.hold.clear()  # the provider's token endpoint waits until released
    with ThreadPoolExecutor(MAX_CONCURRENT_EXCHANGES) as pool:
        held = [
            pool.submit(_exchange, gateway, body | {"code": "good-code"})
            for _ in range(MAX_CONCURRENT_EXCHANGES)
        ]
        try:
            deadline = time.monotonic() + 30
            while jwt_provider.waiting < MAX_CONCURRENT_EXCHANGES:
                assert time.monotonic() < deadline, f"{jwt_provider.waiting} exchanges arrived"
                time.sleep(0.05)

            busy = _exchange(gateway, body | {"code": "good-code"})
        finally:
            jwt_provider.hold.set()
        answers = [future.result() for future in held]

    assert busy.status_code == 503, busy.text
    assert busy.headers["retry-after"] == "2"
    assert _error(busy).startswith("too many sign-ins are being completed at once")
    assert len(jwt_provider.requests) == MAX_CONCURRENT_EXCHANGES  # the ninth was not sent
    assert [answer.status_code for answer in answers] == [200] * MAX_CONCURRENT_EXCHANGES
    assert _exchange(gateway, body | {"code": "good-code"}).status_code == 200  # freed again


def test_a_code_sent_to_another_redirect_uri_is_not_redeemed(
    sso_gateway: Gateway, oidc_provider: OidcProvider
) -> None:
    # A provider whose client allows loose redirect URIs (wildcards) sent the code elsewhere: a
    # phished code, with its verifier, must not become an admin token here.
    phished = oidc_provider.sign_in(ADMIN_SUB, "https://evil.example/admin/")

    response = _exchange(sso_gateway, phished.body())

    assert response.status_code == 422, response.text
    assert _error(response) == (
        "invalid request: redirect_uri is not this gateway's admin page (one of "
        "GATEWAY_ADMIN_OIDC_REDIRECT_URIS, which GET admin/oidc/config lists)"
    )
    # The code was not spent: the provider was never asked (it still redeems it for that URI).
    form = {
        "grant_type": "authorization_code",
        "code": phished.code,
        "redirect_uri": phished.redirect_uri,
        "code_verifier": phished.code_verifier,
        "client_id": CLIENT_ID,
    }
    redeemed = httpx.post(f"{oidc_provider.url}/oauth2/token", data=form, timeout=30)
    assert redeemed.status_code == 200, redeemed.text


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"code_verifier": "short"}, 422, "invalid request: code_verifier String should match"),
        ({"redirect_uri": "https://evil.example/cb"}, 422, "invalid request: redirect_uri must"),
        ({"redirect_uri": "javascript:alert(1)//admin/"}, 422, "invalid request: redirect_uri"),
        ({"code": "c" * 20_000}, 413, "request body is larger than 16384 bytes"),
        ({"extra": "field"}, 422, "invalid request: extra Extra inputs are not permitted"),
    ],
)
def test_bodies_out_of_bounds_are_refused_before_the_provider_is_asked(
    sso_gateway: Gateway, change: dict[str, str], status: int, message: str
) -> None:
    body = {"code": "c", "code_verifier": "v" * 43, "redirect_uri": _page(sso_gateway)}
    response = _exchange(sso_gateway, body | {"nonce": "n"} | change)

    assert response.status_code == status, response.text
    assert _error(response).startswith(message)


def test_a_form_post_is_not_read(sso_gateway: Gateway) -> None:
    response = httpx.post(
        f"{sso_gateway.url}/admin/oidc/token",
        data={"code": "c", "code_verifier": "v" * 43, "nonce": "n"},
        timeout=30,
    )

    assert response.status_code == 422
    assert _error(response) == "invalid request: send a JSON body (Content-Type: application/json)"


# --- the provider unreachable or not what it claims ------------------------------------------


def test_a_provider_that_is_down_gets_502(make_gateway: MakeGateway) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    gateway = make_gateway(
        port=port,
        admin_oidc_redirect_uris=[f"http://127.0.0.1:{port}/admin/"],
        admin_jwks_url=f"{down}/jwks",
        admin_jwt_issuer=down,
        admin_jwt_audience="llm-gateway",
        admin_jwt_scope_claim="groups",
        admin_jwt_admin_values=["gateway-admins"],
        admin_oidc_client_id=CLIENT_ID,
    )
    config = httpx.get(f"{gateway.url}/admin/oidc/config", timeout=30)
    body = {"code": "c", "code_verifier": "v" * 43, "redirect_uri": _page(gateway), "nonce": "n"}
    exchange = _exchange(gateway, body)

    for response in (config, exchange):
        assert response.status_code == 502, response.text
        assert _error(response) == "the identity provider cannot be reached (ConnectError)"


def test_a_discovery_document_of_another_issuer_is_refused(
    make_gateway: MakeGateway, oidc_provider: OidcProvider
) -> None:
    # The same document, but the configured issuer differs by its trailing slash: OIDC
    # Discovery 1.0 section 4.3 wants them identical.
    gateway = _sso(make_gateway, oidc_provider, admin_jwt_issuer=oidc_provider.url + "/")

    response = httpx.get(f"{gateway.url}/admin/oidc/config", timeout=30)

    assert response.status_code == 502
    assert "names another issuer than GATEWAY_ADMIN_JWT_ISSUER" in _error(response)


# --- access_token mode: a provider that issues JWT access tokens -----------------------------

SECRET = "s3cr3t:with/odd chars"
"""A confidential client's secret, with characters RFC 6749 section 2.3.1 has encoded."""


class JwtAccessTokenProvider:
    """Discovery and a token endpoint around `IdentityProvider`: Keycloak-like JWT tokens.

    It accepts one code, `good-code`, from the confidential client `CLIENT_ID` with `SECRET`
    sent as `client_secret_basic`; its access token is `IdentityProvider.token` (audience
    `llm-gateway`), its ID token carries the nonce `the-nonce`. `requests` records each token
    request's form and `Authorization` header, `discoveries` counts discovery fetches. While
    `hold` is clear the token endpoint waits (`waiting` counts the requests held).
    """

    def __init__(self, roles: list[str]) -> None:
        self.idp = IdentityProvider()
        self.kid = self.idp.add_key("RS256")
        self.roles = roles
        self.url = ""
        self.requests: list[tuple[dict[str, list[str]], str | None]] = []
        self.discoveries = 0
        self.hold = threading.Event()
        self.hold.set()
        self.waiting = 0
        self.app = Starlette(
            routes=[
                Route("/.well-known/openid-configuration", self._discovery),
                Route(self.idp.jwks_path, self._jwks),
                Route("/token", self._token, methods=["POST"]),
            ]
        )

    async def _discovery(self, _: Request) -> Response:
        self.discoveries += 1
        return JSONResponse(
            {
                "issuer": self.url,
                "authorization_endpoint": f"{self.url}/auth",
                "token_endpoint": f"{self.url}/token",
                "jwks_uri": f"{self.url}{self.idp.jwks_path}",
            }
        )

    async def _jwks(self, _: Request) -> Response:
        return JSONResponse(self.idp.jwks())

    async def _token(self, request: Request) -> Response:
        form = parse_qs((await request.body()).decode())
        authorization = request.headers.get("authorization")
        self.requests.append((form, authorization))
        if not self.hold.is_set():
            self.waiting += 1
            await anyio.to_thread.run_sync(self.hold.wait)
        basic = base64.b64encode(f"{CLIENT_ID}:s3cr3t%3Awith%2Fodd%20chars".encode()).decode()
        if authorization != f"Basic {basic}":
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        if form.get("code") != ["good-code"]:
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        access = self.idp.token(self.kid, self.roles, iss=self.url, sub="dave")
        id_token = self.idp.token(
            self.kid,
            [],
            **{"iss": self.url, "aud": CLIENT_ID, "typ": "ID", "azp": CLIENT_ID},
            **{"sub": "dave", "nonce": "the-nonce"},
        )
        return JSONResponse(
            {"access_token": access, "id_token": id_token, "token_type": "Bearer"},
            headers={"Cache-Control": "no-store"},
        )


@pytest.fixture
def jwt_provider() -> Iterator[JwtAccessTokenProvider]:
    provider = JwtAccessTokenProvider(["gateway-admin"])
    with LoopbackServer(provider.app) as server:
        provider.url = server.url
        yield provider


def _access_token_gateway(
    make_gateway: MakeGateway, provider: JwtAccessTokenProvider, **overrides: Any
) -> Gateway:
    port = free_port()
    return make_gateway(
        port=port,
        admin_oidc_redirect_uris=[f"http://127.0.0.1:{port}/admin/"],
        admin_jwks_url=f"{provider.url}{provider.idp.jwks_path}",
        admin_jwt_issuer=provider.url,
        admin_jwt_audience=provider.idp.audience,
        admin_jwt_scope_claim="realm_access.roles",
        admin_jwt_admin_values=["gateway-admin"],
        admin_oidc_client_id=CLIENT_ID,
        admin_oidc_client_secret=SECRET,
        admin_oidc_token="access_token",
        **overrides,
    )


def test_access_token_mode_answers_the_access_token_for_a_confidential_client(
    make_gateway: MakeGateway, jwt_provider: JwtAccessTokenProvider
) -> None:
    gateway = _access_token_gateway(make_gateway, jwt_provider)
    verifier = "v" * 43
    body = {
        "code": "good-code",
        "code_verifier": verifier,
        "redirect_uri": _page(gateway),
        "nonce": "the-nonce",
    }

    response = _exchange(gateway, body)

    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["subject"], answer["scopes"]) == ("dave", ["admin", "read"])
    claims = json.loads(base64.urlsafe_b64decode(answer["token"].split(".")[1] + "=="))
    assert claims["aud"] == ["llm-gateway", "account"]  # the access token, not the ID token
    [(form, _)] = jwt_provider.requests
    assert form == {
        "grant_type": ["authorization_code"],
        "code": ["good-code"],
        "redirect_uri": [_page(gateway)],
        "code_verifier": [verifier],
    }  # no client_id in the body: the client authenticates with Basic
    assert _admin(gateway, answer["token"], "GET", "/keys").status_code == 200


def test_access_token_mode_does_not_let_id_tokens_open_the_api(
    make_gateway: MakeGateway, jwt_provider: JwtAccessTokenProvider
) -> None:
    gateway = _access_token_gateway(make_gateway, jwt_provider)
    id_token = jwt_provider.idp.token(
        jwt_provider.kid, ["gateway-admin"], iss=jwt_provider.url, aud=CLIENT_ID
    )

    refused = _admin(gateway, id_token, "GET", "/keys")

    assert refused.status_code == 401
    assert _error(refused) == "wrong audience"


def test_access_token_mode_still_checks_the_id_tokens_nonce(
    make_gateway: MakeGateway, jwt_provider: JwtAccessTokenProvider
) -> None:
    gateway = _access_token_gateway(make_gateway, jwt_provider)
    body = {"code": "good-code", "code_verifier": "v" * 43, "redirect_uri": _page(gateway)}

    response = _exchange(gateway, body | {"nonce": "not-the-nonce"})

    assert response.status_code == 401
    assert _error(response) == "the ID token's nonce is not the sign-in's"


def test_the_discovery_document_is_fetched_once_for_many_uses(
    make_gateway: MakeGateway, jwt_provider: JwtAccessTokenProvider
) -> None:
    gateway = _access_token_gateway(make_gateway, jwt_provider)
    body = {"code": "good-code", "code_verifier": "v" * 43, "redirect_uri": _page(gateway)}

    for _ in range(3):
        config = httpx.get(f"{gateway.url}/admin/oidc/config", timeout=30).json()
        assert config["authorization_endpoint"] == f"{jwt_provider.url}/auth"
        assert config["end_session_endpoint"] is None  # optional in discovery
    assert _exchange(gateway, body | {"nonce": "the-nonce"}).status_code == 200

    assert jwt_provider.discoveries == 1

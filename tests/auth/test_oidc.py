"""`OidcClient` (gateway/auth/oidc.py) against a scripted provider on a loopback port.

The provider is a Starlette app whose discovery document and token answers each test writes;
the client's clock is stepped by hand, so the cache and retry policy is tested without waiting.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth.identity import AdminAuthError
from gateway.auth.oidc import (
    MAX_ANSWER_BYTES,
    OidcClient,
    OidcRefusedError,
    OidcUnavailableError,
)
from gateway.testing.idp import forge
from gateway.testing.server import LoopbackServer

pytestmark = pytest.mark.anyio


class Scripted:
    """A provider whose answers a test sets: `discovery` (a dict, or a status) and `token`."""

    def __init__(self) -> None:
        self.url = ""
        self.discovery: dict[str, Any] | int = 200
        self.token: tuple[int, Any] = (200, {})
        self.fetches = 0
        self.app = Starlette(
            routes=[
                Route("/.well-known/openid-configuration", self._discovery),
                Route("/token", self._token, methods=["POST"]),
            ]
        )

    def document(self, **changes: Any) -> dict[str, Any]:
        return {
            "issuer": self.url,
            "authorization_endpoint": f"{self.url}/auth",
            "token_endpoint": f"{self.url}/token",
            "end_session_endpoint": f"{self.url}/logout",
        } | changes

    async def _discovery(self, _: Request) -> Response:
        self.fetches += 1
        if isinstance(self.discovery, int):
            if self.discovery != 200:
                return Response("down", status_code=self.discovery)
            return JSONResponse(self.document())
        return JSONResponse(self.discovery)

    async def _token(self, _: Request) -> Response:
        status, body = self.token
        if isinstance(body, bytes):
            return Response(body, status_code=status, media_type="application/json")
        return JSONResponse(body, status_code=status)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def provider() -> Iterator[Scripted]:
    scripted = Scripted()
    with LoopbackServer(scripted.app) as server:
        scripted.url = server.url
        yield scripted


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def client(provider: Scripted, clock: Clock) -> Any:
    oidc = OidcClient(
        issuer=provider.url,
        client_id="page",
        client_secret=None,
        scope="openid",
        token="id_token",
        http=httpx.AsyncClient(),
        cache_seconds=300,
        min_refresh_seconds=30,
        clock=clock,
    )
    yield oidc
    await oidc.aclose()


async def test_discovery_is_cached_then_fetched_again(
    provider: Scripted, client: Any, clock: Clock
) -> None:
    first = await client.metadata()
    await client.metadata()
    assert provider.fetches == 1
    assert (first.token_endpoint, first.end_session_endpoint) == (
        f"{provider.url}/token",
        f"{provider.url}/logout",
    )

    clock.now += 300
    await client.metadata()

    assert provider.fetches == 2


async def test_a_failed_fetch_keeps_the_last_good_document(
    provider: Scripted, client: Any, clock: Clock
) -> None:
    good = await client.metadata()
    provider.discovery = 503
    clock.now += 300

    assert await client.metadata() == good
    assert provider.fetches == 2
    assert await client.metadata() == good  # no new fetch within the minimum interval
    assert provider.fetches == 2


async def test_a_provider_down_since_start_is_asked_again_only_after_the_interval(
    provider: Scripted, client: Any, clock: Clock
) -> None:
    provider.discovery = 503
    for _ in range(3):
        with pytest.raises(OidcUnavailableError, match="discovery answered 503"):
            await client.metadata()
    assert provider.fetches == 1

    provider.discovery = 200
    clock.now += 30
    await client.metadata()

    assert provider.fetches == 2


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"issuer": "https://other.example"}, "names another issuer"),
        ({"token_endpoint": "http://sso.example.com/token"}, "lacks an https"),
        ({"authorization_endpoint": None}, "lacks an https"),
        ({"authorization_endpoint": "javascript:alert(1)"}, "lacks an https"),
    ],
)
async def test_a_document_that_is_not_the_issuers_is_refused(
    provider: Scripted, client: Any, changes: dict[str, Any], message: str
) -> None:
    provider.discovery = provider.document(**changes)

    with pytest.raises(OidcUnavailableError, match=message):
        await client.metadata()


async def test_an_end_session_endpoint_that_is_no_https_url_is_left_out(
    provider: Scripted, client: Any
) -> None:
    provider.discovery = provider.document(end_session_endpoint="http://sso.example.com/out")

    assert (await client.metadata()).end_session_endpoint is None


async def test_the_providers_refusal_is_cut_to_printable_ascii(
    provider: Scripted, client: Any
) -> None:
    description = "code \u202eexpired\n<script>" + "x" * 500
    provider.token = (400, {"error": "invalid_grant", "error_description": description})

    with pytest.raises(OidcRefusedError) as caught:
        await client.exchange("code", "v" * 43, "https://gw.example/admin/")

    assert caught.value.error == "invalid_grant"
    assert caught.value.description == ("code ?expired?<script>" + "x" * 500)[:200]
    assert str(caught.value).startswith("the identity provider refused the sign-in: invalid_grant")


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ((500, {"error": "server_error"}), "token endpoint answered 500"),
        ((400, b"not json"), "token endpoint answered 400"),
        ((200, {"access_token": "opaque"}), "without an ID token"),
        ((200, b"x" * (MAX_ANSWER_BYTES + 1)), f"over {MAX_ANSWER_BYTES} bytes"),
    ],
)
async def test_token_answers_that_are_not_oauth_are_the_providers_failure(
    provider: Scripted, client: Any, answer: tuple[int, Any], message: str
) -> None:
    provider.token = answer

    with pytest.raises(OidcUnavailableError, match=message):
        await client.exchange("code", "v" * 43, "https://gw.example/admin/")


def _id_token(**claims: Any) -> str:
    return forge({"alg": "RS256", "kid": "k"}, {"exp": 2_000_000_000, **claims}, None)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"nonce": "other"}, "the ID token's nonce is not the sign-in's"),
        ({}, "the ID token's nonce is not the sign-in's"),
        ({"nonce": "n", "iss": "https://other.example", "aud": "page"}, "wrong issuer"),
        ({"nonce": "n", "aud": ["other"]}, "wrong audience"),
        # OIDC Core 1.0 section 3.1.3.7 items 4 and 5: issued to this client, not another.
        ({"nonce": "n", "aud": ["page", "x"]}, "ID token issued to another client (azp)"),
        ({"nonce": "n", "azp": "other"}, "ID token issued to another client (azp)"),
        (
            {"nonce": "n", "azp": "page", "typ": "Bearer"},
            "not an ID token (an access token of the identity provider)",
        ),
    ],
)
async def test_the_id_token_must_be_for_this_sign_in(
    provider: Scripted, client: Any, claims: dict[str, Any], message: str
) -> None:
    token = _id_token(**({"iss": provider.url, "aud": "page"} | claims))

    with pytest.raises(AdminAuthError) as caught:
        client.check_id_token(token, "n")

    assert (caught.value.status, caught.value.message) == (401, message)


async def test_an_id_token_for_this_sign_in_passes(provider: Scripted, client: Any) -> None:
    client.check_id_token(_id_token(iss=provider.url, aud="page", nonce="n"), "n")
    client.check_id_token(
        _id_token(iss=provider.url, aud=["page", "x"], azp="page", nonce="n"), "n"
    )

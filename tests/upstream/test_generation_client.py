"""`GenerationClient.request`: the fields httpx would make, built without httpx's derivation.

Fast: no network. The bytes on the wire come from these fields (`HttptoolsTransport`'s
`_encode`, aiohttp's request), so equal fields in equal order mean an unchanged request.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pydantic import SecretStr

from gateway.policies import UpstreamTimeouts
from gateway.settings import UpstreamSpec
from gateway.upstream.client import GenerationClient, upstream_default_headers
from gateway.upstream.httptools_transport import _encode

BODY = b'{"model":"m","prompt":"hi","stream":true}'
TIMEOUTS = UpstreamTimeouts(connect=2, first_byte=30, idle=7)


def _reference(spec: UpstreamSpec, path: str, headers: dict[str, str]) -> httpx.Request:
    """What httpx makes of the same POST (the client before this change built exactly this)."""
    return httpx.Request(
        "POST",
        spec.base + path,
        content=BODY,
        headers={**upstream_default_headers(spec), **headers},
    )


@pytest.mark.parametrize(
    ("spec", "headers"),
    [
        (UpstreamSpec(url="http://127.0.0.1:11434"), {"x-request-id": "abc"}),  # type: ignore[arg-type]
        (UpstreamSpec(url="http://gpu-1:80/ollama"), {"user-agent": "app/1"}),  # type: ignore[arg-type]
        (UpstreamSpec(url="http://[::1]:8080"), {"x-request-id": "abc"}),  # type: ignore[arg-type]
        (
            UpstreamSpec(  # type: ignore[arg-type]
                url="http://[::1]:8080",
                host_header="localhost:11434",
                api_key=SecretStr("upstream-secret"),
            ),
            {"accept-language": "de", "x-request-id": "abc"},
        ),
    ],
)
def test_the_request_has_httpx_own_fields_in_httpx_own_order(
    spec: UpstreamSpec, headers: dict[str, str]
) -> None:
    client = GenerationClient(spec, TIMEOUTS, httpx.AsyncHTTPTransport())
    for _ in range(2):  # the second from the cached URL
        built = client.request("/api/generate", BODY, headers)
        reference = _reference(spec, "/api/generate", headers)
        assert built.method == "POST"
        assert built.url == reference.url
        assert built.headers.raw == reference.headers.raw
        assert asyncio.run(built.aread()) == BODY
        assert _encode(built, BODY) == _encode(reference, BODY)
        assert built.extensions["timeout"]["read"] is None  # the relay's deadlines bound reads


def test_a_header_httpx_cannot_encode_is_refused_as_before() -> None:
    spec = UpstreamSpec(url="http://127.0.0.1:11434")  # type: ignore[arg-type]
    client = GenerationClient(spec, TIMEOUTS, httpx.AsyncHTTPTransport())
    with pytest.raises(UnicodeEncodeError):
        _reference(spec, "/api/chat", {"user-agent": "münchen"})
    with pytest.raises(UnicodeEncodeError):
        client.request("/api/chat", BODY, {"user-agent": "münchen"})

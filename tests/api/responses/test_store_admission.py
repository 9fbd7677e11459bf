"""Stored responses (`GATEWAY_RESPONSES_STORE`) admit the key before they read its body.

With the store on, `POST /v1/responses` reads the body to expand `previous_response_id` from
the database. That read, its JSON parse and the database lookup used to run before the key's
RPM check: a key over its limit still made the gateway read, parse (on the event loop) and
look up as many bodies as it could send, and learnt 400s and 404s instead of its 429.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.support.client import MODEL
from tests.support.stack import Gateway


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
def test_a_key_over_its_rpm_is_refused_before_its_body_is_read(
    make_gateway: Callable[..., Gateway], dialect: str
) -> None:
    gw = make_gateway(upstream_dialect=dialect, responses_store=True)
    _, key = gw.create_key("one-a-minute", rpm=1)
    with httpx.Client(base_url=gw.url, headers=gw.headers(key), timeout=10) as client:
        first = client.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert first.status_code == 200, first.text
        junk = client.post("/v1/responses", content=b"{not json")
        unknown = client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "hi", "previous_response_id": "resp_guess"},
        )
    for refused in (junk, unknown):
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"]


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
def test_a_stored_conversation_still_continues_and_errors_keep_their_status(
    make_gateway: Callable[..., Gateway], dialect: str
) -> None:
    gw = make_gateway(upstream_dialect=dialect, responses_store=True)
    with httpx.Client(base_url=gw.url, headers=gw.headers(), timeout=10) as client:
        first = client.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert first.status_code == 200, first.text
        second = client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "again", "previous_response_id": first.json()["id"]},
        )
        assert second.status_code == 200, second.text
        assert second.json()["previous_response_id"] == first.json()["id"]
        items = client.get(f"/v1/responses/{second.json()['id']}/input_items?order=asc")
        texts = [i["content"][0]["text"] for i in items.json()["data"] if i["type"] == "message"]
        assert texts[0] == "hi"
        assert texts[-1] == "again"
        missing = client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "hi", "previous_response_id": "resp_guess"},
        )
        assert missing.status_code == 404, missing.text
        junk = client.post("/v1/responses", content=b"{not json")
        assert junk.status_code == 400, junk.text
        assert "error" in junk.json()

"""Stored responses (`GATEWAY_RESPONSES_STORE`) admit the key before they read its body.

With the store on, `POST /v1/responses` reads the body to expand `previous_response_id` from
the database. That read, its JSON parse and the database lookup used to run before the key's
RPM check: a key over its limit still made the gateway read, parse (on the event loop) and
look up as many bodies as it could send, and learnt 400s and 404s instead of its 429.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import func, select

from gateway.db.engine import open_engine
from gateway.db.tables import ResponseRow
from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway


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


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
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


def _in_flight(gw: Gateway) -> float:
    """Generations and upstream requests still open (both gauges are always exported)."""
    text = gw.metrics_text()
    assert "gateway_requests_in_flight" in text
    assert "gateway_upstream_in_flight" in text
    return metric_value(text, "gateway_requests_in_flight") + metric_value(
        text, "gateway_upstream_in_flight"
    )


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("dialect", ["ollama", "openai"])
def test_a_client_leaving_while_its_body_or_answer_is_read_frees_its_slot(
    make_gateway: Callable[..., Gateway], emulator: Emulator, dialect: str
) -> None:
    """The store's body read and its answer's save are phases of their own: leaving in either."""
    gw = make_gateway(upstream_dialect=dialect, responses_store=True)
    _, key = gw.create_key("one-at-a-time", max_concurrent=1)
    host, port = gw.url.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "input": "hi", "stream": True}).encode()
    # Leaves halfway through its body.
    with socket.create_connection((host, int(port))) as sock:
        head = (
            f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body[: len(body) // 2])
    # Leaves after the first events of a slow answer.
    emulator.config.inter_token = 0.2
    with (
        httpx.Client(base_url=gw.url, headers=gw.headers(key), timeout=10) as client,
        client.stream("POST", "/v1/responses", content=body) as answer,
    ):
        assert answer.status_code == 200
        next(answer.iter_bytes())
    emulator.config.inter_token = 0.0
    for _ in range(100):  # the gateway notices the leave on its own schedule
        if _in_flight(gw) == 0:
            break
        time.sleep(0.05)
    assert _in_flight(gw) == 0
    with httpx.Client(base_url=gw.url, headers=gw.headers(key), timeout=10) as client:
        again = client.post("/v1/responses", json={"model": MODEL, "input": "hi"})
    assert again.status_code == 200, again.text
    assert asyncio.run(_rows(gw)) == 1  # only the answer that completed is kept


async def _rows(gw: Gateway) -> int:
    engine = open_engine(gw.database_url)
    try:
        async with engine.connect() as connection:
            return int(await connection.scalar(select(func.count()).select_from(ResponseRow)))
    finally:
        await engine.dispose()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("dialect", ["ollama", "openai"])
def test_a_conversation_by_previous_response_id_stops_at_the_body_limit(
    make_gateway: Callable[..., Gateway], dialect: str
) -> None:
    """Each turn carries every earlier one: past `GATEWAY_MAX_BODY_BYTES` it is a 413 that says so.

    The client's own body stays small, so the message names the stored conversation (it
    said only "request body is larger than N bytes" before).
    """
    gw = make_gateway(upstream_dialect=dialect, responses_store=True, max_body_bytes=8192)
    previous = None
    statuses = []
    with httpx.Client(base_url=gw.url, headers=gw.headers(), timeout=10) as client:
        for _ in range(10):
            body = {"model": MODEL, "input": "x" * 1500, "previous_response_id": previous}
            answer = client.post("/v1/responses", json=body)
            statuses.append(answer.status_code)
            if answer.status_code != 200:
                break
            previous = answer.json()["id"]
    assert statuses[0] == 200
    assert statuses[-1] == 413, statuses
    assert "previous_response_id" in answer.json()["error"]["message"]

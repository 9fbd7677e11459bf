"""A stored response is written whole or not at all: an upstream failing mid-answer keeps none.

The `response` object is stored before the answer's last bytes, and only once it completed
(`ResponsesCodec.final`); a stream cut by the upstream ends in `response.failed` and its id,
announced in `response.created`, is 404 for every read and for `previous_response_id`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from tests.api.responses.test_store_admission import _rows
from tests.support.client import MODEL
from tests.support.stack import Emulator, Gateway


def _created_id(stream: str) -> str:
    for line in stream.splitlines():
        if line.startswith("data: "):
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "response.created":
                return str(event["response"]["id"])
    raise AssertionError("no response.created event")


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("dialect", ["ollama", "openai"])
@pytest.mark.parametrize("fault", ["error_midstream", "drop_midstream"])
def test_an_answer_the_upstream_cuts_is_not_stored(
    make_gateway: Callable[..., Gateway], emulator: Emulator, dialect: str, fault: str
) -> None:
    gw = make_gateway(upstream_dialect=dialect, responses_store=True)
    emulator.config.fault = fault
    emulator.config.fault_after = 3
    with httpx.Client(base_url=gw.url, headers=gw.headers(), timeout=10) as client:
        streamed = client.post(
            "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}
        )
        whole = client.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert streamed.status_code == 200
        assert "response.failed" in streamed.text
        assert "response.completed" not in streamed.text
        assert whole.status_code >= 500
        assert stored(gw) == 0
        cut = _created_id(streamed.text)
        emulator.config.fault = None
        assert client.get(f"/v1/responses/{cut}").status_code == 404
        follow = client.post(
            "/v1/responses", json={"model": MODEL, "input": "go on", "previous_response_id": cut}
        )
        assert follow.status_code == 404
        assert client.post("/v1/responses", json={"model": MODEL, "input": "hi"}).status_code == 200
    assert stored(gw) == 1


def stored(gw: Gateway) -> int:
    """The rows of `gateway_responses`."""
    return asyncio.run(_rows(gw))

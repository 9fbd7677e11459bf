"""The field-failure classes on `/v1/messages`, in front of both upstream dialects.

The harness of `tests/api/test_surface_failures.py` (a scripted upstream stand-in, gateways on
the client protocol `gateway serve` runs, the emulator's faults; its fixtures via conftest.py),
with Anthropic's framing and error shapes: the text arrives whole and valid UTF-8 when the
upstream's answer is cut at every byte; errors before the first byte are a real status in
Anthropic's shape, with `Retry-After` kept; a failure after it is status 200 then one `error`
event, never replayed.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.api.test_surface_failures import (
    DEADLINE,
    EMULATED_PREFIX,
    STATUSES,
    TOKENS,
    UPSTREAM_ERROR,
    one_generation,
)
from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.slow

ROUTE = "/v1/messages"
dialects = pytest.mark.parametrize("dialect", ["ollama", "openai"])


def _post(gw: Gateway, *, stream: bool = True) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 100, "stream": stream}
    body["messages"] = [{"role": "user", "content": "hi"}]
    with httpx.Client(timeout=DEADLINE * 2) as client:
        return client.post(f"{gw.url}{ROUTE}", json=body, headers=gw.headers())


def events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """Check Anthropic's SSE framing (status 200, valid UTF-8, `event:` + `data:` a event)."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    text = response.content.decode("utf-8")  # strict: raises on invalid UTF-8
    assert "\ufffd" not in text
    blocks = text.split("\n\n")
    assert blocks[-1] == "", text[-200:]
    parsed = []
    for block in blocks[:-1]:
        name, data = block.split("\n")
        assert name.startswith("event: "), block
        body = json.loads(data.removeprefix("data: "))
        assert body["type"] == name.removeprefix("event: ")
        parsed.append((body["type"], body))
    return parsed


def streamed_text(parsed: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [
        body["delta"]["text"]
        for kind, body in parsed
        if kind == "content_block_delta" and body["delta"]["type"] == "text_delta"
    ]


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """Anthropic's error body at `status`: `{"type": "error", "error": {"type", "message"}}`."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"}, body
    assert body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}, body
    return dict(body["error"])


@dialects
@pytest.mark.parametrize("ending", ["done", "error"])
def test_an_answer_cut_at_every_byte_reaches_the_client_whole(scripted, ending):
    script, gw = scripted()
    script.piece, script.ending = 1, ending
    parsed = events(_post(gw))
    assert streamed_text(parsed) == TOKENS  # one delta per upstream token, each whole
    kinds = [kind for kind, _ in parsed]
    if ending == "done":
        assert kinds[-2:] == ["message_delta", "message_stop"]
        assert parsed[-2][1]["usage"] == {"input_tokens": 3, "output_tokens": 8}
    else:
        assert kinds[-1] == "error"
        assert "message_stop" not in kinds
        assert parsed[-1][1]["error"]["type"] == "api_error"


@dialects
def test_a_non_streamed_answer_cut_at_every_byte_is_one_message(scripted):
    script, gw = scripted()
    script.piece = 1
    response = _post(gw, stream=False)
    assert response.status_code == 200, response.text
    message = response.json()
    assert message["content"] == [{"type": "text", "text": "".join(TOKENS)}]
    assert message["usage"] == {"input_tokens": 3, "output_tokens": 8}


@dialects
def test_upstream_error_statuses_are_real_statuses_in_anthropics_shape(scripted):
    script, gw = scripted(retry_backoff=0.01)
    kinds = {502: "api_error", 503: "overloaded_error", 404: "not_found_error"}
    kinds[429] = "rate_limit_error"
    for (status, headers), (expected, retry_after, tries) in STATUSES.items():
        case = f"upstream {status} {dict(headers)}"
        script.calls.clear()
        script.failures = [(status, f"upstream says {status}", dict(headers))] * 3
        response = _post(gw)
        assert error_of(response, expected)["type"] == kinds[expected], case
        assert response.headers.get("retry-after") == retry_after, case
        assert len(script.calls) == tries, case


@dialects
def test_an_answer_that_fails_before_its_first_token_is_a_real_502(scripted):
    script, gw = scripted(retry_backoff=0.01)
    script.tokens, script.ending = [], "error"
    assert error_of(_post(gw), 502) == {"type": "api_error", "message": UPSTREAM_ERROR}


@dialects
def test_a_failure_after_the_first_byte_is_one_error_event_and_no_replay(
    front, emulator: Emulator, dialect
):
    gw = front(emulator.url, retry_backoff=0.01)
    emulator.config.fault = "error_midstream"
    parsed = events(_post(gw))
    assert "".join(streamed_text(parsed)) == EMULATED_PREFIX
    kind, body = parsed[-1]
    assert kind == "error"
    assert body["error"]["type"] == "api_error"
    if dialect == "ollama":
        assert body["error"]["message"] == emulator.config.fault_message
    one_generation(emulator)  # never replayed
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_requests_total", route=ROUTE) == 1
    assert metric_value(metrics, "gateway_upstream_retries_total") == 0
    # Not streamed, the same failure is a real status: nothing was sent yet.
    assert error_of(_post(gw, stream=False), 502)["type"] == "api_error"

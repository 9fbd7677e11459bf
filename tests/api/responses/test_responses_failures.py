"""The field-failure classes on `/v1/responses`, in front of both upstream dialects.

The same classes `tests/api/test_surface_failures.py` runs on the other surfaces, with its
scripted upstream stand-ins and raw-socket client, over the client protocol `gateway serve` runs:
the upstream's answer cut at every byte (inside multi-byte characters too) reaches the client
whole, as Responses events; errors before the first byte are real statuses in OpenAI's shape;
an error after it is an `error` event then `response.failed`, never replayed; a client leaving
at any phase frees the upstream request and its slot.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.api.test_surface_failures import (
    DEADLINE,
    ONE_SLOT,
    TOKENS,
    UPSTREAM_ERROR,
    RawClient,
    Script,
    _freed,
    eventually,
    one_generation,
)
from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.slow

PATH = "/v1/responses"


@pytest.fixture(params=["ollama", "openai"])
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _post(gw: Gateway, *, stream: bool = True) -> httpx.Response:
    body = {"model": MODEL, "input": "hi", "stream": stream}
    with httpx.Client(timeout=DEADLINE * 2) as client:
        return client.post(f"{gw.url}{PATH}", json=body, headers=gw.headers())


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    """The SSE events, each `event: <type>` then `data: <one line of JSON>` and a blank line."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    raw = response.content.decode("utf-8")  # strict: raises on invalid UTF-8
    assert "\ufffd" not in raw
    frames = raw.split("\n\n")
    assert frames[-1] == "", raw[-200:]
    events = []
    for frame in frames[:-1]:
        kind, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def _deltas(events: list[dict[str, Any]]) -> list[str]:
    return [e["delta"] for e in events if e["type"] == "response.output_text.delta"]


@pytest.mark.parametrize(
    ("piece", "ending", "stream"),
    [(1, "done", True), (1, "error", True), (None, "done", True), (1, "done", False)],
    ids=["every-byte-done", "every-byte-error", "one-write-done", "unstreamed"],
)
def test_an_answer_cut_anywhere_reaches_the_client_whole(
    scripted: Callable[..., tuple[Script, Gateway]], piece: int | None, ending: str, stream: bool
) -> None:
    script, gw = scripted()
    script.piece, script.ending = piece, ending  # type: ignore[assignment]
    response = _post(gw, stream=stream)
    if not stream:
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["status"] == "completed"
        assert answer["output"][0]["content"][0]["text"] == "".join(TOKENS)
        assert answer["usage"]["output_tokens"] == 8  # the upstream's count
    elif ending == "done":
        events = _events(response)
        assert _deltas(events) == TOKENS  # one delta per upstream token, each whole
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["usage"]["input_tokens"] == 3
    else:
        events = _events(response)
        assert _deltas(events) == TOKENS
        error, failed = events[-2:]
        assert (error["type"], error["message"]) == ("error", UPSTREAM_ERROR)
        assert failed["type"] == "response.failed"
        assert failed["response"]["error"]["message"] == UPSTREAM_ERROR
    assert len(script.calls) == 1


@pytest.mark.parametrize(
    ("status", "headers", "expected", "retry_after"),
    [(500, {}, 502, None), (429, {"Retry-After": "7"}, 429, "7"), (404, {}, 404, None)],
)
def test_an_upstream_error_before_the_first_byte_is_a_real_status_in_openais_shape(
    scripted: Callable[..., tuple[Script, Gateway]],
    status: int,
    headers: dict[str, str],
    expected: int,
    retry_after: str | None,
) -> None:
    script, gw = scripted(retry_backoff=0.01)
    script.failures = [(status, f"upstream says {status}", headers)] * 3
    response = _post(gw)
    assert response.status_code == expected
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.headers.get("retry-after") == retry_after


def test_a_failure_after_the_first_byte_is_never_replayed(
    front: Callable[..., Gateway], emulator: Emulator
) -> None:
    gw = front(emulator.url, retry_backoff=0.01)
    emulator.config.fault = "error_midstream"
    events = _events(_post(gw))
    assert "".join(_deltas(events)) == "".join(f"tok{i} " for i in range(5))
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    record = one_generation(emulator)
    assert record.wait_ended(DEADLINE)
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_requests_total", route=PATH) == 1
    assert metric_value(metrics, "gateway_upstream_retries_total") == 0


@pytest.mark.parametrize(
    ("phase", "stream"),
    [("before_first_byte", True), ("gathering", False), ("mid_stream", True)],
)
def test_a_client_leaving_frees_the_upstream_request_and_its_slot(
    front: Callable[..., Gateway], emulator: Emulator, phase: str, stream: bool
) -> None:
    gw = front(emulator.url, **ONE_SLOT)
    if phase == "before_first_byte":
        emulator.config.fault = "hang_before"
    else:
        emulator.config.tokens, emulator.config.inter_token = 400, 0.05  # a 20 s answer
    body = {"model": MODEL, "input": "hi", "stream": stream}
    with RawClient(gw, PATH, body) as client:
        record = one_generation(emulator)
        if phase == "mid_stream":
            client.first_frame(openai=True)
        elif phase == "gathering":
            eventually(lambda: record.tokens_sent >= 2, "tokens are being gathered")
    assert record.wait_ended(DEADLINE)
    assert record.outcome == "client_disconnect"
    _freed(gw, PATH)
    emulator.config.fault, emulator.config.tokens = None, 3
    assert _post(gw, stream=False).status_code == 200

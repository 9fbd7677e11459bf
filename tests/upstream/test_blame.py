"""Whose fault is a failure: one key cannot eject an upstream for all; panic mode; Retry-After.

Every test runs over real loopback sockets (issue 11, classes 1, 7 and 8; docs/operations.md,
"Whose fault is a failure").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.server import LoopbackServer
from tests.support.client import MODEL
from tests.support.lookalikes import OllamaLookalike, ndjson, served
from tests.support.metrics import metric_value, wait_polled
from tests.support.stack import Emulator, Gateway

#: The message of Ollama's runner crash: a broken server, or a prompt that crashes it.
CRASH = "model runner has unexpectedly stopped, this may be due to resource limitations"
#: One failure that is the upstream's own opens its circuit, for a minute.
OPEN_AT_ONE = {"circuit_failures": 1, "circuit_cooldown": 60}


class ScriptedUpstream(OllamaLookalike):
    """An Ollama look-alike whose answer to `/api/generate` follows the request's prompt.

    `answers` maps a prompt to (status, JSON body, headers); any other prompt gets a clean
    three-line stream. `calls` counts generate requests per prompt.
    """

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[str, tuple[int, dict[str, Any], dict[str, str]]] = {}
        self.calls: dict[str, int] = {}

    async def generate(self, request: Request) -> Response:
        prompt = str((await request.json()).get("prompt", ""))
        self.calls[prompt] = self.calls.get(prompt, 0) + 1
        if prompt in self.answers:
            status, body, headers = self.answers[prompt]
            return JSONResponse(body, status, headers=headers)
        body_text = ndjson(
            {"model": MODEL, "response": "a", "done": False},
            {"model": MODEL, "response": "", "done": True, "eval_count": 1},
        )
        return Response(body_text, media_type="application/x-ndjson")

    @property
    def total(self) -> int:
        return sum(self.calls.values())


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedUpstream, str]]:
    yield from served(ScriptedUpstream())


@pytest.fixture
def second() -> Iterator[Emulator]:
    """A second emulator, as another GPU node."""
    app = create_emulator_app(EmulatorConfig())
    with LoopbackServer(app) as server:
        yield Emulator(server.url, app.state.emulator)


def _generate(
    gw: Gateway,
    key: str | None = None,
    prompt: str = "x",
    headers: dict[str, Any] | None = None,
    **body: Any,
) -> httpx.Response:
    payload = {"model": MODEL, "prompt": prompt, "stream": False, **body}
    return httpx.post(
        f"{gw.url}/v1/generate",
        json=payload,
        headers={**gw.headers(key), **(headers or {})},
        timeout=30,
    )


def _circuit(gw: Gateway, url: str) -> float:
    name = url.removeprefix("http://")
    return metric_value(gw.metrics_text(), "gateway_upstream_circuit_state", upstream=name)


def _generations(emulator: Emulator) -> int:
    return len([r for r in emulator.state.records if r.path == "/api/generate"])


def _in_front_of(make_gateway: Callable[..., Gateway], *urls: str, **settings: Any) -> Gateway:
    """A gateway over the upstreams at `urls`, once its monitor has seen every one of them up."""
    gw = make_gateway(upstreams=[{"url": url} for url in urls], **settings)
    wait_polled(gw, len(urls))
    return gw


# --- class 1: failures a client causes do not open the circuit ------------------------------


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_non_ascii_user_agent_is_served_without_it_and_never_opens_the_circuit(
    make_gateway, emulator
):
    """Ollama serves `User-Agent: münchen`; the gateway serves it too, and does not forward a
    value its upstream client cannot encode (it used to fail there, blamed on the upstream)."""
    gw = make_gateway(circuit_failures=2, circuit_cooldown=60, retry_backoff=0.01)
    for agent in (b"\xff", "münchen/1.0".encode("latin-1")) * 3:  # past the threshold, one key
        assert _generate(gw, headers={"User-Agent": agent}).status_code == 200
    forwarded = [r.headers.get("user-agent") for r in emulator.state.records if r.body]
    assert len(forwarded) == 6
    assert all(agent and agent.isascii() for agent in forwarded)
    _, other = gw.create_key("other")
    assert _generate(gw, other).status_code == 200
    assert _circuit(gw, emulator.url) == 0
    assert metric_value(gw.metrics_text(), "gateway_upstream_errors_total") == 0


def test_an_over_long_forwarded_header_is_not_forwarded(gateway, emulator):
    response = _generate(gateway, headers={"Accept-Language": "x" * 2000})
    assert response.status_code == 200
    assert "accept-language" not in emulator.state.records[-1].headers


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_one_keys_ambiguous_500s_do_not_eject_the_upstream_for_other_keys(scripted, make_gateway):
    upstream, url = scripted
    upstream.answers["crash me"] = (500, {"error": CRASH}, {})
    gw = make_gateway(upstream_url=url, circuit_failures=2, circuit_cooldown=60, retry_backoff=0.01)
    for _ in range(4):
        response = _generate(gw, prompt="crash me")
        assert response.status_code == 502
        assert response.json()["error"].startswith("model runner")
    assert _circuit(gw, url) == 0
    _, other = gw.create_key("other")
    assert _generate(gw, other).status_code == 200


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_ambiguous_500s_from_two_keys_do_open_the_circuit(scripted, make_gateway):
    """The rule's other half: a 500 every key sees is the upstream's, and ejects it."""
    upstream, url = scripted
    upstream.answers["x"] = (500, {"error": CRASH}, {})
    gw = make_gateway(
        upstream_url=url,
        circuit_failures=2,
        circuit_cooldown=60,
        retry_attempts=1,
    )
    _, other = gw.create_key("other")
    assert _generate(gw).status_code == 502
    assert _circuit(gw, url) == 0
    assert _generate(gw, other).status_code == 502
    assert _generate(gw, other).status_code == 502
    assert _circuit(gw, url) == 2
    assert _generate(gw).status_code == 503  # out of rotation


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_500_that_blames_the_request_is_a_400_and_not_retried(scripted, make_gateway):
    upstream, url = scripted
    message = "prediction aborted, token repeat limit reached"
    upstream.answers["loop"] = (500, {"error": message}, {})
    gw = make_gateway(upstream_url=url, circuit_failures=1, retry_backoff=0.01)
    for _ in range(3):
        response = _generate(gw, prompt="loop")
        assert response.status_code == 400
        assert response.json() == {"error": message}
    assert upstream.calls["loop"] == 3  # one try each, no retries
    assert _circuit(gw, url) == 0
    assert _generate(gw).status_code == 200
    text = gw.metrics_text()
    assert metric_value(text, "gateway_upstream_retries_total") == 0
    assert metric_value(text, "gateway_upstream_errors_total", kind="status_4xx") == 3


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_body_the_dialect_cannot_translate_is_a_422_not_an_upstream_fault(make_gateway, emulator):
    # Ollama takes only inline images: an OpenAI image given by URL cannot reach it.
    gw = make_gateway(upstream_dialect="ollama", circuit_failures=2, circuit_cooldown=60)
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    bad = {"model": MODEL, "messages": [{"role": "user", "content": [image]}]}
    for _ in range(4):
        response = httpx.post(
            f"{gw.url}/v1/chat/completions", json=bad, headers=gw.headers(), timeout=30
        )
        assert response.status_code == 422
        assert response.json()["error"]["message"] == "the ollama upstream cannot take this request"
    assert not [r for r in emulator.state.records if r.path == "/api/chat"]
    assert _circuit(gw, emulator.url) == 0
    good = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    _, other = gw.create_key("other")
    response = httpx.post(f"{gw.url}/v1/chat", json=good, headers=gw.headers(other), timeout=30)
    assert response.status_code == 200


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_requests_own_deadline_mid_stream_is_not_an_upstream_failure(make_gateway, emulator):
    gw = make_gateway(circuit_failures=1, circuit_cooldown=60, request_timeout=0.5)
    emulator.config.tokens = 100
    emulator.config.inter_token = 0.05  # 5 s of answer: tokens keep flowing
    response = _generate(gw, stream=True)
    assert response.status_code == 200
    assert "request took longer" in response.text.splitlines()[-1]
    assert _circuit(gw, emulator.url) == 0
    emulator.config.tokens = 2
    assert _generate(gw).status_code == 200


# --- class 7: panic mode, and busy is not broken --------------------------------------------


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_when_every_circuit_is_open_requests_reach_the_open_upstreams(make_gateway, emulator):
    """A's circuit is open, B dies: A serves again (panic mode) instead of 503 for a minute."""
    doomed = LoopbackServer(create_emulator_app(EmulatorConfig()))
    doomed.start()
    gw = _in_front_of(make_gateway, emulator.url, doomed.url, retry_attempts=1, **OPEN_AT_ONE)
    emulator.config.fault = "status_before"
    emulator.config.fault_status = 502  # the upstream's own fault: one request opens it
    for _ in range(30):  # ties go to a random upstream: ask until A was chosen
        assert _generate(gw).status_code == 200
        if _circuit(gw, emulator.url) == 2:
            break
    assert _circuit(gw, emulator.url) == 2
    emulator.config.fault = None  # A recovers, its circuit still open for a minute
    doomed.stop()  # B dies between probes
    served = _generations(emulator)
    for _ in range(3):
        assert _generate(gw).status_code == 200
    assert _generations(emulator) == served + 3
    assert _circuit(gw, emulator.url) == 0  # A's success closed its circuit


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_busy_upstream_is_skipped_without_opening_its_circuit(make_gateway, emulator, second):
    # Least in flight, whose ties are random: the default (scored) keeps one prompt on the
    # server that took it first, which may never be the busy one.
    gw = _in_front_of(
        make_gateway,
        emulator.url,
        second.url,
        retry_backoff=0.01,
        routing="least_in_flight",
        **OPEN_AT_ONE,
    )
    emulator.config.fault = "busy"  # Ollama's 503 "server busy"
    for _ in range(30):  # ask until the busy one was asked, then a few more
        assert _generate(gw).status_code == 200  # served by the other upstream
        if metric_value(gw.metrics_text(), "gateway_upstream_errors_total", kind="busy") >= 2:
            break
    assert _circuit(gw, emulator.url) == 0
    text = gw.metrics_text()
    assert metric_value(text, "gateway_upstream_errors_total", kind="busy") >= 1
    assert metric_value(text, "gateway_upstream_errors_total", kind="status") == 0
    assert metric_value(text, "gateway_upstream_failovers_total") >= 1


# --- class 8: an upstream's 429 and its Retry-After -----------------------------------------


def test_an_upstream_429_passes_its_retry_after_to_the_client(scripted, make_gateway):
    upstream, url = scripted
    upstream.answers["x"] = (429, {"error": "slow down"}, {"Retry-After": "7"})
    gw = make_gateway(upstream_url=url, circuit_failures=1, retry_backoff=0.01)
    response = _generate(gw)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json() == {"error": "slow down"}
    assert upstream.calls["x"] == 1  # not retried sooner than asked
    assert _circuit(gw, url) == 0
    assert (
        metric_value(gw.metrics_text(), "gateway_upstream_errors_total", kind="rate_limited") == 1
    )


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_an_upstream_429_sends_requests_elsewhere_until_its_retry_after(
    scripted, make_gateway, emulator
):
    upstream, url = scripted
    upstream.answers["x"] = (429, {"error": "slow down"}, {"Retry-After": "60"})
    # Least in flight, whose ties are random: the default (scored) would keep this one prompt
    # on whichever server took it first, which may never be the limited one.
    gw = _in_front_of(
        make_gateway, url, emulator.url, retry_backoff=0.01, routing="least_in_flight"
    )
    for _ in range(30):  # ties go to a random upstream: ask until the limited one was asked
        assert _generate(gw).status_code == 200
        if upstream.total:
            break
    assert upstream.total == 1
    for _ in range(5):
        assert _generate(gw).status_code == 200
    assert upstream.total == 1  # left alone for its Retry-After


def test_retry_after_is_read_as_seconds_or_an_http_date_and_capped():
    from gateway.errors import MAX_RETRY_AFTER, parse_retry_after

    assert parse_retry_after("120") == 120
    assert parse_retry_after("999999") == MAX_RETRY_AFTER
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412480.0) == 30
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-5") is None
    assert parse_retry_after(None) is None


def test_the_breaker_counts_ambiguous_failures_only_from_two_keys():
    from gateway.upstream.breaker import CircuitBreaker, CircuitState

    breaker = CircuitBreaker(failures=2, cooldown=60)
    for _ in range(10):
        breaker.record_failure("key-a")
    assert breaker.state is CircuitState.CLOSED
    breaker.record_failure("key-b")
    breaker.record_failure("key-a")
    assert breaker.state is CircuitState.OPEN
    fresh = CircuitBreaker(failures=2, cooldown=60)
    fresh.record_failure()  # the upstream's own fault counts from one request
    fresh.record_failure()
    assert fresh.state is CircuitState.OPEN


# --- the half-open trial: it proves something, or it is handed on -----------------------------


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_trial_that_proves_nothing_hands_the_trial_to_the_next_request(emulator, make_gateway):
    """A half-open circuit whose trial ends without a verdict (here: a busy 503) must not stay
    half-open: that refused every request of every key for as long as the process ran."""
    gw = make_gateway(circuit_failures=1, circuit_cooldown=0.3, retry_attempts=1)
    emulator.config.fault, emulator.config.fault_status = "status_before", 502
    assert _generate(gw).status_code == 502  # the upstream's own fault: the circuit opens
    assert _circuit(gw, emulator.url) == 2
    time.sleep(0.5)  # past the cooldown
    emulator.config.fault_status = 503  # the trial: busy, neither success nor failure
    assert _generate(gw).status_code == 503
    emulator.config.fault = None
    _, other = gw.create_key("other")
    assert _generate(gw, other).status_code == 200  # the next request was the trial
    assert _circuit(gw, emulator.url) == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_long_trial_stream_does_not_hold_other_keys_off(emulator, make_gateway):
    """The trial closes the circuit with its first chunk, not when its stream ends."""
    gw = make_gateway(circuit_failures=1, circuit_cooldown=0.3, retry_attempts=1)
    emulator.config.fault, emulator.config.fault_status = "status_before", 502
    assert _generate(gw).status_code == 502
    time.sleep(0.5)
    emulator.config.fault = None
    emulator.config.tokens, emulator.config.inter_token = 200, 0.05  # a 10 s stream
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/generate",
        json={"model": MODEL, "prompt": "long"},
        headers=gw.headers(),
        timeout=30,
    ) as trial:
        lines = trial.iter_lines()
        assert json.loads(next(lines))["done"] is False  # the trial is streaming
        emulator.config.tokens = 2
        _, other = gw.create_key("other")
        assert _generate(gw, other).status_code == 200  # served while the trial streams
        assert _circuit(gw, emulator.url) == 0


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_an_upstream_error_message_that_echoes_the_request_is_not_logged_by_default(
    make_gateway, emulator: Emulator, caplog: pytest.LogCaptureFixture, level: int
) -> None:
    # vLLM's 400s carry pydantic's `input`, the messages themselves: the client gets the
    # message, the log only its length unless debug logging is on. Both relay paths: the
    # generation engine and the Ollama surface's model management (`/api/delete`).
    gw = make_gateway(retry_attempts=1)
    echoed = "Field required, input: {'content': 'my secret plans for Q3'}"
    emulator.config.fault, emulator.config.fault_status = "status_before", 400
    emulator.config.fault_message = echoed
    caplog.set_level(level, logger="gateway")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{gw.url}/api/chat", json=chat, headers=gw.headers(), timeout=10)
    assert (response.status_code, response.json()) == (400, {"error": echoed})
    manager = gw.create_key("manager", manage_models=True)[1]
    response = httpx.request(
        "DELETE",
        f"{gw.url}/api/delete",
        json={"model": "secret-plans:q3"},
        headers=gw.headers(manager),
        timeout=10,
    )
    assert response.status_code == 404
    missing = response.json()["error"]
    assert "secret-plans" in missing
    logged = [r.getMessage() for r in caplog.records if "upstream answered" in r.getMessage()]
    if level == logging.DEBUG:
        assert logged == [f"upstream answered 400: {echoed}", f"upstream answered 404: {missing}"]
    else:
        tail = "-character message, logged at debug level only)"
        assert logged == [
            f"upstream answered 400 (a {len(echoed)}{tail}",
            f"upstream answered 404 (a {len(missing)}{tail}",
        ]
        assert "secret plans" not in caplog.text  # (the model name is in the access line)

"""Several upstreams over real sockets: routing by model, balancing, failover, circuit breaking."""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx
import pytest

from gateway.errors import UpstreamStatusError
from gateway.metering.metrics import Metrics
from gateway.policies import PoolPolicy
from gateway.settings import Settings
from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.server import LoopbackServer
from gateway.upstream.breaker import CircuitBreaker, CircuitState
from gateway.upstream.headers import upstream_request_id
from gateway.upstream.pool import open_pool
from gateway.upstream.scheduling.ticket import RouteTicket
from tests.support.client import MODEL
from tests.support.metrics import metric_value, wait_polled
from tests.support.stack import Emulator, Gateway


@pytest.fixture
def second() -> Iterator[Emulator]:
    """A second emulator, as another GPU node."""
    app = create_emulator_app(EmulatorConfig())
    with LoopbackServer(app) as server:
        yield Emulator(server.url, app.state.emulator)


def _upstreams(*urls: str, **extra) -> list[dict]:
    return [{"url": url, **extra} for url in urls]


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _generations(emulator: Emulator) -> int:
    return len([r for r in emulator.state.records if r.path == "/api/generate"])


def _generate(gw: Gateway, model: str = MODEL, **body) -> httpx.Response:
    payload = {"model": model, "prompt": "x", "stream": False, **body}
    return httpx.post(f"{gw.url}/v1/generate", json=payload, headers=gw.headers(), timeout=30)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_least_in_flight_spreads_concurrent_requests(make_gateway, emulator, second):
    gw = make_gateway(
        upstreams=_upstreams(emulator.url, second.url),
        upstream_poll_interval=0.2,
        routing="least_in_flight",
    )
    wait_polled(gw, 2)
    for em in (emulator, second):
        em.config.tokens = 10
        em.config.inter_token = 0.05
    with ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(lambda _: _generate(gw).status_code, range(6)))
    assert statuses == [200] * 6
    assert (_generations(emulator), _generations(second)) == (3, 3)
    text = gw.metrics_text()
    assert metric_value(text, "gateway_upstream_in_flight") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_requests_go_to_the_upstream_that_has_the_model(make_gateway, emulator, second):
    emulator.config.models = ["alpha:latest"]
    second.config.models = ["beta:latest"]
    gw = make_gateway(upstreams=_upstreams(emulator.url, second.url), upstream_poll_interval=0.2)
    wait_polled(gw, 2)
    for _ in range(3):
        assert _generate(gw, "alpha").status_code == 200
        assert _generate(gw, "beta:latest").status_code == 200
    assert (_generations(emulator), _generations(second)) == (3, 3)
    models = httpx.get(f"{gw.url}/v1/models", headers=gw.headers()).json()
    assert [m["id"] for m in models["data"]] == ["alpha:latest", "beta:latest"]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_connect_failure_fails_over_and_the_circuit_opens(make_gateway, emulator):
    """An upstream that dies between health probes: requests fail over, then its circuit opens."""
    doomed = LoopbackServer(create_emulator_app(EmulatorConfig()))
    doomed.start()
    gw = make_gateway(
        upstreams=_upstreams(doomed.url, emulator.url),
        retry_backoff=0.01,
        circuit_failures=2,
        circuit_cooldown=60,
    )
    wait_polled(gw, 2)  # both answered their first probe; the next one is 15 s away
    doomed_name = doomed.url.removeprefix("http://")
    doomed.stop()

    def circuit() -> float:
        return metric_value(
            gw.metrics_text(), "gateway_upstream_circuit_state", upstream=doomed_name
        )

    # Ties between idle upstreams are broken at random: ask until the dead one was tried twice.
    asked = 0
    while circuit() != 2 and asked < 40:
        assert _generate(gw).status_code == 200  # failed over when the dead one was chosen
        asked += 1
    assert circuit() == 2  # open
    assert _generations(emulator) == asked
    for _ in range(5):  # once open, the dead upstream is no longer tried
        assert _generate(gw).status_code == 200
    assert metric_value(gw.metrics_text(), "gateway_upstream_failovers_total") == 2


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_an_open_circuit_lets_one_trial_through_after_the_cooldown(make_gateway, emulator, second):
    gw = make_gateway(
        upstreams=_upstreams(emulator.url, second.url),
        retry_attempts=1,
        circuit_failures=1,
        circuit_cooldown=0.5,
    )
    # 502 before the first byte: the upstream's own fault, so one key's requests open it (a 500
    # might be the request's, tests/upstream/test_blame.py).
    emulator.config.fault = "status_before"
    emulator.config.fault_status = 502
    name = emulator.url.removeprefix("http://")

    def circuit() -> float:
        return metric_value(gw.metrics_text(), "gateway_upstream_circuit_state", upstream=name)

    # Ties between idle upstreams are broken at random: ask until the failing one was chosen.
    for _ in range(30):
        assert _generate(gw).status_code == 200  # failed over to the second upstream
        if circuit() == 2:
            break
    assert circuit() == 2  # open
    failed = _generations(emulator)
    assert failed >= 1
    emulator.config.fault = None
    time.sleep(0.6)
    for _ in range(30):
        assert _generate(gw).status_code == 200
        if _generations(emulator) > failed:
            break
    assert circuit() == 0  # the trial succeeded: closed again


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_silent_upstream_fails_over_before_the_first_byte(make_gateway, emulator, second):
    """F-07: nothing was sent yet, so another upstream is tried after the first-byte timeout."""
    gw = make_gateway(upstreams=_upstreams(emulator.url, second.url), first_byte_timeout=1.0)
    emulator.config.fault = "hang_before"
    second.config.fault = "hang_before"
    start = time.perf_counter()
    response = _generate(gw)
    elapsed = time.perf_counter() - start
    assert response.status_code == 504
    assert 1.8 < elapsed < 4  # two upstreams, one timeout each
    emulator.config.fault = None
    second.config.fault = None


def test_a_mid_stream_failure_is_not_moved_to_another_upstream(make_gateway, emulator, second):
    gw = make_gateway(upstreams=_upstreams(emulator.url, second.url))
    for em in (emulator, second):
        em.config.fault = "drop_midstream"
        em.config.fault_after = 3
    response = httpx.post(
        f"{gw.url}/v1/generate", json={"model": MODEL, "prompt": "x"}, headers=gw.headers()
    )
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert set(lines[-1]) == {"error"}
    assert _generations(emulator) + _generations(second) == 1


def test_readyz_reports_each_upstream_and_is_ready_while_one_answers(make_gateway, emulator):
    dead = _closed_port_url()
    gw = make_gateway(upstreams=_upstreams(emulator.url, dead))
    ready = httpx.get(f"{gw.url}/readyz")
    assert ready.status_code == 200
    upstreams = ready.json()["upstreams"]
    assert upstreams[emulator.url.removeprefix("http://")].startswith("upstream answered 200")
    assert upstreams[dead.removeprefix("http://")].startswith("down")


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_weights_share_the_load(make_gateway, emulator, second):
    # Least in flight: the default (scored) keeps these identical prompts on the server that
    # holds their prefix, as it should (tests/upstream/test_routing.py).
    gw = make_gateway(
        upstreams=[{"url": emulator.url, "weight": 3}, {"url": second.url}],
        upstream_poll_interval=0.2,
        routing="least_in_flight",
    )
    wait_polled(gw, 2)
    for em in (emulator, second):
        em.config.tokens = 10
        em.config.inter_token = 0.05
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: _generate(gw), range(8)))
    heavy, light = _generations(emulator), _generations(second)
    assert heavy + light == 8
    assert heavy >= 5  # 3:1 weights: 6 and 2, give or take the ties broken at random


def test_the_upstream_request_id_is_always_a_uuid():
    """llama-cpp-python answers 400 to a non-UUID X-Request-ID; the mapping is stable."""
    own = uuid.uuid4().hex
    assert upstream_request_id(own) == own
    canonical = str(uuid.uuid4())
    assert upstream_request_id(canonical) == canonical
    mapped = upstream_request_id("req-123")
    assert uuid.UUID(mapped).version == 5
    assert mapped == upstream_request_id("req-123") != upstream_request_id("req-124")
    assert uuid.UUID(upstream_request_id("batch_req_0123456789abcdef01234567"))


def test_an_upstream_4xx_without_a_message_still_says_what_happened():
    error = UpstreamStatusError(400, "")
    assert error.status_code == 400
    assert error.message == "upstream answered 400 with no error message"
    assert UpstreamStatusError(404, "model 'x' not found").message == "model 'x' not found"


# --- failover past open circuits within one request (panic mode) ------------------------------


def _access_line(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    """The access log line of `request_id`, waiting for it (it is written as the response ends)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for record in list(caplog.records):
            if record.name == "gateway.access":
                line = json.loads(record.getMessage())
                if line["request_id"] == request_id:
                    return line
        time.sleep(0.02)
    raise AssertionError(f"no access log line for {request_id}")


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
@pytest.mark.parametrize("death", ["killed", "502", "silent"])
def test_a_request_fails_over_past_an_open_circuit_when_the_last_closed_upstream_dies(
    make_gateway, second, caplog, death
):
    """B's circuit is open after hangs; then A dies mid-run. The request that finds A dead goes
    on to B within itself (panic mode for its own failover) instead of answering 502, and the
    access log shows the order it tried them in. Three ways to die: the process is gone
    (refused), every answer is a 502, the upstream is silent."""
    caplog.set_level(logging.INFO, logger="gateway.access")
    a_app = create_emulator_app(EmulatorConfig())
    a_server = LoopbackServer(a_app)
    a_server.start()
    a, b = a_server.url.removeprefix("http://"), second.url.removeprefix("http://")
    try:
        gw = make_gateway(
            upstreams=_upstreams(a_server.url, second.url),
            first_byte_timeout=2.0,  # B's hangs (and a silent A) cost this each
            retry_backoff=0.01,
            circuit_failures=2,  # one failure of A leaves its circuit closed
            circuit_cooldown=60,
        )
        wait_polled(gw, 2)

        def circuit(name: str) -> float:
            return metric_value(gw.metrics_text(), "gateway_upstream_circuit_state", upstream=name)

        second.config.fault = "hang_before"
        for _ in range(40):  # ties go to a random upstream: ask until B timed out twice
            assert _generate(gw).status_code == 200  # A served each time
            if circuit(b) == 2:
                break
        assert circuit(b) == 2  # open, for a minute
        second.config.fault = None  # B would answer again; its circuit does not know yet
        served_by_b = _generations(second)
        statuses = []
        for i in range(10):
            if i == 3:  # A dies mid-run, between two of its health probes
                if death == "killed":
                    a_server.stop()
                elif death == "502":
                    a_app.state.emulator.config.fault = "status_before"
                    a_app.state.emulator.config.fault_status = 502
                else:
                    a_app.state.emulator.config.fault = "hang_before"
            response = httpx.post(
                f"{gw.url}/v1/generate",
                json={"model": MODEL, "prompt": "x", "stream": False},
                headers={**gw.headers(), "X-Request-ID": f"run-{i}"},
                timeout=30,
            )
            statuses.append(response.status_code)
        assert statuses == [200] * 10
        first_after = _access_line(caplog, "run-3")
        assert first_after["tried"] == [a, b]  # the failover order: A, then B past its circuit
        assert first_after["upstream"] == b
        assert _generations(second) >= served_by_b + 7
        assert "tried" not in _access_line(caplog, "run-0")  # A alone served it
    finally:
        a_server.stop()


@pytest.mark.anyio
async def test_panic_mode_offers_every_upstream_once_nearest_to_closing_first():
    """The order of one request's failover: closed circuits first, then half-open, then open
    ones by how long ago they opened; each upstream once; then none."""
    urls = [f"http://127.0.0.1:{port}" for port in (1, 2, 3, 4)]
    settings = Settings(upstreams=[{"url": url} for url in urls])
    transport = httpx.MockTransport(lambda _: httpx.Response(500))
    async with AsyncExitStack() as stack:
        pool = await open_pool(PoolPolicy.of(settings), Metrics(), stack, transport)
        closed, half_open, old, young = pool.upstreams
        for upstream in (old, young):
            upstream.breaker = CircuitBreaker(failures=1, cooldown=60)
        half_open.breaker = CircuitBreaker(failures=1, cooldown=0.001)
        old.breaker.record_failure()
        await anyio.sleep(0.01)  # opened later than `old`
        young.breaker.record_failure()
        half_open.breaker.record_failure()
        await anyio.sleep(0.01)
        assert half_open.breaker.acquire()  # its trial is running: not available
        assert half_open.breaker.state is CircuitState.HALF_OPEN
        tried: set[str] = set()
        order = []
        while (upstream := pool.choose(MODEL, tried)) is not None:
            tried.add(upstream.name)
            order.append(upstream)
            pool.finished(upstream, None)
        assert order == [closed, half_open, old, young]
        assert young.breaker.state is CircuitState.OPEN  # panic mode passes a circuit by


@pytest.mark.anyio
@pytest.mark.parametrize("healthy", [None, True, False])
async def test_a_request_that_ends_unanswered_leaves_no_load_under_way(healthy):
    """Refused, a 4xx, the client gone, failed: whatever ended before the first chunk started
    no load a later request should wait for (a key could otherwise pin everyone's requests to
    a cold server with cheap requests that never reach the model)."""
    settings = Settings(upstreams=[{"url": "http://127.0.0.1:1"}], routing="scored")
    transport = httpx.MockTransport(lambda _: httpx.Response(500))
    async with AsyncExitStack() as stack:
        pool = await open_pool(PoolPolicy.of(settings), Metrics(), stack, transport)
        (upstream,) = pool.upstreams
        residency = pool.scheduler.residency
        ticket = RouteTicket(MODEL, tokens=1000, output=100)
        assert pool.choose(MODEL, set(), ticket=ticket) is upstream
        residency.started(upstream.name, MODEL, 5.0)  # as `chosen` notes a cold one
        pool.finished(upstream, healthy, ticket=ticket)
        assert residency.loading(upstream.name, MODEL) is None
        assert (upstream.in_flight, upstream.tokens_in_flight, upstream.prefills) == (0, 0, [])
        # Answered: the load is over (`served`), and the end keeps it so.
        ticket = RouteTicket(MODEL, tokens=1000, output=100)
        assert pool.choose(MODEL, set(), ticket=ticket) is upstream
        residency.started(upstream.name, MODEL, 5.0)
        pool.answering(upstream, MODEL, ticket)
        assert upstream.prefills == []
        pool.finished(upstream, healthy, ticket=ticket)
        assert (upstream.in_flight, upstream.tokens_in_flight, upstream.prefills) == (0, 0, [])

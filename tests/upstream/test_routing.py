"""The routing policy over real sockets: emulated model servers behind a real gateway.

Residency from Ollama's `/api/ps`, prefix affinity across the turns of a conversation,
failover when the preferred server dies, a server that restarts empty, and the default
policy untouched.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import httpx
import pytest

from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.server import LoopbackServer
from tests.support.client import MODEL
from tests.support.metrics import metric_value, wait_polled
from tests.support.stack import Emulator, Gateway
from tests.upstream.test_upstreams import _access_line

Fleet = Callable[..., list[Emulator]]


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    """Start emulators on loopback ports (each a model server); `fleet(n, **config)`."""
    with ExitStack() as stack:

        def start(count: int, **config: object) -> list[Emulator]:
            emulators = []
            for _ in range(count):
                app = create_emulator_app(EmulatorConfig(ttft=0.01, inter_token=0.002, **config))
                server = stack.enter_context(LoopbackServer(app))
                emulators.append(Emulator(server.url, app.state.emulator))
            return emulators

        yield start


def _gateway(make_gateway, emulators: list[Emulator], **settings) -> Gateway:
    values = {"upstream_poll_interval": 0.1, "routing": "scored", **settings}
    gw = make_gateway(upstreams=[{"url": em.url} for em in emulators], **values)
    wait_polled(gw, len(emulators))
    return gw


def _chats(emulator: Emulator) -> int:
    return len([r for r in emulator.state.records if r.path == "/api/chat"])


def _conversation(name: str, turns: int) -> list[dict[str, str]]:
    """A system prompt of ~6 kB (several prefix blocks) and `turns` turns after it."""
    messages = [{"role": "system", "content": f"You are {name}'s assistant. " + "Rules. " * 800}]
    for n in range(turns):
        role = "user" if n % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"{name} turn {n}: " + "words " * 60})
    return messages


def _chat(gw: Gateway, messages: list[dict[str, str]], model: str = MODEL) -> str:
    """Send a chat through the gateway; returns the request id (200 asserted)."""
    request_id = uuid.uuid4().hex
    response = httpx.post(
        f"{gw.url}/api/chat",
        json={"model": model, "messages": messages, "stream": False},
        headers={**gw.headers(), "x-request-id": request_id},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return request_id


def _served(emulators: list[Emulator], before: list[int]) -> int:
    """The index of the one emulator that served a chat since `before` (its counts)."""
    grown = [i for i, em in enumerate(emulators) if _chats(em) > before[i]]
    assert len(grown) == 1, grown
    return grown[0]


def _wait(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _loaded(gw: Gateway, emulator: Emulator) -> float:
    name = emulator.url.removeprefix("http://")
    return metric_value(gw.metrics_text(), "gateway_upstream_models_loaded", upstream=name)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_residency_from_ps_steers_requests_to_the_server_holding_the_model(
    make_gateway, fleet, caplog
):
    caplog.set_level("INFO", logger="gateway.access")
    warm, cold = fleet(2, cold_load=0.3)
    gw = _gateway(make_gateway, [warm, cold])
    # Load the model on one server behind the gateway's back, as another client would.
    loaded = httpx.post(
        f"{warm.url}/api/generate", json={"model": MODEL, "prompt": "x", "stream": False}
    )
    assert loaded.status_code == 200
    _wait(lambda: _loaded(gw, warm) == 1, "the monitor to see the loaded model")
    assert _loaded(gw, cold) == 0
    for n in range(6):
        request_id = _chat(gw, [{"role": "user", "content": f"short question {n}"}])
        assert _access_line(caplog, request_id)["route_reason"] == "residency"
    assert (_chats(warm), _chats(cold)) == (6, 0)
    text = gw.metrics_text()
    assert metric_value(text, "gateway_route_decisions_total", reason="residency") == 6
    assert metric_value(text, "gateway_route_cold_loads_total") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_each_model_goes_to_the_server_holding_it_without_a_cold_load(make_gateway, fleet):
    first, second = fleet(2, cold_load=0.3, models=["alpha:latest", "beta:latest"])
    gw = _gateway(make_gateway, [first, second])
    for emulator, model in ((first, "alpha"), (second, "beta")):
        body = {"model": model, "prompt": "x", "stream": False}
        assert httpx.post(f"{emulator.url}/api/generate", json=body).status_code == 200
    _wait(lambda: _loaded(gw, first) == 1 and _loaded(gw, second) == 1, "both /api/ps")
    for _ in range(4):
        _chat(gw, [{"role": "user", "content": "hi"}], model="alpha")
        _chat(gw, [{"role": "user", "content": "hi"}], model="beta")
    assert (_chats(first), _chats(second)) == (4, 4)
    assert {r.body["model"] for r in first.state.records if r.path == "/api/chat"} == {"alpha"}
    assert metric_value(gw.metrics_text(), "gateway_route_cold_loads_total") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_next_turn_goes_to_the_server_that_served_the_conversation(make_gateway, fleet, caplog):
    caplog.set_level("INFO", logger="gateway.access")
    emulators = fleet(3)
    gw = _gateway(make_gateway, emulators)
    homes = {}
    for name in ("ada", "bob", "cyd", "dan"):
        before = [_chats(em) for em in emulators]
        _chat(gw, _conversation(name, 1))
        homes[name] = _served(emulators, before)
    for turns in (3, 5, 7):
        for name, home in homes.items():
            before = [_chats(em) for em in emulators]
            request_id = _chat(gw, _conversation(name, turns))
            assert _served(emulators, before) == home, name
            assert _access_line(caplog, request_id)["route_reason"] == "prefix"
    text = gw.metrics_text()
    assert metric_value(text, "gateway_route_decisions_total", reason="prefix") == 12
    assert metric_value(text, "gateway_route_prefix_hit_tokens_count") == 16
    assert metric_value(text, "gateway_route_prefix_hit_tokens_sum") > 12 * 1500


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_when_the_preferred_server_dies_the_turn_fails_over_and_its_affinity_moves(
    make_gateway, caplog
):
    caplog.set_level("INFO", logger="gateway.access")
    apps = [create_emulator_app(EmulatorConfig(ttft=0.01, inter_token=0.002)) for _ in range(2)]
    servers = [LoopbackServer(app).__enter__() for app in apps]
    emulators = [Emulator(s.url, app.state.emulator) for s, app in zip(servers, apps, strict=True)]
    try:
        gw = _gateway(make_gateway, emulators, upstream_poll_interval=30)
        before = [0, 0]
        _chat(gw, _conversation("eve", 1))
        home = _served(emulators, before)
        other = 1 - home
        servers[home].__exit__(None, None, None)  # dies between two turns
        request_id = _chat(gw, _conversation("eve", 3))
        line = _access_line(caplog, request_id)
        assert line["tried"] == [emulators[home].url[7:], emulators[other].url[7:]]
        assert line["route_reason"] == "failover"
        assert _chats(emulators[other]) == 1
        # The next turn goes where the last one was served, without trying the dead one.
        request_id = _chat(gw, _conversation("eve", 5))
        line = _access_line(caplog, request_id)
        assert line["upstream"] == emulators[other].url[7:]
        assert "tried" not in line
        assert _chats(emulators[other]) == 2
    finally:
        for server in servers:
            server.__exit__(None, None, None)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_server_that_restarts_empty_loses_its_affinity(make_gateway, caplog):
    caplog.set_level("INFO", logger="gateway.access")
    servers: list[LoopbackServer] = []
    try:
        emulators = []
        for _ in range(2):
            app = create_emulator_app(EmulatorConfig(ttft=0.01, inter_token=0.002))
            servers.append(LoopbackServer(app).__enter__())
            emulators.append(Emulator(servers[-1].url, app.state.emulator))
        gw = _gateway(make_gateway, emulators)
        _wait(lambda: all(_loaded(gw, em) > 0 for em in emulators), "both servers' /api/ps")
        _chat(gw, _conversation("fay", 1))
        home = _served(emulators, [0, 0])
        other = 1 - home
        port = servers[home].port
        servers[home].__exit__(None, None, None)
        # Back at once, on the same port, with nothing loaded: a restarted Ollama.
        app = create_emulator_app(EmulatorConfig(ttft=0.01, inter_token=0.002, cold_load=0.2))
        servers[home] = LoopbackServer(app, port=port).__enter__()
        emulators[home] = Emulator(servers[home].url, app.state.emulator)
        name = emulators[home].url.removeprefix("http://")

        def empty_and_up() -> bool:
            text = gw.metrics_text()
            up = metric_value(text, "gateway_upstream_up", upstream=name) == 1
            return up and metric_value(text, "gateway_upstream_models_loaded", upstream=name) == 0

        # 0 models: what its /api/ps says once it is back (a poll may have seen it down too).
        _wait(empty_and_up, "the monitor to see it back, empty")
        before = [_chats(em) for em in emulators]
        request_id = _chat(gw, _conversation("fay", 3))
        assert _served(emulators, before) == other
        assert _access_line(caplog, request_id)["route_reason"] == "residency"
        assert metric_value(gw.metrics_text(), "gateway_route_cold_loads_total") == 0
    finally:
        for server in servers:
            server.__exit__(None, None, None)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_least_in_flight_counts_its_decisions_and_hashes_nothing(make_gateway, fleet):
    emulators = fleet(2)
    gw = make_gateway(
        upstreams=[{"url": em.url} for em in emulators],
        upstream_poll_interval=0.1,
        routing="least_in_flight",
    )
    wait_polled(gw, 2)
    for _ in range(4):
        _chat(gw, _conversation("gus", 1))
    text = gw.metrics_text()
    assert metric_value(text, "gateway_route_decisions_total", reason="least_in_flight") == 4
    assert metric_value(text, "gateway_route_decisions_total") == 4
    assert metric_value(text, "gateway_route_prefix_hit_tokens_count") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_default_policy_is_scored(make_gateway, fleet):
    emulators = fleet(2)
    gw = make_gateway(upstreams=[{"url": em.url} for em in emulators], upstream_poll_interval=0.1)
    wait_polled(gw, 2)
    for turn in range(1, 5):
        _chat(gw, _conversation("gus", turn))
    text = gw.metrics_text()
    assert metric_value(text, "gateway_route_decisions_total", reason="least_in_flight") == 0
    assert metric_value(text, "gateway_route_decisions_total") == 4
    assert metric_value(text, "gateway_route_prefix_hit_tokens_count") >= 1
    assert sum(1 for em in emulators if _chats(em)) == 1  # the conversation stayed on one

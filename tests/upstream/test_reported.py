"""A model server's own load: its `/metrics` parsed and discovered, the `server` cost, the policy.

Pure units for the parser and the cost, `httpx.MockTransport` for the reader's discovery, then
over real sockets: emulated GPU servers (vLLM's names on `/metrics`) behind a real gateway.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from datetime import timedelta

import httpx
import pytest
from prometheus_client import generate_latest

from gateway.auth.jwt import mint_token
from gateway.metering.metrics import Metrics
from gateway.policies import SchedulingPolicy
from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.server import LoopbackServer
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.dialects.openai import OpenAIDialect
from gateway.upstream.monitor import LoadedModel, UpstreamMonitor
from gateway.upstream.reported import (
    MAX_METRICS_BYTES,
    MAX_READ_LINES,
    ReportReader,
    ServerReport,
    parse_metrics,
)
from gateway.upstream.scheduling.reported import KV_FULL_FROM, server_cost
from gateway.upstream.scheduling.scheduler import Scheduler
from gateway.upstream.scheduling.scores import (
    DEFAULT_HOLD_SECONDS,
    LOAD_TOKENS_PER_SECOND,
    REQUEST_TOKENS,
)
from gateway.upstream.scheduling.ticket import RouteTicket
from tests.support.client import MODEL
from tests.support.metrics import metric_value, wait_polled
from tests.support.stack import Emulator, Gateway
from tests.upstream.test_scheduling import FakeServer
from tests.upstream.test_upstreams import _access_line

SECRET = "k7Qy2mVn8RwT4pZs6XbJ3cLd9FhGa5Ue1NoKi0Mt"

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.93
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 3.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 3.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 3.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 8.128902e+06
"""

# llama.cpp server's `--metrics` (tools/server/README.md): current builds have no KV gauge.
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""

LLAMACPP_OLDER = (
    LLAMACPP
    + """\
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.5
"""
)

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
"""


def _readings(text: str) -> tuple[float | None, float | None, float | None] | None:
    report = parse_metrics(text)
    return None if report is None else (report.waiting, report.running, report.kv_usage)


# --- the parser ---------------------------------------------------------------------------


def test_vllm_counts_are_summed_over_label_sets_and_the_fullest_kv_cache_counts():
    assert _readings(VLLM) == (5.0, 5.0, 0.93)


def test_llama_cpp_deferred_is_waiting_and_only_older_builds_say_kv():
    assert _readings(LLAMACPP) == (5.0, 2.0, None)
    assert _readings(LLAMACPP_OLDER) == (5.0, 2.0, 0.5)


def test_sglang_queue_running_and_token_usage():
    assert _readings(SGLANG) == (0.0, 7.0, 0.28)


@pytest.mark.parametrize(
    "body",
    [
        "",
        "<html><body><h1>It works</h1></body></html>",
        '{"error": "not found"}',
        "404 page not found",
        "\x00\x01\x02 binary",
        # Prometheus text, but none of the names read (the gateway's own /metrics, say).
        "# TYPE gateway_requests_total counter\ngateway_requests_total 3\n",
        # A name read here, but not in the text format.
        "vllm:num_requests_waiting lots\n",
        'vllm:num_requests_waiting{model_name="m" 3\n',
    ],
)
def test_garbage_and_other_exporters_are_not_a_report(body):
    assert parse_metrics(body) is None


def test_values_that_are_not_finite_or_negative_are_left_out_and_kv_is_capped_at_one():
    body = (
        "vllm:num_requests_waiting NaN\nvllm:num_requests_running -1\n"
        "vllm:kv_cache_usage_perc 1.7\n"
    )
    assert _readings(body) == (None, None, 1.0)


def test_finite_samples_that_add_up_to_infinity_are_no_reading():
    body = (
        'vllm:num_requests_waiting{model_name="a"} 1.7e308\n'
        'vllm:num_requests_waiting{model_name="b"} 1.7e308\n'
        "vllm:num_requests_running 2\n"
    )
    assert _readings(body) == (None, 2.0, None)


def test_a_body_of_too_many_read_lines_is_no_report():
    """A label explosion (or a body made to stall the parser on the event loop)."""
    many = "".join(
        f'vllm:num_requests_waiting{{model_name="m{i}"}} 1\n' for i in range(MAX_READ_LINES + 1)
    )
    assert parse_metrics(many) is None
    enough = "".join(
        f'vllm:num_requests_waiting{{model_name="m{i}"}} 1\n' for i in range(MAX_READ_LINES)
    )
    assert _readings(enough) == (float(MAX_READ_LINES), None, None)


def test_a_family_declared_without_samples_still_publishes_with_nothing_said():
    assert _readings("# TYPE vllm:num_requests_waiting gauge\n") == (None, None, None)


def test_a_huge_body_of_other_metrics_costs_a_line_scan():
    noise = "".join(
        f'vllm:time_to_first_token_seconds_bucket{{le="{i}"}} 1\n' for i in range(20000)
    )
    assert _readings(noise + VLLM) == (5.0, 5.0, 0.93)


# --- the reader: discovery ------------------------------------------------------------------


class Server:
    """A `/metrics` answer for `httpx.MockTransport`, and the times it was asked."""

    def __init__(self, status: int = 200, body: bytes = VLLM.encode()) -> None:
        self.status, self.body, self.asked = status, body, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        self.asked += 1
        return httpx.Response(self.status, content=self.body)


def _reader(server: Callable[[httpx.Request], httpx.Response]) -> ReportReader:
    client = httpx.AsyncClient(transport=httpx.MockTransport(server), base_url="http://model")
    return ReportReader(client, timeout=1.0)


@pytest.mark.anyio
async def test_a_server_that_publishes_is_read_every_time():
    server = Server()
    reader = _reader(server)
    for _ in range(3):
        report = await reader.read()
        assert report is not None
        assert report.waiting == 5
    assert (server.asked, reader.publishes) == (3, True)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, b"404 page not found"),  # Ollama; llama.cpp without --metrics
        (400, b"model name is missing from the request"),  # llama.cpp's router mode
        (200, b"<html>a web page</html>"),
        (200, b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1\n"),
    ],
)
async def test_a_server_that_does_not_publish_is_not_asked_again_until_it_restarts(status, body):
    server = Server(status, body)
    reader = _reader(server)
    for _ in range(3):
        assert await reader.read() is None
    assert (server.asked, reader.publishes) == (1, False)
    reader.server_restarted()  # seen down, then back: maybe with --metrics now
    server.status, server.body = 200, VLLM.encode()
    assert await reader.read() is not None
    assert server.asked == 2


@pytest.mark.anyio
async def test_a_passing_failure_is_asked_again_next_poll():
    server = Server(503, b"busy")
    reader = _reader(server)
    assert await reader.read() is None
    assert reader.publishes is None
    server.status, server.body = 200, VLLM.encode()
    assert await reader.read() is not None

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    assert await _reader(refuse).read() is None


@pytest.mark.anyio
async def test_a_body_over_the_bound_is_not_read_to_its_end_and_counts_as_not_publishing():
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        while sent < 4 * MAX_METRICS_BYTES:
            sent += 64 * 1024
            yield VLLM.encode().ljust(64 * 1024, b"\n")

    def huge(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless())

    reader = _reader(huge)
    assert await reader.read() is None
    assert reader.publishes is False
    assert sent <= MAX_METRICS_BYTES + 64 * 1024


@pytest.mark.anyio
async def test_the_monitor_keeps_a_reading_through_a_passing_failure_until_it_ages_out():
    server = Server()

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return server(request)
        return httpx.Response(200, json={"object": "list", "data": []})

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://model")
    metrics, dialect = Metrics(), OpenAIDialect()
    monitor = UpstreamMonitor(
        name="model:80",
        client=client,
        dialect=dialect,
        catalog=ModelCatalog(dialect, client, timeout=1.0),
        metrics=metrics,
        interval=10.0,
        timeout=1.0,
    )
    assert await monitor.poll()
    assert monitor.report is not None
    assert monitor.report.waiting == 5
    assert monitor.report.fresh_until - monitor.report.at == pytest.approx(30.0)
    server.status = 503
    assert await monitor.poll()
    assert monitor.report is not None  # kept: fresh for 3 intervals
    monitor.report = replace(monitor.report, fresh_until=time.monotonic() - 1)  # 30 s later
    assert await monitor.poll()
    assert monitor.report is None
    assert "gateway_upstream_reported_waiting{" not in generate_latest(metrics.registry).decode()


# --- the cost -------------------------------------------------------------------------------

NOW = 1000.0
#: One queued request, in tokens: a slot's hold (unlearned) over the 4 slots `_cost` assumes.
WAIT = DEFAULT_HOLD_SECONDS / 4 * LOAD_TOKENS_PER_SECOND


def _cost(report: ServerReport | None, in_flight: int = 0, **changes: float) -> float:
    values = {"slots": 4, "weight": 1.0, "tokens": 1000, "now": NOW, **changes}
    return server_cost(report, in_flight=in_flight, **values)  # type: ignore[arg-type]


def test_no_report_or_a_stale_one_costs_nothing():
    assert _cost(None) == 0
    stale = ServerReport(waiting=9, running=4, kv_usage=1.0, at=NOW - 60, fresh_until=NOW - 1)
    assert _cost(stale) == 0
    assert _cost(ServerReport(None, None, None, fresh_until=NOW)) == 0


def test_a_queue_this_gateway_did_not_cause_costs_a_slot_wait_per_request():
    # Another replica's 4 running and 3 queued, none of them this gateway's.
    report = ServerReport(waiting=3, running=4, kv_usage=0.2)
    assert _cost(report) == 3 * WAIT + 4 * REQUEST_TOKENS
    assert _cost(report, weight=2.0) == (3 * WAIT + 4 * REQUEST_TOKENS) / 2


def test_this_gateways_own_requests_are_not_charged_twice():
    # 6 in flight here on a 4-slot server: 4 run, 2 wait, which the load cost already charges.
    assert _cost(ServerReport(waiting=2, running=4, kv_usage=0.2), in_flight=6) == 0
    # Its 4 running, and 2 others' queued behind them.
    assert _cost(ServerReport(waiting=2, running=4, kv_usage=0.2), in_flight=4) == 2 * WAIT


def test_a_queue_the_gateway_did_not_expect_counts_even_if_the_requests_are_its_own():
    # The server runs 2 at once, not the 4 assumed: 2 of this gateway's 4 wait.
    assert _cost(ServerReport(waiting=2, running=2, kv_usage=None), in_flight=4) == 2 * WAIT


def test_kv_pressure_charges_the_requests_tokens_from_the_threshold_to_full():
    assert _cost(ServerReport(0, 0, KV_FULL_FROM)) == 0
    assert _cost(ServerReport(0, 0, 1.0), tokens=1000) == pytest.approx(1000)
    halfway = (KV_FULL_FROM + 1) / 2
    assert _cost(ServerReport(0, 0, halfway), tokens=1000) == pytest.approx(500)
    assert _cost(ServerReport(0, 0, 1.0), tokens=0) == pytest.approx(REQUEST_TOKENS)


# --- the policy -----------------------------------------------------------------------------


def _order(mode: str, servers: list[FakeServer], **changes) -> tuple[list[str], str]:
    policy = SchedulingPolicy(mode=mode, **changes)  # type: ignore[arg-type]
    scheduler = Scheduler(policy, Metrics())
    order, reason = scheduler.order(list(servers), RouteTicket(MODEL, tokens=500))
    return [s.name for s in order], reason


def _busy_and_idle() -> list[FakeServer]:
    busy = FakeServer("busy", report=ServerReport(waiting=3, running=4, kv_usage=0.5))
    idle = FakeServer("idle", report=ServerReport(waiting=0, running=0, kv_usage=0.1))
    return [busy, idle]


def test_scored_leaves_a_server_busy_with_others_requests():
    for _ in range(8):  # the rotation is random: every start
        order, reason = _order("scored", _busy_and_idle())
        assert (order[0], reason) == ("idle", "server")


def test_the_server_cost_can_be_turned_off_and_the_other_policies_ignore_it():
    off = (("prefix", 1.0), ("load", 1.0), ("residency", 1.0), ("server", 0.0))
    firsts = {_order("scored", _busy_and_idle(), weights=off)[0][0] for _ in range(40)}
    assert firsts == {"busy", "idle"}  # a tie, broken at random
    firsts = {_order("least_in_flight", _busy_and_idle())[0][0] for _ in range(40)}
    assert firsts == {"busy", "idle"}
    robin = Scheduler(SchedulingPolicy(mode="round_robin"), Metrics())
    servers = _busy_and_idle()
    assert [robin.order(list(servers), RouteTicket(MODEL))[0][0].name for _ in range(2)] == [
        "busy",
        "idle",
    ]


def test_a_warm_server_queued_by_others_has_no_room_so_a_cold_load_may_beat_the_wait():
    loaded = [LoadedModel(MODEL, 4_000_000_000, 4_000_000_000, None)]
    warm = FakeServer("warm", loaded=loaded, report=ServerReport(3, 4, 0.5))
    cold = FakeServer("cold", loaded=[])
    # Three waits of 2.5 s (and four others' requests) against a 4 s load (4 GB at 1 GB/s).
    order, reason = _order("scored", [warm, cold])
    assert (order[0], reason) == ("cold", "server")
    off = (("prefix", 1.0), ("load", 1.0), ("residency", 1.0), ("server", 0.0))
    assert _order("scored", [warm, cold], weights=off) == (["warm"], "residency")
    warm.report = ServerReport(0, 4, 0.5)  # its own slots busy, nobody waiting: room
    assert _order("scored", [warm, cold]) == (["warm"], "residency")


def test_a_stale_report_decides_nothing():
    servers = _busy_and_idle()
    servers[0].report = ServerReport(9, 9, 1.0, at=0.0, fresh_until=time.monotonic() - 1)
    firsts = {_order("scored", servers)[0][0] for _ in range(40)}
    assert firsts == {"busy", "idle"}


# --- over real sockets ----------------------------------------------------------------------

# A GPU server of one slot (vLLM's names on /metrics); 120 tokens at 5 ms: 0.6 s a generation.
GPU = {"prefill_rate": 3000.0, "cache_tokens": 32768, "parallel": 1, "ttft": 0.01}


@pytest.fixture
def gpus() -> Iterator[Callable[..., list[Emulator]]]:
    with ExitStack() as stack:

        def start(count: int, **config: object) -> list[Emulator]:
            emulators = []
            for _ in range(count):
                values = {"inter_token": 0.005, "tokens": 120, **GPU, **config}
                app = create_emulator_app(EmulatorConfig(**values))  # type: ignore[arg-type]
                server = stack.enter_context(LoopbackServer(app))
                emulators.append(Emulator(server.url, app.state.emulator))
            return emulators

        yield start


def _name(emulator: Emulator) -> str:
    return emulator.url.removeprefix("http://")


def _chats(emulator: Emulator) -> int:
    """Chats the gateway (or anyone) sent it."""
    return len([r for r in emulator.state.records if r.path == "/v1/chat/completions"])


def _asked_metrics(emulator: Emulator) -> int:
    return len([r for r in emulator.state.records if r.path == "/metrics"])


def _wait(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _gateway(make_gateway, emulators: list[Emulator], dialect: str = "openai", **settings):
    upstreams = [{"url": em.url, "dialect": dialect} for em in emulators]
    values = {"upstream_poll_interval": 0.1, "routing": "scored", **settings}
    gw: Gateway = make_gateway(upstreams=upstreams, **values)
    wait_polled(gw, len(emulators))
    return gw


def _load_directly(emulator: Emulator, count: int) -> list[threading.Thread]:
    """Another client (a second gateway replica, say) sends `count` chats straight to it."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": False}
    threads = [
        threading.Thread(
            target=httpx.post,
            args=(f"{emulator.url}/v1/chat/completions",),
            kwargs={"json": body, "timeout": 30},
        )
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads


def _ask(gw: Gateway, text: str) -> str:
    """One short chat through the gateway (two tokens); returns its request id."""
    request_id = uuid.uuid4().hex
    response = httpx.post(
        f"{gw.url}/v1/chat/completions",
        # ~300 bytes: whole blocks of the emulator's prefix cache, none of the gateway's
        # prefix index (1,024 characters a block).
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{text} " + "words " * 50}],
            "max_tokens": 2,
        },
        headers={**gw.headers(), "x-request-id": request_id},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return request_id


def _queued(gw: Gateway, emulator: Emulator, count: int) -> None:
    waiting = "gateway_upstream_reported_waiting"
    check = lambda: metric_value(gw.metrics_text(), waiting, upstream=_name(emulator)) >= count  # noqa: E731
    _wait(check, "the monitor to read the queue")


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_new_requests_go_around_a_queue_another_client_made(make_gateway, gpus, caplog):
    caplog.set_level("INFO", logger="gateway.access")
    loaded, free = gpus(2)
    # The server cost alone (residency's rule would decide too once one server is warm).
    gw = _gateway(make_gateway, [loaded, free], routing_scores="prefix=1,load=1,server=1")
    others = _load_directly(loaded, 6)  # one slot: 1 runs, 5 wait, about 3.6 s of work
    try:
        _queued(gw, loaded, 4)
        for n in range(4):
            line = _access_line(caplog, _ask(gw, f"q{n}"))
            assert (line["upstream"], line["route_reason"]) == (_name(free), "server")
        text = gw.metrics_text()
        assert metric_value(text, "gateway_route_decisions_total", reason="server") == 4
        assert metric_value(text, "gateway_upstream_reported_running", upstream=_name(loaded)) == 1
        kv = "gateway_upstream_kv_cache_usage_ratio"
        _wait(lambda: metric_value(gw.metrics_text(), kv, upstream=_name(free)) > 0, "KV fill")
    finally:
        for thread in others:
            thread.join(timeout=30)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_one_warm_server_loses_its_room_to_a_queue_of_its_own(make_gateway, gpus, caplog):
    caplog.set_level("INFO", logger="gateway.access")
    emulators = gpus(2)
    gw = _gateway(make_gateway, emulators)  # the default scores
    first = _access_line(caplog, _ask(gw, "warm"))["upstream"]
    # The warm one (this gateway was answered there) and the other, unknown to it; without
    # its queue the residency rule would keep every request on the warm one.
    warm, other = sorted(emulators, key=lambda em: _name(em) != first)
    others = _load_directly(warm, 6)
    try:
        _queued(gw, warm, 4)
        reasons = []
        for n in range(4):
            line = _access_line(caplog, _ask(gw, f"q{n}"))
            assert line["upstream"] == _name(other)
            reasons.append(line["route_reason"])
        # Its queue outweighs a cold load's guess; then the other is warm, and has room: the
        # residency rule keeps both warm servers, and the queue it reports decides again.
        assert reasons == ["server", "server", "server", "server"]
    finally:
        for thread in others:
            thread.join(timeout=30)


def test_an_ollama_upstream_is_never_asked_for_metrics(make_gateway, gpus):
    emulators = gpus(2)
    gw = _gateway(make_gateway, emulators, dialect="ollama")
    _wait(lambda: len(emulators[0].state.records) >= 6, "a few polls")
    assert [_asked_metrics(em) for em in emulators] == [0, 0]
    assert "gateway_upstream_reported_waiting{" not in gw.metrics_text()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_server_without_metrics_is_asked_once_and_its_gauges_stay_absent(make_gateway, gpus):
    emulators = gpus(2, prefill_rate=0.0)  # not GPU mode: /metrics is a 404, as on Ollama
    gw = _gateway(make_gateway, emulators)
    _wait(lambda: len(emulators[0].state.records) >= 12, "several polls")
    assert [_asked_metrics(em) for em in emulators] == [1, 1]
    text = gw.metrics_text()
    assert "gateway_upstream_reported_waiting{" not in text
    assert "gateway_upstream_kv_cache_usage_ratio{" not in text


def test_readings_show_per_upstream_and_in_the_live_view(make_gateway, gpus):
    emulators = gpus(2)
    gw = _gateway(make_gateway, emulators, admin_jwt_secret=SECRET)
    name = _name(emulators[0])
    kv = "gateway_upstream_kv_cache_usage_ratio"
    _wait(lambda: f'{kv}{{upstream="{name}"}}' in gw.metrics_text(), "the first reading")
    text = gw.metrics_text()
    assert metric_value(text, "gateway_upstream_reported_waiting", upstream=name) == 0
    assert metric_value(text, "gateway_upstream_reported_running", upstream=name) == 0
    assert math.isfinite(metric_value(text, kv, upstream=name))
    token = mint_token(SECRET, subject="ops@example.com", scope="read", ttl=timedelta(hours=1))
    live = httpx.get(f"{gw.url}/admin/v1/live", headers={"Authorization": f"Bearer {token}"})
    assert live.status_code == 200, live.text
    views = {view["upstream"]: view for view in live.json()["upstreams"]}
    assert views[name]["reported"] == {"waiting": 0, "running": 0, "kv_cache_usage": 0}
    registry = Metrics()
    registry.set_reported("a:1", 2, 3, 0.5)
    registry.set_reported("a:1", None, 3, None)  # a reading it lacks drops its series
    exposed = generate_latest(registry.registry).decode()
    assert 'gateway_upstream_reported_running{upstream="a:1"} 3.0' in exposed
    assert 'gateway_upstream_reported_waiting{upstream="a:1"}' not in exposed


@pytest.mark.anyio
async def test_the_monitor_logs_going_down_and_coming_back_once_each(caplog):
    status = {"code": 200}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(404)
        if request.url.path == "/v1/models" and status["code"] != 200:
            return httpx.Response(status["code"])
        return httpx.Response(200, json={"object": "list", "data": []})

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://model")
    dialect = OpenAIDialect()
    monitor = UpstreamMonitor(
        name="model:80",
        client=client,
        dialect=dialect,
        catalog=ModelCatalog(dialect, client, timeout=1.0),
        metrics=Metrics(),
        interval=10.0,
        timeout=1.0,
    )
    caplog.set_level(logging.INFO, logger="gateway.upstream")
    assert await monitor.poll()
    status["code"] = 503
    for _ in range(3):
        assert not await monitor.poll()
    status["code"] = 500  # another reason: said once more
    assert not await monitor.poll()
    assert not await monitor.poll()
    status["code"] = 200
    assert await monitor.poll()
    assert await monitor.poll()
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.upstream"]
    assert lines == [
        "upstream model:80 is down: upstream answered 503",
        "upstream model:80 is down: upstream answered 500",
        "upstream model:80 is back up after 0 s down",
    ]

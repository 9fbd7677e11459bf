"""`gateway.clients.bench.policy`: the gate, queue and queue timeout recommended from the knee."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.clients.bench.policy import recommend
from gateway.clients.bench.shapes import ShapeOptions, search_knee
from gateway.settings import Settings
from tests.clients.bench.bench_sim import HAND, WINDOW, closed

pytestmark = pytest.mark.anyio


def _point(level: int, rps: float, e2e_p95: float | None = 1.0, shape: str = "concurrency") -> Any:
    summary = {"requests_per_second": {"median": rps}, "e2e_seconds.p95": {"median": e2e_p95}}
    return {"shape": shape, "level": level, "summary": summary}


async def test_policy_from_the_hand_computed_knee() -> None:
    result = await search_knee(closed(HAND, WINDOW), maximum=16, options=ShapeOptions())
    policy = recommend(result.points, result.knee, result.slo_limit, target_queue_wait=2.0)
    assert policy is not None
    # Knee 4 (tests/clients/bench/test_bench_shapes.py): 40 requests in 2.1875 s = 18.29
    # requests/s there.
    # Little's law: 18.29 req/s x 2 s = 36.6 waiting -> 37. Timeout: 2 s + e2e p95 (one wave,
    # 7/32 s) = 2.22 -> 3 s.
    assert policy["upstream_max_concurrent"] == 4
    assert policy["upstream_queue_size"] == 37
    assert policy["upstream_queue_timeout"] == 3.0
    assert policy["basis"] == "knee"
    assert policy["env"] == {
        "GATEWAY_UPSTREAM_MAX_CONCURRENT": "4",
        "GATEWAY_UPSTREAM_QUEUE_SIZE": "37",
        "GATEWAY_UPSTREAM_QUEUE_TIMEOUT": "3",
    }
    assert "GATEWAY_UPSTREAM_MAX_CONCURRENT=4" in policy["sentence"]
    assert "18.3 requests/s" in policy["sentence"]
    # Every value is one the gateway's settings accept.
    Settings(
        upstream_max_concurrent=policy["upstream_max_concurrent"],
        upstream_queue_size=policy["upstream_queue_size"],
        upstream_queue_timeout=policy["upstream_queue_timeout"],
    )


def test_the_slo_limit_wins_when_it_is_below_the_knee() -> None:
    points = [_point(4, 10.0), _point(8, 12.0)]
    policy = recommend(points, {"level": 8}, {"level": 4}, target_queue_wait=0.5)
    assert policy is not None
    assert (policy["basis"], policy["upstream_max_concurrent"]) == ("slo_limit", 4)
    assert policy["upstream_queue_size"] == 5  # 10 req/s x 0.5 s
    assert policy["upstream_queue_timeout"] == 2.0  # 0.5 s + 1 s p95, rounded up
    assert "(the SLO limit)" in policy["sentence"]
    # A knee below the SLO limit wins in turn: past it, only latency grows.
    policy = recommend(points, {"level": 4}, {"level": 8})
    assert policy is not None
    assert policy["basis"] == "knee"


def test_limits_are_per_gateway_process() -> None:
    policy = recommend([_point(8, 20.0)], {"level": 8}, None, target_queue_wait=1.0, replicas=3)
    assert policy is not None
    assert policy["upstream_max_concurrent"] == 2  # 8 // 3
    assert policy["upstream_queue_size"] == 7  # 20 x 1 / 3 = 6.7 -> 7
    assert "2 per gateway process" in policy["sentence"]
    one = recommend([_point(1, 2.0)], {"level": 1}, None, replicas=4)
    assert one is not None
    assert one["upstream_max_concurrent"] == 1  # never 0, which would switch the gate off


def test_an_upstream_entry_gets_the_gate_instead_of_the_global_variable() -> None:
    url = "http://gpu-1:11434"
    policy = recommend([_point(4, 8.0)], {"level": 4}, None, upstream_url=url)
    assert policy is not None
    assert policy["upstreams_entry"] == {"url": url, "max_concurrent": 4}
    assert "GATEWAY_UPSTREAM_MAX_CONCURRENT" not in policy["env"]
    assert "max_concurrent 4 in its GATEWAY_UPSTREAMS entry" in policy["sentence"]


def test_queue_size_rounds_whole_waits_exactly_and_zero_wait_means_no_queue() -> None:
    rate = 25 / 6  # 25 requests in 6 s
    assert rate * 30 == 125.00000000000001  # in floats
    exact = recommend([_point(4, rate)], {"level": 4}, None, target_queue_wait=30.0)
    assert exact is not None
    assert exact["upstream_queue_size"] == 125  # not 126
    none = recommend([_point(4, 9.0)], {"level": 4}, None, target_queue_wait=0.0)
    assert none is not None
    assert none["upstream_queue_size"] == 0
    assert none["upstream_queue_timeout"] == 1.0  # at least 1 s (> 0 for the setting)
    no_e2e = recommend([_point(4, 9.0, e2e_p95=None)], {"level": 4}, None, target_queue_wait=2)
    assert no_e2e is not None
    assert no_e2e["upstream_queue_timeout"] == 4.0  # 2 x the wait without a duration


def test_no_policy_without_a_limit_or_from_a_rate_shape() -> None:
    points = [_point(4, 8.0)]
    assert recommend(points, None, None) is None
    assert recommend(points, {"level": None}, {"level": None}) is None
    assert recommend([_point(4, 8.0, shape="rate")], {"level": 4}, None) is None


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="target_queue_wait"):
        recommend([], None, None, target_queue_wait=-1)
    with pytest.raises(ValueError, match="replicas"):
        recommend([], None, None, replicas=0)


def test_one_request_and_one_waiting_request_are_singular() -> None:
    policy = recommend([_point(1, 0.5)], {"level": 1}, None, target_queue_wait=2.0)
    assert policy is not None
    assert "Allow 1 request at once" in policy["sentence"]
    assert "GATEWAY_UPSTREAM_QUEUE_SIZE=1 waiting request;" in policy["sentence"]

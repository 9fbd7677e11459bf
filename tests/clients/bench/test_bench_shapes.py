"""`gateway.clients.bench.shapes` against a simulated batching server (`bench_sim.py` here).

The simulation is exact and sleeps not at all, so knees, SLO limits and goodput can be compared
with arithmetic done by hand.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.shapes import (
    Measurement,
    ShapeOptions,
    exponential_levels,
    run_fixed,
    run_sweep,
    search_knee,
)
from gateway.clients.bench.slo import parse_slo
from tests.clients.bench.bench_sim import HAND, QUEUE_FULL, WINDOW, SimulatedServer, closed

pytestmark = pytest.mark.anyio


def by_level(points: list[dict[str, Any]]) -> dict[float, dict[str, Any]]:
    return {p["level"]: p for p in points}


def median(point: dict[str, Any], key: str) -> Any:
    return point["summary"][key]["median"]


@pytest.mark.parametrize("slots", [1, 2, 3, 6, 8, 12])
async def test_knee_search_finds_the_servers_parallel_slots(slots: int) -> None:
    server = SimulatedServer(slots=slots, base=0.01, k=0.05, tokens=16)
    result = await search_knee(closed(server, 30.0), maximum=64, options=ShapeOptions())
    assert result.knee is not None
    assert result.knee["level"] == slots
    levels = [p["level"] for p in result.points]
    assert slots + 1 in levels  # the flat step above the knee was measured, not guessed
    assert levels == sorted(levels)
    assert all(isinstance(level, int) for level in levels)
    assert len(levels) <= 14  # doubling then bisection, not every level up to 64
    assert result.slo_limit is None  # no SLO given
    assert result.stopped is not None
    assert result.stopped["reason"] == "knee bracketed"


async def test_slo_limit_and_goodput_match_the_hand_computed_case() -> None:
    # SLO: TTFT p99 within 100 ms.
    # c = 4: every request joins a batch at once, TTFT = t(4) = 7/256 s = 27 ms: all good;
    #   10 waves x 4 = 40 requests end inside the 2.1875 s window: 40 / 2.1875 = 18.29 req/s,
    #   goodput the same.
    # c = 5: each wave runs 4 and 1 waits a whole wave (FIFO), TTFT 7/32 + 7/256 = 246 ms: bad.
    #   Wave 1 has no one waiting, waves 2-10 one each: 9 bad of the 40 in the window, 31 good:
    #   goodput 31 / 2.1875 = 14.17 req/s at the same 18.29 req/s; the 41st (waited through
    #   wave 10) ends after the window. 10 of 41 TTFTs are bad, so p99 misses the SLO.
    slo = parse_slo("ttft_p99<=100ms")
    result = await search_knee(closed(HAND, WINDOW), maximum=16, options=ShapeOptions(slo=slo))
    points = by_level(result.points)
    assert result.slo_limit is not None
    assert result.slo_limit["level"] == 4
    assert result.slo_limit["goodput_requests_per_second"] == pytest.approx(40 / 2.1875)
    assert points[4]["slo_met"] is True
    assert points[5]["slo_met"] is False
    assert median(points[5], "requests_per_second") == pytest.approx(40 / 2.1875)
    assert median(points[5], "goodput_requests_per_second") == pytest.approx(31 / 2.1875)
    assert points[5]["repeats"][0]["requests"] == 41
    # The knee is the same 4: from 4 to 5 output tokens/s stay at 40 * 8 / 2.1875 = 146.3.
    assert result.knee is not None
    assert result.knee["level"] == 4
    assert result.knee["output_tokens_per_second"] == pytest.approx(320 / 2.1875)
    assert result.stopped == {"level": 8, "reason": "knee bracketed and SLO missed"}


async def test_over_saturation_stops_a_sweep_when_throughput_is_flat_and_ttft_climbs() -> None:
    seen: list[float] = []
    options = ShapeOptions(progress=lambda point: seen.append(point["level"]))
    result = await run_sweep(closed(HAND, WINDOW), exponential_levels(256), options=options)
    # Flat from 4 to 8 and from 8 to 16 while TTFT p50 grows from 27 ms to well over a wave.
    assert seen == [1, 2, 4, 8, 16]
    assert [p["level"] for p in result.points] == seen
    assert result.stopped is not None
    assert result.stopped["level"] == 16
    assert result.stopped["reason"].startswith(
        "over-saturated: throughput flat for 2 levels (4 to 16) while TTFT p50 rose"
    )
    assert result.knee is not None
    assert result.knee["level"] == 4


async def test_over_saturation_stops_a_rate_sweep_when_requests_fail() -> None:
    # 18.3 requests/s is all the server completes; with 2 places in its queue the excess is
    # refused with 503 at once.
    server = SimulatedServer(slots=4, base=1 / 64, k=1 / 4, tokens=8, queue_limit=2)

    async def rate(level: float) -> Measurement:
        return server.open_loop(level, 60.0, seed=7)

    result = await run_sweep(rate, [4.0, 8.0, 40.0, 80.0], shape="rate", options=ShapeOptions())
    assert [p["level"] for p in result.points] == [4.0, 8.0, 40.0]
    assert result.stopped is not None
    assert result.stopped["level"] == 40.0
    assert "of requests failed at level 40.0" in result.stopped["reason"]
    top = result.points[-1]
    assert median(top, "error_rate") > 0.10
    assert top["repeats"][0]["error_examples"] == [QUEUE_FULL]
    assert median(result.points[0], "error_rate") < 0.10  # a Poisson burst may meet a full queue


async def test_a_sweep_stops_when_the_slo_is_missed_at_two_consecutive_levels() -> None:
    options = ShapeOptions(slo=parse_slo("ttft_p99<=100ms"))
    result = await run_sweep(closed(HAND, WINDOW), [2, 4, 5, 6, 7, 8], options=options)
    assert [p["level"] for p in result.points] == [2, 4, 5, 6]
    assert result.stopped is not None
    assert result.stopped["reason"].startswith("SLO missed at 2 consecutive levels, 5 and 6")
    assert result.slo_limit is not None
    assert result.slo_limit["level"] == 4


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_a_rate_knee_search_stays_on_the_grid_of_its_start() -> None:
    server = SimulatedServer(slots=4, base=1 / 64, k=1 / 4, tokens=8)

    async def rate(level: float) -> Measurement:
        return server.open_loop(level, 120.0, seed=3)

    result = await search_knee(rate, maximum=64.0, start=2.0, shape="rate", options=ShapeOptions())
    levels = [p["level"] for p in result.points]
    assert all(level % 2 == 0 for level in levels)
    assert result.knee is not None
    # Capacity 40 / 2.1875 = 18.3 requests/s: the knee is the grid's last rate below it or the
    # first above it.
    assert result.knee["level"] in (16.0, 18.0, 20.0)


def _run(tokens: int) -> Measurement:
    """Ten 1-second requests that each yield `tokens` output tokens, in a 10 s window."""
    records = [
        RequestRecord(
            start=float(i),
            end=i + 1.0,
            ok=True,
            status=200,
            error=None,
            first_token=i + 0.5,
            chunk_times=(i + 0.5, i + 1.0),
            output_tokens=tokens,
            output_source="ollama",
        )
        for i in range(10)
    ]
    return Measurement(records=records, window_start=0.0, window_end=10.0)


async def test_each_point_is_repeated_with_median_and_spread() -> None:
    runs = iter([90, 120, 100])  # tokens per request: 90, 120, 100 output tokens/s
    calls: list[float] = []

    async def measure(level: float) -> Measurement:
        calls.append(level)
        return _run(next(runs))

    result = await run_fixed(measure, 3, options=ShapeOptions(repeat=3))
    assert calls == [3, 3, 3]
    (point,) = result.points
    assert len(point["repeats"]) == 3
    summary = point["summary"]["output_tokens_per_second"]
    assert {k: summary[k] for k in ("median", "min", "max", "spread")} == {
        "median": 100.0,
        "min": 90.0,
        "max": 120.0,
        "spread": pytest.approx(0.3),  # (120 - 90) / 100
    }
    # Student's t over the 3 repeats: mean 103.33, s = 15.28, t(0.975, 2) = 4.303.
    assert summary["mean"] == pytest.approx(103.333, abs=1e-3)
    assert summary["ci_low"] == pytest.approx(103.333 - 4.3027 * 15.275 / 3**0.5, abs=0.01)
    assert summary["ci_method"] == "t over repeats"
    assert summary["n"] == 3
    assert point["summary"]["ttft_seconds.p50"]["spread"] == 0.0
    assert point["slo_met"] is None
    assert result.knee is None  # one level has no knee
    assert result.as_dict()["points"] == [point]


def test_exponential_levels_double_up_to_the_maximum() -> None:
    assert exponential_levels(8) == [1, 2, 4, 8]
    assert exponential_levels(6) == [1, 2, 4, 6]
    assert exponential_levels(1) == [1]
    assert exponential_levels(5.0, start=0.5) == [0.5, 1.0, 2.0, 4.0, 5.0]
    with pytest.raises(ValueError, match="start <= maximum"):
        exponential_levels(2, start=4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"repeat": 0}, "repeat"),
        ({"knee_gain": 0.0}, "knee_gain"),
        ({"ttft_rise": 1.0}, "ttft_rise"),
        ({"max_error_rate": 1.5}, "max_error_rate"),
    ],
)
def test_options_refuse_values_no_run_could_use(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShapeOptions(**options)


async def test_sweeps_and_searches_refuse_empty_or_reversed_ranges() -> None:
    measure = closed(HAND, WINDOW)
    with pytest.raises(ValueError, match="positive levels"):
        await run_sweep(measure, [], options=ShapeOptions())
    with pytest.raises(ValueError, match="positive levels"):
        await run_sweep(measure, [0, 2], options=ShapeOptions())
    with pytest.raises(ValueError, match="start <= maximum"):
        await search_knee(measure, maximum=2, start=4, options=ShapeOptions())

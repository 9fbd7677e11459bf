"""`gateway.clients.bench.knee`: growth per doubling, the knee, the SLO limit, over-saturation
rules."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.clients.bench.knee import find_knee, find_slo_limit, growth, oversaturation


def _point(
    level: float,
    tokens_per_second: float | None,
    *,
    ttft: float = 0.1,
    errors: float = 0.0,
    slo_met: bool | None = None,
) -> dict[str, Any]:
    summary = {
        "output_tokens_per_second": {"median": tokens_per_second},
        "ttft_seconds.p50": {"median": ttft},
        "error_rate": {"median": errors},
        "requests_per_second": {"median": level / 2},
        "goodput_requests_per_second": {"median": level / 4},
    }
    return {
        "shape": "concurrency",
        "level": level,
        "summary": summary,
        "slo_met": slo_met,
        "slo_violations": [] if slo_met is not False else ["ttft_p99<=1s (median 2)"],
    }


def test_growth_is_per_doubling_of_the_load() -> None:
    assert growth(_point(4, 100.0), _point(8, 200.0)) == pytest.approx(1.0)  # linear: +100%
    assert growth(_point(6, 100.0), _point(7, 700 / 6)) == pytest.approx(1.0)  # linear too
    assert growth(_point(4, 100.0), _point(16, 121.0)) == pytest.approx(0.1)  # 1.1 x 1.1
    assert growth(_point(1, 0.0), _point(2, 5.0)) == math.inf
    assert growth(_point(1, None), _point(2, None)) == 0.0


def test_the_knee_is_the_lowest_level_whose_next_one_is_flat() -> None:
    points = [_point(8, 390.0), _point(1, 100.0), _point(2, 195.0), _point(4, 380.0)]
    knee = find_knee(points, 0.10)
    assert knee is not None
    assert (knee["level"], knee["output_tokens_per_second"]) == (4, 380.0)
    assert knee["reason"].startswith("throughput grew 2.6% from 4 to 8")
    # With a gain of 2% per doubling the step from 4 to 8 (2.6%) still counts as growth.
    not_reached = find_knee(points, 0.02)
    assert not_reached is not None
    assert not_reached["level"] is None
    assert "not reached" in not_reached["reason"]
    assert find_knee(points[:1], 0.10) is None


def test_the_slo_limit_is_the_highest_level_meeting_it() -> None:
    points = [
        _point(1, 1.0, slo_met=True),
        _point(2, 2.0, slo_met=True),
        _point(4, 3.0, slo_met=False),
    ]
    limit = find_slo_limit(points)
    assert limit == {
        "level": 2,
        "goodput_requests_per_second": 0.5,
        "requests_per_second": 1.0,
        "reason": "met up to 2, missed at 4",
    }
    missed = find_slo_limit([_point(1, 1.0, slo_met=False)])
    assert missed is not None
    assert missed["level"] is None
    assert "lowest level measured, 1: ttft_p99<=1s" in missed["reason"]
    everywhere = find_slo_limit([_point(1, 1.0, slo_met=True)])
    assert everywhere is not None
    assert everywhere["reason"] == "met at every level measured, up to 1"
    assert find_slo_limit([_point(1, 1.0)]) is None  # measured without an SLO


def _check(raised: list[dict[str, Any]], *, slo_rule: bool = True) -> str | None:
    return oversaturation(
        raised, knee_gain=0.10, ttft_rise=1.5, max_error_rate=0.10, slo_rule=slo_rule
    )


def test_over_saturation_rules() -> None:
    flat = [_point(4, 100.0, ttft=0.1), _point(8, 101.0, ttft=0.2), _point(16, 101.0, ttft=0.5)]
    assert _check(flat) == (
        "over-saturated: throughput flat for 2 levels (4 to 16) while TTFT p50 rose 5.0x"
    )
    # Flat throughput with TTFT rising too little at one step is not over-saturation yet.
    calm = [_point(4, 100.0, ttft=0.1), _point(8, 101.0, ttft=0.12), _point(16, 101.0, ttft=0.5)]
    assert _check(calm) is None
    failing = [_point(4, 100.0), _point(8, 150.0, errors=0.25)]
    assert _check(failing) == "over-saturated: 25% of requests failed at level 8"
    missed = [_point(4, 100.0, slo_met=False), _point(8, 190.0, slo_met=False)]
    reason = _check(missed)
    assert reason == "SLO missed at 2 consecutive levels, 4 and 8: ttft_p99<=1s (median 2)"
    assert _check(missed, slo_rule=False) is None
    assert _check([]) is None

"""Reading a series of load points: throughput growth, the knee, the SLO limit, over-saturation.

Pure functions over the point dicts `gateway.clients.bench.shapes` builds (`level`, `summary`,
`slo_met`); the shapes use them to decide where to measure next and when to stop, and the
reports to state what was found.

Throughput is the median output tokens/s of a point's repeats. Its growth between two levels is
measured per doubling of the load, `(T_b / T_a) ** (1 / log2(b / a)) - 1`, so that one step of a
sweep (4 -> 8) and one step of a bisection (6 -> 7) are judged alike: a server that still scales
linearly grows 100% per doubling on either, a saturated one 0%. The knee is the lowest level
after which throughput grows less than `knee_gain` (10%) per doubling: the highest load worth
sending, since above it each request only gets slower.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

THROUGHPUT = "output_tokens_per_second"
TTFT_P50 = "ttft_seconds.p50"

Point = Mapping[str, Any]


def median(point: Point, key: str) -> float | None:
    """The median over repeats of `key` (`output_tokens_per_second`, `ttft_seconds.p50`)."""
    value = point["summary"].get(key, {}).get("median")
    return None if value is None else float(value)


def growth(low: Point, high: Point) -> float:
    """Throughput growth from `low` to `high` per doubling of the level (0.1: 10%).

    A throughput that is missing or 0 at both is flat (0.0); from 0 to anything is infinite.
    """
    before, after = median(low, THROUGHPUT) or 0.0, median(high, THROUGHPUT) or 0.0
    if before <= 0:
        return math.inf if after > 0 else 0.0
    doublings = math.log2(high["level"] / low["level"])
    return float((after / before) ** (1 / doublings) - 1)


def stalled(low: Point, high: Point, knee_gain: float) -> bool:
    """Whether throughput grew less than `knee_gain` per doubling from `low` to `high`."""
    return growth(low, high) < knee_gain


def _ratio(low: Point, high: Point, key: str) -> float | None:
    before, after = median(low, key), median(high, key)
    return None if before is None or after is None or before <= 0 else after / before


def find_knee(points: Sequence[Point], knee_gain: float) -> dict[str, Any] | None:
    """The knee among measured points: the lowest level whose next level grows < `knee_gain`.

    Args:
        points: Points of one shape, any order (sorted by level here).
        knee_gain: Growth per doubling below which throughput counts as flat (0.1: 10%).

    Returns:
        `{"level", "shape", "output_tokens_per_second", "reason"}`; `level` None when
        throughput still grew at the highest level measured; None with fewer than 2 points.
    """
    ordered = sorted(points, key=lambda p: p["level"])
    if len(ordered) < 2:
        return None
    for low, high in itertools.pairwise(ordered):
        if stalled(low, high, knee_gain):
            ttft = _ratio(low, high, TTFT_P50)
            rose = "" if ttft is None else f" while TTFT p50 went {ttft:.2f}x"
            return {
                "level": low["level"],
                "shape": low["shape"],
                THROUGHPUT: median(low, THROUGHPUT),
                "reason": f"throughput grew {_grew(low, high)} from {low['level']} to "
                f"{high['level']} (less than {knee_gain:.0%} per doubling){rose}",
            }
    low, high = ordered[-2], ordered[-1]
    return {
        "level": None,
        "shape": high["shape"],
        THROUGHPUT: None,
        "reason": f"not reached: throughput still grew {_grew(low, high)} from {low['level']} "
        f"to {high['level']}, the highest level measured",
    }


def _grew(low: Point, high: Point) -> str:
    ratio = _ratio(low, high, THROUGHPUT)
    return "from nothing" if ratio is None else f"{ratio - 1:.1%}"


def find_slo_limit(points: Sequence[Point]) -> dict[str, Any] | None:
    """The highest measured level that meets the SLO, with its goodput.

    Returns:
        `{"level", "goodput_requests_per_second", "requests_per_second", "reason"}` (`level`
        None when no level met it), or None when the points were measured without an SLO.
    """
    judged = sorted((p for p in points if p.get("slo_met") is not None), key=lambda p: p["level"])
    if not judged:
        return None
    met = [p for p in judged if p["slo_met"]]
    if not met:
        lowest = judged[0]
        missed = "; ".join(lowest.get("slo_violations", [])) or "missed"
        return {
            "level": None,
            "goodput_requests_per_second": None,
            "requests_per_second": None,
            "reason": f"missed at the lowest level measured, {lowest['level']}: {missed}",
        }
    best = met[-1]
    above = [p for p in judged if p["level"] > best["level"]]
    reason = (
        f"met up to {best['level']}, missed at {above[0]['level']}"
        if above
        else f"met at every level measured, up to {best['level']}"
    )
    return {
        "level": best["level"],
        "goodput_requests_per_second": median(best, "goodput_requests_per_second"),
        "requests_per_second": median(best, "requests_per_second"),
        "reason": reason,
    }


def oversaturation(
    raised: Sequence[Point],
    *,
    knee_gain: float,
    ttft_rise: float,
    max_error_rate: float,
    slo_rule: bool = True,
) -> str | None:
    """Why load should not be raised further after `raised` (in the order measured), or None.

    Three rules, the first that holds wins: the last level failed more than `max_error_rate`
    of its requests; throughput was flat (< `knee_gain` per doubling) for the last 2 steps while
    TTFT p50 rose more than `ttft_rise` times at each; the SLO was missed at the last 2 levels
    (`slo_rule`).
    """
    if not raised:
        return None
    last = raised[-1]
    errors = median(last, "error_rate")
    if errors is not None and errors > max_error_rate:
        return f"over-saturated: {errors:.0%} of requests failed at level {last['level']}"
    if len(raised) >= 3:
        first, middle = raised[-3], raised[-2]
        steps = ((first, middle), (middle, last))
        flat = all(stalled(a, b, knee_gain) for a, b in steps)
        rises = [_ratio(a, b, TTFT_P50) for a, b in steps]
        if flat and all(r is not None and r > ttft_rise for r in rises):
            total = _ratio(first, last, TTFT_P50) or 0.0
            return (
                f"over-saturated: throughput flat for 2 levels ({first['level']} to "
                f"{last['level']}) while TTFT p50 rose {total:.1f}x"
            )
    if slo_rule and len(raised) >= 2 and all(p.get("slo_met") is False for p in raised[-2:]):
        levels = f"{raised[-2]['level']} and {last['level']}"
        return f"SLO missed at 2 consecutive levels, {levels}: " + "; ".join(
            last.get("slo_violations", [])
        )
    return None

"""Percentiles, one definition for every benchmark statistic.

`gateway.clients.bench.stats` (distributions, summaries), `gateway.clients.bench.slo` (a bound's
statistic) and `benchmarks/` (the gateway's overhead benchmark) all use `percentile`, so the
tools compute one statistic one way. A module of its own, below both `slo` and `stats`: `stats`
takes an `Slo`, so `slo` cannot import `stats`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0-100) of `values` with linear interpolation between ranks.

    The same definition as numpy's default (`linear`): rank `(n - 1) * q / 100` in the sorted
    values, interpolated between its two neighbours.

    Returns:
        The percentile, or None without values.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def stat_name(q: float) -> str:
    """The key of the `q`-th percentile: `p50`, `p99`, `p99.9`."""
    return f"p{q:g}"

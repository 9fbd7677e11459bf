"""Service-level objectives (`--slo "ttft_p99<=2s,tpot_p50<=100ms"`), on a point and per request.

A bound names a metric, a statistic, a direction and a threshold:

- metrics: `ttft`, `tpot`, `itl`, `e2e` (latencies, seconds; upper bounds `<=` with a unit,
  `s` or `ms`) and `decode_tps` (decode tokens/s; a lower bound `>=`, a bare number);
- statistics: `pNN` or `pNN.N` (a percentile, 0 < q <= 100) or `mean`.

A point meets the SLO when the median over its repeats of every bound's statistic meets the
bound. For goodput, a request is good when its own values meet every bound, the statistic
ignored (vLLM's definition, `benchmark_serving.py --goodput`): its TTFT, TPOT, end-to-end time and
decode rate each against the threshold. Inter-token latency has many values per request: a
request's ITL is the bound's own statistic over that request's gaps (`itl_p99<=200ms`: 99% of
its gaps within 200 ms; `itl_mean`: their mean), so one stall in a long answer does not fail it
while a bound on `p100` would. A value a request cannot have (TPOT, ITL and decode rate of a
one-token answer) does not fail it; a missing TTFT does.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gateway.clients.bench.quantiles import percentile, stat_name
from gateway.clients.bench.records import RequestRecord

#: SLO metric name -> the run document's metric.
METRIC_NAMES = {
    "ttft": "ttft_seconds",
    "tpot": "tpot_seconds",
    "itl": "itl_seconds",
    "e2e": "e2e_seconds",
    "decode_tps": "decode_tokens_per_second",
}
_LATENCIES = frozenset({"ttft", "tpot", "itl", "e2e"})
_UNITS = {"s": 1.0, "ms": 0.001}
_BOUND = re.compile(
    r"(?P<metric>[a-z0-9_]+?)_(?P<stat>mean|p\d+(?:\.\d+)?)\s*(?P<op><=|>=|<|>|=)\s*"
    r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-z/]*)"
)


@dataclass(frozen=True, slots=True)
class Bound:
    """One objective, e.g. `ttft_p99<=2s`.

    Attributes:
        metric: `ttft`, `tpot`, `itl`, `e2e` or `decode_tps`.
        stat: `mean` or a percentile key (`p50`, `p99.9`).
        op: `<=` (latencies) or `>=` (decode rate).
        threshold: Seconds for latencies, tokens/s for the decode rate.
        text: The bound as written (normalised spacing).
    """

    metric: str
    stat: str
    op: Literal["<=", ">="]
    threshold: float
    text: str

    @property
    def key(self) -> str:
        """The point summary's key: `ttft_seconds.p99`."""
        return f"{METRIC_NAMES[self.metric]}.{self.stat}"

    @property
    def quantile(self) -> float | None:
        """The percentile (0-100), None for `mean`."""
        return None if self.stat == "mean" else float(self.stat[1:])

    def meets(self, value: float | None) -> bool:
        """Whether `value` meets the bound; None (not measured) never does."""
        if value is None:
            return False
        return value <= self.threshold if self.op == "<=" else value >= self.threshold


@dataclass(frozen=True, slots=True)
class Slo:
    """A parsed `--slo`: every bound must hold (see the module docstring).

    Attributes:
        bounds: The objectives, in the order written.
        text: The SLO as written.
    """

    bounds: tuple[Bound, ...]
    text: str

    def percentiles(self) -> dict[str, list[float]]:
        """Run-document metric -> the percentiles the bounds need (for `stats.summarize`)."""
        out: dict[str, list[float]] = {}
        for bound in self.bounds:
            if bound.quantile is not None:
                out.setdefault(METRIC_NAMES[bound.metric], []).append(bound.quantile)
        return out

    def violations(self, summary: Mapping[str, Mapping[str, float | None]]) -> list[str]:
        """The bounds a point's summary misses, each with its median, e.g. `ttft_p99<=2s (3.1 s)`.

        Args:
            summary: `stats.point_summary` of the point (`<metric>.<stat>` -> median, ...).
        """
        missed = []
        for bound in self.bounds:
            median = summary.get(bound.key, {}).get("median")
            if not bound.meets(median):
                shown = "not measured" if median is None else f"{median:.4g}"
                missed.append(f"{bound.text} (median {shown})")
        return missed

    def met(self, summary: Mapping[str, Mapping[str, float | None]]) -> bool:
        """Whether the point meets every bound (medians over its repeats)."""
        return not self.violations(summary)

    def request_good(self, record: RequestRecord) -> bool:
        """Whether one request counts toward goodput: it succeeded and meets every bound."""
        if not record.ok:
            return False
        for bound in self.bounds:
            value = _request_value(record, bound)
            if value is None and bound.metric in ("ttft", "e2e"):
                return False
            if value is not None and not bound.meets(value):
                return False
        return True


def _request_value(record: RequestRecord, bound: Bound) -> float | None:
    if bound.metric == "ttft":
        return record.ttft
    if bound.metric == "tpot":
        return record.tpot
    if bound.metric == "e2e":
        return record.e2e
    if bound.metric == "decode_tps":
        rate = record.decode_rate
        return None if rate is None else rate[0]
    gaps = record.inter_token_latencies
    if not gaps:
        return None
    q = bound.quantile
    return statistics.fmean(gaps) if q is None else percentile(gaps, q)


def parse_slo(text: str) -> Slo:
    """Parse `--slo`, e.g. `"ttft_p99<=2s,tpot_p50<=100ms,e2e_p95<=30s,decode_tps_p50>=20"`.

    Raises:
        ValueError: an empty SLO, or a bound that does not parse, with the bound and what is
            wrong with it (unknown metric, statistic out of range, wrong direction, missing or
            unknown unit, a metric bounded twice the same way).
    """
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise ValueError("the SLO is empty; write e.g. 'ttft_p99<=2s,tpot_p50<=100ms'")
    bounds: list[Bound] = []
    for part in parts:
        if not part:
            raise ValueError(f"empty bound in SLO {text!r} (two commas, or one at an end?)")
        bound = _parse_bound(part.lower())
        if any(b.key == bound.key and b.op == bound.op for b in bounds):
            raise ValueError(f"SLO {text!r} bounds {bound.metric}_{bound.stat} twice")
        bounds.append(bound)
    return Slo(bounds=tuple(bounds), text=text.strip())


def _parse_bound(part: str) -> Bound:
    match = _BOUND.fullmatch(part)
    if match is None:
        raise ValueError(
            f"SLO bound {part!r} does not parse: write <metric>_<stat><=<number><unit>, "
            "e.g. ttft_p99<=2s, tpot_mean<=80ms, decode_tps_p50>=20"
        )
    metric, stat, op = match["metric"], match["stat"], match["op"]
    if metric not in METRIC_NAMES:
        known = ", ".join(METRIC_NAMES)
        raise ValueError(f"SLO bound {part!r}: unknown metric {metric!r} (one of {known})")
    if stat != "mean":
        q = float(stat[1:])
        if not 0 < q <= 100:
            raise ValueError(f"SLO bound {part!r}: percentile {stat} is outside p0-p100")
        stat = stat_name(q)
    number, unit = float(match["number"]), match["unit"]
    if metric in _LATENCIES:
        if op != "<=":
            raise ValueError(f"SLO bound {part!r}: {metric} is a latency; bound it with <=")
        if unit not in _UNITS:
            raise ValueError(f"SLO bound {part!r}: give {metric} a unit, s or ms (e.g. 2s, 500ms)")
        threshold = number * _UNITS[unit]
    else:
        if op != ">=":
            raise ValueError(f"SLO bound {part!r}: {metric} is a rate; bound it with >=")
        if unit not in ("", "tok/s"):
            raise ValueError(f"SLO bound {part!r}: {metric} is tokens/s; write a bare number")
        threshold = number
    if threshold <= 0:
        raise ValueError(f"SLO bound {part!r}: the threshold must be positive")
    return Bound(metric, stat, "<=" if op == "<=" else ">=", threshold, part.replace(" ", ""))

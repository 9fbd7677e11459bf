"""The confidence intervals of a saved run, as lines under each model's table.

`interval_lines(entry)` gives one line per point with the intervals of the headline statistics
(`stats.interval_over_repeats`: Student's t over the repeats, or the interval within the single
run), and what `--until-ci` found; `gateway.clients.bench.report.facts` prints them. Values are
read leniently (`document`): a hand-edited file shows "-" rather than failing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.clients.bench.document import mapping, points, real, sequence
from gateway.clients.bench.intervals import DEFAULT_CONFIDENCE, quantile_interval
from gateway.clients.bench.tables import level, number, safe

#: (summary key, label, scale, unit) of the statistics whose intervals are printed.
SHOWN = (
    ("ttft_seconds.p50", "TTFT p50", 1000.0, "ms"),
    ("tpot_seconds.p50", "TPOT p50", 1000.0, "ms"),
    ("itl_seconds.p50", "ITL p50", 1000.0, "ms"),
    ("e2e_seconds.p50", "E2E p50", 1000.0, "ms"),
    ("output_tokens_per_second", "output", 1.0, "tok/s"),
)


def _interval(entry: Mapping[str, Any], scale: float, unit: str) -> str | None:
    low, high, mean = real(entry.get("ci_low")), real(entry.get("ci_high")), real(entry.get("mean"))
    if low is None or high is None:
        return None
    text = f"{number(low, scale)}-{number(high, scale)} {unit}"
    if mean:
        text += f" (+-{(high - low) / 2 / abs(mean):.1%})"
    return text


def _fewest_for_median(confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The fewest samples whose p50 has a distribution-free interval (6 at 95%)."""
    return next(n for n in range(2, 1000) if quantile_interval(range(n), 0.5, confidence))


def _no_interval(point: Mapping[str, Any]) -> list[str]:
    """Why a single-repeat point has no interval, when it is too few requests for a p50's ranks.

    A run made before the intervals existed has none for no such reason: nothing is said then.
    """
    (repeat,) = sequence(point.get("repeats"))
    found = mapping(repeat).get("requests")
    needed = _fewest_for_median()
    if not isinstance(found, int) or isinstance(found, bool) or found >= needed:
        return []
    requests = f"{found} request" + ("" if found == 1 else "s")
    return [f"no interval at {level(point.get('level'))}: {requests}, a p50 needs {needed}"]


def interval_lines(entry: Mapping[str, Any]) -> list[str]:
    """One escaped line per point of a model entry with an interval, and its convergence.

    Returns:
        E.g. `95% intervals at 2 (t over 3 repeats): TTFT p50 51.2-51.8 ms (+-0.6%), ...`;
        nothing for a point without intervals (one repeat of a document made before them).
    """
    lines = []
    for point in points(entry):
        summary = mapping(point.get("summary"))
        parts, how, confidence = [], None, None
        for key, label, scale, unit in SHOWN:
            found = mapping(summary.get(key))
            shown = _interval(found, scale, unit)
            if shown is None:
                continue
            parts.append(f"{label} {shown}")
            how = how or found.get("ci_method")
            confidence = confidence or real(found.get("confidence"))
        convergence = mapping(point.get("convergence"))
        if parts:
            repeats = len(sequence(point.get("repeats")))
            method = f"t over {repeats} repeats" if how == "t over repeats" else "within the run"
            share = "" if confidence is None else f"{confidence * 100:g}% "
            lines.append(
                f"{share}intervals at {level(point.get('level'))} ({method}): {', '.join(parts)}"
            )
        if not parts and len(sequence(point.get("repeats"))) == 1:
            lines += _no_interval(point)
        if convergence:
            target = real(convergence.get("target"))
            wanted = "-" if target is None else f"+-{target:.1%}"
            if convergence.get("converged") is True:
                lines.append(
                    f"converged to {wanted} at {level(point.get('level'))} after"
                    f" {len(sequence(point.get('repeats')))} repeats"
                )
            else:
                wide = ", ".join(safe(w) for w in sequence(convergence.get("wide"))[:4])
                lines.append(
                    f"not converged to {wanted} at {level(point.get('level'))} after"
                    f" {len(sequence(point.get('repeats')))} repeats (--max-repeats): {wide}"
                )
        if point.get("partial") is True:
            lines.append(f"partial: the point at {level(point.get('level'))} was cut short")
    return lines

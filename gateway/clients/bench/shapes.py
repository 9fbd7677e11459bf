"""Load shapes: a fixed level, a sweep, a knee search; each point repeated, with a stop rule.

A shape never sends a request itself: it calls the injected `measure(level)`, an async
callable that drives the target at one concurrency (closed loop) or one request rate (open
loop) and returns the records and the measured window (`Measurement`). The CLI passes the
driver (`gateway.clients.bench.driver.run_concurrency` / `run_rate` bound to a target and
workload); the
tests pass a simulated server. Levels of a concurrency shape are ints, of a rate shape
requests/s.

Every point is measured `repeat` times; its `summary` holds median, min, max and spread of
every statistic (`stats.point_summary`), and `slo_met` whether the medians meet the SLO.
Raising shapes (sweep, knee search) stop early once the server is over-saturated
(`knee.oversaturation`), and say why in `stopped`.

The knee search doubles the load from `start` (1, 2, 4, ...) until throughput stops growing
(and, with an SLO, the SLO is missed), then bisects on the grid of multiples of `start` for the
knee (the lowest level whose next level grows less than `knee_gain` per doubling, so the knee
and the level above it are both measured) and for the SLO limit (the highest level that meets
it, with the level above missing it).

Over ~300 lines for one reason: the shapes are built from one point measurement (`measure_point`)
and one stop rule (`_check`, `_stop`), and the knee search's bracketing and bisections (`_raise`,
`_bisect_knee`, `_bisect_slo`) read the same measured points; split, the stop rule would sit apart
from the shapes it stops.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.clients.bench.health import TargetLost
from gateway.clients.bench.intervals import DEFAULT_CONFIDENCE
from gateway.clients.bench.knee import find_knee, find_slo_limit, oversaturation, stalled
from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.slo import Slo
from gateway.clients.bench.stats import across_repeats, point_summary, summarize, unconverged

Shape = Literal["concurrency", "rate"]
Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class Measurement:
    """What one run at one level returned.

    Attributes:
        records: Every request of the run, warm-up included (flagged).
        window_start: `perf_counter` seconds the measured window began.
        window_end: `perf_counter` seconds it ended.
        offered_rate: The open loop's requested rate (requests/s), None in a closed loop.
        achieved_rate: The rate its counted arrivals really left at (`driver.achieved_rate`),
            None in a closed loop.
    """

    records: Sequence[RequestRecord]
    window_start: float
    window_end: float
    offered_rate: float | None = None
    achieved_rate: float | None = None


Measure = Callable[[float], Awaitable[Measurement]]
"""Drive the target at one level (concurrency, or requests/s) and return what was measured."""


@dataclass(frozen=True, slots=True)
class ShapeOptions:
    """How each point is measured and judged.

    Attributes:
        repeat: Runs per point (`--repeat`), at least 1.
        slo: The SLO points are judged against (`--slo`), or None.
        knee_gain: Throughput growth per doubling of load below which it counts as flat
            (`--knee-gain`, 0.1: 10%).
        ttft_rise: Over-saturation: TTFT p50 growth per level (times) that, with flat
            throughput for 2 levels, stops the raising.
        max_error_rate: Over-saturation: error share of a point above which raising stops.
        progress: Called with each finished point (for the live progress line).
        confidence: The confidence of every interval (`--confidence`, 0.95).
        until_ci: `--until-ci`: repeat a point (at least `repeat` times, at least twice) until
            the interval of each `stats.CONVERGENCE_KEYS` is within +-`until_ci` of its mean
            (0.02: 2%), or `max_repeats` runs; None: exactly `repeat` runs.
        max_repeats: The cap on runs per point with `until_ci` (`--max-repeats`).
    """

    repeat: int = 1
    slo: Slo | None = None
    knee_gain: float = 0.10
    ttft_rise: float = 1.5
    max_error_rate: float = 0.10
    progress: Progress | None = None
    confidence: float = DEFAULT_CONFIDENCE
    until_ci: float | None = None
    max_repeats: int = 10

    def __post_init__(self) -> None:
        """Refuse settings no run could use.

        Raises:
            ValueError: `repeat` < 1, `knee_gain` <= 0, `ttft_rise` <= 1, `max_error_rate`
                outside 0-1, `confidence` outside (0, 1), `until_ci` not positive or
                `max_repeats` below 2 or below `repeat` with `until_ci`.
        """
        if self.repeat < 1:
            raise ValueError(f"repeat must be at least 1, got {self.repeat}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be within (0, 1), got {self.confidence}")
        if self.until_ci is not None:
            if not self.until_ci > 0:
                raise ValueError(f"until_ci must be positive, got {self.until_ci}")
            if self.max_repeats < max(2, self.repeat):
                raise ValueError(
                    f"max_repeats ({self.max_repeats}) must be at least 2 and at least repeat"
                )
        if self.knee_gain <= 0:
            raise ValueError(f"knee_gain must be positive, got {self.knee_gain}")
        if self.ttft_rise <= 1:
            raise ValueError(f"ttft_rise must be above 1, got {self.ttft_rise}")
        if not 0 <= self.max_error_rate <= 1:
            raise ValueError(f"max_error_rate must be within 0-1, got {self.max_error_rate}")


@dataclass(slots=True)
class ShapeResult:
    """The points a shape measured and what they show.

    Attributes:
        points: The run document's point objects, sorted by level.
        knee: `knee.find_knee` over the points (None for a single level).
        slo_limit: `knee.find_slo_limit` (None without an SLO).
        stopped: `{"level", "reason"}` when raising stopped before the last level, else None.
    """

    points: list[dict[str, Any]] = field(default_factory=list)
    knee: dict[str, Any] | None = None
    slo_limit: dict[str, Any] | None = None
    stopped: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The model entry's `points`, `knee`, `slo_limit` and `stopped`."""
        return {
            "points": self.points,
            "knee": self.knee,
            "slo_limit": self.slo_limit,
            "stopped": self.stopped,
        }


async def measure_point(
    measure: Measure, shape: Shape, level: float, options: ShapeOptions
) -> dict[str, Any]:
    """Measure one level `options.repeat` times (or until its intervals converge) and summarise.

    With `options.until_ci` the point is measured at least `max(repeat, 2)` times, then again
    until `stats.unconverged` finds every headline interval narrow enough or `max_repeats` runs
    were made; the point says which in `convergence`.

    Returns:
        `{"shape", "level", "repeats", "summary", "slo_met", "slo_violations"}` (`slo_met`
        None without an SLO), plus `convergence` (`target`, `converged`, `repeats`, `wide`)
        with `until_ci`. An open loop's repeat also holds `arrival_rate` (`offered`, `achieved`
        requests/s) and its summary `achieved_rate`; a multi-turn run's repeat holds `turns`
        (`_turns`).

    Raises:
        health.TargetLost: the target stopped answering; its `point` holds the repeats
            measured, the cut-short one included, marked `partial`.
    """
    repeats: list[dict[str, Any]] = []
    target = options.until_ci
    least = options.repeat if target is None else max(options.repeat, 2)
    wide: list[str] = []
    try:
        while True:
            run = await measure(level)
            repeats.append(_summarize(run, options))
            if len(repeats) < least:
                continue
            if target is None:
                break
            wide = unconverged(point_summary(repeats, options.confidence), target)
            if not wide or len(repeats) >= options.max_repeats:
                break
    except TargetLost as lost:
        cut = lost.measurement
        if isinstance(cut, Measurement) and cut.window_end > cut.window_start:
            repeats.append(_summarize(cut, options))
        if repeats:
            lost.point = _point(shape, level, repeats, options)
            lost.point["partial"] = True
        raise
    point = _point(shape, level, repeats, options)
    if target is not None:
        point["convergence"] = {
            "target": target,
            "converged": not wide,
            "repeats": len(repeats),
            "wide": wide,
        }
    if options.progress is not None:
        options.progress(point)
    return point


def _summarize(run: Measurement, options: ShapeOptions) -> dict[str, Any]:
    repeat = summarize(
        run.records, run.window_start, run.window_end, options.slo, options.confidence
    )
    if run.offered_rate is not None:
        repeat["arrival_rate"] = {"offered": run.offered_rate, "achieved": run.achieved_rate}
    turns = _turns(run.records)
    if turns:
        repeat["turns"] = turns
    return repeat


def _point(
    shape: Shape, level: float, repeats: list[dict[str, Any]], options: ShapeOptions
) -> dict[str, Any]:
    summary = point_summary(repeats, options.confidence)
    achieved = [r["arrival_rate"]["achieved"] for r in repeats if "arrival_rate" in r]
    if achieved:
        summary["achieved_rate"] = across_repeats(achieved)
    slo = options.slo
    return {
        "shape": shape,
        "level": level,
        "repeats": repeats,
        "summary": summary,
        "slo_met": None if slo is None else slo.met(summary),
        "slo_violations": [] if slo is None else slo.violations(summary),
    }


def _turns(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """Per conversation turn (1, 2, ...): counted requests and their prompt words.

    Mean, min and max words, so a run shows how the resent history grew; empty for a
    single-turn run.
    """
    by_turn: dict[int, list[int]] = {}
    for record in records:
        if not record.warmup and record.turn is not None and record.prompt_words is not None:
            by_turn.setdefault(record.turn, []).append(record.prompt_words)
    return [
        {
            "turn": turn,
            "requests": len(words),
            "prompt_words_mean": sum(words) / len(words),
            "prompt_words_min": min(words),
            "prompt_words_max": max(words),
        }
        for turn, words in sorted(by_turn.items())
    ]


def _finish(points: Iterable[dict[str, Any]], options: ShapeOptions) -> ShapeResult:
    ordered = sorted(points, key=lambda p: p["level"])
    return ShapeResult(
        points=ordered,
        knee=find_knee(ordered, options.knee_gain),
        slo_limit=find_slo_limit(ordered),
    )


def _check(
    raised: Sequence[dict[str, Any]], options: ShapeOptions, *, slo_rule: bool
) -> str | None:
    return oversaturation(
        raised,
        knee_gain=options.knee_gain,
        ttft_rise=options.ttft_rise,
        max_error_rate=options.max_error_rate,
        slo_rule=slo_rule,
    )


async def run_fixed(
    measure: Measure, level: float, *, shape: Shape = "concurrency", options: ShapeOptions
) -> ShapeResult:
    """One level (`--concurrency N` or `--rate R`), repeated."""
    return _finish([await measure_point(measure, shape, level, options)], options)


def exponential_levels(maximum: float, start: float = 1) -> list[float]:
    """`start`, 2 x `start`, 4 x `start`, ... up to `maximum`, which ends the list.

    Raises:
        ValueError: `start` not positive or above `maximum`.
    """
    if not 0 < start <= maximum:
        raise ValueError(f"levels need 0 < start <= maximum, got {start} and {maximum}")
    levels = [start]
    while levels[-1] * 2 < maximum:
        levels.append(levels[-1] * 2)
    if levels[-1] != maximum:
        levels.append(maximum)
    return levels


async def run_sweep(
    measure: Measure,
    levels: Sequence[float],
    *,
    shape: Shape = "concurrency",
    options: ShapeOptions,
) -> ShapeResult:
    """Each level in rising order, stopping early once the server is over-saturated.

    Raises:
        ValueError: no levels, or a level that is not positive.
    """
    ordered = sorted(set(levels))
    if not ordered or ordered[0] <= 0:
        raise ValueError(f"a sweep needs positive levels, got {list(levels)}")
    raised: list[dict[str, Any]] = []
    stopped = None
    for level in ordered:
        raised.append(await measure_point(measure, shape, level, options))
        reason = _check(raised, options, slo_rule=True)
        if reason is not None and level != ordered[-1]:
            stopped = {"level": level, "reason": reason}
            break
    result = _finish(raised, options)
    result.stopped = stopped
    return result


async def search_knee(
    measure: Measure,
    *,
    maximum: float,
    start: float = 1,
    shape: Shape = "concurrency",
    options: ShapeOptions,
) -> ShapeResult:
    """Find the knee (and the SLO limit) on the grid of multiples of `start` up to `maximum`.

    Args:
        measure: The driver at one level.
        maximum: The highest level to send (`--max-concurrency`, `--max-rate`).
        start: The lowest level and the grid's step (1 for concurrency).
        shape: `concurrency` (levels are ints) or `rate`.
        options: Repeats, SLO, knee gain, over-saturation rules, progress.

    Raises:
        ValueError: `start` not positive or above `maximum`.
    """
    if not 0 < start <= maximum:
        raise ValueError(f"a knee search needs 0 < start <= maximum, got {start} and {maximum}")
    top = int(maximum // start)
    measured: dict[int, dict[str, Any]] = {}

    async def at(step: int) -> dict[str, Any]:
        if step not in measured:
            level: float = step * start
            if shape == "concurrency":
                level = round(level)
            measured[step] = await measure_point(measure, shape, level, options)
        return measured[step]

    stopped, bracket = await _raise(at, top, options)
    if bracket is not None:
        await _bisect_knee(at, *bracket, options.knee_gain)
    if options.slo is not None:
        await _bisect_slo(at, measured)
    result = _finish(measured.values(), options)
    result.stopped = stopped
    return result


Step = Callable[[int], Awaitable[dict[str, Any]]]


async def _raise(
    at: Step, top: int, options: ShapeOptions
) -> tuple[dict[str, Any] | None, tuple[int, int] | None]:
    """Double the load until the knee is bracketed (and the SLO missed) or a stop rule holds.

    Returns `stopped`, and the grid steps (low, high) between which the knee lies: from the
    step before the first flat doubling to that doubling's top (None: no flat doubling).
    """
    steps: list[int] = []
    raised: list[dict[str, Any]] = []
    bracket: tuple[int, int] | None = None
    step = 1
    while True:
        steps.append(step)
        raised.append(await at(step))
        flat = len(raised) >= 2 and stalled(raised[-2], raised[-1], options.knee_gain)
        if bracket is None and flat:
            bracket = (steps[-3] if len(steps) >= 3 else steps[-2], steps[-1])
        # The SLO rule waits for the knee: the search must bracket both.
        reason = _check(raised, options, slo_rule=bracket is not None)
        slo_done = options.slo is None or raised[-1]["slo_met"] is False
        if reason is None and bracket is not None and slo_done:
            reason = "knee bracketed" + ("" if options.slo is None else " and SLO missed")
        if reason is not None or step >= top:
            return None if reason is None else _stop(raised[-1], reason), bracket
        step = min(step * 2, top)


def _stop(point: dict[str, Any], reason: str) -> dict[str, Any]:
    return {"level": point["level"], "reason": reason}


async def _bisect_knee(at: Step, low: int, high: int, knee_gain: float) -> None:
    """Find the lowest step in [low, high) whose next step is flat, measuring both of each probe."""
    while low < high:
        middle = (low + high) // 2
        if stalled(await at(middle), await at(middle + 1), knee_gain):
            high = middle
        else:
            low = middle + 1


async def _bisect_slo(at: Step, measured: dict[int, dict[str, Any]]) -> None:
    """Narrow the highest step meeting the SLO until the step above it is measured and misses."""
    met = [s for s, p in measured.items() if p["slo_met"]]
    if not met:
        return
    best = max(met)
    above = [s for s in measured if s > best]
    if not above:
        return
    missed = min(above)
    while missed - best > 1:
        middle = (best + missed) // 2
        if (await at(middle))["slo_met"]:
            best = middle
        else:
            missed = middle

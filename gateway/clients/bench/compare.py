"""Comparing two saved runs: one row per model, level and metric, and a verdict.

`gateway bench compare BASE NEW` answers "did NEW get slower than BASE?" for runs of the same
model build on the same machine and workload (`fingerprint.mismatches` refuses the others
unless `--allow-mismatch`). Exit codes: 0 pass, 1 regression, 2 refused, a bad file or any
other failure (a crash must never look like a regression, nor like a pass).

The rule, per row (`judge`). `change` is relative, (NEW - BASE) / BASE, except for the error
rate, where it is the difference in percentage points (a relative change from 0 errors is
meaningless). With 2 or more repeats on both sides (`--repeat`), the gate is a test:

1. `change` is that of the means over repeats, and Welch's t-test (`intervals.welch`: unequal
   variances, B. L. Welch 1947) gives its confidence interval at `--confidence` (95%).
2. `|change| <= threshold` (5% by default): "same".
3. Otherwise, when the interval holds 0 (the difference is not significant at that
   confidence): "noise".
4. Otherwise "better" or "worse" by the metric's direction (a latency or the error rate going
   up is worse, a throughput, the knee or the quality score going down is worse): a "worse" row
   is a regression beyond the threshold at the stated confidence. This is pyperf's and Google
   Benchmark's `compare.py` practice: a change counts when it is both large (the threshold) and
   significant (the test).

With one repeat on either side there is no measured noise, so the older rule applies, and the
comparison warns (`Comparison.warnings`; `--require-repeats N` refuses instead): the change is
that of the medians; `|change| <= threshold` is "same"; when the two runs' min-max ranges over
their repeats overlap it is "noise"; with one repeat a range is a single value, so the
threshold alone decides, except that a tail percentile (p99) measured once on either side is
"noise" whatever its change (the p99 of one short run moves by more than any useful threshold
between two runs of the same setup; it gates only with repeats). The knee and the quality score
are one value per run and always take this rule.

The comparison also warns when a row's interval of the change is wider than +-threshold and it
was not called "better" or "worse": those runs cannot tell a threshold-sized change from noise
(`--strict-stats` refuses then), and the warning says about how many repeats would. For a tail
percentile (p99) this is only a note, informational: a p99 per repeat rests on a few samples, so
its interval is wide by nature, and it must not make `--strict-stats` refuse a clean comparison.

A row with the value measured in BASE and missing in NEW (NEW measured no first token, no rate)
is "worse"; missing in BASE only it is "missing" and never a regression. A higher-is-better value
(a throughput) that BASE measured above 0 and NEW at 0 is "worse" whatever the test says.
The verdict is "refused" when the fingerprints differ and mismatches were not allowed, when
either run is partial (any `partial` but false or absent: it stopped when its target stopped
answering), when a point has fewer repeats than `--require-repeats`, or when NEW cannot be
judged against BASE: a model of BASE has no counterpart in NEW, a level of BASE was not measured
in NEW, or no row was compared at all (NEW has none of the values, as when it measured nothing).
A run that measured nothing must not pass
the gate. The rows are still computed, for the curious. Otherwise the verdict is "regression"
when any row is "worse", else "pass". What NEW measured beyond BASE (another model, more levels)
is only noted.

Over ~300 lines for one reason: the rule (`judge`, `gate_warnings`), the pairing of models and
levels (`_pair_models`, `_compare_model`) and the verdict (`Comparison`) are one gate, and
`render_comparison` and `main_compare` only print it and turn it into the exit code.
"""

# ruff: noqa: T201 (main_compare prints the comparison by design)
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from gateway.clients.bench.document import (
    RunFileError,
    load_run,
    mapping,
    models,
    nested,
    points,
    real,
    sequence,
    stat,
)
from gateway.clients.bench.fingerprint import mismatches as fingerprint_mismatches
from gateway.clients.bench.intervals import DEFAULT_CONFIDENCE, parse_confidence, welch
from gateway.clients.bench.tables import MISSING, Column, level, number, safe, text_table

Verdict = Literal["better", "worse", "same", "noise", "missing"]
Outcome = Literal["pass", "regression", "refused"]
EXIT_CODES: dict[Outcome, int] = {"pass": 0, "regression": 1, "refused": 2}


@dataclass(frozen=True, slots=True)
class Metric:
    """One compared quantity.

    Attributes:
        key: The point summary key (`ttft_seconds.p50`) or, for a model, `knee` or `quality`.
        label: Its name in the report, with the unit ("TTFT p50 (ms)").
        scale: Factor from the document's unit to the shown one (seconds -> ms: 1000).
        higher_is_better: Throughputs, the knee, quality; latencies and errors are lower-better.
        absolute: `change` is NEW - BASE (error rate) instead of relative.
        is_level: The value is a load level (the knee), shown as one.
        tail: A tail percentile (p99): gates only when both runs have repeats.
    """

    key: str
    label: str
    scale: float = 1.0
    higher_is_better: bool = False
    absolute: bool = False
    is_level: bool = False
    tail: bool = False


def _latency(key: str, label: str) -> Metric:
    return Metric(key, f"{label} (ms)", scale=1000.0, tail=key.endswith(".p99"))


POINT_METRICS: tuple[Metric, ...] = (
    _latency("ttft_seconds.p50", "TTFT p50"),
    _latency("ttft_seconds.p99", "TTFT p99"),
    _latency("tpot_seconds.p50", "TPOT p50"),
    _latency("itl_seconds.p50", "ITL p50"),
    _latency("itl_seconds.p99", "ITL p99"),
    _latency("e2e_seconds.p50", "E2E p50"),
    Metric("decode_tokens_per_second.p50", "decode p50 (tok/s)", higher_is_better=True),
    Metric("output_tokens_per_second", "output (tok/s)", higher_is_better=True),
    Metric("requests_per_second", "requests (req/s)", higher_is_better=True),
    Metric("goodput_requests_per_second", "goodput (req/s)", higher_is_better=True),
    Metric("error_rate", "error rate (%)", scale=100.0, absolute=True),
)
MODEL_METRICS: tuple[Metric, ...] = (
    Metric("knee", "knee (level)", higher_is_better=True, is_level=True),
    Metric("quality", "quality score (%)", scale=100.0, higher_is_better=True),
)


@dataclass(frozen=True, slots=True)
class Span:
    """A value over repeats in the document's unit: the median, the min-max range, the values.

    `values` holds each repeat's value (empty when unknown, as in a hand-made span); with 2 or
    more on both sides the gate tests them (`judge`).
    """

    median: float
    low: float
    high: float
    values: tuple[float, ...] = ()

    def overlaps(self, other: Span) -> bool:
        """Whether the two ranges share a value."""
        return self.low <= other.high and other.low <= self.high


@dataclass(frozen=True, slots=True)
class Row:
    """One compared value.

    Attributes:
        model: The model (`"BASE-name vs NEW-name"` when two single-model runs are paired).
        level: The point's level, None for a model-wide metric (knee, quality).
        metric: What is compared.
        base: BASE's value, None when not measured.
        new: NEW's value, None when not measured.
        change: Relative change (0.2: +20%), percentage points / 100 for the error rate,
            +-inf from a zero base, None when a side is missing.
        noise: The larger relative spread ((max - min) / median) of the two sides, for the
            reader; the verdict uses the ranges themselves (module docstring).
        verdict: "better", "worse", "same", "noise" or "missing".
        test: How it was judged: "welch" (repeats on both sides), "range" (the min-max rule
            with fewer than 2 repeats on a side), None when missing.
        change_low: With "welch": the lower end of the change's confidence interval (the
            difference's interval over |BASE's mean|), else None.
        change_high: Its upper end.
        p_value: With "welch": the two-sided p-value of "no difference", else None.
        confidence: The confidence of the interval and the test.
        threshold: The threshold the row was judged against.
    """

    model: str
    level: float | None
    metric: Metric
    base: Span | None
    new: Span | None
    change: float | None
    noise: float | None
    verdict: Verdict
    test: str | None = None
    change_low: float | None = None
    change_high: float | None = None
    p_value: float | None = None
    confidence: float = DEFAULT_CONFIDENCE
    threshold: float = 0.05

    @property
    def unresolved(self) -> bool:
        """Judged by the test, not called a change, with an interval wider than the threshold."""
        if self.test != "welch" or self.verdict in ("better", "worse"):
            return False
        if self.change_low is None or self.change_high is None:
            return False
        return (self.change_high - self.change_low) / 2 > self.threshold


@dataclass(slots=True)
class Comparison:
    """The result of `compare`.

    Attributes:
        rows: Every compared value, by model, then level (model-wide rows last), then metric.
        regressions: The rows whose verdict is "worse".
        mismatches: `fingerprint.mismatches` of the two runs.
        verdict: "pass", "regression" or "refused".
        threshold: The relative change below which a row is "same".
        notes: Models or levels measured in one run only, and other things the reader must know.
        refusals: Why NEW cannot be judged against BASE (a BASE model or level NEW lacks,
            nothing compared); any makes the verdict "refused".
        mismatch_allowed: The fingerprints' mismatches, if any, were allowed.
        warnings: What limits the verdict's worth: runs without repeats, values whose interval
            is wider than the threshold (module docstring).
        confidence: The confidence of the test and of the intervals.
        informational: What the reader should know that neither warns nor gates: tail
            percentiles too noisy to resolve the threshold (`gate_warnings`).
    """

    rows: list[Row]
    regressions: list[Row]
    mismatches: list[str]
    verdict: Outcome
    threshold: float
    notes: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    mismatch_allowed: bool = False
    warnings: list[str] = field(default_factory=list)
    confidence: float = DEFAULT_CONFIDENCE
    informational: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 pass, 1 regression, 2 refused."""
        return EXIT_CODES[self.verdict]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form (`--json`); any NaN or infinity is None (JSON has neither)."""
        rows = []
        for row in self.rows:
            item = asdict(row)
            item["metric"] = row.metric.key
            item["label"] = row.metric.label
            item["change"], item["noise"] = _finite(row.change), _finite(row.noise)
            rows.append(item)
        result = {
            "verdict": self.verdict,
            "threshold": self.threshold,
            "confidence": self.confidence,
            "warnings": self.warnings,
            "informational": self.informational,
            "mismatches": self.mismatches,
            "refusals": self.refusals,
            "notes": self.notes,
            "regressions": [r for r in rows if r["verdict"] == "worse"],
            "rows": rows,
        }
        return dict(json_safe(result))


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float None, so `json.dumps(allow_nan=False)` succeeds."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def judge(
    metric: Metric,
    base: Span | None,
    new: Span | None,
    threshold: float,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Row:
    """Compare one value of BASE and NEW by the rule of the module docstring.

    Returns:
        A `Row` with empty `model` and `level` (the caller fills them in).
    """
    if base is None or new is None:
        # BASE measured it and NEW did not (no first token, no rate): NEW lost it, which a
        # gate must not wave through; missing in BASE only is what NEW measured beyond it.
        lost: Verdict = "worse" if base is not None else "missing"
        return Row("", None, metric, base, new, None, None, lost, confidence=confidence)
    if metric.higher_is_better and base.median > 0 and new.high <= 0:
        # a throughput gone to 0 is worse whatever the spread of the repeats says
        change = -1.0 if not metric.absolute else new.median - base.median
        noise = max(_spread(base), _spread(new))
        return Row("", None, metric, base, new, change, noise, "worse", confidence=confidence)
    noise = max(_spread(base), _spread(new))
    test = welch(base.values, new.values, confidence)
    if test is not None:
        base_mean = sum(base.values) / len(base.values)
        scale = 1.0 if metric.absolute else abs(base_mean)
        if scale == 0:
            change = 0.0 if test.difference == 0 else math.copysign(math.inf, test.difference)
            low = high = change
        else:
            change, low, high = test.difference / scale, test.low / scale, test.high / scale
        verdict: Verdict
        if abs(change) <= threshold:
            verdict = "same"
        elif not test.significant:
            verdict = "noise"
        else:
            verdict = "better" if (change > 0) == metric.higher_is_better else "worse"
        return Row(
            "",
            None,
            metric,
            base,
            new,
            change,
            noise,
            verdict,
            "welch",
            low,
            high,
            test.p_value,
            confidence,
            threshold,
        )
    if metric.absolute:
        change = new.median - base.median
    elif base.median == 0:
        change = 0.0 if new.median == 0 else math.copysign(math.inf, new.median)
    else:
        change = (new.median - base.median) / abs(base.median)
    once = base.low == base.high or new.low == new.high
    if abs(change) <= threshold:
        verdict = "same"
    elif base.overlaps(new) or (metric.tail and once):
        verdict = "noise"
    else:
        verdict = "better" if (change > 0) == metric.higher_is_better else "worse"
    return Row(
        "",
        None,
        metric,
        base,
        new,
        change,
        noise,
        verdict,
        "range",
        confidence=confidence,
        threshold=threshold,
    )


def _spread(span: Span) -> float:
    if span.high == span.low:
        return 0.0
    return (span.high - span.low) / abs(span.median) if span.median else math.inf


def point_span(point: Mapping[str, Any], key: str) -> Span | None:
    """A summary key's median, range and per-repeat values, or None when not measured."""
    median = stat(point, key)
    if median is None:
        return None
    low, high = stat(point, key, "min"), stat(point, key, "max")
    return Span(
        median,
        median if low is None else low,
        median if high is None else high,
        repeat_values(point, key),
    )


def repeat_values(point: Mapping[str, Any], key: str) -> tuple[float, ...]:
    """Each repeat's value of a summary key (`ttft_seconds.p50`, `error_rate`), where known.

    Returns an empty tuple unless every repeat has a finite value: a test on some of the
    repeats would not be the test of the point.
    """
    found: list[float | None] = []
    metric, _, which = key.partition(".")
    for repeat in sequence(point.get("repeats")):
        item = mapping(repeat)
        if which:
            found.append(real(nested(item, "metrics", metric, which)))
        else:
            found.append(real(item.get(key)))
    present = [v for v in found if v is not None]
    return tuple(present) if len(present) == len(found) else ()


def model_span(entry: Mapping[str, Any], key: str) -> Span | None:
    """The knee level or the quality score of a model entry (a single value), or None."""
    found = nested(entry, "knee", "level") if key == "knee" else nested(entry, "quality", "score")
    value = real(found)
    return None if value is None else Span(value, value, value)


def _probe(entry: Mapping[str, Any]) -> tuple[Any, Any]:
    """The quality probe's question set and endpoint (`chat` when a run predates the field)."""
    quality = nested(entry, "quality")
    if not isinstance(quality, Mapping):
        return (None, None)
    return (quality.get("set"), quality.get("endpoint") or "chat")


def compare(
    base_doc: Mapping[str, Any],
    new_doc: Mapping[str, Any],
    *,
    threshold: float = 0.05,
    allow_mismatch: bool = False,
    confidence: float = DEFAULT_CONFIDENCE,
    require_repeats: int = 1,
    strict_stats: bool = False,
) -> Comparison:
    """Compare two run documents (`document.load_run`), model by model, level by level.

    Models are matched by name; when each run holds exactly one model, the two are compared
    whatever their names (comparing two builds is what `--allow-mismatch` is for: the
    fingerprint names the difference). Points are matched by shape and level.

    Args:
        base_doc: The reference run.
        new_doc: The run under test.
        threshold: Relative change (0.05: 5%) a row must exceed to count as a change.
        allow_mismatch: Judge even when the fingerprints differ.
        confidence: The confidence of Welch's test and of the intervals (0.95).
        require_repeats: Refuse when a compared point of either run has fewer repeats.
        strict_stats: Refuse when the comparison warns (`gate_warnings`).

    A BASE model or level that NEW lacks, or nothing compared at all, makes the verdict
    "refused" (module docstring); NEW's extra models and levels are noted only.

    Returns:
        The `Comparison`.

    Raises:
        ValueError: `threshold` negative or not finite.
    """
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"the threshold must be a non-negative number, got {threshold}")
    found = fingerprint_mismatches(
        mapping(base_doc.get("fingerprint")), mapping(new_doc.get("fingerprint"))
    )
    rows: list[Row] = []
    notes: list[str] = []
    refusals: list[str] = []
    for name, doc in (("BASE", base_doc), ("NEW", new_doc)):
        if "partial" in doc and doc["partial"] is not False:  # "yes", 1, null: not a clean run
            reason = doc.get("partial_reason")
            refusals.append(f"{name} is a partial run (it stopped: {reason})")
    pairs = _pair_models(base_doc, new_doc, notes, refusals)
    for label, base_entry, new_entry in pairs:
        rows.extend(
            _compare_model(label, base_entry, new_entry, threshold, notes, refusals, confidence)
        )
    fewest = _fewest_repeats(pairs)
    warnings, informational = gate_warnings(rows, fewest, threshold, confidence, require_repeats)
    if fewest is not None and min(fewest[0][0], fewest[1][0]) < require_repeats:
        (base_n, base_at), (new_n, new_at) = fewest
        side, n, at = ("BASE", base_n, base_at) if base_n <= new_n else ("NEW", new_n, new_at)
        refusals.append(
            f"{side} has {n} repeat(s) at {at}, fewer than --require-repeats {require_repeats}"
        )
    if strict_stats and warnings:
        refusals.append("--strict-stats: the runs cannot tell the threshold from noise (warnings)")
    if all(row.new is None for row in rows):
        refusals.append(
            "no value was compared: NEW measured nothing that BASE measured"
            if rows
            else "no value was compared: the runs share no model"
        )
    regressions = [row for row in rows if row.verdict == "worse"]
    verdict: Outcome = "regression" if regressions else "pass"
    if (found and not allow_mismatch) or refusals:
        verdict = "refused"
    return Comparison(
        rows,
        regressions,
        found,
        verdict,
        threshold,
        notes,
        refusals,
        bool(allow_mismatch),
        warnings,
        confidence,
        informational,
    )


Fewest = tuple[tuple[int, str], tuple[int, str]]


def _fewest_repeats(pairs: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> Fewest | None:
    """The fewest repeats of a point in BASE and in NEW, with where, over the paired models."""
    sides: list[tuple[int, str] | None] = [None, None]
    for label, *entries in pairs:
        for index, entry in enumerate(entries):
            for point in points(entry):
                n = len(sequence(point.get("repeats")))
                at = f"{label} level {real(point.get('level')) or 0:g}"
                if sides[index] is None or n < sides[index][0]:  # type: ignore[index]
                    sides[index] = (n, at)
    base, new = sides
    return None if base is None or new is None else (base, new)


def gate_warnings(
    rows: list[Row],
    fewest: Fewest | None,
    threshold: float,
    confidence: float,
    require_repeats: int = 1,
) -> tuple[list[str], list[str]]:
    """What limits the verdict: runs measured once, values the repeats cannot resolve.

    Args:
        rows: The compared rows.
        fewest: The fewest repeats of a point on each side, with where (`_fewest_repeats`).
        threshold: The gate's threshold.
        confidence: The test's confidence.
        require_repeats: `--require-repeats` as given: the advice to pass it is left out when
            it is already above 1.

    Returns:
        (warnings, informational). The warnings: one line for runs with a single repeat at
        some point (no noise measured: the threshold alone decides, and a real model's
        identical runs differ by 10-30%), naming each side that has one; and one for the rows
        judged by the test whose interval of the change is wider than +-threshold while they
        were not called a change, naming a few with about how many repeats would resolve them
        (the interval narrows as 1/sqrt(n)). A tail percentile (p99) with such an interval goes
        to the informational lines instead: a p99 of a few dozen requests per repeat is a
        handful of samples, noisy by nature, and must not make `--strict-stats` refuse a
        clean comparison of its medians.
    """
    warnings: list[str] = []
    informational: list[str] = []
    if fewest is not None and min(fewest[0][0], fewest[1][0]) < 2:
        (base_n, base_at), (new_n, new_at) = fewest
        once = [(s, n, at) for s, n, at in (("BASE", base_n, base_at), ("NEW", new_n, new_at))]
        once = [item for item in once if item[1] < 2]
        named = " and ".join(f"{side} has {n} repeat at {at}" for side, n, at in once)
        advice = "run both with --repeat 3 or more"
        if require_repeats <= 1:
            advice += ", or pass --require-repeats 3 to refuse such a comparison"
        warnings.append(
            f"{named}: with a single run there is no measured noise, so"
            f" the {threshold:.1%} threshold alone decides and a change may be noise (identical"
            f" runs of a real model differed by 10-30%); {advice}"
        )
    wide = [row for row in rows if row.unresolved]
    for chosen, out, what in (
        ([row for row in wide if not row.metric.tail], warnings, "value(s) cannot tell"),
        (
            [row for row in wide if row.metric.tail],
            informational,
            "tail percentile(s), informational only (few samples per repeat), cannot tell",
        ),
    ):
        if chosen:
            out.append(
                f"{len(chosen)} {what} a {threshold:.1%} change from noise at"
                f" {confidence * 100:g}% confidence (their interval of the change is wider):"
                f" {_unresolved(chosen, threshold)}"
            )
    return warnings, informational


def _unresolved(rows: list[Row], threshold: float) -> str:
    """A few unresolved rows with their half-interval and about how many repeats would do."""
    shown = []
    for row in rows[:4]:
        half = (row.change_high - row.change_low) / 2  # type: ignore[operator]
        n = min(len(row.base.values), len(row.new.values))  # type: ignore[union-attr]
        need = math.ceil(n * (half / threshold) ** 2) if threshold > 0 else None
        where = row.model if row.level is None else f"{row.model} at {level(row.level)}"
        more = "" if need is None else f", about {need} repeats"
        if need is not None and need > 100:
            more = ", over 100 repeats: too noisy to gate at this threshold"
        shown.append(f"{where}: {row.metric.label} +-{half:.1%}{more}")
    return "; ".join(shown)


def _pair_models(
    base_doc: Mapping[str, Any],
    new_doc: Mapping[str, Any],
    notes: list[str],
    refusals: list[str],
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    base, new = models(base_doc), models(new_doc)
    if len(base) == 1 and len(new) == 1:
        names = str(base[0].get("model")), str(new[0].get("model"))
        label = names[0] if names[0] == names[1] else f"{names[0]} vs {names[1]}"
        return [(label, base[0], new[0])]
    by_name = {str(entry.get("model")): entry for entry in new}
    pairs = []
    for entry in base:
        name = str(entry.get("model"))
        other = by_name.pop(name, None)
        if other is None:
            notes.append(f"model {name} measured only in BASE")
            refusals.append(f"model {name} of BASE was not measured in NEW")
        else:
            pairs.append((name, entry, other))
    notes.extend(f"model {name} measured only in NEW" for name in by_name)
    return pairs


def _compare_model(
    label: str,
    base_entry: Mapping[str, Any],
    new_entry: Mapping[str, Any],
    threshold: float,
    notes: list[str],
    refusals: list[str],
    confidence: float = DEFAULT_CONFIDENCE,
) -> list[Row]:
    def key(point: Mapping[str, Any]) -> tuple[str, float]:
        # `points` keeps only the points with a finite level.
        return str(point.get("shape", "")), real(point.get("level")) or 0.0

    base_points = {key(p): p for p in points(base_entry)}
    new_points = {key(p): p for p in points(new_entry)}
    rows: list[Row] = []
    for where in sorted(base_points.keys() | new_points.keys(), key=lambda k: (k[0], k[1])):
        if where not in new_points or where not in base_points:
            side = "BASE" if where in base_points else "NEW"
            notes.append(f"{label}: level {where[1]:g} ({where[0]}) measured only in {side}")
            if side == "BASE":
                refusals.append(f"{label}: level {where[1]:g} ({where[0]}) of BASE not in NEW")
            continue
        for metric in POINT_METRICS:
            row = judge(
                metric,
                point_span(base_points[where], metric.key),
                point_span(new_points[where], metric.key),
                threshold,
                confidence,
            )
            rows.append(_place(row, label, where[1]))
    for metric in MODEL_METRICS:
        base_span, new_span = model_span(base_entry, metric.key), model_span(new_entry, metric.key)
        if metric.key == "quality" and _probe(base_entry) != _probe(new_entry):
            base_span = new_span = None  # scores on other questions, or asked otherwise: missing
        row = judge(metric, base_span, new_span, threshold, confidence)
        rows.append(_place(row, label, None))
    return rows


def _place(row: Row, model: str, level: float | None) -> Row:
    return replace(row, model=model, level=level)


def parse_threshold(text: str) -> float:
    """`--threshold`: "5%" or a fraction "0.05".

    Raises:
        argparse.ArgumentTypeError: Not a number, negative, or a bare number of 1 or more
            (ambiguous: "5" could mean 5% or 500%).
    """
    body = text.strip()
    is_percent = body.endswith("%")
    try:
        value = float(body.rstrip("%").strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a threshold: {text!r} (write 5% or 0.05)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"the threshold must be >= 0, got {text!r}")
    if is_percent:
        return value / 100
    if value >= 1:
        raise argparse.ArgumentTypeError(
            f"ambiguous threshold {text!r}: write {value:g}% or a fraction"
        )
    return value


def _span(span: Span | None, metric: Metric) -> str:
    if span is None:
        return MISSING
    if metric.is_level:
        return level(span.median)
    scale = metric.scale
    text = number(span.median, scale)
    if span.low != span.high:
        text += f" ({number(span.low, scale)}-{number(span.high, scale)})"
    return text


def _change(change: float | None, absolute: bool) -> str:
    if change is None:
        return MISSING
    if absolute:
        return f"{change * 100:+.1f} pp"
    return f"{change:+.1%}" if abs(change) != float("inf") else ("+inf" if change > 0 else "-inf")


def _interval(row: Row) -> str:
    if row.test != "welch" or row.change_low is None or row.change_high is None:
        return MISSING
    absolute = row.metric.absolute
    return f"{_change(row.change_low, absolute)} to {_change(row.change_high, absolute)}"


def render_comparison(comparison: Comparison) -> str:
    """The terminal form of `compare.compare`: the rows, the notes and the verdict line.

    Refused for mismatched fingerprints: the mismatches only. Refused because NEW lacks what
    BASE measured: the rows, then the reasons and the verdict.
    """
    mismatch_refused = bool(comparison.mismatches) and not comparison.mismatch_allowed
    if comparison.verdict == "refused" and mismatch_refused:
        lines = ["refused: the runs are not comparable:"]
        lines += [f"  {safe(m, 500)}" for m in comparison.mismatches]
        lines += [f"  {safe(r, 500)}" for r in comparison.refusals]
        lines.append("pass --allow-mismatch to compare them anyway")
        return "\n".join(lines) + "\n"
    columns = [Column("model", "left"), Column("level"), Column("metric", "left")]
    shown = f"{comparison.confidence * 100:g}% CI of change"
    columns += [Column("BASE"), Column("NEW"), Column("change"), Column(shown)]
    columns += [Column("verdict", "left")]
    rows = [
        [
            safe(row.model),
            level(row.level),
            row.metric.label,
            _span(row.base, row.metric),
            _span(row.new, row.metric),
            _change(row.change, row.metric.absolute),
            _interval(row),
            row.verdict,
        ]
        for row in comparison.rows
    ]
    lines = [text_table(columns, rows)]
    lines += [f"mismatch (allowed): {safe(m, 500)}" for m in comparison.mismatches]
    lines += [f"note: {safe(n, 500)}" for n in comparison.notes]
    lines += [f"note: {safe(n, 1000)}" for n in comparison.informational]
    worse = len(comparison.regressions)
    if comparison.refusals:
        lines.append("refused: NEW cannot be judged against BASE:")
        lines += [f"  {safe(r, 500)}" for r in comparison.refusals]
        lines.append("verdict: refused")
        return "\n".join(lines) + "\n"
    tested = sum(1 for row in comparison.rows if row.test == "welch")
    once = sum(1 for row in comparison.rows if row.test == "range")
    confidence = f"{comparison.confidence * 100:g}%"
    parts = [f"{worse} of {len(comparison.rows)} values worse by more than"]
    parts[0] += f" {comparison.threshold:.1%}"
    if tested:
        parts.append(f"{tested} tested with Welch's t-test over the repeats")
    if once:
        parts.append(f"{once} without repeats on a side: the threshold alone decides")
    verdict = comparison.verdict + (f" at {confidence} confidence" if tested else "")
    undecided = sum(1 for row in comparison.rows if row.verdict == "noise")
    if comparison.verdict == "pass" and undecided:
        # exit 0 still (--strict-stats or --require-repeats refuse instead), but not a bare pass
        parts.insert(0, f"inconclusive for {undecided} value(s): too noisy or too few repeats")
    lines.append(f"verdict: {verdict} ({'; '.join(parts)})")
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `gateway bench compare`."""
    parser.add_argument("base", metavar="BASE", help="the reference run (JSON)")
    parser.add_argument("new", metavar="NEW", help="the run under test (JSON)")
    parser.add_argument(
        "--threshold",
        type=parse_threshold,
        default=0.05,
        help="relative change that counts, e.g. 5%% or 0.05 (default 5%%)",
    )
    parser.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare even when the fingerprints differ (other model build, machine, workload)",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument(
        "--confidence",
        type=_confidence,
        default=DEFAULT_CONFIDENCE,
        help="confidence of Welch's test and the intervals, e.g. 95%% or 0.99 (default 95%%)",
    )
    parser.add_argument(
        "--require-repeats",
        type=_repeats,
        default=1,
        metavar="N",
        help="refuse (exit 2) when a point of either run has fewer than N repeats (default 1:"
        " warn only)",
    )
    parser.add_argument(
        "--strict-stats",
        action="store_true",
        help="refuse (exit 2) whenever the comparison warns: single runs, or values whose"
        " interval of the change is wider than the threshold",
    )


def _confidence(text: str) -> float:
    try:
        return parse_confidence(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _repeats(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--require-repeats takes a whole number >= 1: {text!r}")
    return int(text)


def main_compare(args: argparse.Namespace) -> int:
    """Run `gateway bench compare`: print the comparison, return the exit code.

    Returns:
        0 pass, 1 regression, 2 refused (fingerprint mismatch, NEW lacking what BASE measured,
        nothing compared), a file that is unreadable or no run document, or any other failure
        (one line on stderr, never a traceback: 1 must only ever mean a regression).
    """
    try:
        return _compare_files(args)
    except Exception as exc:  # a hostile file must not end in a traceback, nor in exit 1
        print(
            f"gateway bench compare: cannot compare: {type(exc).__name__}: {safe(exc, 300)}",
            file=sys.stderr,
        )
        return 2


def _compare_files(args: argparse.Namespace) -> int:
    try:
        base, new = load_run(args.base), load_run(args.new)
    except RunFileError as exc:
        print(f"gateway bench compare: {safe(exc, 500)}", file=sys.stderr)
        return 2
    result = compare(
        base,
        new,
        threshold=args.threshold,
        allow_mismatch=args.allow_mismatch,
        confidence=getattr(args, "confidence", DEFAULT_CONFIDENCE),
        require_repeats=getattr(args, "require_repeats", 1),
        strict_stats=getattr(args, "strict_stats", False),
    )
    # On stderr in both forms: a CI log shows them beside the exit status.
    for warning in result.warnings:
        print(f"gateway bench compare: warning: {safe(warning, 1000)}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, ensure_ascii=True, allow_nan=False))
        # The reasons are in the JSON too; stderr tells the CI log without parsing it.
        reasons = [*result.refusals]
        if not result.mismatch_allowed:
            reasons += [f"fingerprints differ: {m}" for m in result.mismatches]
        for reason in reasons:
            print(f"gateway bench compare: refused: {safe(reason, 500)}", file=sys.stderr)
    else:
        print(render_comparison(result))
    return result.exit_code

"""Comparing two saved runs: one row per model, level and metric, and a verdict.

`gateway bench compare BASE NEW` answers "did NEW get slower than BASE?" for runs of the same
model build on the same machine and workload (`fingerprint.mismatches` refuses the others
unless `--allow-mismatch`). Exit codes: 0 pass, 1 regression, 2 refused, a bad file or any
other failure (a crash must never look like a regression, nor like a pass).

The noise rule, per row (`judge`). `change` is relative, (NEW - BASE) / BASE of the medians
over repeats, except for the error rate, where it is the difference in percentage points (a
relative change from 0 errors is meaningless). Then:

1. `|change| <= threshold` (5% by default): "same".
2. Otherwise, when the two runs' min-max ranges over their repeats overlap: "noise". Some
   repeat of NEW did as well as some repeat of BASE, so the repeats' own variation explains
   the change; a real change of that size moves the whole range. With one repeat a range is a
   single value, so this never applies and the threshold alone decides: with repeat=1 every
   change beyond the threshold counts, and `--repeat 3` is how to tell noise apart. One
   exception: a tail percentile (p99) measured once on either side is "noise" whatever its
   change, because the p99 of one short run moves by more than any useful threshold between
   two runs of the same setup (it is a handful of requests); it gates only with repeats.
3. Otherwise "better" or "worse" by the metric's direction (a latency or the error rate going
   up is worse, a throughput, the knee or the quality score going down is worse).

A row with the value missing on either side is "missing" and never a regression. The verdict is
"refused" when the fingerprints differ and mismatches were not allowed, or when NEW cannot be
judged against BASE: a model of BASE has no counterpart in NEW, a level of BASE was not measured
in NEW, or no row was compared at all (every row "missing", as when NEW measured nothing). A
run that measured nothing must not pass the gate. The rows are still computed, for the curious.
Otherwise the verdict is "regression" when any row is "worse", else "pass". What NEW measured
beyond BASE (another model, more levels) is only noted.

Over ~300 lines for one reason: the noise rule (`judge`), the pairing of models and levels
(`_pair_models`, `_compare_model`) and the verdict (`Comparison`) are one gate, and
`render_comparison` and `main_compare` only print it and turn it into the exit code.
"""

# ruff: noqa: T201 (main_compare prints the comparison by design)
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gateway.clients.bench.document import (
    RunFileError,
    load_run,
    mapping,
    models,
    nested,
    points,
    real,
    stat,
)
from gateway.clients.bench.fingerprint import mismatches as fingerprint_mismatches
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
    """A value over repeats in the document's unit: the median and the min-max range."""

    median: float
    low: float
    high: float

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
    """

    model: str
    level: float | None
    metric: Metric
    base: Span | None
    new: Span | None
    change: float | None
    noise: float | None
    verdict: Verdict


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
    """

    rows: list[Row]
    regressions: list[Row]
    mismatches: list[str]
    verdict: Outcome
    threshold: float
    notes: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    mismatch_allowed: bool = False

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


def judge(metric: Metric, base: Span | None, new: Span | None, threshold: float) -> Row:
    """Compare one value of BASE and NEW by the noise rule (module docstring).

    Returns:
        A `Row` with empty `model` and `level` (the caller fills them in).
    """
    if base is None or new is None:
        return Row("", None, metric, base, new, None, None, "missing")
    if metric.absolute:
        change = new.median - base.median
    elif base.median == 0:
        change = 0.0 if new.median == 0 else math.copysign(math.inf, new.median)
    else:
        change = (new.median - base.median) / abs(base.median)
    noise = max(_spread(base), _spread(new))
    verdict: Verdict
    once = base.low == base.high or new.low == new.high
    if abs(change) <= threshold:
        verdict = "same"
    elif base.overlaps(new) or (metric.tail and once):
        verdict = "noise"
    else:
        verdict = "better" if (change > 0) == metric.higher_is_better else "worse"
    return Row("", None, metric, base, new, change, noise, verdict)


def _spread(span: Span) -> float:
    if span.high == span.low:
        return 0.0
    return (span.high - span.low) / abs(span.median) if span.median else math.inf


def point_span(point: Mapping[str, Any], key: str) -> Span | None:
    """A summary key's median and range over the point's repeats, or None when not measured."""
    median = stat(point, key)
    if median is None:
        return None
    low, high = stat(point, key, "min"), stat(point, key, "max")
    return Span(median, median if low is None else low, median if high is None else high)


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
    for label, base_entry, new_entry in _pair_models(base_doc, new_doc, notes, refusals):
        rows.extend(_compare_model(label, base_entry, new_entry, threshold, notes, refusals))
    if all(row.verdict == "missing" for row in rows):
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
        rows, regressions, found, verdict, threshold, notes, refusals, bool(allow_mismatch)
    )


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
            )
            rows.append(_place(row, label, where[1]))
    for metric in MODEL_METRICS:
        base_span, new_span = model_span(base_entry, metric.key), model_span(new_entry, metric.key)
        if metric.key == "quality" and _probe(base_entry) != _probe(new_entry):
            base_span = new_span = None  # scores on other questions, or asked otherwise: missing
        row = judge(metric, base_span, new_span, threshold)
        rows.append(_place(row, label, None))
    return rows


def _place(row: Row, model: str, level: float | None) -> Row:
    return Row(model, level, row.metric, row.base, row.new, row.change, row.noise, row.verdict)


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
    columns += [Column("BASE"), Column("NEW"), Column("change"), Column("verdict", "left")]
    rows = [
        [
            safe(row.model),
            level(row.level),
            row.metric.label,
            _span(row.base, row.metric),
            _span(row.new, row.metric),
            _change(row.change, row.metric.absolute),
            row.verdict,
        ]
        for row in comparison.rows
    ]
    lines = [text_table(columns, rows)]
    lines += [f"mismatch (allowed): {safe(m, 500)}" for m in comparison.mismatches]
    lines += [f"note: {safe(n, 500)}" for n in comparison.notes]
    worse = len(comparison.regressions)
    if comparison.refusals:
        lines.append("refused: NEW cannot be judged against BASE:")
        lines += [f"  {safe(r, 500)}" for r in comparison.refusals]
        lines.append("verdict: refused")
        return "\n".join(lines) + "\n"
    lines.append(
        f"verdict: {comparison.verdict} ({worse} of {len(comparison.rows)} values worse by more"
        f" than {comparison.threshold:.1%} and beyond the repeats' range)"
    )
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
    result = compare(base, new, threshold=args.threshold, allow_mismatch=args.allow_mismatch)
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

"""Reports of a saved run: table, Markdown, CSV, JSON, the model matrix (a comparison: `compare`).

`gateway bench report RUN.json [--format table|md|csv|json] [--plots DIR] [--html FILE]`.
Each model gets one row per measured point: latencies in ms, throughputs in tok/s and req/s, the
error rate in %, every value the median over the point's repeats (with the spread of the output
throughput, so a reader sees how much to trust it); then the knee, the SLO limit, the suggested
gateway policy, why raising the load stopped, the cold load, the model's size and quality, and the
notes. A run of several models starts with the matrix, one line per model. Missing values are "-"
(empty in CSV, which spreadsheets read as no number); server text is escaped
(`gateway.clients.bench.tables`).

Over ~300 lines for one reason: every format of one saved run (`render_table` and
`render_markdown` over `point_table` and `facts`, `render_csv`, `render_json`, `render_matrix`)
reads it through the same helpers (`_repeat_sum`, `_gb`, `_quality`), so the formats cannot
disagree on what a run says; `RENDERERS` picks one and `main_report` is a thin front.
"""

# ruff: noqa: T201 (main_report prints the report by design)
from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.clients.bench.confidence import interval_lines
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
from gateway.clients.bench.plots import PlotError, plot_run
from gateway.clients.bench.tables import (
    MISSING,
    Column,
    count,
    level,
    markdown_table,
    markdown_text,
    number,
    percent,
    safe,
    text_table,
)

_MS = 1000.0
_ERROR_EXAMPLES = 5
_GB = 1e-9
#: (summary key, column title, scale) of the point table, in order.
_POINT_VALUES = (
    ("ttft_seconds.p50", "TTFT p50 (ms)", _MS),
    ("ttft_seconds.p99", "TTFT p99 (ms)", _MS),
    ("tpot_seconds.p50", "TPOT p50 (ms)", _MS),
    ("itl_seconds.p99", "ITL p99 (ms)", _MS),
    ("e2e_seconds.p50", "E2E p50 (ms)", _MS),
    ("decode_tokens_per_second.p50", "decode p50 (tok/s)", 1.0),
    ("output_tokens_per_second", "output (tok/s)", 1.0),
)
#: (summary key, CSV column, scale): latencies in ms, rates per second, the error rate in %.
_CSV_VALUES = (
    *(
        (f"{metric}_seconds.{q}", f"{metric}_{q}_ms", _MS)
        for metric in ("ttft", "tpot", "itl", "e2e")
        for q in ("p50", "p90", "p99")
    ),
    ("decode_tokens_per_second.p50", "decode_p50_tok_s", 1.0),
    ("prefill_tokens_per_second.p50", "prefill_p50_tok_s", 1.0),
    ("output_tokens_per_second", "output_tok_s", 1.0),
    ("requests_per_second", "requests_req_s", 1.0),
    ("goodput_requests_per_second", "goodput_req_s", 1.0),
    ("error_rate", "error_rate_percent", 100.0),
)
CSV_COLUMNS = (
    *("model", "shape", "level", "repeats", "requests", "errors"),
    *(column for _, column, _ in _CSV_VALUES),
    *("output_tok_s_spread_percent", "slo_met"),
)


def _repeat_sum(point: Mapping[str, Any], key: str) -> int | None:
    values = [r.get(key) for r in sequence(point.get("repeats")) if isinstance(r, Mapping)]
    counts = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return sum(counts) if counts else None


def _spread(point: Mapping[str, Any]) -> float | None:
    """The output tokens/s spread over repeats; None (shown "-") with one repeat: no spread."""
    if len(sequence(point.get("repeats"))) < 2:
        return None
    return stat(point, "output_tokens_per_second", "spread")


def _slo(point: Mapping[str, Any]) -> str:
    met = point.get("slo_met")
    return MISSING if met is None else ("met" if met else "missed")


def point_table(entry: Mapping[str, Any]) -> tuple[list[Column], list[list[str]]]:
    """One model's points as table columns and rows (cells escaped for a terminal)."""
    ordered = points(entry)
    shape = ordered[0].get("shape") if ordered else None
    columns = [Column("rate (req/s)" if shape == "rate" else "concurrency")]
    columns += [Column(t) for t in ("repeats", "requests", "failed")]
    columns += [Column(title) for _, title, _ in _POINT_VALUES]
    columns += [Column(t) for t in ("tok/s spread", "req/s", "goodput (req/s)", "errors (%)")]
    columns.append(Column("SLO", "left"))
    rows = []
    for point in ordered:
        row = [level(point["level"]), count(len(sequence(point.get("repeats"))) or None)]
        row += [count(_repeat_sum(point, "requests")), count(_repeat_sum(point, "errors"))]
        row += [number(stat(point, key), scale) for key, _, scale in _POINT_VALUES]
        row.append(percent(_spread(point)))
        row += [number(stat(point, "requests_per_second"))]
        row += [number(stat(point, "goodput_requests_per_second"))]
        row += [number(stat(point, "error_rate"), 100.0), _slo(point)]
        rows.append(row)
    return columns, rows


_list = sequence


def _gb(value: object) -> str:
    return number(value, _GB)


def facts(entry: Mapping[str, Any]) -> list[str]:
    """What a model's table does not show, one escaped sentence each (printed under it)."""
    lines = []
    for key, label in (("knee", "knee"), ("slo_limit", "SLO limit")):
        found = entry.get(key)
        if isinstance(found, Mapping):
            lines.append(f"{label}: {level(found.get('level'))} ({safe(found.get('reason'))})")
    sentence = nested(entry, "policy", "sentence")
    if sentence:
        lines.append(f"policy: {safe(sentence, 500)}")
    stopped = entry.get("stopped")
    if isinstance(stopped, Mapping):
        lines.append(f"stopped at {level(stopped.get('level'))}: {safe(stopped.get('reason'))}")
    lines += interval_lines(entry)  # bench-stats: the intervals and --until-ci
    cold = entry.get("cold_load")
    if isinstance(cold, Mapping):
        load, ttft = cold.get("load_seconds"), cold.get("ttft_seconds")
        lines.append(f"cold load: {number(load)} s load, {number(ttft, _MS)} ms TTFT")
    size = entry.get("size")
    if isinstance(size, Mapping):
        line = (
            f"size: {_gb(size.get('disk_bytes'))} GB on disk, {_gb(size.get('loaded_bytes'))} GB"
            f" resident, {_gb(size.get('vram_bytes'))} GB on GPU"
        )
        if real(size.get("parameters")) is not None:
            line += f", {number(size.get('parameters'), _GB)} B parameters"
        if size.get("source"):
            line += f" (from {safe(size.get('source'), 100)})"
        lines.append(line)
    quality = entry.get("quality")
    if isinstance(quality, Mapping):
        lines.append(f"quality: {_quality(quality)} on {safe(quality.get('set'))}")
    examples: list[str] = []
    for repeat in (r for point in points(entry) for r in _list(point.get("repeats"))):
        for example in _list(repeat.get("error_examples") if isinstance(repeat, Mapping) else []):
            line = f"error example: {safe(example)}"
            # Every repeat keeps its own examples; a few distinct ones tell the story.
            if line not in examples and len(examples) < _ERROR_EXAMPLES:
                examples.append(line)
    lines += examples
    lines += [f"note: {safe(n, 500)}" for n in _list(nested(entry, "resources", "notes"))]
    return lines


def _quality(quality: Mapping[str, Any]) -> str:
    score = percent(quality.get("score"), 0)
    if score == MISSING:
        return MISSING
    return f"{score} ({count(quality.get('correct'))}/{count(quality.get('total'))})"


def header(doc: Mapping[str, Any]) -> list[str]:
    """The run's own lines: when, against what, with which load and workload (escaped)."""
    parameters = mapping(doc.get("parameters"))
    workload = mapping(parameters.get("workload"))
    through = " through the gateway" if parameters.get("through_gateway") else ""
    lines = [
        f"run {safe(doc.get('created', MISSING))}: {safe(parameters.get('target', MISSING))}"
        f" ({safe(parameters.get('api', MISSING))}{through})",
        f"shape {safe(parameters.get('shape', MISSING))}, repeat {count(parameters.get('repeat'))},"
        f" workload {safe(workload.get('name', MISSING))} ({count(workload.get('prompts'))}"
        f" prompts), SLO {safe(parameters.get('slo') or MISSING)}",
    ]
    return lines + [f"note: {safe(note, 500)}" for note in _list(doc.get("notes"))]


def render_table(doc: Mapping[str, Any]) -> str:
    """The terminal report: the run's header, the matrix (several models), each model's table."""
    parts = ["\n".join(header(doc))]
    if len(models(doc)) > 1:
        parts.append(render_matrix(doc))
    for entry in models(doc):
        columns, rows = point_table(entry)
        body = [f"model {safe(entry['model'])}", text_table(columns, rows), *facts(entry)]
        parts.append("\n".join(body))
    return "\n\n".join(parts) + "\n"


def render_markdown(doc: Mapping[str, Any]) -> str:
    """The report as GitHub-flavoured Markdown: a heading and a table per model."""
    parts = ["# gateway bench run", "\n".join(f"- {markdown_text(line)}" for line in header(doc))]
    if len(models(doc)) > 1:
        parts += ["## Models", render_matrix(doc, markdown=True)]
    for entry in models(doc):
        columns, rows = point_table(entry)
        parts += [f"## {markdown_text(safe(entry['model']))}", markdown_table(columns, rows)]
        lines = facts(entry)
        if lines:
            parts.append("\n".join(f"- {markdown_text(line)}" for line in lines))
    return "\n\n".join(parts) + "\n"


def _csv_cell(value: float | None, scale: float) -> str:
    scaled = real(None if value is None else value * scale)
    return "" if scaled is None else f"{scaled:.6g}"


def _csv_count(value: int | None) -> str:
    # No repeat counted: 0; an absurd sum from a hand-edited file: empty, like a missing value.
    if value is None:
        return "0"
    return "" if count(value) == MISSING else str(value)


def _csv_text(text: str) -> str:
    # A cell starting with = + - @ is a formula to a spreadsheet (CSV injection); a quote
    # before it keeps it text. Model names come from the server's catalogue.
    text = safe(text, 500)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def render_csv(doc: Mapping[str, Any]) -> str:
    """One CSV row per model x point, with the columns of `CSV_COLUMNS` (units in the names).

    Values are medians over repeats; a missing value is an empty cell.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for entry in models(doc):
        for point in points(entry):
            met = point.get("slo_met")
            writer.writerow(
                [
                    _csv_text(entry["model"]),
                    _csv_text(str(point.get("shape", ""))),
                    level(point["level"]),
                    len(sequence(point.get("repeats"))),
                    _csv_count(_repeat_sum(point, "requests")),
                    _csv_count(_repeat_sum(point, "errors")),
                    *(_csv_cell(stat(point, key), scale) for key, _, scale in _CSV_VALUES),
                    _csv_cell(_spread(point), 100.0),
                    "" if met is None else str(bool(met)).lower(),
                ]
            )
    return out.getvalue()


def render_json(doc: Mapping[str, Any]) -> str:
    """The document as indented JSON; ASCII only, so no control character reaches a terminal."""
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"


def _on_gpu(size: Mapping[str, Any]) -> str:
    vram, loaded = real(size.get("vram_bytes")), real(size.get("loaded_bytes"))
    shown = _gb(vram)
    if vram is not None and loaded is not None and loaded > 0:
        shown += f" ({percent(vram / loaded, 0)})"  # the share: < 100% is a partial offload
    return shown


def render_matrix(doc: Mapping[str, Any], *, markdown: bool = False) -> str:
    """One line per model: size, memory, single-stream speed, knee, goodput, quality.

    TTFT and decode rate are those of each model's lowest level measured (one stream, in a
    concurrency run), the goodput that at the SLO limit.
    """
    columns, rows = matrix_table(doc)
    render = markdown_table if markdown else text_table
    return render(columns, rows)


def matrix_table(doc: Mapping[str, Any]) -> tuple[list[Column], list[list[str]]]:
    """The matrix's columns and rows (cells escaped for a terminal): `render_matrix`."""
    columns = [Column("model", "left"), Column("disk (GB)"), Column("resident (GB)")]
    columns += [Column("on GPU (GB)"), Column("TTFT p50 (ms)"), Column("decode p50 (tok/s)")]
    columns += [Column("knee"), Column("goodput at SLO limit (req/s)"), Column("quality")]
    rows = []
    for entry in models(doc):
        size = mapping(entry.get("size"))
        first = points(entry)[:1]
        row = [safe(entry["model"]), _gb(size.get("disk_bytes")), _gb(size.get("loaded_bytes"))]
        row.append(_on_gpu(size))
        row.append(number(stat(first[0], "ttft_seconds.p50"), _MS) if first else MISSING)
        row.append(number(stat(first[0], "decode_tokens_per_second.p50")) if first else MISSING)
        row.append(level(nested(entry, "knee", "level")))
        row.append(number(nested(entry, "slo_limit", "goodput_requests_per_second")))
        quality = entry.get("quality")
        row.append(_quality(quality) if isinstance(quality, Mapping) else MISSING)
        rows.append(row)
    return columns, rows


RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "table": render_table,
    "md": render_markdown,
    "csv": render_csv,
    "json": render_json,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `gateway bench report`."""
    parser.add_argument("run", metavar="RUN", help="a run document (JSON) from gateway bench run")
    parser.add_argument(
        "--format",
        choices=sorted(RENDERERS),
        default="table",
        help="table (terminal, default), md (GitHub Markdown), csv (one row per model and"
        " point), json (the document)",
    )
    parser.add_argument("--plots", metavar="DIR", type=Path, help="also write PNG plots to DIR")
    parser.add_argument(
        "--html",
        metavar="FILE",
        type=Path,
        help="also write a self-contained HTML report (tables and plots, no network) to FILE",
    )


def main_report(args: argparse.Namespace) -> int:
    """Run `gateway bench report`: print the report, write the plots when asked.

    Returns:
        0 done; 1 the plots could not be drawn (matplotlib missing, DIR not writable, values
        matplotlib cannot draw: the report is printed, the message goes to stderr); 2 the file
        is unreadable or no run document, or the report failed in some unexpected way (one
        line on stderr, never a traceback).
    """
    try:
        return _report(args)
    except Exception as exc:  # a hostile file must not end in a traceback
        print(
            f"gateway bench report: cannot report {safe(args.run, 200)}:"
            f" {type(exc).__name__}: {safe(exc, 300)}",
            file=sys.stderr,
        )
        return 2


def _report(args: argparse.Namespace) -> int:
    try:
        doc = load_run(args.run)
    except RunFileError as exc:
        print(f"gateway bench report: {safe(exc, 500)}", file=sys.stderr)
        return 2
    sys.stdout.write(RENDERERS[args.format](doc))
    if args.plots is not None:
        notes: list[str] = []
        try:
            written: Sequence[Path] = plot_run(doc, args.plots, notes=notes)
        except (PlotError, OSError) as exc:
            print(f"gateway bench report: no plots: {safe(exc, 500)}", file=sys.stderr)
            return 1
        for note in notes:
            print(f"gateway bench report: {safe(note, 500)}", file=sys.stderr)
        for path in written:
            print(f"plot: {safe(path, 500)}", file=sys.stderr)
    return 0

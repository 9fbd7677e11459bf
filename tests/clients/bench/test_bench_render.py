"""`gateway.clients.bench.report`, `tables` and `plots`: what a saved run looks like in each
format."""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gateway.clients.bench import plots
from gateway.clients.bench.compare import compare, render_comparison
from gateway.clients.bench.plots import PlotFailed, PlotsUnavailable, plot_run, slug
from gateway.clients.bench.report import (
    CSV_COLUMNS,
    RENDERERS,
    add_arguments,
    main_report,
    render_csv,
    render_json,
    render_markdown,
    render_matrix,
    render_table,
)
from gateway.clients.bench.tables import Column, markdown_text, number, text_table, width
from tests.clients.bench.bench_docs import model_entry, run_doc

HOSTILE = "evil\x1b[2J\x1b]0;owned\x07|name\u202e\x9b31m"


def _printable(text: str) -> bool:
    """No control or format character but the newline (no ANSI escape, no bidi override)."""
    return all(c == "\n" or c.isprintable() for c in text)


def test_numbers_keep_a_few_digits_and_missing_is_a_dash() -> None:
    assert [number(v) for v in (1234.56, 12.345, 1.2345, 0.012345, 0.0)] == [
        "1235",
        "12.3",
        "1.23",
        "0.0123",
        "0",
    ]
    assert number(0.0504, 1000.0) == "50.4"
    assert number(None) == "-"


def test_the_table_has_units_in_its_headers_and_the_findings_under_it() -> None:
    out = render_table(run_doc())
    for title in ("TTFT p50 (ms)", "TPOT p50 (ms)", "decode p50 (tok/s)", "output (tok/s)"):
        assert title in out
    assert "req/s" in out
    assert "errors (%)" in out
    assert "knee: 4 (throughput grew" in out
    assert "SLO limit: 4 (met up to 4, missed at 8)" in out
    assert "policy: Allow 4 requests at once (the knee)" in out
    assert "quality: 92% (11/12) on builtin-12" in out
    assert "cold load: 1.80 s load, 2100 ms TTFT" in out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("concurrency"))
    rule = lines[lines.index(header) + 1]
    # Every row of the table is as wide as its rule: the columns line up.
    rows = lines[lines.index(header) + 2 : lines.index(header) + 6]
    assert all(len(row) <= len(rule) for row in rows)
    assert [row.split()[0] for row in rows] == ["1", "2", "4", "8"]


def test_one_repeat_has_no_spread_and_says_why_a_point_has_no_interval() -> None:
    doc = run_doc(repeat=1)
    point = doc["models"][0]["points"][0]
    point["repeats"][0]["requests"] = 5
    for key in ("ttft_seconds.p50", "tpot_seconds.p50", "itl_seconds.p50", "e2e_seconds.p50"):
        point["summary"].get(key, {}).pop("ci_low", None)
    point["summary"].get("output_tokens_per_second", {}).pop("ci_low", None)
    out = render_table(doc)
    header = next(line for line in out.splitlines() if line.startswith("concurrency"))
    spread = header.index("tok/s spread")
    rows = out.splitlines()[out.splitlines().index(header) + 2 :][:4]
    assert all(row[spread : spread + len("tok/s spread")].strip() == "-" for row in rows)
    assert "no interval at 1: 5 requests, a p50 needs 6" in out
    assert "no interval at 2" not in out  # 20 requests: enough; this document has none for


def test_values_not_measured_print_a_dash() -> None:
    entry = model_entry(slo=None, quality=None)
    entry["size"] = {"disk_bytes": None, "loaded_bytes": None, "vram_bytes": None}
    out = render_table(run_doc([entry], slo=None))
    row = next(line for line in out.splitlines() if line.lstrip().startswith("1 "))
    # goodput and the SLO column are unmeasured without an SLO.
    assert row.split()[-2:] == ["0", "-"]
    assert "goodput" in out
    assert "size: - GB on disk, - GB resident, - GB on GPU" in out
    assert "quality" not in out.split("SLO")[-1]


def test_server_text_reaches_the_terminal_without_control_characters() -> None:
    entry = model_entry(HOSTILE, errors=1, error_text="boom\x1b[31m red\r\nsecond line")
    doc = run_doc([entry, model_entry("other")])
    doc["notes"] = ["note with \x1b[0m reset"]
    for render in (render_table, render_markdown, render_csv, render_json):
        out = render(doc)
        assert _printable(out), render.__name__
        assert "\x1b" not in out
    table = render_table(doc)
    assert "error example: boom\\x1b[31m red\\r\\nsecond line" in table
    assert "model evil\\x1b[2J" in table


def test_markdown_tables_are_valid_gfm() -> None:
    doc = run_doc([model_entry("a|b"), model_entry("c")])
    out = render_markdown(doc)
    blocks = [b for b in out.split("\n\n") if b.startswith("|")]
    assert len(blocks) == 3  # the matrix, then one table per model
    for block in blocks:
        lines = block.splitlines()
        cells = [len(re.findall(r"(?<!\\)\|", line)) for line in lines]
        assert len(set(cells)) == 1, block  # the same number of cells on every line
        assert re.fullmatch(r"\|(:?---:?\|)+", lines[1])
    assert "## a\\|b" in out
    assert "| a\\|b |" in out


def test_csv_has_one_row_per_model_and_point_in_stable_columns() -> None:
    doc = run_doc([model_entry("=HYPERLINK(1)"), model_entry("b", slo=None)])
    rows = list(csv.reader(io.StringIO(render_csv(doc))))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == 1 + 2 * 4
    records = [dict(zip(CSV_COLUMNS, row, strict=True)) for row in rows[1:]]
    assert records[0]["model"] == "'=HYPERLINK(1)"  # a formula kept as text
    assert records[0]["level"] == "1"
    assert float(records[0]["ttft_p50_ms"]) == pytest.approx(50, rel=0.05)
    assert float(records[0]["output_tok_s"]) > 0
    assert records[0]["slo_met"] == "true"
    assert records[4]["goodput_req_s"] == ""  # no SLO: no goodput
    assert records[4]["slo_met"] == ""
    assert records[0]["requests"] == "15"


def test_json_round_trips_and_is_ascii() -> None:
    doc = run_doc([model_entry("通义千问")])
    out = render_json(doc)
    assert out.isascii()
    assert json.loads(out) == doc


def test_the_matrix_has_one_line_per_model() -> None:
    small = model_entry("small")
    small["size"] = {
        "disk_bytes": 1_000_000_000,
        "loaded_bytes": 2_000_000_000,
        "vram_bytes": 1_000_000_000,
    }
    doc = run_doc([small, model_entry("large", slowdown=2.0, quality=None)])
    out = render_matrix(doc)
    lines = out.splitlines()
    assert lines[0].split("  ")[0] == "model"
    assert "goodput at SLO limit (req/s)" in lines[0]
    assert lines[2].split()[:5] == ["small", "1.00", "2.00", "1.00", "(50%)"]
    assert lines[3].split()[-1] == "-"  # no quality probe
    assert lines[2].split()[-2:] == ["92%", "(11/12)"]
    assert out in render_table(doc)


def test_wide_characters_are_aligned_by_display_width() -> None:
    assert width("通义") == 4
    table = text_table([Column("model", "left"), Column("n")], [["通义", "1"], ["ab", "22"]])
    first, second = table.splitlines()[2:]
    assert width(first) == width(second)


def test_a_comparison_renders_its_rows_and_its_refusal() -> None:
    base = run_doc()
    slow = run_doc(slowdown=1.2, seed=2)
    out = render_comparison(compare(base, slow))
    assert "verdict: regression" in out
    assert re.search(
        r"TTFT p50 \(ms\)\s+\S+ \(\S+-\S+\)\s+\S+ \(\S+-\S+\)\s+\+\d+\.\d%\s+"
        r"\+\d+\.\d% to \+\d+\.\d%\s+worse",
        out,
    )
    assert "knee (level)" in out
    other = run_doc(digests={"llama3.2:1b": f"sha256:{HOSTILE}"})
    refused = render_comparison(compare(base, other))
    assert refused.startswith("refused: the runs are not comparable:")
    assert _printable(refused)


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gateway bench report")
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("fmt", ["table", "md", "csv", "json"])
def test_the_command_prints_each_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_doc()))
    assert main_report(_cli(str(path), "--format", fmt)) == 0
    out = capsys.readouterr().out
    assert "llama3.2:1b" in out


def test_the_command_exits_2_on_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.json"
    path.write_text('{"schema": "other"}')
    assert main_report(_cli(str(path))) == 2
    err = capsys.readouterr().err
    assert "schema 'other' is not 'gateway-bench/1'" in err
    assert "Traceback" not in err


def test_without_matplotlib_the_plots_say_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(name: str) -> ModuleType:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(plots.importlib, "import_module", missing)
    with pytest.raises(PlotsUnavailable, match=r"pip install 'llm-gateway\[bench\]'"):
        plot_run(run_doc(), tmp_path)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_doc()))
    assert main_report(_cli(str(path), "--plots", str(tmp_path / "plots"))) == 1
    captured = capsys.readouterr()
    assert "model llama3.2:1b" in captured.out  # the report is printed all the same
    assert "llm-gateway[bench]" in captured.err


def test_model_names_become_safe_file_names() -> None:
    assert slug("library/llama3.2:1b") == "library_llama3.2_1b"
    assert slug("../../etc/passwd") == "etc_passwd"
    assert slug("..") == "model"


def _png(path: Path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_plots_are_written_per_model_and_as_a_matrix(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    # "a/b" and "a_b" share a slug; "$" would be mathtext to matplotlib.
    doc = run_doc([model_entry("a/b"), model_entry("a_b", slowdown=1.5), model_entry("x$y$")])
    written = plot_run(doc, tmp_path / "out")
    names = [p.name for p in written]
    assert names == [
        "a_b-throughput.png",
        "a_b-latency.png",
        "a_b-2-throughput.png",
        "a_b-2-latency.png",
        "x_y-throughput.png",
        "x_y-latency.png",
        "matrix.png",
        "matrix-load.png",
    ]
    assert all(_png(path) for path in written)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_single_model_has_no_matrix_and_the_command_writes_the_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_doc(repeat=1)))
    assert main_report(_cli(str(path), "--plots", str(tmp_path / "plots"))) == 0
    files = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert files == ["llama3.2_1b-latency.png", "llama3.2_1b-throughput.png"]
    assert all(_png(tmp_path / "plots" / name) for name in files)
    assert "plot: " in capsys.readouterr().err


def test_error_examples_are_listed_once_and_at_most_five() -> None:
    entry = model_entry(errors=1, error_text="HTTP 503: busy")
    out = render_table(run_doc([entry]))
    assert out.count("error example: HTTP 503: busy") == 1
    for index, point in enumerate(entry["points"]):
        point["repeats"][0]["error_examples"] = [f"failure {index}-{n}" for n in range(5)]
    out = render_table(run_doc([entry]))
    assert out.count("error example: ") == 5


def test_a_hand_edited_file_with_wrong_types_still_renders() -> None:
    entry = model_entry(quality=None)
    entry["knee"] = {"level": "four", "reason": "\x1b[1mbold"}
    entry["cold_load"] = {"load_seconds": "slow", "ttft_seconds": None}
    entry["size"] = {"disk_bytes": "big", "loaded_bytes": 0, "vram_bytes": 5}
    entry["quality"] = {"score": "good", "correct": "x", "total": 12}
    doc = run_doc([entry, model_entry("b")])
    doc["parameters"]["repeat"] = "\x1b[2J"
    doc["notes"] = "not a list"
    entry["points"][0]["repeats"].append("not a repeat")
    for render in (render_table, render_markdown, render_csv, render_json):
        assert _printable(render(doc))
    out = render_table(doc)
    assert "knee: - (\\x1b[1mbold)" in out
    assert "cold load: - s load, - ms TTFT" in out
    assert "repeat -," in out


def _hostile_doc() -> dict[str, Any]:
    doc = run_doc([model_entry("a"), model_entry("b")])
    first, second = doc["models"]
    first["points"][0]["summary"]["ttft_seconds.p50"] = {
        "median": 10**400,
        "min": 1e308,
        "max": float("inf"),
    }
    first["points"][0]["summary"]["output_tokens_per_second"] = {"median": 1e308}
    first["points"][1]["repeats"] = 5
    first["points"][2]["repeats"] = [{"requests": 10**400, "errors": True}]
    first["size"] = [1]
    first["knee"] = {"level": 1e308, "reason": 10**400}
    first["quality"] = {"score": 1e307, "correct": 10**400, "total": "x"}
    second["size"] = {"vram_bytes": 10**400, "loaded_bytes": 1}
    second["knee"] = {"level": float("nan")}
    second["cold_load"] = {"load_seconds": 10**400, "ttft_seconds": float("inf")}
    doc["parameters"]["workload"] = "x"
    doc["fingerprint"]["models"] = [{}]
    doc["notes"] = "not a list"
    return doc


@pytest.mark.parametrize("fmt", ["table", "md", "csv", "json"])
def test_hostile_values_render_in_every_format(fmt: str) -> None:
    out = RENDERERS[fmt](_hostile_doc())
    assert "model" in out or "a" in out
    if fmt != "json":
        assert "1" + "0" * 300 not in out  # no 400-digit cell


def test_the_command_reports_a_hostile_file_and_its_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_hostile_doc()))
    assert main_report(_cli(str(path), "--plots", str(tmp_path / "plots"))) in (0, 1)
    err = capsys.readouterr().err
    assert "Traceback" not in err


def test_a_matplotlib_failure_is_a_plot_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")

    def absurd(*args: object) -> None:
        raise ValueError("arange: cannot compute length")

    monkeypatch.setattr(plots, "_throughput", absurd)
    with pytest.raises(PlotFailed, match=r"cannot draw a-throughput\.png"):
        plot_run(run_doc([model_entry("a")]), tmp_path / "direct")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_doc([model_entry("a")])))
    assert main_report(_cli(str(path), "--plots", str(tmp_path / "plots"))) == 1
    err = capsys.readouterr().err
    assert "no plots: cannot draw" in err
    assert "Traceback" not in err
    assert not [p for p in (tmp_path / "plots").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_knee_far_outside_the_levels_is_not_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    marked: list[float | None] = []
    mark_knee = plots._mark_knee

    def recording(axes: Any, knee: float | None) -> None:
        marked.append(knee)
        mark_knee(axes, knee)

    monkeypatch.setattr(plots, "_mark_knee", recording)
    entry = model_entry("a")
    entry["knee"] = {"level": 1e308}
    other = model_entry("b")
    written = plot_run(run_doc([entry, other]), tmp_path)
    # Every plot is still written (not an empty list that `all` would pass on) ...
    assert [p.name for p in written] == [
        "a-throughput.png",
        "a-latency.png",
        "b-throughput.png",
        "b-latency.png",
        "matrix.png",
        "matrix-load.png",
    ]
    assert all(_png(p) for p in written)
    # ... with a's knee left out of its plots (throughput, both latency panels) and b's knee
    # drawn on each of its own.
    assert marked == [None] * 3 + [other["knee"]["level"]] * 3


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_plots_replace_a_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / "a-throughput.png").symlink_to(victim)
    plot_run(run_doc([model_entry("a")]), out)
    assert victim.read_text() == "keep me"
    assert not (out / "a-throughput.png").is_symlink()
    assert _png(out / "a-throughput.png")
    assert sorted(p.name for p in out.iterdir()) == ["a-latency.png", "a-throughput.png"]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_at_most_max_models_are_plotted_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(plots, "MAX_MODELS", 2)
    entry = model_entry("a", levels=(1, 2), repeat=1)
    entries = [{**entry, "model": f"m{n}"} for n in range(3)]
    notes: list[str] = []
    written = plot_run(run_doc(entries), tmp_path, notes=notes)
    assert [p.name for p in written] == [
        "m0-throughput.png",
        "m0-latency.png",
        "m1-throughput.png",
        "m1-latency.png",
        "matrix.png",
        "matrix-load.png",
    ]
    assert notes == ["plots show the first 2 of 3 models"]


def test_the_command_exits_2_on_an_unexpected_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_doc()))

    def explode(doc: object) -> str:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setitem(RENDERERS, "table", explode)
    assert main_report(_cli(str(path))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "OverflowError" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("https://evil.example/login", "`https://evil.example/login`"),
        ("@octocat/team", "`@octocat/team`"),
        ("see WWW.evil.example", "`see WWW.evil.example`"),
        ("a|b@c", "`a\\|b@c`"),  # the cell still splits on no pipe
        ("``@x", "``` ``@x ```"),
        ("&#64;octocat", "\\&\\#64;octocat"),  # no entity that renders as @
        ("llama3.2:1b", "llama3.2:1b"),
    ],
)
def test_markdown_shows_links_and_mentions_as_text(name: str, shown: str) -> None:
    assert markdown_text(name) == shown
    out = render_markdown(run_doc([model_entry(name)]))
    assert f"## {shown}" in out


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_legends_sit_outside_the_data_and_the_load_matrix_has_headroom() -> None:
    # Inside the axes a legend hid the level-1 points (issue 30); matrix-load's TTFT line ran
    # along the top edge. Drawn and measured in display coordinates.
    pytest.importorskip("matplotlib")
    figure_class, canvas_class = plots._figure_classes()
    doc = run_doc([model_entry(model="a"), model_entry(model="b")])
    entry = doc["models"][0]
    ordered = plots.points(entry)
    figures = [
        plots._latency(figure_class(figsize=(7, 6)), "a", ordered, 4.0),
        plots._throughput(figure_class(figsize=(7, 4.5)), "a", ordered, 4.0),
    ]
    for figure in figures:
        canvas_class(figure).draw()
        for axes in figure.axes:
            legend = axes.get_legend().get_window_extent()
            assert not legend.overlaps(axes.get_window_extent())
    load = plots._matrix_load(figure_class(figsize=(11, 4.5)), doc["models"])
    canvas_class(load).draw()
    (legend,) = load.legends
    for axes in load.axes:
        assert axes.get_legend() is None
        assert not legend.get_window_extent().overlaps(axes.get_window_extent())
        highest = max(max(line.get_ydata()) for line in axes.get_lines())
        assert axes.get_ylim()[1] >= highest * 1.1

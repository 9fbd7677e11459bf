"""The HTML report of a run: one self-contained file, tables and plots, that opens offline.

`gateway bench run ... --html report.html` and `gateway bench report RUN.json --html
report.html` write it. Everything is inside the file: the CSS in a `<style>` element, the plots
as PNG `data:` URIs (RFC 2397), no script, no font, no link to anything outside; a Content
Security Policy (`default-src 'none'`) tells the browser so too, so a report mailed or kept as a
CI artefact shows the same everywhere and calls nowhere. The tables are the terminal report's
(`report.point_table`, `report.matrix_table`, `report.facts`), so the formats cannot disagree;
every text from the run (model names, notes, answers: the server's or a file's words) is
HTML-escaped (`html.escape`). Without matplotlib the report holds the tables and says why the
plots are missing.
"""

from __future__ import annotations

# ruff: noqa: T201 (main_report prints where the report went)
import argparse
import base64
import html
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.clients.bench import report
from gateway.clients.bench.document import (
    RunFileError,
    load_run,
    mapping,
    models,
    points,
    sequence,
)
from gateway.clients.bench.plots import PlotError, render_pngs, replace_file, slug
from gateway.clients.bench.report import facts, header, matrix_table, point_table
from gateway.clients.bench.tables import Column, safe

#: Shown answers of the quality probe per model (a user's file may hold thousands).
MAX_ANSWERS = 50

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #1b1f24; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; margin: 0.8em 0; font-variant-numeric: tabular-nums;
        font-size: 13px; }
.scroll { overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: 0.25em 0.6em; }
th { background: #f6f8fa; font-weight: 600; }
td.r, th.r { text-align: right; } td.l, th.l { text-align: left; }
tr:nth-child(even) td { background: #fbfcfd; }
ul.facts { color: #32383f; } .note { color: #6e4c00; }
img { max-width: 100%; border: 1px solid #eaeef2; margin: 0.5em 0; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr));
         gap: 1em; align-items: start; }
.wide img { width: 100%; }
.ok { color: #116329; } .bad { color: #a40e26; }
details { margin: 0.5em 0; } summary { cursor: pointer; }
"""
_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    cls = ["l" if c.align == "left" else "r" for c in columns]
    head = "".join(f'<th class="{k}">{_e(c.title)}</th>' for c, k in zip(columns, cls, strict=True))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{k}">{_e(cell)}</td>' for cell, k in zip(row, cls, strict=True))
        + "</tr>"
        for row in rows
    )
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="scroll">{table}</div>'


def _image(name: str, data: bytes, alt: str) -> str:
    encoded = base64.b64encode(data).decode("ascii")
    return f'<img src="data:image/png;base64,{encoded}" alt="{_e(alt)}" title="{_e(name)}">'


def _answers(quality: Mapping[str, Any]) -> str:
    """The probe's answers as a folded table: what was asked for, what came, scored how."""
    answers = [a for a in sequence(quality.get("answers")) if isinstance(a, Mapping)]
    if not answers:
        return ""
    rows = []
    for answer in answers[:MAX_ANSWERS]:
        said = answer.get("answer")
        error = answer.get("error")
        shown = safe(said, 160) if isinstance(said, str) else f"(failed: {safe(error, 160)})"
        mark = (
            '<span class="ok">right</span>'
            if answer.get("correct")
            else ('<span class="bad">wrong</span>')
        )
        rows.append(
            f"<tr><td>{_e(safe(answer.get('id'), 60))}</td>"
            f"<td>{_e(safe(answer.get('expected'), 80))}</td><td>{_e(shown)}</td>"
            f"<td>{mark}</td></tr>"
        )
    more = len(answers) - MAX_ANSWERS
    tail = f"<p>{more} more in the run document.</p>" if more > 0 else ""
    title = (
        f"quality probe answers ({_e(safe(quality.get('set'), 80))},"
        f" {_e(safe(quality.get('endpoint') or 'chat', 20))})"
    )
    return (
        f"<details><summary>{title}</summary><table><thead><tr><th>id</th><th>expected</th>"
        f"<th>answer</th><th>scored</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f"{tail}</details>"
    )


def render_html(doc: Mapping[str, Any], *, notes: list[str] | None = None) -> str:
    """The run as one HTML page (the module docstring says what it holds).

    Args:
        doc: The run document.
        notes: Where to append why plots are missing (matplotlib absent or failing).

    Returns:
        The page, UTF-8 text.
    """
    images: dict[str, bytes] = {}
    missing = ""
    try:
        images = dict(render_pngs(doc, notes=notes))
    except PlotError as exc:
        missing = f"no plots: {safe(exc, 300)}"
        if notes is not None:
            notes.append(missing)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>gateway bench run {_e(safe(doc.get('created', ''), 40))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>gateway bench run</h1>",
    ]
    lines = header(doc)
    parts.append(
        '<ul class="facts">'
        + "".join(
            f'<li class="note">{_e(line)}</li>'
            if line.startswith("note: ")
            else f"<li>{_e(line)}</li>"
            for line in lines
        )
        + "</ul>"
    )
    if missing:
        parts.append(f'<p class="note">{_e(missing)}</p>')
    entries = models(doc)
    if len(entries) > 1:
        parts.append("<h2>Models side by side</h2>")
        parts.append(_table(*matrix_table(doc)))
        shown = [images[name] for name in ("matrix.png", "matrix-load.png") if name in images]
        if shown:
            parts.append(
                '<div class="wide">'
                + "".join(_image("matrix", data, "the models side by side") for data in shown)
                + "</div>"
            )
    used: set[str] = set()
    for entry in entries:
        model = str(entry.get("model"))
        parts.append(f"<h2>model {_e(safe(model))}</h2>")
        columns, rows = point_table(entry)
        parts.append(_table(columns, rows))
        found = facts(entry)
        if found:
            parts.append(
                '<ul class="facts">' + "".join(f"<li>{_e(f)}</li>" for f in found) + "</ul>"
            )
        parts.append(_answers(mapping(entry.get("quality"))))
        base = slug(model)
        name, n = base, 2
        while name in used:  # as `plots.render_pngs` names them
            name, n = f"{base}-{n}", n + 1
        if points(entry):
            used.add(name)
        plots = [
            _image(f"{name}-{kind}.png", images[f"{name}-{kind}.png"], f"{model}: {kind}")
            for kind in ("throughput", "latency")
            if f"{name}-{kind}.png" in images
        ]
        if plots:
            parts.append('<div class="plots">' + "".join(plots) + "</div>")
    parts.append("</body></html>")
    return "\n".join(part for part in parts if part) + "\n"


def write_report(doc: Mapping[str, Any], path: str | Path) -> list[str]:
    """Write `render_html(doc)` to `path` (through a new file and a rename, as the plots).

    Returns:
        What the reader should know (plots missing), one sentence each.

    Raises:
        OSError: the file cannot be written.
    """
    notes: list[str] = []
    page = render_html(doc, notes=notes).encode("utf-8")
    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    replace_file(target, lambda handle: handle.write(page))
    return notes


def main_report(args: argparse.Namespace) -> int:
    """`gateway bench report`: `report.main_report`, then the HTML file when `--html` asks.

    Returns:
        `report.main_report`'s status; 1 when the HTML file could not be written (the message
        on stderr; without matplotlib the file is written with the tables and a note).
    """
    status = report.main_report(args)
    if args.html is None or status == 2:
        return status
    try:
        doc = load_run(args.run)
        for note in write_report(doc, args.html):
            print(f"gateway bench report: {safe(note, 500)}", file=sys.stderr)
    except (RunFileError, OSError) as exc:
        print(f"gateway bench report: no HTML report: {safe(exc, 500)}", file=sys.stderr)
        return 1
    print(f"html: {safe(args.html, 500)}", file=sys.stderr)
    return status

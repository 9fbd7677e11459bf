"""PNG plots of a saved run: throughput and latency against load per model, the matrix as bars.

matplotlib is optional (the extra `llm-gateway[bench]`) and imported only when a plot is drawn,
so `gateway bench` starts fast and works without it. The figures are drawn on the Agg canvas
directly (`matplotlib.figure.Figure` with `FigureCanvasAgg`), never through `pyplot`: pyplot
keeps global figure state and picks a GUI backend when it finds a display, neither of which a
command writing files wants.

A run document is input: values matplotlib cannot draw (a knee of 1e308) end in `PlotFailed`,
not a traceback; each PNG is written to a new temporary file in the directory and renamed over
its name, so a symlink planted at `<model>-throughput.png` is replaced, never written through;
at most `MAX_MODELS` models are plotted.

Over ~300 lines for one reason: the figures (`_throughput`, `_latency`, `_matrix`, `_matrix_load`)
share the axis, label and legend helpers that make them read alike, the lazy matplotlib import and
the safe file writing they all go through; split per figure, those helpers would be imported back by
each.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from gateway.clients.bench.document import mapping, models, nested, points, real, stat
from gateway.clients.bench.tables import safe

INSTALL_HINT = "pip install 'llm-gateway[bench]'"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: The most models a run's plots show (two PNGs each, and one bar each in the matrix).
MAX_MODELS = 50


class PlotError(RuntimeError):
    """No plots: matplotlib is missing or could not draw the run's values."""


class PlotsUnavailable(PlotError):
    """matplotlib is not installed."""


class PlotFailed(PlotError):
    """matplotlib failed on the run's values (absurd numbers from a hand-edited file)."""


def _figure_classes() -> tuple[Any, Any]:
    """`(Figure, FigureCanvasAgg)`, imported now.

    Raises:
        PlotsUnavailable: matplotlib is not installed.
    """
    try:
        figure = importlib.import_module("matplotlib.figure")
        agg = importlib.import_module("matplotlib.backends.backend_agg")
    except ImportError as exc:
        raise PlotsUnavailable(f"matplotlib is not installed: {INSTALL_HINT}") from exc
    return figure.Figure, agg.FigureCanvasAgg


def slug(name: str) -> str:
    """A file-name part for a model name: only letters, digits, `.`, `_`, `-` (no `/`, no `..`)."""
    text = _UNSAFE.sub("_", name).strip("._") or "model"
    return text[:80]


def _label(name: object) -> str:
    # matplotlib reads $...$ as mathtext: a "$" in a model name would fail the plot.
    return safe(name, 80).replace("$", r"\$")


def plot_run(
    doc: Mapping[str, Any], outdir: str | Path, *, notes: list[str] | None = None
) -> list[Path]:
    """Draw the run's plots into `outdir` (created when missing).

    Per model, `<model>-throughput.png` (output tok/s against the level, each point labelled)
    and `<model>-latency.png` (two panels on one load axis: TTFT p50 and p99 above, TPOT p50
    and ITL p99 below, so neither squashes the other), each with the knee marked when it lies
    among the levels measured; the load axis is ticked at the levels measured (a doubling
    sweep on a log-2 axis). With more than one model also `matrix.png` (per model, labelled
    horizontal bars of TTFT p50, decode tok/s, knee and quality; "not measured" where a value
    is missing) and `matrix-load.png` (every model's output tok/s and TTFT p50 against the
    load, one line each). A model without points gets no plot; only the first `MAX_MODELS`
    models are drawn (a sentence in `notes` says so).

    Args:
        doc: The run document.
        outdir: The directory of the PNGs.
        notes: Where to append what the reader should know (models left out).

    Returns:
        The files written, in that order.

    Raises:
        PlotsUnavailable: matplotlib is not installed.
        PlotFailed: matplotlib could not draw the values.
        OSError: `outdir` cannot be created or written.
    """
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, data in render_pngs(doc, notes=notes):
        replace_file(out / name, _writer(data))
        written.append(out / name)
    return written


def _writer(data: bytes) -> Callable[[BinaryIO], object]:
    return lambda handle: handle.write(data)


def render_pngs(
    doc: Mapping[str, Any], *, notes: list[str] | None = None
) -> list[tuple[str, bytes]]:
    """The run's plots as PNG bytes, by file name (`plot_run` writes them, the HTML embeds them).

    Raises:
        PlotsUnavailable: matplotlib is not installed.
        PlotFailed: matplotlib could not draw the values.
    """
    figure_class, canvas_class = _figure_classes()
    drawn: list[tuple[str, bytes]] = []
    used: set[str] = set()
    entries = models(doc)
    if len(entries) > MAX_MODELS and notes is not None:
        notes.append(f"plots show the first {MAX_MODELS} of {len(entries)} models")
    entries = entries[:MAX_MODELS]

    def save(name: str, draw: Any, size: tuple[float, float], *args: Any) -> None:
        try:
            figure = draw(figure_class(figsize=size), *args)
            canvas_class(figure)
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=100)
        except Exception as exc:  # matplotlib's own errors on absurd values vary by version
            raise PlotFailed(f"cannot draw {name}: {type(exc).__name__}: {exc}") from exc
        drawn.append((name, buffer.getvalue()))

    for entry in entries:
        ordered = points(entry)
        if not ordered:
            continue
        model = str(entry.get("model"))
        base = slug(model)
        # Two names can share a slug ("a/b" and "a_b"); a number keeps both plots.
        name, n = base, 2
        while name in used:
            name, n = f"{base}-{n}", n + 1
        used.add(name)
        knee = _knee(entry, ordered)
        save(f"{name}-throughput.png", _throughput, (7, 4.5), model, ordered, knee)
        save(f"{name}-latency.png", _latency, (7, 6), model, ordered, knee)
    if len(entries) > 1:
        save("matrix.png", _matrix, (11, 2.4 + 1.2 * len(entries)), entries)
        if any(points(entry) for entry in entries):
            save("matrix-load.png", _matrix_load, (11, 4.5), entries)
    return drawn


def _write(figure: Any, path: Path) -> None:
    """Save `figure` as PNG at `path` (`replace_file`)."""
    replace_file(path, lambda handle: figure.savefig(handle, format="png", dpi=100))


def replace_file(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write a file at `path` with `write(handle)`, through a new file in the same directory.

    `mkstemp` creates the file exclusively (no symlink followed); `os.replace` then replaces
    whatever `path` is, a symlink included, instead of writing to its target. The file gets
    the permissions a plain `open` would give it (0666 less the umask).

    Raises:
        OSError: the directory is not writable (nothing is left behind).
    """
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from others
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _knee(entry: Mapping[str, Any], ordered: Sequence[Mapping[str, Any]]) -> float | None:
    # The knee is one of the levels measured; anything outside them (1e308) is not drawn.
    knee = real(nested(entry, "knee", "level"))
    levels = [float(p["level"]) for p in ordered]
    if knee is None or not levels or not min(levels) <= knee <= max(levels):
        return None
    return knee


def _xlabel(ordered: Sequence[Mapping[str, Any]]) -> str:
    return "requests/s" if ordered[0].get("shape") == "rate" else "concurrent requests"


def _load_axis(axes: Any, levels: Sequence[float]) -> None:
    """Tick the load axis at the levels measured; log 2 when they span 4x or more.

    A linear axis ticked by matplotlib shows 1.5 and 2.5 concurrent requests, and a sweep
    1, 2, 4, 8, 16 bunches its first points together.
    """
    found = sorted(set(levels))
    if not found:
        return
    if found[0] > 0 and found[-1] / found[0] >= 4:
        axes.set_xscale("log", base=2)
    axes.set_xticks(found, [f"{level:g}" for level in found])
    axes.minorticks_off()
    if len(found) == 1:
        axes.set_xlim(found[0] * 0.5, found[0] * 1.5)


def _mark_knee(axes: Any, knee: float | None) -> None:
    if knee is not None:
        axes.axvline(knee, color="tab:red", linestyle=":", label=f"knee {knee:g}")


def _series(
    ordered: Sequence[Mapping[str, Any]], key: str, scale: float = 1.0
) -> tuple[list[float], list[float]]:
    pairs = [(float(p["level"]), stat(p, key)) for p in ordered]
    present = [(x, y * scale) for x, y in pairs if y is not None]
    return [x for x, _ in present], [y for _, y in present]


def _short(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _throughput(
    figure: Any, model: str, ordered: Sequence[Mapping[str, Any]], knee: float | None
) -> Any:
    axes = figure.add_subplot()
    xs, ys = _series(ordered, "output_tokens_per_second")
    axes.plot(xs, ys, marker="o", label="output tok/s (median)")
    for x, y in zip(xs, ys, strict=True):
        axes.annotate(
            _short(y), (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8
        )
    _mark_knee(axes, knee)
    _load_axis(axes, [float(p["level"]) for p in ordered])
    axes.set_ylim(bottom=0, top=max(ys, default=1.0) * 1.15 or 1.0)
    axes.set_xlabel(_xlabel(ordered))
    axes.set_ylabel("output tokens/s (all requests)")
    axes.set_title(f"{_label(model)}: throughput")
    axes.grid(True, alpha=0.3)
    _legend_outside(axes)
    figure.tight_layout()
    return figure


def _legend_outside(axes: Any) -> None:
    """The legend right of the axes: inside, any corner can hide a point (issue 30)."""
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _latency(
    figure: Any, model: str, ordered: Sequence[Mapping[str, Any]], knee: float | None
) -> Any:
    top = figure.add_subplot(2, 1, 1)
    bottom = figure.add_subplot(2, 1, 2, sharex=top)
    panels = (
        (
            top,
            "time to first token (ms)",
            (("ttft_seconds.p50", "TTFT p50", "-"), ("ttft_seconds.p99", "TTFT p99", "--")),
        ),
        (
            bottom,
            "per token (ms)",
            (("tpot_seconds.p50", "TPOT p50", "-"), ("itl_seconds.p99", "ITL p99", "--")),
        ),
    )
    for axes, ylabel, series in panels:
        drawn: list[float] = []
        for key, label, style in series:
            xs, ys = _series(ordered, key, 1000.0)
            if ys:
                axes.plot(xs, ys, style, marker="o", label=label)
                drawn.extend(ys)
        # Queueing moves TTFT by orders of magnitude; a linear axis would hide the low levels.
        if drawn and min(drawn) > 0 and max(drawn) / min(drawn) > 20:
            axes.set_yscale("log")
            _plain_numbers(axes)
        else:
            axes.set_ylim(bottom=0, top=max(drawn, default=1.0) * 1.15 or 1.0)
        _mark_knee(axes, knee)
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
        _legend_outside(axes)
    _load_axis(bottom, [float(p["level"]) for p in ordered])
    bottom.set_xlabel(_xlabel(ordered))
    top.set_title(f"{_label(model)}: latency")
    figure.tight_layout()
    return figure


def _plain_numbers(axes: Any) -> None:
    """Label a log axis 200, 1000, 5000 instead of 2 x 10^2 (and no minor labels)."""
    ticker = importlib.import_module("matplotlib.ticker")
    axes.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axes.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _pos: f"{value:g}"))
    axes.yaxis.set_minor_formatter(ticker.NullFormatter())


def _matrix(figure: Any, entries: Sequence[Mapping[str, Any]]) -> Any:
    names = [_label(entry.get("model")) for entry in entries]
    firsts = [points(entry)[:1] for entry in entries]
    quality = [mapping(entry.get("quality")) for entry in entries]
    panels = (
        (
            "TTFT p50 (ms), lowest level (lower is better)",
            [real(stat(f[0], "ttft_seconds.p50")) if f else None for f in firsts],
            1000.0,
            None,
        ),
        (
            "decode p50 (tok/s), lowest level (higher is better)",
            [real(stat(f[0], "decode_tokens_per_second.p50")) if f else None for f in firsts],
            1.0,
            None,
        ),
        (
            "knee (level; none: throughput still grew)",
            [_knee(e, points(e)) for e in entries],
            1.0,
            None,
        ),
        (
            "quality (% correct)",
            [real(q.get("score")) for q in quality],
            100.0,
            [_fraction(q) for q in quality],
        ),
    )
    colors = [f"C{index % 10}" for index in range(len(names))]
    rows = list(range(len(names)))
    for index, (title, values, scale, labels) in enumerate(panels, start=1):
        axes = figure.add_subplot(2, 2, index)
        heights = [_height(v, scale) for v in values]
        axes.barh(rows, heights, color=colors, height=0.6)
        axes.set_yticks(rows, names, fontsize=9)
        axes.invert_yaxis()  # the first model on top, as in the table
        top = 100.0 if title.startswith("quality") else max(heights, default=0.0) or 1.0
        axes.set_xlim(0, top * 1.3)
        if title.startswith("quality"):
            axes.set_xticks([0, 25, 50, 75, 100])
        for row, (value, height) in enumerate(zip(values, heights, strict=True)):
            if value is None:
                text = "none" if title.startswith("knee") else "not measured"
            elif labels is not None:
                text = f"{_short(height)}% {labels[row]}"
            else:
                text = _short(height)
            axes.text(height + top * 0.02, row, text, va="center", fontsize=8)
        axes.set_title(title, fontsize=10)
        axes.grid(True, axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def _fraction(quality: Mapping[str, Any]) -> str:
    correct, total = quality.get("correct"), quality.get("total")
    if isinstance(correct, int) and isinstance(total, int) and total < 10**9:
        return f"({correct}/{total})"
    return ""


def _matrix_load(figure: Any, entries: Sequence[Mapping[str, Any]]) -> Any:
    """Every model on one load axis: output tok/s (left) and TTFT p50 (right)."""
    left = figure.add_subplot(1, 2, 1)
    right = figure.add_subplot(1, 2, 2)
    levels: list[float] = []
    ttfts: list[float] = []
    tokens: list[float] = []
    for index, entry in enumerate(entries):
        ordered = points(entry)
        if not ordered:
            continue
        levels += [float(p["level"]) for p in ordered]
        color, label = f"C{index % 10}", _label(entry.get("model"))
        xs, ys = _series(ordered, "output_tokens_per_second")
        left.plot(xs, ys, marker="o", color=color, label=label)
        tokens += ys
        xs, ys = _series(ordered, "ttft_seconds.p50", 1000.0)
        right.plot(xs, ys, marker="o", color=color, label=label)
        ttfts += ys
    first = next(points(e) for e in entries if points(e))
    for axes, title in ((left, "output tokens/s"), (right, "TTFT p50 (ms)")):
        _load_axis(axes, levels)
        axes.set_xlabel(_xlabel(first))
        axes.set_title(title, fontsize=10)
        values = ttfts if axes is right else tokens
        highest = max(values, default=0.0)
        if axes is right and ttfts and min(ttfts) > 0 and highest / min(ttfts) > 20:
            axes.set_yscale("log")  # queueing multiplies TTFT: keep the low levels readable
            _plain_numbers(axes)
            axes.set_ylim(top=highest * 1.6)  # headroom: the top line off the frame
        else:
            axes.set_ylim(bottom=0, top=highest * 1.15 or 1.0)
        axes.grid(True, alpha=0.3)
    # One legend for both panels (the same models), below them: over a panel it hid lines.
    handles, labels = left.get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(len(labels), 4) or 1)
    rows = max(1, -(-len(labels) // 4))
    figure.tight_layout(rect=(0.0, min(0.06 * rows + 0.02, 0.4), 1.0, 1.0))
    return figure


def _height(value: object, scale: float) -> float:
    found = real(value)
    scaled = None if found is None else real(found * scale)
    return 0.0 if scaled is None else scaled

"""The PNG plot of a run: TTFT p50/p99 and throughput against concurrency, one line per target.

matplotlib is optional: `plot_run` returns a message instead of a file when it is missing
(`.venv/bin/pip install matplotlib`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_STYLE = {
    "direct": "tab:gray",
    "gateway": "tab:blue",
    "gw-httpx": "tab:orange",
    "floor": "tab:purple",
    "nginx": "tab:green",
    "direct-chat": "tab:brown",
    "gw-chat": "tab:red",
    "direct-sse": "tab:olive",
    "gw-sse": "tab:cyan",
    "gw-responses": "tab:pink",
    "gw-messages": "black",
}


def plot_run(run: dict[str, Any], path: Path) -> str:
    """Draw the emulator sweep (and the real-model sweep, if any) to `path`.

    Returns:
        What happened, for the terminal: the file written, or why there is none.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (.venv/bin/pip install matplotlib)"
    sections = [("emulator", run["rows"], "chunks_per_second", "chunks/s")]
    if run.get("real_model"):
        sections.append(("real model", run["real_model"], "tokens_per_second", "tokens/s"))
    figure, axes = plt.subplots(len(sections), 2, figsize=(12, 4.5 * len(sections)), squeeze=False)
    for (title, rows, rate, unit), (latency_ax, rate_ax) in zip(sections, axes, strict=True):
        for target in dict.fromkeys(row["target"] for row in rows):
            mine = sorted(
                (r for r in rows if r["target"] == target), key=lambda r: r["concurrency"]
            )
            levels = [r["concurrency"] for r in mine]
            color = _STYLE.get(target)
            for q, style in (("p50", "-"), ("p99", "--")):
                values = [r["ttft_ms"][q] for r in mine]
                latency_ax.plot(
                    levels, values, style, marker="o", color=color, label=f"{target} {q}"
                )
            rate_ax.plot(levels, [r[rate] for r in mine], marker="o", color=color, label=target)
        levels = sorted({row["concurrency"] for row in rows})
        for ax in (latency_ax, rate_ax):
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(level) for level in levels])
            ax.set_xlabel("concurrent streams")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        latency_ax.set_yscale("log")
        latency_ax.set_ylabel("TTFT (ms)")
        latency_ax.set_title(f"{title}: time to first token")
        rate_ax.set_ylabel(unit)
        rate_ax.set_title(f"{title}: throughput")
    meta = run.get("meta", {})
    figure.suptitle(f"LLM gateway benchmark, {meta.get('date', '')}, {meta.get('machine', '')}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return f"plot: {path}"

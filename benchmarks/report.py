# ruff: noqa: T201 (a benchmark prints its table)
"""What a run tells: the terminal tables, the JSON file, regressions against a baseline, targets.

Owns the derived numbers (`add_relative`: added TTFT and throughput against each row's baseline,
`direct` or another direct row such as `direct-chat`, at the same concurrency), the issue-6
targets (`check_targets`, for each gateway row), `--compare` (`find_regressions`: a metric
more than the threshold worse than in the baseline, beyond a small absolute noise floor) and the
printing. The PNG plot is `benchmarks.plot`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LATENCY: tuple[tuple[str, bool, float], ...] = (
    ("ttft_ms.p50", False, 1.0),
    ("ttft_ms.p99", False, 2.0),
    ("added_ttft_ms.p50", False, 0.5),
    ("added_ttft_ms.p95", False, 1.0),
    ("added_ttft_ms.p99", False, 1.0),
    ("requests_per_second", True, 0.0),
    ("proxy_cpu_ms_per_request", False, 0.1),
)
#: Metrics compared against a baseline, per section: (path in the row, higher is better, noise
#: floor in the metric's unit). Emulator rows count chunks; real-model rows count tokens.
COMPARED: dict[str, tuple[tuple[str, bool, float], ...]] = {
    "rows": (*_LATENCY, ("chunks_per_second", True, 0.0)),
    "real_model": (*_LATENCY, ("tokens_per_second", True, 0.0)),
}


def metric(row: dict[str, Any], path: str) -> float | None:
    """Read a dotted metric (`ttft_ms.p50`) from a row; None when absent."""
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            return None
        value = value[part]
    return float(value)


def baseline_of(row: dict[str, Any]) -> str | None:
    """The target a row is measured against; None for a baseline row.

    Rows name it in `baseline` (`benchmarks.servers.Target.baseline`). Rows of runs written before
    that field existed had one baseline, `direct`, for every other row.
    """
    name = row.get("baseline", "direct")
    return None if name == row["target"] else name


def add_relative(rows: list[dict[str, Any]]) -> None:
    """Add `added_ttft_ms`, `added_gap_ms` and `chunks_vs_direct` to rows with a baseline, in place.

    Both are taken against the row's own baseline (`baseline_of`) at the same concurrency:
    `gw-chat` against `direct-chat`, `gateway` against `direct`. The key keeps its name
    `chunks_vs_direct` whatever the baseline is called, so runs stay comparable. A row whose
    baseline did not run gets neither. The share uses tokens/s when the baseline counted
    tokens (real model), else chunks/s.
    """
    baselines = {(row["target"], row["concurrency"]): row for row in rows}
    for row in rows:
        name = baseline_of(row)
        base = None if name is None else baselines.get((name, row["concurrency"]))
        if base is None:
            continue
        row["added_ttft_ms"] = {
            q: None
            if row["ttft_ms"][q] is None or base["ttft_ms"][q] is None
            else row["ttft_ms"][q] - base["ttft_ms"][q]
            for q in ("p50", "p95", "p99")
        }
        gap, base_gap = (row.get("gap_ms") or {}).get("p99"), (base.get("gap_ms") or {}).get("p99")
        row["added_gap_ms"] = {"p99": None if gap is None or base_gap is None else gap - base_gap}
        unit = "tokens_per_second" if base["tokens_per_second"] else "chunks_per_second"
        base_rate, rate = base[unit], row[unit]
        row["chunks_vs_direct"] = rate / base_rate if base_rate else None


@dataclass(frozen=True)
class Regression:
    """A metric worse than in the baseline by more than the threshold."""

    section: str
    target: str
    concurrency: int
    metric: str
    baseline: float
    current: float

    def __str__(self) -> str:
        change = (self.current - self.baseline) / abs(self.baseline) if self.baseline else 0.0
        return (
            f"{self.section}: {self.target} @{self.concurrency} {self.metric}: "
            f"{self.baseline:.2f} -> {self.current:.2f} ({change:+.0%})"
        )


def find_regressions(
    run: dict[str, Any], baseline: dict[str, Any], threshold: float
) -> list[Regression]:
    """Metrics of `run` worse than in `baseline` by more than `threshold` (0.10 = 10 %)."""
    found = []
    for section, compared in COMPARED.items():
        old = {(r["target"], r["concurrency"]): r for r in baseline.get(section) or []}
        for row in run.get(section) or []:
            before = old.get((row["target"], row["concurrency"]))
            if before is None:
                continue
            for path, higher_better, floor in compared:
                now, then = metric(row, path), metric(before, path)
                if now is None or then is None:
                    continue
                worse = then - now if higher_better else now - then
                if worse > max(threshold * abs(then), floor):
                    found.append(
                        Regression(section, row["target"], row["concurrency"], path, then, now)
                    )
    old_mem = (baseline.get("idle_memory") or {}).get("kib_per_stream")
    new_mem = (run.get("idle_memory") or {}).get("kib_per_stream")
    if (
        old_mem is not None
        and new_mem is not None
        and new_mem - old_mem > max(threshold * abs(old_mem), 2.0)
    ):
        found.append(Regression("idle_memory", "gateway", 0, "kib_per_stream", old_mem, new_mem))
    return found


GATEWAY_ROWS = ("gateway", "gw-chat", "gw-sse", "gw-responses", "gw-messages")
"""The rows the targets apply to: one per client surface (`/v1/generate`, `/api/chat`,
`/v1/chat/completions`, `/v1/responses`, `/v1/messages`)."""


def check_targets(run: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The issue-6 targets: (goal, what was measured, met?); None when not measured.

    The latency, throughput and CPU targets are checked for every gateway row of the run
    (`GATEWAY_ROWS`; `gateway` always, as "not run" when it is absent), each against its own
    baseline; idle memory is measured on `/v1/generate` only.
    """
    rows = {(r["target"], r["concurrency"]): r for r in run["rows"]}
    present = {r["target"] for r in run["rows"]}
    checks: list[tuple[str, str, bool | None]] = []
    for name in GATEWAY_ROWS:
        if name != "gateway" and name not in present:
            continue
        checks += _row_targets(name, rows)
    kib = (run.get("idle_memory") or {}).get("kib_per_stream")
    checks.append(
        (
            "gateway RSS < 64 KiB per idle stream",
            "not run" if kib is None else f"{kib:.1f} KiB",
            None if kib is None else kib < 64.0,
        )
    )
    return checks


def _row_targets(
    name: str, rows: dict[tuple[str, int], dict[str, Any]]
) -> list[tuple[str, str, bool | None]]:
    """Added TTFT @1/16/64, chunks/s @64 and CPU @16 of one gateway row."""
    base = next((baseline_of(row) for (target, _), row in rows.items() if target == name), None)
    against = base or "direct"
    checks: list[tuple[str, str, bool | None]] = []
    for n in (1, 16, 64):
        goal = f"{name}: added TTFT @{n}: p50 <= 1 ms, p99 <= 5 ms"
        added = (rows.get((name, n)) or {}).get("added_ttft_ms") or {}
        p50, p99 = added.get("p50"), added.get("p99")
        if p50 is None or p99 is None:
            checks.append((goal, "not run", None))
            continue
        met = p50 <= 1.0 and p99 <= 5.0
        checks.append((goal, f"p50 {p50:+.2f}, p99 {p99:+.2f}", met))
    ratio = (rows.get((name, 64)) or {}).get("chunks_vs_direct")
    checks.append(
        (
            f"{name}: chunks/s @64 >= 95 % of {against}",
            "not run" if ratio is None else f"{ratio:.1%}",
            None if ratio is None else ratio >= 0.95,
        )
    )
    cpu = (rows.get((name, 16)) or {}).get("proxy_cpu_ms_per_request")
    checks.append(
        (
            f"{name}: CPU @16 <= 5 ms/request",
            "not run" if cpu is None else f"{cpu:.2f} ms",
            None if cpu is None else cpu <= 5.0,
        )
    )
    return checks


def check_speed_targets(run: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issue 27's targets for the run's `--preset` (`today` or `100x`); [] without one.

    `today` (TTFT 50 ms, 10 ms a token, 64 tokens): every gateway row's CPU per request at 16
    and 64 streams at most twice nginx's at the same level; at 256 streams at least 95 % of its
    baseline's chunks/s and added TTFT p50 at most 5 ms. `100x` (TTFT 5 ms, 0.2 ms a token, 256
    tokens): at 16 streams at least 95 % of the chunks/s and added TTFT p50 at most 1 ms; at one
    stream added TTFT p50 at most 0.5 ms.
    """
    preset = run.get("meta", {}).get("preset")
    rows = {(r["target"], r["concurrency"]): r for r in run["rows"]}
    names = [name for name in GATEWAY_ROWS if any(target == name for target, _ in rows)]
    checks: list[tuple[str, str, bool | None]] = []
    for name in names:
        if preset == "today":
            for n in (16, 64):
                cpu = (rows.get((name, n)) or {}).get("proxy_cpu_ms_per_request")
                nginx = (rows.get(("nginx", n)) or {}).get("proxy_cpu_ms_per_request")
                goal = f"{name}: CPU/request @{n} <= 2x nginx's"
                if cpu is None or not nginx:
                    checks.append((goal, "not run", None))
                else:
                    checks.append((goal, f"{cpu / nginx:.2f}x", cpu <= 2 * nginx))
            checks += _pace_targets(name, rows, 256, share=0.95, added_p50=5.0)
        elif preset == "100x":
            checks += _pace_targets(name, rows, 16, share=0.95, added_p50=1.0)
            checks += _pace_targets(name, rows, 1, share=None, added_p50=0.5)
    return checks


def _pace_targets(
    name: str,
    rows: dict[tuple[str, int], dict[str, Any]],
    n: int,
    *,
    share: float | None,
    added_p50: float,
) -> list[tuple[str, str, bool | None]]:
    """Chunks/s against the baseline (unless `share` is None) and added TTFT p50 at `n`."""
    row = rows.get((name, n)) or {}
    checks: list[tuple[str, str, bool | None]] = []
    if share is not None:
        ratio = row.get("chunks_vs_direct")
        checks.append(
            (
                f"{name}: chunks/s @{n} >= {share:.0%} of its baseline",
                "not run" if ratio is None else f"{ratio:.1%}",
                None if ratio is None else ratio >= share,
            )
        )
    added = (row.get("added_ttft_ms") or {}).get("p50")
    checks.append(
        (
            f"{name}: added TTFT p50 @{n} <= {added_p50:g} ms",
            "not run" if added is None else f"{added:+.2f} ms",
            None if added is None else added <= added_p50,
        )
    )
    return checks


def _fmt(value: float | None, spec: str = ".1f", signed: bool = False) -> str:
    if value is None:
        return "-"
    return format(value, ("+" if signed else "") + spec)


def _table(header: list[str], lines: Iterable[list[str]]) -> None:
    rows = [header, *lines]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))


def _flag(flags: set[tuple[str, int, str]], row: dict[str, Any], path: str, text: str) -> str:
    return text + ("!" if (row["target"], row["concurrency"], path) in flags else "")


def print_sweep(rows: list[dict[str, Any]], regressions: list[Regression]) -> None:
    """The emulator sweep table; `!` marks a regression against the baseline."""
    flags = {(r.target, r.concurrency, r.metric) for r in regressions if r.section == "rows"}
    header = ["target", "conc", "req/s", "chunks/s", "vs dir", "TTFT p50", "p95", "p99"]
    header += ["+p50", "+p95", "+p99", "gap p99", "+gap", "held", "cpu ms/req", "proxy%"]
    header += ["up%", "load%", "err"]
    lines = []
    for row in rows:
        ttft, added = row["ttft_ms"], row.get("added_ttft_ms") or {}

        def cell(path: str, value: float | None, spec: str = ".1f", signed: bool = False) -> str:
            return _flag(flags, row, path, _fmt(value, spec, signed))  # noqa: B023

        share = row.get("proxy_cpu_share")
        lines.append(
            [
                row["target"],
                str(row["concurrency"]),
                cell("requests_per_second", row["requests_per_second"]),
                cell("chunks_per_second", row["chunks_per_second"], ".0f"),
                _fmt(row.get("chunks_vs_direct"), ".1%"),
                cell("ttft_ms.p50", ttft["p50"], ".2f"),
                cell("ttft_ms.p95", ttft["p95"], ".2f"),
                cell("ttft_ms.p99", ttft["p99"], ".2f"),
                cell("added_ttft_ms.p50", added.get("p50"), ".2f", True),
                cell("added_ttft_ms.p95", added.get("p95"), ".2f", True),
                cell("added_ttft_ms.p99", added.get("p99"), ".2f", True),
                _fmt((row.get("gap_ms") or {}).get("p99"), ".2f"),
                _fmt((row.get("added_gap_ms") or {}).get("p99"), ".2f", True),
                _held(row),
                cell("proxy_cpu_ms_per_request", row["proxy_cpu_ms_per_request"], ".2f"),
                _fmt(None if share is None else share * 100, ".0f"),
                _fmt(row["upstream_cpu_share"] * 100, ".0f"),
                _fmt(row["load_cpu_share"] * 100, ".0f"),
                str(row["errors"]),
            ]
        )
    _table(header, lines)


def _held(row: dict[str, Any]) -> str:
    """`held/judged` answers (the open rig's streams sustained), or `-` when not judged."""
    if not row.get("judged"):
        return "-"
    return f"{row['held']}/{row['judged']}"


def print_real_model(rows: list[dict[str, Any]]) -> None:
    """The real-model table: TTFT, tokens/s, decode rate per stream, tokens per answer."""
    header = ["target", "conc", "req/s", "tokens/s", "vs dir", "TTFT p50", "p95", "+p50"]
    header += ["decode tok/s p50", "tokens/answer", "cpu ms/req", "err"]
    lines = [
        [
            row["target"],
            str(row["concurrency"]),
            _fmt(row["requests_per_second"], ".2f"),
            _fmt(row["tokens_per_second"], ".1f"),
            _fmt(row.get("chunks_vs_direct"), ".1%"),
            _fmt(row["ttft_ms"]["p50"], ".1f"),
            _fmt(row["ttft_ms"]["p95"], ".1f"),
            _fmt((row.get("added_ttft_ms") or {}).get("p50"), ".1f", True),
            _fmt(row.get("decode_tokens_per_second_p50"), ".1f"),
            _fmt(row.get("tokens_per_request_p50"), ".0f"),
            _fmt(row["proxy_cpu_ms_per_request"], ".2f"),
            str(row["errors"]),
        ]
        for row in rows
    ]
    _table(header, lines)


def print_run(run: dict[str, Any], regressions: list[Regression]) -> None:
    """Everything: sweep, idle memory, real model, targets, regressions, notes."""
    print()
    print("Emulator sweep (ms; chunks = NDJSON lines or SSE data events but [DONE], for")
    print("/v1/responses and /v1/messages the events carrying a delta and the last event;")
    print("cpu ms/req = proxy CPU per request; proxy/up/load % = share of one core used by the")
    print("proxy, the emulator, the load generator; vs dir and +p50.. against the row's baseline)")
    others = {
        row["target"]: baseline_of(row)
        for row in run["rows"]
        if baseline_of(row) not in (None, "direct")
    }
    if others:
        print("baselines: " + ", ".join(f"{name} vs {base}" for name, base in others.items()))
    print_sweep(run["rows"], regressions)
    memory = run.get("idle_memory")
    if memory:
        print(
            f"\nIdle streams: {memory['ready']}/{memory['streams']} open, gateway RSS "
            f"{memory['rss_baseline_kib']} -> {memory['rss_loaded_kib']} KiB: "
            f"{_fmt(memory['kib_per_stream'])} KiB per stream"
        )
    if run.get("real_model"):
        print("\nReal model (llama-cpp-python; tokens/s over the whole run)")
        print_real_model(run["real_model"])
    print("\nIssue 6 targets (each gateway row against its baseline)")
    for goal, measured, met in check_targets(run):
        verdict = {True: "met", False: "MISSED", None: "-"}[met]
        print(f"  {verdict:6}  {goal}: {measured}")
    speed = check_speed_targets(run)
    if speed:
        print(f"\nIssue 27 targets (--preset {run['meta']['preset']})")
        for goal, measured, met in speed:
            verdict = {True: "met", False: "MISSED", None: "-"}[met]
            print(f"  {verdict:6}  {goal}: {measured}")
    for note in run.get("notes", []):
        print(f"note: {note}")
    if regressions:
        print(f"\n{len(regressions)} regression(s) against the baseline (marked !):")
        for regression in regressions:
            print(f"  {regression}")


def write_json(run: dict[str, Any], path: Path) -> None:
    """Write the run as indented JSON (creating the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=2) + "\n")

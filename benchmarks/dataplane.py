# ruff: noqa: T201 (a benchmark prints its progress and table)
"""`python -m benchmarks.dataplane`: can a Python data plane cost at most 2x nginx's CPU?

Issue 27 asks the gateway's CPU per streamed request to be at most twice nginx's at 16 and 64
streams, today's speed. The gateway costs about 1.8 times the floor relay (`benchmarks.floor`:
uvicorn + aiohttp, no gateway work), and the floor alone about 1.6-3 times nginx, so no trimming
of the gateway's own code can get there on that stack. This benchmark measures bare relays of
other architectures (`benchmarks.relays`), side by side in one run with nginx and direct:

| row | architecture |
|---|---|
| `floor` (a) | uvicorn (httptools) + aiohttp client, uvloop: `benchmarks.floor`, as today |
| `floor/asyncio` (e) | the same on the standard library's event loop |
| `uvicorn-raw` (b) | uvicorn ASGI + a raw asyncio Protocol upstream client (httptools) |
| `uvicorn-raw/asyncio` (e) | the same on the standard library's event loop |
| `protocols` (c) | asyncio Protocols on both legs, no ASGI, no coroutine per chunk |
| `protocols/asyncio` (e) | the same on the standard library's event loop |
| `granian-rsgi` (d) | granian (Rust server, PyPI wheel), RSGI, the raw upstream client |
| `granian-asgi` (d) | granian with ASGI, the app of `uvicorn-raw` |
| `protocols-sse` | c plus the gateway's per-chunk SSE translation (`/api/chat` to OpenAI) |
| `protocols-sse-orjson` | the same translation with orjson (Rust, the dev lock) for `json` |
| `gateway`, `gw-sse` | `gateway serve` as shipped, `/v1/generate` and `/v1/chat/completions` |

Each relay runs as its own process in front of one emulator (TTFT 50 ms, 10 ms a token, 64
tokens: 65 chunks an answer, NDJSON lines or SSE events); nginx (one worker, `proxy_buffering off`,
`benchmarks.servers`) is the reference. A round runs every row once at every level (16 and 64
streams, `--per-stream` answers per stream), the row order rotated from round to round so that
a neighbour's burst does not always land on the same row. A row's CPU is its processes'
user + system seconds from /proc over the requests it completed (`benchmarks.measure`); the
table gives the least and the median over the rounds and their ratio to nginx's, and the
median of the per-round ratios (row over nginx in the same round, which cancels most of
what other work on the machine adds). Every run must complete all its requests with no error
and deliver exactly 65 chunks an answer, as direct does: a relay that dropped or merged lines
would be cheaper and wrong.

granian is not in the project's lock: the granian rows run from a scratch virtualenv
(`--granian PATH/TO/granian`; the default looks beside this interpreter and on `PATH`) with
this tree on `PYTHONPATH`, and are skipped with a note when there is none. Make one with
`python3.11 -m venv /tmp/dp-venv && /tmp/dp-venv/bin/pip install granian uvloop httptools`.

The default (5 rounds, 12 answers a stream, 14 rows, 2 levels) takes about 23 minutes on 2
cores; `--quick` (1 round, 16 streams, 4 answers a stream, the relays but the SSE ones) about
one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks.gateway import BODY, CHAT_BODY, _commit, _machine
from benchmarks.measure import LoadPlan, measure
from benchmarks.procstat import children, load_average
from benchmarks.relays import UPSTREAM_ENV
from benchmarks.servers import (
    Target,
    emulator_process,
    floor_process,
    gateway_with_key,
    nginx_binary,
    nginx_process,
)
from gateway.testing.stack import ManagedProcess, free_port

PROFILE = {"ttft": 0.05, "inter_token": 0.01, "tokens": 64}
"""Today's speed (issue 27's standard profile): the emulator's timing."""

LINES_PER_ANSWER = PROFILE["tokens"] + 1
"""NDJSON lines the emulator sends per answer: one per token and the `done` line."""

TARGET_RATIO = 2.0
"""Issue 27: CPU per request at most twice nginx's."""

ROOT = Path(__file__).resolve().parents[1]


def _relay(workdir: Path, name: str, argv: list[str], env: dict[str, str]) -> ManagedProcess:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [arg.replace("{port}", str(port)) for arg in argv]
    log = workdir / f"{name.replace('/', '-')}.log"
    return ManagedProcess(
        name, argv, url, f"{url}/api/version", env=env, log_path=log, start_timeout=30.0
    )


RELAYS = {
    "floor": ("benchmarks.floor",),
    "floor/asyncio": ("floor", "asyncio"),
    "uvicorn-raw": ("uvicorn-raw", "uvloop"),
    "uvicorn-raw/asyncio": ("uvicorn-raw", "asyncio"),
    "protocols": ("protocols", "uvloop"),
    "protocols/asyncio": ("protocols", "asyncio"),
    "protocols-sse": ("protocols-sse", "uvloop"),
    "protocols-sse-orjson": ("protocols-sse-orjson", "uvloop"),
    "granian-rsgi": ("granian", "rsgi"),
    "granian-asgi": ("granian", "asgi"),
}
"""Row name: how `benchmarks.relays` serves it (variant and event loop, or granian's interface)."""

GATEWAY_ROWS = ("gateway", "gw-sse")
"""The gateway as shipped: `/v1/generate` (NDJSON) and `/v1/chat/completions` (SSE)."""

SSE_ROWS = ("protocols-sse", "protocols-sse-orjson", "gw-sse")
"""Rows asked `/api/chat`'s body that answer OpenAI SSE: 64 delta events and the finish event."""


def relay_process(
    workdir: Path, name: str, upstream: str, granian: str | None
) -> ManagedProcess | None:
    """Row `name`'s relay (`RELAYS`) as an unstarted process; None for granian without one."""
    how = RELAYS[name]
    if how[0] == "benchmarks.floor":
        return floor_process(workdir, upstream)
    if how[0] == "granian":
        if granian is None:
            return None
        argv = [granian, "--interface", how[1], "--factory", "--host", "127.0.0.1"]
        argv += ["--port", "{port}", "--workers", "1", "--runtime-mode", "st"]
        argv += ["--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning"]
        argv += ["--no-access-log", "--working-dir", str(ROOT)]
        argv.append(f"benchmarks.relays:granian_{how[1]}")
        env = {"PYTHONPATH": str(ROOT), UPSTREAM_ENV: upstream}
        return _relay(workdir, name, argv, env)
    argv = [sys.executable, "-m", "benchmarks.relays", how[0], "--port", "{port}"]
    argv += ["--upstream", upstream, "--loop", how[1]]
    return _relay(workdir, name, argv, {})


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it (nginx's worker, granian's worker)."""
    found = [pid]
    for child in children(pid):
        found += descendants(child)
    return found


def find_granian(given: str | None) -> str | None:
    """The granian executable: `given`, beside this interpreter, or on PATH; else None."""
    if given:
        return given
    beside = Path(sys.executable).parent / "granian"
    return str(beside) if beside.exists() else shutil.which("granian")


def start_targets(
    stack: ExitStack, workdir: Path, args: argparse.Namespace, notes: list[str]
) -> tuple[list[Target], int]:
    """Start the emulator and every row's process on `stack`; the targets and the emulator pid."""
    emulator = stack.enter_context(emulator_process(workdir, **PROFILE))  # type: ignore[arg-type]
    assert emulator.process is not None  # noqa: S101 - started
    targets = [Target("direct", emulator.url, "/api/generate", BODY, baseline=None)]
    binary = nginx_binary()
    if binary is None:
        raise SystemExit("nginx is not installed (apt-get install -y nginx): it is the reference")
    port = int(emulator.url.rsplit(":", 1)[1])
    nginx = stack.enter_context(nginx_process(workdir, binary, port))
    assert nginx.process is not None  # noqa: S101
    targets.append(
        Target(
            "nginx", nginx.url, "/api/generate", BODY, pids=tuple(descendants(nginx.process.pid))
        )
    )
    granian = find_granian(args.granian)
    rows = args.rows or [*RELAYS, *GATEWAY_ROWS]
    if granian is None and any(RELAYS.get(row, ("",))[0] == "granian" for row in rows):
        notes.append("granian rows skipped: no granian executable (see --granian)")
    for name in (row for row in RELAYS if row in rows):
        relay = relay_process(workdir, name, emulator.url, granian)
        if relay is None:
            continue
        stack.enter_context(relay)
        assert relay.process is not None  # noqa: S101
        pids = tuple(descendants(relay.process.pid))
        path, body = ("/api/chat", CHAT_BODY) if name in SSE_ROWS else ("/api/generate", BODY)
        targets.append(Target(name, relay.url, path, body, sse=name in SSE_ROWS, pids=pids))
    if any(row in GATEWAY_ROWS for row in rows):
        gateway, key = gateway_with_key(workdir / "gateway", emulator.url)
        stack.enter_context(gateway)
        assert gateway.process is not None  # noqa: S101
        pids = (gateway.process.pid,)
        if "gateway" in rows:
            targets.append(Target("gateway", gateway.url, "/v1/generate", BODY, key=key, pids=pids))
        if "gw-sse" in rows:
            path = "/v1/chat/completions"
            sse = Target("gw-sse", gateway.url, path, CHAT_BODY, key=key, sse=True, pids=pids)
            targets.append(sse)
    return targets, emulator.process.pid


def run_rounds(
    targets: list[Target], levels: list[int], per_stream: int, rounds: int, emulator_pid: int
) -> list[dict[str, Any]]:
    """Measure every target at every level, `rounds` times; every run's row, tagged by round."""
    for target in targets:  # connections, caches and lazy imports before measuring
        measure(target, 4, LoadPlan(warmup=0.0, requests=16), None)
    runs = []
    for number in range(rounds):
        shift = number % len(targets)
        order = targets[shift:] + targets[:shift]
        for level in levels:
            plan = LoadPlan(warmup=0.0, requests=level * per_stream)
            for target in order:
                print(
                    f"  round {number + 1}/{rounds}: {target.name} @{level}",
                    file=sys.stderr,
                    flush=True,
                )
                row = measure(target, level, plan, emulator_pid)
                row["round"] = number
                row["expected_requests"] = level * per_stream
                runs.append(row)
    return runs


def delivery_problems(runs: list[dict[str, Any]]) -> list[str]:
    """Runs that lost a request, had an error, or did not deliver every line of every answer."""
    problems = []
    for row in runs:
        where = f"{row['target']} @{row['concurrency']} round {row['round'] + 1}"
        expected = row["expected_requests"]
        if row["errors"] or row["completed"] != expected:
            problems.append(
                f"{where}: {row['completed']}/{expected} completed, {row['errors']} errors "
                f"{row['error_examples'][:1]}"
            )
        if row["chunks"] != row["completed"] * LINES_PER_ANSWER:
            problems.append(f"{where}: {row['chunks']} lines for {row['completed']} answers")
    return problems


def table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per row and level: CPU ms per request least and median, ratios to nginx."""
    by: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in runs:
        by.setdefault((row["target"], row["concurrency"]), []).append(row)
    lines = []
    for (name, level), rows in by.items():
        if name == "direct":
            continue
        cpu = [r["proxy_cpu_ms_per_request"] for r in rows]
        nginx = {r["round"]: r["proxy_cpu_ms_per_request"] for r in by[("nginx", level)]}
        direct = by[("direct", level)]
        per_round = [r["proxy_cpu_ms_per_request"] / nginx[r["round"]] for r in rows]
        lines.append(
            {
                "row": name,
                "streams": level,
                "cpu_ms_least": min(cpu),
                "cpu_ms_median": median(cpu),
                "x_nginx_least": min(cpu) / min(nginx.values()),
                "x_nginx_median": median(cpu) / median(nginx.values()),
                "x_nginx_per_round_median": median(per_round),
                "chunks_vs_direct": median(r["chunks_per_second"] for r in rows)
                / median(r["chunks_per_second"] for r in direct),
                "added_ttft_p50_ms": median(r["ttft_ms"]["p50"] for r in rows)
                - median(r["ttft_ms"]["p50"] for r in direct),
                "lines": sum(r["chunks"] for r in rows),
                "answers": sum(r["completed"] for r in rows),
                "rounds_cpu_ms": [round(c, 3) for c in cpu],
            }
        )
    return sorted(lines, key=lambda line: (line["streams"], line["cpu_ms_median"]))


COLUMNS = (
    "row",
    "streams",
    "CPU ms/req least",
    "median",
    "x nginx: least",
    "median",
    "per-round median",
    "chunks/s vs direct",
    "added TTFT p50 ms",
    "lines / answers",
)


def print_table(lines: list[dict[str, Any]]) -> None:
    """The markdown table docs/performance.md quotes; ratios within `TARGET_RATIO` in bold."""
    print("| " + " | ".join(COLUMNS) + " |")
    print("|---|" + "--:|" * (len(COLUMNS) - 1))
    for line in lines:
        ratios = []
        for key in ("x_nginx_least", "x_nginx_median", "x_nginx_per_round_median"):
            mark = "**" if line[key] <= TARGET_RATIO else ""
            ratios.append(f"{mark}{line[key]:.2f}{mark}")
        cells = [
            line["row"],
            str(line["streams"]),
            f"{line['cpu_ms_least']:.2f}",
            f"{line['cpu_ms_median']:.2f}",
            *ratios,
            f"{line['chunks_vs_direct']:.1%}",
            f"{line['added_ttft_p50_ms']:+.1f}",
            f"{line['lines']:,} / {line['answers']:,}",
        ]
        print("| " + " | ".join(cells) + " |")


def build_parser() -> argparse.ArgumentParser:
    """The `python -m benchmarks.dataplane` arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dataplane",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every row (default 5)")
    parser.add_argument("--levels", default="16,64", help="concurrent streams (default 16,64)")
    parser.add_argument(
        "--per-stream", type=int, default=12, help="answers per stream a run (default 12)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 round, 16 streams, 4 answers a stream, no gateway rows",
    )
    parser.add_argument("--granian", help="granian executable (a scratch virtualenv's)")
    parser.add_argument(
        "--rows",
        type=lambda text: text.split(","),
        help="only these rows besides direct and nginx (default: all): "
        + ", ".join([*RELAYS, *GATEWAY_ROWS]),
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/dataplane.json"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rounds, print the table; exit 1 when a run lost requests or lines."""
    args = build_parser().parse_args(argv)
    if args.quick:
        args.rounds, args.levels, args.per_stream = 1, "16", 4
        args.rows = args.rows or [row for row in RELAYS if not row.startswith("protocols-sse")]
    unknown = set(args.rows or ()) - {*RELAYS, *GATEWAY_ROWS}
    if unknown:
        build_parser().error(f"unknown rows: {', '.join(sorted(unknown))}")
    levels = [int(level) for level in args.levels.split(",")]
    notes: list[str] = []
    started = datetime.now(UTC)
    loads = [load_average()]
    with tempfile.TemporaryDirectory(prefix="dataplane-") as tmp, ExitStack() as stack:
        targets, emulator_pid = start_targets(stack, Path(tmp), args, notes)
        runs = run_rounds(targets, levels, args.per_stream, args.rounds, emulator_pid)
    loads.append(load_average())
    loads += [row["load_average_before"] for row in runs]
    lines = table(runs)
    problems = delivery_problems(runs)
    run = {
        "meta": {
            "date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": round((datetime.now(UTC) - started).total_seconds(), 1),
            "machine": _machine(),
            "commit": _commit(),
            "command": "python -m benchmarks.dataplane " + " ".join(argv or sys.argv[1:]),
            "profile": PROFILE,
            "rounds": args.rounds,
            "per_stream": args.per_stream,
            "load_average_1min": {"min": min(loads), "max": max(loads), "median": median(loads)},
        },
        "notes": notes,
        "problems": problems,
        "table": lines,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(run, indent=2) + "\n")
    print(
        f"\n{args.rounds} rounds, {run['meta']['seconds']} s; 1-min load average "
        f"{min(loads):.2f}-{max(loads):.2f} (median {median(loads):.2f}); json: {args.out}\n"
    )
    print_table(lines)
    for note in notes:
        print(f"note: {note}")
    for problem in problems:
        print(f"LOST: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

# ruff: noqa: T201 (a gate prints its table and verdict)
"""`python -m benchmarks.gate`: fail when the gateway's CPU per request grows (issue 27's gate).

Measures the standard profile (today's speed: the emulator's TTFT 50 ms, 10 ms per token, 64
tokens; 16 streams) through the gateway as shipped (a real key with limits, metrics, the
access log) on `/v1/generate`, `/api/chat` and `/v1/chat/completions`, and through the floor
relay (`benchmarks.floor`: bare uvicorn + aiohttp, no gateway code), in `--rounds` rounds that
each run every row once, one after the other. A row's figure is its least CPU per request over
the rounds divided by the floor's least (`benchmarks.measure`: the proxy process's CPU seconds
over the requests it completed): the ratio cancels the VM's speed, and the least of several
rounds leaves out most of what a busy neighbour adds (interference only ever adds CPU). It is
compared with the committed baseline (`benchmarks/baselines/cpu-gate.json`). A slowdown that
costs no CPU (a sleep, a lock, streams served one after another) would pass that, so each row
must also keep pace with the floor: its best chunks/s over the rounds at least `MIN_PACE` of
the floor's best, and its best TTFT p50 at most `MAX_ADDED_TTFT_MS` above the floor's.

Exit status: 0 when every row's ratio is within `--threshold` (default 20 %) of its baseline,
1 when one grew more in every attempt (the table says which), 2 on a usage error or a missing
baseline. `--update` measures and writes the baseline instead (commit it with the change that
moved it, and say why in the commit). CI runs the gate after the static checks (`.ci/run`); it
takes about three minutes on 2 cores, six when an attempt is repeated. On an idle 2-core VM
four runs of the same commit gave ratios within 9 % of each other (the baseline file keeps
them, and is their median).

What it does not catch: a cost that grows the floor's as much (a library both use), TTFT and
throughput (the full benchmark, `python -m benchmarks.gateway`, measures those side by side with
nginx), and changes smaller than the threshold, which the round-to-round spread (a few percent
on an idle machine) would hide.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.gateway import BODY, CHAT_BODY, _commit, _machine
from benchmarks.measure import LoadPlan, measure
from benchmarks.servers import Target, emulator_process, floor_process, gateway_with_key

BASELINE = Path(__file__).parent / "baselines" / "cpu-gate.json"
"""The committed ratios the gate compares with."""

PROFILE = {"ttft": 0.05, "inter_token": 0.01, "tokens": 64}
"""Today's speed (issue 27's standard profile): the emulator's timing."""

STREAMS = 16
"""Concurrent streams of every run."""

REQUESTS = 128
"""Requests per run: 8 answers per stream, about 5.6 s at the profile's pace."""

MIN_PACE = 0.85
"""A row's best chunks/s over the floor's best, at least (the gateway's is 0.99 at 16 streams)."""

MAX_ADDED_TTFT_MS = 25.0
"""A row's best TTFT p50 over the floor's best, at most (the gateway adds about 3 ms)."""


def _targets(gateway_url: str, key: str, gateway_pid: int, floor_url: str, floor_pid: int):
    """The floor row and the gateway's rows, in the order each round runs them."""
    gateway = {"key": key, "pids": (gateway_pid,)}
    return [
        Target("floor", floor_url, "/api/generate", BODY, pids=(floor_pid,)),
        Target("gateway", gateway_url, "/v1/generate", BODY, **gateway),  # type: ignore[arg-type]
        Target("gw-chat", gateway_url, "/api/chat", CHAT_BODY, **gateway),  # type: ignore[arg-type]
        Target(
            "gw-sse",
            gateway_url,
            "/v1/chat/completions",
            CHAT_BODY,
            sse=True,
            **gateway,  # type: ignore[arg-type]
        ),
    ]


def run_rounds(
    rounds: int, workdir: Path
) -> tuple[dict[str, list[float]], dict[str, list[tuple[float, float]]]]:
    """Start the emulator, the floor relay and a gateway; measure every row `rounds` times.

    Returns:
        `{row: [CPU ms per request, one per round]}` and `{row: [(chunks/s, TTFT p50 ms),
        one per round]}`, the floor included in both.

    Raises:
        RuntimeError: a row had errors (a gate over failed requests would measure nothing).
    """
    cpu: dict[str, list[float]] = {}
    pace: dict[str, list[tuple[float, float]]] = {}
    with ExitStack() as stack:
        emulator = stack.enter_context(emulator_process(workdir, **PROFILE))  # type: ignore[arg-type]
        gateway, key = gateway_with_key(workdir / "gateway", emulator.url)
        stack.enter_context(gateway)
        floor = stack.enter_context(floor_process(workdir, emulator.url))
        assert gateway.process is not None  # noqa: S101 - started
        assert floor.process is not None  # noqa: S101 - started
        targets = _targets(gateway.url, key, gateway.process.pid, floor.url, floor.process.pid)
        for target in targets:  # connections, caches and lazy imports before measuring
            measure(target, 4, LoadPlan(warmup=0.0, requests=16), None)
        plan = LoadPlan(warmup=0.0, requests=REQUESTS)
        for number in range(rounds):
            print(f"  round {number + 1}/{rounds} ...", file=sys.stderr, flush=True)
            this_round = {}
            for target in targets:
                row = measure(target, STREAMS, plan, None)
                if row["errors"]:
                    raise RuntimeError(
                        f"{target.name}: {row['errors']} errors: {row['error_examples']}"
                    )
                this_round[target.name] = float(row["proxy_cpu_ms_per_request"])
                ttft = row["ttft_ms"]["p50"]
                pace.setdefault(target.name, []).append(
                    (float(row["chunks_per_second"]), float("inf") if ttft is None else ttft)
                )
            for name, value in this_round.items():
                cpu.setdefault(name, []).append(value)
    return cpu, pace


def pace_problems(pace: dict[str, list[tuple[float, float]]]) -> list[str]:
    """The rows that fell behind the floor's pace (module docstring), each with why."""
    floor_chunks = max(chunks for chunks, _ in pace["floor"])
    floor_ttft = min(ttft for _, ttft in pace["floor"])
    problems = []
    for name, runs in pace.items():
        if name == "floor":
            continue
        chunks = max(c for c, _ in runs)
        ttft = min(t for _, t in runs)
        if chunks < MIN_PACE * floor_chunks:
            problems.append(f"{name}: {chunks:.0f} chunks/s, the floor {floor_chunks:.0f}")
        if ttft - floor_ttft > MAX_ADDED_TTFT_MS:
            problems.append(f"{name}: TTFT p50 {ttft:.1f} ms, the floor {floor_ttft:.1f} ms")
    return problems


def verdict(
    ratios: dict[str, float], baseline: dict[str, float], threshold: float
) -> list[tuple[str, float, float | None, bool]]:
    """Each row: (name, ratio now, the baseline's or None, within the threshold).

    A row the baseline lacks passes (a new row: `--update` adds it).
    """
    rows = []
    for name, now in ratios.items():
        then = baseline.get(name)
        rows.append((name, now, then, then is None or now <= then * (1 + threshold)))
    return rows


def ratios_of(cpu: dict[str, list[float]]) -> dict[str, float]:
    """Each gateway row's least CPU per request over the floor's least (module docstring)."""
    floor = min(cpu["floor"])
    return {name: min(values) / floor for name, values in cpu.items() if name != "floor"}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure; compare with (or with `--update`, write) the baseline."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gate", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every row (default 5)")
    parser.add_argument(
        "--threshold", type=float, default=0.20, help="allowed growth of a ratio (default 0.20)"
    )
    parser.add_argument(
        "--attempts", type=int, default=2, help="measurements before a failure counts (default 2)"
    )
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--update", action="store_true", help="write the baseline instead")
    parser.add_argument("--out", type=Path, help="also write the last run's figures here (JSON)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.attempts < 1:
        parser.error("--rounds and --attempts must be at least 1")
    baseline: dict[str, Any] = {}
    if not args.update:
        if not args.baseline.exists():
            print(f"gate: no baseline at {args.baseline} (make one with --update)", file=sys.stderr)
            return 2
        baseline = json.loads(args.baseline.read_text())
    attempt = 0
    while True:
        attempt += 1
        with tempfile.TemporaryDirectory(prefix="gateway-gate-") as tmp:
            cpu, pace = run_rounds(args.rounds, Path(tmp))
        ratios = ratios_of(cpu)
        slow = pace_problems(pace)
        run = {
            "profile": {**PROFILE, "streams": STREAMS, "requests": REQUESTS, "rounds": args.rounds},
            "ratio": {name: round(value, 3) for name, value in ratios.items()},
            "cpu_ms_per_request": {name: round(min(values), 3) for name, values in cpu.items()},
            "rounds_cpu_ms": {name: [round(v, 3) for v in values] for name, values in cpu.items()},
            "commit": _commit(),
            "machine": _machine(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if args.out is not None:
            args.out.write_text(json.dumps(run, indent=2) + "\n")
        floor_ms = run["cpu_ms_per_request"]["floor"]
        print(f"CPU per request over the floor relay's ({floor_ms:.2f} ms), least of {args.rounds}")
        if args.update:
            args.baseline.parent.mkdir(parents=True, exist_ok=True)
            args.baseline.write_text(json.dumps(run, indent=2) + "\n")
            for name, value in ratios.items():
                print(f"  {name:8s} {value:5.2f}  ({run['cpu_ms_per_request'][name]:.2f} ms)")
            print(f"baseline written: {args.baseline}")
            return 0
        rows = verdict(ratios, baseline["ratio"], args.threshold)
        for name, now, then, fine in rows:
            was = "new" if then is None else f"{then:5.2f}"
            mark = "ok" if fine else f"GREW more than {args.threshold:.0%}"
            ms = run["cpu_ms_per_request"][name]
            print(f"  {name:8s} {now:5.2f} (baseline {was}; {ms:.2f} ms)  {mark}")
        for problem in slow:
            print(f"  behind the floor's pace: {problem}")
        if all(fine for *_, fine in rows) and not slow:
            return 0
        if attempt >= args.attempts:
            break
        print(
            f"gate: attempt {attempt} of {args.attempts} failed; measuring again", file=sys.stderr
        )
    print(
        "gate: the gateway's CPU per request grew against the floor relay, or it fell behind "
        "the floor's pace; profile it "
        "(python -m benchmarks.gateway --profile 16) or, if the cost is meant, "
        "python -m benchmarks.gate --update and say why in the commit",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    raise SystemExit(main())

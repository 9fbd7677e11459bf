# ruff: noqa: T201 (a benchmark prints its progress)
"""`python -m benchmarks.batch_isolation`: interactive TTFT while a batch saturates the upstream.

Issue 15's isolation benchmark. The emulator models a GPU server with `--parallel` slots (more
requests queue inside it); the gateway lets that many requests through at once
(`GATEWAY_UPSTREAM_MAX_CONCURRENT`) and keeps `GATEWAY_BATCH_RESERVED_SLOTS` of them for
interactive traffic. The same interactive load, a closed loop of C requests driven by `gateway
bench run` with its own key, is measured in three phases, side by side in one run (and
interleaved when `--rounds` > 1, so a drift of the machine hits every phase alike):

- `alone`: nothing else runs;
- `batch`: a batch through `/v1/batches` whose runner may run `--demand` lines at once, more
  than the upstream has slots: it saturates every slot interactive traffic leaves;
- `loop`: the same demand as a client loop, `--demand` concurrent requests from another key
  (what a team runs today without a batch API), queueing beside interactive traffic.

For each phase and each C it prints TTFT p50 and p99 (client-measured, first token), the p99's
change against `alone`, errors, the batch's lines per second and how many of its lines
interactive requests preempted. Output: a Markdown table on stdout, the raw numbers as JSON with
`--out`. The defaults take about 4 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import MODEL, emulator_process, gateway_env
from gateway.testing.stack import ManagedProcess, create_key, gateway_process

PHASES = ("alone", "batch", "loop")
LIMITS = ("--rpm", "1000000000", "--tpm", "2000000000", "--max-concurrent", "100000")


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.batch_isolation", description=__doc__
    )
    add = parser.add_argument
    add("--levels", default="1,2", help="interactive concurrency levels (default 1,2)")
    add("--duration", type=float, default=20.0, help="seconds per measurement (default 20)")
    add("--rounds", type=int, default=1, help="times each phase is measured, interleaved")
    add("--parallel", type=int, default=4, help="the upstream's slots (default 4)")
    add("--reserve", type=int, default=1, help="GATEWAY_BATCH_RESERVED_SLOTS (default 1)")
    add("--demand", type=int, default=8, help="batch lines (or loop requests) at once (8)")
    add("--ttft", type=float, default=0.1, help="the emulator's prefill seconds (0.1)")
    add("--inter-token", type=float, default=0.01, help="seconds between tokens (0.01)")
    add("--tokens", type=int, default=30, help="tokens per answer (30)")
    add("--out", type=Path, help="also write the rows as JSON here")
    return parser


def _bench_argv(url: str, key_file: Path, concurrency: int, duration: float) -> list[str]:
    return [
        sys.executable, "-m", "gateway", "bench", "run", "--target", url, "--api", "ollama",
        "--key-file", str(key_file), "--model", MODEL.split(":")[0],
        "--concurrency", str(concurrency), "--duration", str(duration),
        "--format", "json", "--no-save", "--quiet", "--no-gpu",
    ]  # fmt: skip


def _interactive(url: str, key_file: Path, concurrency: int, duration: float) -> dict[str, Any]:
    """One `gateway bench run` at `concurrency`; TTFT p50/p99 in ms, requests and errors."""
    done = subprocess.run(  # noqa: S603 - our own command
        _bench_argv(url, key_file, concurrency, duration),
        capture_output=True,
        check=True,
        timeout=duration + 120,
    )
    [repeat] = json.loads(done.stdout)["models"][0]["points"][0]["repeats"]
    ttft = repeat["metrics"]["ttft_seconds"]
    return {
        "requests": repeat["completed"],
        "errors": repeat["errors"],
        "ttft_p50_ms": ttft["p50"] * 1000,
        "ttft_p99_ms": ttft["p99"] * 1000,
    }


def _metric(client: httpx.Client, name: str, **labels: str) -> float:
    """One sample of the gateway's /metrics (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    series = f"{name}{{{want}}}" if want else name
    for line in client.get("/metrics").text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == series:
            return float(value)
    return 0.0


class BatchLoad:
    """A saturating batch on the gateway: created, watched, cancelled (OpenAI Batch API)."""

    def __init__(self, url: str, key: str, lines: int) -> None:
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        self.lines = lines
        self.batch_id = ""

    def __enter__(self) -> BatchLoad:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        content = "".join(
            json.dumps(
                {
                    "custom_id": f"l{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
            )
            + "\n"
            for i in range(self.lines)
        )
        uploaded = self.client.post(
            "/v1/files",
            files={"file": ("load.jsonl", content.encode(), "application/jsonl")},
            data={"purpose": "batch"},
        ).raise_for_status()
        created = self.client.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        ).raise_for_status()
        self.batch_id = created.json()["id"]
        return self

    def wait_saturated(self, running: int, timeout: float = 30.0) -> None:
        """Until the runner holds `running` lines (every slot interactive traffic leaves)."""
        deadline = time.monotonic() + timeout
        while _metric(self.client, "gateway_batch_lines_running") < running:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the batch never ran {running} lines at once")
            time.sleep(0.1)

    def completed(self) -> int:
        """Lines of the batch answered so far."""
        batch = self.client.get(f"/v1/batches/{self.batch_id}").raise_for_status().json()
        return int(batch["request_counts"]["completed"])

    def preempted(self) -> float:
        """Batch lines cut short by interactive requests, so far (this gateway's counter)."""
        return _metric(self.client, "gateway_batch_lines_total", outcome="preempted")

    def __exit__(self, *exc_info: object) -> None:
        self.client.post(f"/v1/batches/{self.batch_id}/cancel")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = self.client.get(f"/v1/batches/{self.batch_id}").json()["status"]
            if status in {"cancelled", "completed", "failed", "expired"}:
                break
            time.sleep(0.2)
        self.client.close()


def _phase(
    phase: str, gw: ManagedProcess, keys: dict[str, Path], args: argparse.Namespace, level: int
) -> dict[str, Any]:
    """Measure interactive traffic at `level` during `phase`; the row of the report."""
    row: dict[str, Any] = {"phase": phase, "concurrency": level}
    if phase == "alone":
        row |= _interactive(gw.url, keys["interactive"], level, args.duration)
    elif phase == "batch":
        service = args.ttft + args.tokens * args.inter_token
        rate = (args.parallel - args.reserve) / service  # lines/s the spare slots serve
        lines = int(rate * (args.duration + 30) * 1.5) + 50
        with BatchLoad(gw.url, keys["batch-key"].read_text().strip(), lines) as batch:
            batch.wait_saturated(min(args.demand, args.parallel - args.reserve))
            before, preempted, start = batch.completed(), batch.preempted(), time.monotonic()
            row |= _interactive(gw.url, keys["interactive"], level, args.duration)
            elapsed = time.monotonic() - start
            row["batch_lines_per_s"] = (batch.completed() - before) / elapsed
            row["preempted"] = int(batch.preempted() - preempted)
    else:
        loop_argv = _bench_argv(gw.url, keys["batch-key"], args.demand, args.duration + 15)
        quiet = subprocess.DEVNULL
        with subprocess.Popen(loop_argv, stdout=quiet, stderr=quiet) as loop:  # noqa: S603
            time.sleep(5)  # its preflight and warm-up, then every slot busy
            row |= _interactive(gw.url, keys["interactive"], level, args.duration)
            loop.terminate()
    return row


def _report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Markdown: one row per phase and level (medians over rounds), p99 change vs alone."""
    lines = [
        f"upstream: {args.parallel} slots, TTFT {args.ttft * 1000:.0f} ms, "
        f"{args.tokens} tokens at {args.inter_token * 1000:.0f} ms; gateway lets "
        f"{args.parallel} through, keeps {args.reserve} for interactive; batch or loop "
        f"demand {args.demand} at once; {args.rounds} round(s) of {args.duration:.0f} s",
        "",
        "| phase | C | requests | TTFT p50 (ms) | TTFT p99 (ms) | p99 vs alone | errors "
        "| batch lines/s | preempted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    alone_p99: dict[int, float] = {}
    for level in sorted({row["concurrency"] for row in rows}):
        for phase in PHASES:
            mine = [r for r in rows if r["phase"] == phase and r["concurrency"] == level]
            med = {
                k: statistics.median(r[k] for r in mine)
                for k in ("requests", "errors", "ttft_p50_ms", "ttft_p99_ms")
            }
            if phase == "alone":
                alone_p99[level] = med["ttft_p99_ms"]
            change = med["ttft_p99_ms"] / alone_p99[level] - 1
            lps = (
                f"{statistics.median(r['batch_lines_per_s'] for r in mine):.1f}"
                if phase == "batch"
                else ""
            )
            pre = f"{sum(r['preempted'] for r in mine)}" if phase == "batch" else ""
            lines.append(
                f"| {phase} | {level} | {med['requests']:.0f} | {med['ttft_p50_ms']:.1f} "
                f"| {med['ttft_p99_ms']:.1f} | {change:+.1%} | {med['errors']:.0f} | {lps} "
                f"| {pre} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the phases (see the module docstring); print the table."""
    args = build_parser().parse_args(argv)
    levels = [int(part) for part in args.levels.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="batch-isolation-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        emulator = stack.enter_context(
            emulator_process(
                workdir,
                ttft=args.ttft,
                inter_token=args.inter_token,
                tokens=args.tokens,
                extra=("--parallel", str(args.parallel)),
            )
        )
        env = gateway_env(workdir, emulator.url) | {
            "GATEWAY_UPSTREAM_MAX_CONCURRENT": str(args.parallel),
            "GATEWAY_UPSTREAM_QUEUE_SIZE": "1000",
            "GATEWAY_UPSTREAM_QUEUE_TIMEOUT": "120",
            "GATEWAY_BATCH_RESERVED_SLOTS": str(args.reserve),
            "GATEWAY_BATCH_MAX_CONCURRENT": str(args.demand),
            "GATEWAY_BATCH_POLL_SECONDS": "0.2",
        }
        keys: dict[str, Path] = {}
        for name in ("interactive", "batch-key"):
            keys[name] = workdir / f"{name}.key"
            keys[name].write_text(str(create_key(env, name, *LIMITS)["key"]))
            os.chmod(keys[name], 0o600)
        gw = stack.enter_context(gateway_process(workdir, env))
        for round_no in range(args.rounds):
            for level in levels:
                for phase in PHASES:
                    print(f"round {round_no + 1}: {phase}, C={level} ...", file=sys.stderr)
                    rows.append(_phase(phase, gw, keys, args, level) | {"round": round_no + 1})
    print(_report(rows, args))
    if args.out:
        args.out.write_text(
            json.dumps({"parameters": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

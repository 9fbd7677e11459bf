# ruff: noqa: T201 (a benchmark prints its progress and table)
"""`python -m benchmarks.cost_split`: CPU per request, split into per request and per chunk.

Issue 27 compares CPU per streamed request with nginx's; which part to cut depends on whether
the cost comes with each request (accepting it, auth, limits, the upstream request, the finish)
or with each chunk (a read from the upstream, decoding, metering, a write to the client). The
split needs no profiler, which distorts both (py-spy inflates the gateway's CPU 1.5 to 2.3
times): every row is measured at two answer lengths on the same emulator timing (TTFT 50 ms,
10 ms a token), `SHORT` and `LONG` tokens, and CPU per request is taken as linear in the
chunks of an answer (tokens + the final line):

    per chunk   = (cpu(LONG) - cpu(SHORT)) / (LONG - SHORT)
    per request = cpu(SHORT) - (SHORT + 1) * per chunk

Rows: nginx (the reference), `protocols` (the bare asyncio Protocol relay of
`benchmarks.relays`, no ASGI and no coroutine per chunk), `floor` (uvicorn + aiohttp, no gateway
work), and the gateway as shipped on `/v1/generate`, `/api/chat` and `/v1/chat/completions` (SSE).
Each length runs every row `--rounds` times at `--streams` streams (the least CPU per request of
the rounds counts: other work on the machine only ever adds), with a fresh set of processes per
length. About 6 minutes on 2 cores with the defaults.

    .venv/bin/python -m benchmarks.cost_split              # the table (docs/performance.md)
    .venv/bin/python -m benchmarks.cost_split --rows nginx,gateway --rounds 1
    .venv/bin/python -m benchmarks.cost_split --steady 1000 --rows nginx,protocols,gw-chat
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from benchmarks.dataplane import descendants, relay_process
from benchmarks.gateway import BODY, CHAT_BODY
from benchmarks.measure import LoadPlan, measure
from benchmarks.servers import (
    Target,
    emulator_process,
    floor_process,
    gateway_with_key,
    nginx_binary,
    nginx_process,
)

SHORT = 8
"""Tokens of the short answer (9 chunks with the final line)."""

LONG = 64
"""Tokens of the long answer: today's profile (65 chunks)."""

ROWS = ("nginx", "protocols", "floor", "gateway", "gw-chat", "gw-sse")
"""Every row, in the order each round runs them."""


def split(
    cpu_short: float, cpu_long: float, short: int = SHORT, long: int = LONG
) -> tuple[float, float]:
    """Per-request and per-chunk CPU from CPU per request at two answer lengths.

    Args:
        cpu_short: CPU ms per request with answers of `short` tokens.
        cpu_long: CPU ms per request with answers of `long` tokens.
        short: Tokens of the short answer (its chunks are `short + 1`: the final line).
        long: Tokens of the long answer; more than `short`.

    Returns:
        `(per request ms, per chunk µs)`.

    Raises:
        ValueError: `long` is not more than `short`.
    """
    if long <= short:
        raise ValueError(f"the long answer ({long} tokens) must be longer than the short ({short})")
    per_chunk = (cpu_long - cpu_short) / (long - short)
    return cpu_short - (short + 1) * per_chunk, per_chunk * 1000


def _targets(stack: ExitStack, workdir: Path, upstream: str, rows: Sequence[str]) -> list[Target]:
    targets = []
    if "nginx" in rows:
        binary = nginx_binary()
        if binary is None:
            raise SystemExit(
                "nginx is not installed (apt-get install -y nginx): it is the reference"
            )
        nginx = stack.enter_context(nginx_process(workdir, binary, int(upstream.rsplit(":", 1)[1])))
        assert nginx.process is not None  # noqa: S101 - started
        pids = tuple(descendants(nginx.process.pid))
        targets.append(Target("nginx", nginx.url, "/api/generate", BODY, pids=pids))
    if "protocols" in rows:
        relay = relay_process(workdir, "protocols", upstream, None)
        assert relay is not None  # noqa: S101 - not a granian row
        stack.enter_context(relay)
        assert relay.process is not None  # noqa: S101
        pids = (relay.process.pid,)
        targets.append(Target("protocols", relay.url, "/api/generate", BODY, pids=pids))
    if "floor" in rows:
        floor = stack.enter_context(floor_process(workdir, upstream))
        assert floor.process is not None  # noqa: S101
        targets.append(Target("floor", floor.url, "/api/generate", BODY, pids=(floor.process.pid,)))
    if any(row.startswith("gw") or row == "gateway" for row in rows):
        gateway, key = gateway_with_key(workdir / "gateway", upstream)
        stack.enter_context(gateway)
        assert gateway.process is not None  # noqa: S101
        shared = {"key": key, "pids": (gateway.process.pid,)}
        candidates = [
            Target("gateway", gateway.url, "/v1/generate", BODY, **shared),  # type: ignore[arg-type]
            Target("gw-chat", gateway.url, "/api/chat", CHAT_BODY, **shared),  # type: ignore[arg-type]
            Target("gw-sse", gateway.url, "/v1/chat/completions", CHAT_BODY, sse=True, **shared),  # type: ignore[arg-type]
        ]
        targets += [target for target in candidates if target.name in rows]
    return targets


def run(
    rows: Sequence[str], streams: int, requests: int, rounds: int
) -> dict[str, dict[int, float]]:
    """Measure every row at both lengths: `{row: {tokens: least CPU ms per request}}`.

    Raises:
        RuntimeError: a run had errors (its CPU would not be a relayed answer's).
    """
    least: dict[str, dict[int, float]] = {}
    for tokens in (SHORT, LONG):
        with tempfile.TemporaryDirectory(prefix="cost-split-") as tmp, ExitStack() as stack:
            workdir = Path(tmp)
            emulator = stack.enter_context(
                emulator_process(workdir, ttft=0.05, inter_token=0.01, tokens=tokens)
            )
            targets = _targets(stack, workdir, emulator.url, rows)
            for target in targets:  # connections, caches and lazy imports before measuring
                measure(target, 4, LoadPlan(warmup=0.0, requests=16), None)
            for number in range(rounds):
                print(f"  {tokens} tokens, round {number + 1}/{rounds} ...", file=sys.stderr)
                for target in targets:
                    row = measure(target, streams, LoadPlan(warmup=0.0, requests=requests), None)
                    if row["errors"]:
                        raise RuntimeError(f"{target.name}: {row['error_examples']}")
                    cpu = float(row["proxy_cpu_ms_per_request"])
                    mine = least.setdefault(target.name, {})
                    mine[tokens] = min(cpu, mine.get(tokens, cpu))
    return least


def steady(rows: Sequence[str], streams: int, tokens: int) -> dict[str, float]:
    """CPU µs per chunk with answers so long that the per-request part vanishes.

    Each row relays `2 x streams` answers of `tokens` tokens at the usual pace (10 ms a token):
    at 1,000 tokens a request's own cost (about 2 ms) is 2 µs a chunk, under the runs' noise.

    Returns:
        `{row: CPU µs per chunk}`.

    Raises:
        RuntimeError: a run had errors.
    """
    per_chunk: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="cost-split-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        emulator = stack.enter_context(
            emulator_process(workdir, ttft=0.05, inter_token=0.01, tokens=tokens)
        )
        targets = _targets(stack, workdir, emulator.url, rows)
        for target in targets:  # connections, caches and lazy imports before measuring
            measure(target, 4, LoadPlan(warmup=0.0, requests=8), None)
        for target in targets:
            print(f"  {target.name}: {tokens} tokens x {2 * streams} ...", file=sys.stderr)
            row = measure(target, streams, LoadPlan(warmup=0.0, requests=2 * streams), None)
            if row["errors"]:
                raise RuntimeError(f"{target.name}: {row['error_examples']}")
            per_chunk[target.name] = float(row["proxy_cpu_ms_per_request"]) * 1000 / (tokens + 1)
    return per_chunk


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cost_split", description=__doc__)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"default: {','.join(ROWS)}")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streams (16)")
    parser.add_argument("--requests", type=int, default=256, help="requests per run (256)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every row per length (3)")
    parser.add_argument(
        "--steady",
        type=int,
        metavar="TOKENS",
        help="instead: CPU per chunk of answers this long (1000: the per-request part vanishes)",
    )
    args = parser.parse_args(argv)
    rows = [row for row in args.rows.split(",") if row]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    if args.steady is not None:
        if args.steady < 1:
            parser.error("--steady needs at least 1 token")
        measured = steady(rows, args.streams, args.steady)
        print(f"CPU per chunk, {args.streams} streams, {args.steady}-token answers (µs)")
        for name in (row for row in ROWS if row in measured):
            print(f"{name:10s} {measured[name]:8.1f}")
        return 0
    least = run(rows, args.streams, args.requests, args.rounds)
    reference = least.get("nginx")
    print(f"CPU per request, {args.streams} streams, least of {args.rounds} (ms; per chunk µs)")
    print(
        f"{'row':10s} {SHORT:>3d} tok {LONG:>3d} tok  per request  per chunk  x nginx ({LONG} tok)"
    )
    for name in (row for row in ROWS if row in least):
        cpu = least[name]
        per_request, per_chunk = split(cpu[SHORT], cpu[LONG])
        times = f"{cpu[LONG] / reference[LONG]:10.2f}" if reference else ""
        print(
            f"{name:10s} {cpu[SHORT]:7.2f} {cpu[LONG]:7.2f} {per_request:12.2f}"
            f" {per_chunk:10.1f} {times}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

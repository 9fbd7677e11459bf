# ruff: noqa: T201 (a benchmark prints its progress and table)
"""`python -m benchmarks.gateway`: what the gateway costs, side by side with direct and nginx.

Starts the Ollama emulator (`benchmarks.servers`), a `gateway serve` in front of it (auth with a
real key, metrics, limits: as shipped) and, when installed, nginx as the floor; then, for each
concurrency level and target, runs the load generator (`benchmarks.load`, its own process) and
records TTFT, added TTFT over the row's baseline, chunks/s, requests/s and the proxy's CPU per
request (`benchmarks.measure`). Then the gateway's RSS per open idle stream, optionally a py-spy
profile (`benchmarks.hotspots`) and the real-model sweep (`benchmarks.real_model`). Prints the
tables and the issue-6 targets, writes JSON, flags regressions against `--compare`, draws a PNG
(`benchmarks.report`, `benchmarks.plot`). Every process it starts is stopped when it ends, also on
Ctrl-C.

Five client surfaces, each a gateway row against a direct row (`--surfaces`): `generate` is
`gateway` (`/v1/generate`) against `direct` (the emulator's `/api/generate`), with the optional
`gw-httpx`, `gw-aiohttp`, `gw-otel` (tracing on, exported to `benchmarks.otlp_sink`), `floor` and
`nginx` rows; `chat` is `gw-chat` (`/api/chat`) against `direct-chat`; `sse` is `gw-sse` (OpenAI's
`/v1/chat/completions`, which the gateway translates to `/api/chat` upstream and encodes as SSE
itself) against `direct-sse` (the emulator's own `/v1/chat/completions`); `responses` is
`gw-responses` (`/v1/responses`) and `messages` is `gw-messages` (`/v1/messages`), both against
`direct-chat`: the upstream request the gateway translates them into (`api_targets`). One gateway
process serves all of them. Idle memory and the profile use `/v1/generate`.

`--rounds N` measures every row N times at each level, the rows interleaved, and keeps each
row's round with the least CPU per request (`least_cpu`: interference only ever adds CPU; the
TTFT and chunks/s shown are that round's, the errors every round's): one 10 s row on a shared
2-core VM spreads 10-30 %, sometimes more.

Run time: about 13 s per target, level and round. The default sweep (1, 16, 64, 256 streams,
the five surfaces: nine targets with nginx, idle memory) takes about 8.5 minutes,
`--concurrency 1,16,64` about 6.5, `--surfaces generate` (the rows of the earlier runs) about 3
and 2.3.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.hotspots import profile_gateway
from benchmarks.measure import LoadPlan, idle_stream_memory, measure
from benchmarks.plot import plot_run
from benchmarks.real_model import real_model_sweep
from benchmarks.report import add_relative, find_regressions, print_run, write_json
from benchmarks.servers import (
    Target,
    emulator_process,
    floor_process,
    gateway_with_key,
    nginx_binary,
    nginx_process,
    otlp_sink_process,
)

BODY = {"model": "bench", "prompt": "Why is the sky blue?", "stream": True}
CHAT_BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "Why is the sky blue?"}],
    "stream": True,
}
"""The body of `/api/chat` (Ollama) and `/v1/chat/completions` (OpenAI) alike."""

PRESETS: dict[str, dict[str, Any]] = {
    "today": {"ttft": 0.05, "inter_token": 0.01, "tokens": 64, "concurrency": [1, 16, 64, 256]},
    "100x": {"ttft": 0.005, "inter_token": 0.0002, "tokens": 256, "concurrency": [1, 4, 16]},
    "rig": {"ttft": 0.05, "inter_token": 0.01, "tokens": 64, "concurrency": [1, 8]},
}
"""Issue 27's profiles (`--preset`): `today` (a model of today's speed: TTFT 50 ms, 100 tokens/s
per stream), `100x` (a model 100 times faster: TTFT 5 ms, 5,000 tokens/s per stream, 256-token
answers) and `rig` (the open rig's definitions: added TTFT at one stream, CPU per request at 8).
An explicit `--ttft`, `--inter-token`, `--tokens` or `--concurrency` wins over the preset's."""

_DEFAULTS = PRESETS["today"]

RESPONSES_BODY = {"model": "bench", "input": "Why is the sky blue?", "stream": True}
"""`/v1/responses`: the same prompt as `CHAT_BODY`, as OpenAI's Responses API takes it."""

MESSAGES_BODY = {
    "model": "bench",
    "max_tokens": 1024,
    "messages": [{"role": "user", "content": "Why is the sky blue?"}],
    "stream": True,
}
"""`/v1/messages`: `CHAT_BODY` with the `max_tokens` Anthropic requires, far above the
emulator's answer (64 tokens by default), so the answer ends as `direct-chat`'s does."""

SURFACES = ("generate", "chat", "sse", "responses", "messages")
"""The client surfaces `--surfaces` picks from (module docstring)."""


@dataclass(frozen=True)
class Proxy:
    """A started gateway the rows go through.

    Attributes:
        url: Its base URL.
        key: The API key made for it.
        pids: Its processes (the CPU counted as the proxy's).
        surfaces: The surfaces its source tree serves (`tree_surfaces`).
    """

    url: str
    key: str
    pids: tuple[int, ...]
    surfaces: frozenset[str] = frozenset(SURFACES)


def tree_surfaces(tree: Path) -> frozenset[str]:
    """The surfaces a source tree's gateway serves (`SURFACES`, all or some).

    A tree from before issue 26 (a `--baseline-tree` of an older commit) has no
    `gateway/api/responses` or `gateway/api/anthropic` package, so no `/v1/responses` or
    `/v1/messages`.
    """
    packages = {"responses": "responses", "messages": "anthropic"}
    return frozenset(
        surface
        for surface in SURFACES
        if surface not in packages or (tree / "gateway" / "api" / packages[surface]).is_dir()
    )


_API_ROWS: tuple[tuple[str, str, dict[str, Any], str | None, str], ...] = (
    ("chat", "/api/chat", CHAT_BODY, None, "direct-chat"),
    ("responses", "/v1/responses", RESPONSES_BODY, "responses", "direct-chat"),
    ("messages", "/v1/messages", MESSAGES_BODY, "messages", "direct-chat"),
    ("sse", "/v1/chat/completions", CHAT_BODY, "chat", "direct-sse"),
)
"""Per surface of `api_targets`: path, body, SSE event set (None: NDJSON), baseline row."""


def api_targets(
    surfaces: Sequence[str], upstream_url: str, gateway: Proxy, base: Proxy | None
) -> tuple[list[Target], list[str]]:
    """The rows of the `chat`, `responses`, `messages` and `sse` surfaces, and notes.

    Each surface is a gateway row (`gw-chat`, `gw-responses`, `gw-messages`, `gw-sse`), a
    `base-*` twin through `base` when given (left out with a note when its tree does not
    serve the surface), and the direct row they are measured against. `/v1/responses` and
    `/v1/messages` have no direct row of their own: neither the emulator (either face) nor
    Ollama's `/api/*` serves them as the gateway does, so their baseline is `direct-chat`, the
    emulator's `/api/chat` with the same prompt and answer length, which is what the gateway
    sends upstream for them (an Ollama upstream). Their added TTFT and CPU are the
    translation's cost as well as the relay's.
    """
    targets: list[Target] = []
    notes: list[str] = []
    if {"chat", "responses", "messages"} & set(surfaces):
        targets.append(Target("direct-chat", upstream_url, "/api/chat", CHAT_BODY, baseline=None))
    for surface, path, body, events, baseline in _API_ROWS:
        if surface not in surfaces:
            continue
        if surface == "sse":
            # The gateway translates to /api/chat upstream and writes the SSE itself; direct
            # is the emulator's own /v1 face. Both send the role on the first content delta,
            # then a `delta: {}` finish event and `[DONE]` (not counted): 65 chunks per answer
            # of 64 tokens, like the NDJSON rows' 64 lines and `done` line.
            targets.append(Target("direct-sse", upstream_url, path, body, sse=True, baseline=None))
        proxies = [("gw", gateway)] + ([("base", base)] if base is not None else [])
        for prefix, proxy in proxies:
            name = f"{prefix}-{surface}"
            if surface not in proxy.surfaces:
                notes.append(f"{name} row skipped: the --baseline-tree does not serve {path}")
                continue
            targets.append(
                Target(
                    name,
                    proxy.url,
                    path,
                    body,
                    key=proxy.key,
                    sse=events is not None,
                    events=events or "chat",
                    pids=proxy.pids,
                    baseline=baseline,
                )
            )
    return targets, notes


def _surfaces(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(SURFACES))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"surfaces are a comma-separated subset of {','.join(SURFACES)}: {text}"
        )
    return [surface for surface in SURFACES if surface in chosen]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be positive")
    return levels


def build_parser() -> argparse.ArgumentParser:
    """The `python -m benchmarks.gateway` arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gateway", description=__doc__.split("\n\n")[0]
    )
    add = parser.add_argument
    add(
        "--preset",
        choices=sorted(PRESETS),
        help="a profile of issue 27 (PRESETS): sets the emulator's timing and the levels, "
        "and prints whether issue 27's targets were met",
    )
    add("--concurrency", type=_levels, help="default: 1,16,64,256 (or the preset's)")
    add("--duration", type=float, default=10.0, help="measured seconds per run (default 10)")
    add("--warmup", type=float, default=1.0, help="ramp-up seconds per run, unmeasured")
    add(
        "--rounds",
        type=_positive,
        default=1,
        help="measure every row N times, interleaved, and keep each row's round with the least "
        "CPU per request (default 1): on a shared VM one 10 s row spreads 10-30 %%",
    )
    add("--requests", type=int, help="measure this many requests per run instead of a duration")
    add("--ttft", type=float, help="emulator seconds to first token (0.05)")
    add("--inter-token", type=float, help="emulator seconds between tokens (0.01)")
    add("--tokens", type=int, help="emulator tokens per answer (64)")
    add(
        "--surfaces",
        type=_surfaces,
        default=list(SURFACES),
        help="client surfaces to measure (default: all): generate = rows direct, "
        "gateway (and nginx, floor, gw-httpx); chat = direct-chat, gw-chat (/api/chat); "
        "sse = direct-sse, gw-sse (/v1/chat/completions); responses = gw-responses "
        "(/v1/responses), messages = gw-messages (/v1/messages), both against direct-chat",
    )
    add("--no-nginx", action="store_true", help="skip the nginx row")
    add(
        "--baseline-tree",
        type=Path,
        metavar="DIR",
        help="also a gateway run from another source tree (e.g. `git worktree add DIR COMMIT`): "
        "rows base, base-chat, base-sse, base-responses, base-messages (those the tree serves) "
        "beside gateway, gw-chat, ... in the same run, so a change is measured against its "
        "parent on the same machine at the same moment",
    )
    add(
        "--floor-row",
        action="store_true",
        help="also a bare uvicorn + aiohttp relay (row floor): the stack's own cost",
    )
    add(
        "--httpx-row",
        action="store_true",
        help="also a gateway with GATEWAY_UPSTREAM_HTTP_CLIENT=httpx (row gw-httpx)",
    )
    add(
        "--aiohttp-row",
        action="store_true",
        help="also a gateway with GATEWAY_UPSTREAM_HTTP_CLIENT=aiohttp (row gw-aiohttp)",
    )
    add(
        "--tracing-row",
        action="store_true",
        help="also a gateway with OpenTelemetry tracing on, exporting to a sink (row gw-otel)",
    )
    add(
        "--workers-rows",
        action="store_true",
        help="also gateways with Redis limit storage: one worker (row gw-redis) and "
        "`--workers 2` (row gw-2w), side by side",
    )
    add("--redis", default="redis://127.0.0.1:6379/0", help="Redis of --workers-rows")
    add("--no-key-limits", action="store_true", help="key without RPM/TPM/concurrency limits")
    add("--idle-streams", type=int, default=256, help="open streams for RSS (0: skip)")
    add("--load-processes", type=int, default=1, help="load generator processes per run")
    add("--load-client", choices=["raw", "httpx"], default="raw", help="load generator client")
    add("--profile", type=int, metavar="N", help="also profile the gateway with py-spy at N")
    add("--real-model", action="store_true", help="also measure Gemma 3 270M (llama-cpp-python)")
    add("--real-concurrency", type=_levels, default=[1, 2, 4], help="default: 1,2,4")
    add("--real-duration", type=float, default=20.0, help="measured seconds per real run")
    add("--real-tokens", type=int, default=64, help="max tokens per real answer")
    add("--real-interrupt", action="store_true", help="keep llama-cpp-python's interrupts")
    add("--out", type=Path, default=Path("benchmarks/results/run.json"), help="JSON output")
    add("--plot", type=Path, help="PNG output (default: --out with .png)")
    add("--no-plot", action="store_true")
    add("--compare", type=Path, metavar="BASELINE.json", help="flag regressions against it")
    add("--threshold", type=float, default=0.10, help="regression threshold (default 0.10)")
    return parser


def apply_preset(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the timing and levels the command line left out from `--preset` (or `today`'s)."""
    preset = PRESETS[args.preset] if args.preset else _DEFAULTS
    for name in ("ttft", "inter_token", "tokens", "concurrency"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    return args


def _machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}, Linux {platform.release()}"


def _commit() -> str:
    try:
        result = subprocess.run(
            ["git", "describe", "--always", "--dirty"],  # noqa: S607
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip()


def run_sweep(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Start the emulator, gateway and nginx; measure every target at every level."""
    plan = LoadPlan(
        duration=args.duration,
        warmup=args.warmup,
        requests=args.requests,
        processes=args.load_processes,
        client=args.load_client,
        pace=args.inter_token,
        expect_chunks=args.tokens + 1,  # the tokens and the end (`done`, or the last event)
    )
    notes: list[str] = []
    result: dict[str, Any] = {"notes": notes}
    timing = {"ttft": args.ttft, "inter_token": args.inter_token, "tokens": args.tokens}
    with ExitStack() as stack:
        emulator = stack.enter_context(emulator_process(workdir, **timing))
        assert emulator.process is not None  # noqa: S101 - started
        gateway, key = gateway_with_key(
            workdir / "gateway", emulator.url, limits=not args.no_key_limits
        )
        stack.enter_context(gateway)
        assert gateway.process is not None  # noqa: S101
        pid = gateway.process.pid
        generate = Target("gateway", gateway.url, "/v1/generate", BODY, key=key, pids=(pid,))
        targets: list[Target] = []
        base: Proxy | None = None
        if args.baseline_tree is not None:
            base = _baseline_gateway(args, workdir, emulator.url, stack)
        if "generate" in args.surfaces:
            targets += [
                Target("direct", emulator.url, "/api/generate", BODY, baseline=None),
                generate,
            ]
            if base is not None:
                targets.append(
                    Target("base", base.url, "/v1/generate", BODY, key=base.key, pids=base.pids)
                )
            targets += _generate_variants(args, workdir, emulator.url, stack, notes)
        gateway_proxy = Proxy(gateway.url, key, (pid,))
        api, skipped = api_targets(args.surfaces, emulator.url, gateway_proxy, base)
        targets += api
        notes += skipped
        for target in targets:  # connections, caches and lazy imports before measuring
            measure(target, 4, LoadPlan(warmup=0.0, requests=16, client=args.load_client), None)
        rows = []
        for n in args.concurrency:
            rounds: dict[str, list[dict[str, Any]]] = {target.name: [] for target in targets}
            for i in range(args.rounds):
                for target in targets:  # interleaved: a slow minute of the VM hits every row
                    mark = f" (round {i + 1} of {args.rounds})" if args.rounds > 1 else ""
                    print(f"  {target.name} @{n}{mark} ...", file=sys.stderr, flush=True)
                    rounds[target.name].append(measure(target, n, plan, emulator.process.pid))
            rows += [least_cpu(rounds[target.name]) for target in targets]
        add_relative(rows)
        result["rows"] = rows
        if args.profile:
            print(f"  profiling the gateway @{args.profile} ...", file=sys.stderr, flush=True)
            out = args.out.with_name(args.out.stem + "-gateway.collapsed")
            result["profile"] = profile_gateway(
                generate, args.profile, plan, emulator.process.pid, out
            )
    if args.idle_streams:
        print(f"  gateway RSS with {args.idle_streams} idle streams ...", file=sys.stderr)
        result["idle_memory"] = _idle_memory(args, workdir / "idle")
    return result


def least_cpu(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The round of one row and level with the least proxy CPU per request, the others noted.

    Other work on a shared VM only ever adds CPU, so the least of several interleaved rounds is
    the least disturbed figure (as `benchmarks.gate` takes it); its TTFT and chunks/s come from
    the same round. A row without a proxy (direct), or whose every round completed nothing,
    keeps its first round: a gateway row's added TTFT and share of chunks/s compare its kept
    round with that one. No failure is hidden: `errors` counts every round's.

    Args:
        rounds: One row's results at one level (`measure`), at least one.

    Returns:
        The kept round's row; with more than one round, also `cpu_ms_rounds` (every round's CPU
        ms per request, in order; None where it completed nothing) and `errors_rounds`, and
        `errors` and `error_examples` over every round.

    Raises:
        ValueError: `rounds` is empty.
    """
    if not rounds:
        raise ValueError("no round to keep")
    if len(rounds) == 1:
        return rounds[0]
    cpu = [row.get("proxy_cpu_ms_per_request") for row in rounds]
    measured = [i for i, value in enumerate(cpu) if value is not None]
    kept = dict(rounds[min(measured, key=lambda i: cpu[i]) if measured else 0])
    if measured:
        kept["cpu_ms_rounds"] = [None if value is None else round(value, 3) for value in cpu]
    kept["errors_rounds"] = [row.get("errors", 0) for row in rounds]
    kept["errors"] = sum(kept["errors_rounds"])
    kept["error_examples"] = [e for row in rounds for e in row.get("error_examples", [])][:5]
    return kept


def _baseline_gateway(
    args: argparse.Namespace, workdir: Path, upstream_url: str, stack: ExitStack
) -> Proxy:
    """A gateway run from `--baseline-tree`, started on `stack`.

    The tree's `gateway` package is put first on the path (`PYTHONPATH`) and the working
    directory is kept off it (`PYTHONSAFEPATH`, Python 3.11), so `python -m gateway` runs the
    other tree's code on this environment's installed packages.
    """
    tree = args.baseline_tree.resolve()
    if not (tree / "gateway" / "__init__.py").is_file():
        raise SystemExit(f"--baseline-tree {tree}: no gateway/ package there")
    env = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    gateway, key = gateway_with_key(
        workdir / "baseline", upstream_url, limits=not args.no_key_limits, extra_env=env
    )
    stack.enter_context(gateway)
    assert gateway.process is not None  # noqa: S101 - started
    return Proxy(gateway.url, key, (gateway.process.pid,), tree_surfaces(tree))


def _generate_variants(
    args: argparse.Namespace, workdir: Path, upstream_url: str, stack: ExitStack, notes: list[str]
) -> list[Target]:
    """The optional rows of the generate surface: gw-httpx, gw-aiohttp, gw-otel, floor, nginx."""
    targets = []
    variants: list[tuple[str, str, dict[str, str]]] = []
    if args.httpx_row:
        variants.append(("gw-httpx", "gateway-httpx", {"GATEWAY_UPSTREAM_HTTP_CLIENT": "httpx"}))
    if args.aiohttp_row:
        aiohttp = {"GATEWAY_UPSTREAM_HTTP_CLIENT": "aiohttp"}
        variants.append(("gw-aiohttp", "gateway-aiohttp", aiohttp))
    if args.tracing_row:
        sink = stack.enter_context(otlp_sink_process(workdir))
        endpoint = {"GATEWAY_OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
        variants.append(("gw-otel", "gateway-otel", endpoint))
    for name, directory, extra_env in variants:  # the gateway as shipped, one setting changed
        variant, variant_key = gateway_with_key(
            workdir / directory, upstream_url, limits=not args.no_key_limits, extra_env=extra_env
        )
        stack.enter_context(variant)
        assert variant.process is not None  # noqa: S101
        pids = (variant.process.pid,)
        targets.append(Target(name, variant.url, "/v1/generate", BODY, key=variant_key, pids=pids))
    if args.workers_rows:
        targets += _worker_rows(args, workdir, upstream_url, stack)
    if args.floor_row:
        floor = stack.enter_context(floor_process(workdir, upstream_url))
        assert floor.process is not None  # noqa: S101
        targets.append(Target("floor", floor.url, "/api/generate", BODY, pids=(floor.process.pid,)))
    binary = None if args.no_nginx else nginx_binary()
    if binary is not None:
        upstream_port = int(upstream_url.rsplit(":", 1)[1])
        nginx = stack.enter_context(nginx_process(workdir, binary, upstream_port))
        assert nginx.process is not None  # noqa: S101
        from benchmarks.procstat import children

        pids = (nginx.process.pid, *children(nginx.process.pid))
        targets.append(Target("nginx", nginx.url, "/api/generate", BODY, pids=pids))
    elif not args.no_nginx:
        notes.append("nginx row skipped: nginx is not installed (apt-get install -y nginx)")
    return targets


def _worker_rows(
    args: argparse.Namespace, workdir: Path, upstream_url: str, stack: ExitStack
) -> list[Target]:
    """Rows gw-redis (one worker) and gw-2w (`--workers 2`), both on Redis limit storage.

    The CPU of gw-2w is its supervisor's and both workers' (`pids`); Redis's own is not counted
    in either row (it is shared by both, and by nothing else in the run).
    """
    from benchmarks.procstat import children

    targets = []
    for name, serve_args in (("gw-redis", ()), ("gw-2w", ("--workers", "2"))):
        env = {
            "GATEWAY_RATE_LIMIT_STORAGE": args.redis,
            "GATEWAY_RATE_LIMIT_KEY_PREFIX": f"bench-{name}-{os.getpid()}",
        }
        gateway, key = gateway_with_key(
            workdir / name,
            upstream_url,
            limits=not args.no_key_limits,
            extra_env=env,
            args=serve_args,
        )
        stack.enter_context(gateway)
        assert gateway.process is not None  # noqa: S101
        pids: tuple[int, ...] = (gateway.process.pid,)
        if serve_args:
            pids = _with_workers(gateway.process.pid, 2, children)
        targets.append(Target(name, gateway.url, "/v1/generate", BODY, key=key, pids=pids))
    return targets


def _with_workers(
    parent: int, workers: int, children: Callable[[int], list[int]]
) -> tuple[int, ...]:
    """The supervisor's pid and its children's, once `workers` workers run."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = children(parent)  # the workers, perhaps multiprocessing's resource tracker
        spawned = [pid for pid in found if b"spawn_main" in _cmdline(pid)]
        if len(spawned) >= workers:
            return (parent, *found)
        time.sleep(0.1)
    raise RuntimeError(f"gateway {parent} did not start {workers} workers in 60 s")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it just exited
        return b""


def _idle_memory(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """RSS per idle stream: an emulator that sends one token, then nothing for 10 minutes."""
    workdir.mkdir(parents=True)
    with emulator_process(workdir, ttft=args.ttft, inter_token=600, tokens=2) as emulator:
        gateway, key = gateway_with_key(
            workdir / "gateway", emulator.url, limits=not args.no_key_limits
        )
        with gateway:
            assert gateway.process is not None  # noqa: S101
            pid = gateway.process.pid
            target = Target("gateway", gateway.url, "/v1/generate", BODY, key=key, pids=(pid,))
            return idle_stream_memory(target, pid, args.idle_streams)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns 1 when `--compare` found regressions, else 0."""
    args = apply_preset(build_parser().parse_args(argv))
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        workdir = Path(tmp)
        run: dict[str, Any] = {
            "meta": {
                "date": started.strftime("%Y-%m-%d %H:%M UTC"),
                "machine": _machine(),
                "python": platform.python_version(),
                "commit": _commit(),
                "command": "python -m benchmarks.gateway " + " ".join(argv or sys.argv[1:]),
                "emulator": {"ttft": args.ttft, "inter_token": args.inter_token},
                "preset": args.preset,
                "tokens": args.tokens,
                "duration": args.duration,
                "key_limits": not args.no_key_limits,
                "load_client": args.load_client,
            },
            **run_sweep(args, workdir),
        }
        if args.real_model:
            real_plan = LoadPlan(duration=args.real_duration, warmup=1.0)
            rows, notes = real_model_sweep(
                workdir,
                args.real_concurrency,
                real_plan,
                max_tokens=args.real_tokens,
                interrupt=args.real_interrupt,
            )
            add_relative(rows)
            run["real_model"] = rows
            run["notes"] += notes
    run["meta"]["seconds"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    regressions = []
    if args.compare:
        baseline = json.loads(args.compare.read_text())
        regressions = find_regressions(run, baseline, args.threshold)
        run["regressions"] = [str(r) for r in regressions]
    print_run(run, regressions)
    if "profile" in run:
        _print_profile(run["profile"])
    write_json(run, args.out)
    print(f"\njson: {args.out}  ({run['meta']['seconds']} s)")
    if not args.no_plot:
        print(plot_run(run, args.plot or args.out.with_suffix(".png")))
    return 1 if regressions else 0


def _print_profile(profile: dict[str, Any]) -> None:
    if "skipped" in profile:
        print(f"\nprofile: {profile['skipped']}")
        return
    print(f"\nGateway CPU profile ({profile['samples']} samples, {profile['file']})")
    print("  self time by library:")
    for name, share in profile["self_by_library"]:
        print(f"    {share:6.1%}  {name}")
    print("  inclusive time, gateway functions:")
    for name, share in profile["inclusive_gateway_functions"][:10]:
        print(f"    {share:6.1%}  {name}")


if __name__ == "__main__":
    raise SystemExit(main())

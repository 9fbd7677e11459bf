# ruff: noqa: T201 (a command prints its report)
"""`gateway bench run|compare|report`: the measuring method on the command line.

`run` loads a target (an Ollama or OpenAI-compatible server directly, or the gateway with a key)
with a fixed workload in one load shape, prints a line per measured point, saves the run
document as JSON (the baseline a later `compare` reads) and prints the report. `compare` and
`report` read saved runs (`gateway.clients.bench.compare`, `gateway.clients.bench.report`). Every
option is in
docs/benchmarking.md.

The key is never an argument (a command line is visible to every user of the machine and lands
in shell history): it comes from `GATEWAY_BENCH_API_KEY` or `--key-file`.

Over ~300 lines: holds the command line (`_add_run` with about 140 lines of options,
`add_parser`, `_plan`, `_run`, `main`) and the target's API detection (`detect_api`, `_head_of`,
`_has_version`, `MAX_VERSION_ANSWER`); the detection could move to
`gateway.clients.bench.preflight`, beside `check_target`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from gateway.clients.bench import compare, html, plots, report
from gateway.clients.bench.dataset import DatasetOptions, build_workload
from gateway.clients.bench.driver import BenchError
from gateway.clients.bench.health import DOWN_AFTER
from gateway.clients.bench.intervals import parse_confidence
from gateway.clients.bench.lengths import Lengths, parse_lengths
from gateway.clients.bench.protocol import Api, Target
from gateway.clients.bench.quality import QualityProbe
from gateway.clients.bench.questions import load_questions
from gateway.clients.bench.runner import Mode, Plan, error_verdict, redact, run_benchmark
from gateway.clients.bench.shapes import Shape, ShapeOptions
from gateway.clients.bench.sizes import SizeHint, parse_size
from gateway.clients.bench.slo import parse_slo
from gateway.clients.bench.stats import escape_error
from gateway.clients.bench.workload import Sampling, WorkloadError
from gateway.clients.keyfile import read_client_key

KEY_ENV = "GATEWAY_BENCH_API_KEY"
TARGET_ENV = "GATEWAY_BENCH_TARGET"
DEFAULT_TARGET = "http://127.0.0.1:11434"


#: The highest request rate taken, per second: far above what one client process can send
#: (Python, one core); more only makes the schedule meaningless.
MAX_RATE = 100_000.0
#: The shortest `--sample-interval`, seconds: a tighter loop would sample more than it measures.
MIN_SAMPLE_INTERVAL = 0.05
#: File descriptors kept free beside the connections (the log, the run file, the GPU sampler).
FD_HEADROOM = 64


def _levels(text: str) -> tuple[float, ...]:
    try:
        levels = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"levels are numbers separated by commas: {text!r}"
        ) from None
    if not levels or not all(math.isfinite(level) and level > 0 for level in levels):
        raise argparse.ArgumentTypeError(f"levels must be positive numbers: {text!r}")
    return levels


def _rates(text: str) -> tuple[float, ...]:
    levels = _levels(text)
    if max(levels) > MAX_RATE:
        raise argparse.ArgumentTypeError(f"rates must be at most {MAX_RATE:g}/s: {text!r}")
    return levels


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):  # nan and inf pass `value <= 0`
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def _rate(text: str) -> float:
    value = _positive(text)
    if value > MAX_RATE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_RATE:g}/s: {text!r}")
    return value


def _interval(text: str) -> float:
    value = _positive(text)
    if value < MIN_SAMPLE_INTERVAL:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_SAMPLE_INTERVAL:g} s: {text!r}")
    return value


def _lengths(text: str) -> Lengths:
    try:
        return parse_lengths(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(text)


def _confidence(text: str) -> float:
    try:
        return parse_confidence(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: `gateway bench run`'s exit status when the run finished but failed more requests than
#: `--max-error-rate` (docs/benchmarking.md "Exit status").
EXIT_TOO_MANY_ERRORS = 3


def _no_key(_text: str) -> str:
    # A key on the command line is visible to every user (ps) and kept in shell history; the
    # message does not repeat it.
    raise argparse.ArgumentTypeError(f"the key is never an argument: set ${KEY_ENV} or --key-file")


def _add_run(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser(
        "run",
        help="load a server or the gateway and measure TTFT, tokens/s, the knee",
        description="Measure a model server (or the gateway in front of it) with a fixed "
        f"workload. The key comes from ${KEY_ENV} or --key-file, never from an argument.",
    )
    where = run.add_argument_group("target")
    where.add_argument(
        "--target",
        default=os.environ.get(TARGET_ENV, DEFAULT_TARGET),
        help=f"base URL of the server or gateway (default: ${TARGET_ENV} or {DEFAULT_TARGET})",
    )
    where.add_argument(
        "--api",
        choices=("auto", "ollama", "openai"),
        default="auto",
        help="the API to speak: auto tries Ollama's /api/version, then /v1/models",
    )
    where.add_argument(
        "--endpoint",
        choices=("chat", "generate", "responses", "messages"),
        default="chat",
        help="chat (/api/chat, /v1/chat/completions), generate (/api/generate, "
        "/v1/completions), responses (/v1/responses) or messages (/v1/messages, Anthropic); "
        "default chat",
    )
    where.add_argument("--key-file", type=Path, help=f"file holding the key (else ${KEY_ENV})")
    where.add_argument("--key", type=_no_key, help=argparse.SUPPRESS)
    where.add_argument(
        "--model",
        "--models",
        dest="models",
        action="append",
        required=True,
        help="model to measure; comma-separated or repeated for a matrix",
    )
    where.add_argument(
        "--timeout", type=_positive, default=300.0, help="seconds allowed per request (default 300)"
    )

    work = run.add_argument_group("workload")
    work.add_argument(
        "--workload",
        default="builtin",
        help="builtin, builtin:short, builtin:long, builtin:en, builtin:zh, synthetic, or a"
        " data set file (JSONL, JSON, CSV: GuideLLM, AIPerf single_turn, multi_turn,"
        " mooncake_trace, ShareGPT, or this tool's own)",
    )
    # --- workload shapes (issue 30 item 1): lengths, synthetic prompts, conversations ---
    work.add_argument(
        "--prompt-words",
        type=_lengths,
        help="synthetic prompts' words: N, uniform:LOW,HIGH, normal:MEAN,SD[,MIN,MAX] (default 64)",
    )
    work.add_argument(
        "--output-tokens",
        type=_lengths,
        help="each answer's limit: N, uniform:LOW,HIGH, normal:MEAN,SD[,MIN,MAX], or dataset"
        " (the file's own; default: the file's where given, else --max-tokens)",
    )
    work.add_argument(
        "--prompts", type=_count, default=64, help="synthetic: prompts to generate (default 64)"
    )
    work.add_argument(
        "--conversations",
        type=_count,
        default=0,
        help="synthetic: multi-turn conversations to generate (default 0: single-turn)",
    )
    work.add_argument(
        "--turns", type=_count, default=1, help="synthetic: user turns per conversation"
    )
    work.add_argument(
        "--system-words",
        type=_count,
        default=0,
        help="synthetic: words of the system message every conversation shares (default 0)",
    )
    work.add_argument(
        "--workload-seed",
        type=int,
        default=1234,
        help="seed of the drawn lengths and synthetic words (default 1234)",
    )
    work.add_argument(
        "--max-tokens", type=_count, default=128, help="tokens per answer (default 128)"
    )
    work.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    work.add_argument("--seed", type=int, default=1234, help="sampling seed")

    load = run.add_argument_group("load shape (default: --concurrency 1)")
    shape = load.add_mutually_exclusive_group()
    shape.add_argument(
        "--concurrency",
        type=_levels,
        help="requests in flight: one level, or a sweep (1,2,4,8)",
    )
    shape.add_argument(
        "--rate", type=_rates, help="Poisson arrivals, requests/s: one rate or a sweep"
    )
    shape.add_argument("--knee", action="store_true", help="search the knee (and the SLO limit)")
    load.add_argument(
        "--max-concurrency",
        type=_count,
        help="knee search: the highest concurrency (default 64)",
    )
    load.add_argument(
        "--max-rate",
        type=_rate,
        help="knee search over request rates up to this rate (requests/s), from --rate-start",
    )
    load.add_argument(
        "--rate-start", type=_rate, help="rate knee search: the lowest rate (default 0.5)"
    )
    span = load.add_mutually_exclusive_group()
    span.add_argument("--duration", type=_positive, help="seconds per run (default 30)")
    span.add_argument("--requests", type=_count, help="requests per run instead of a duration")
    load.add_argument(
        "--warmup",
        type=_count,
        help="requests before each run, not counted (default: one per concurrent slot)",
    )
    load.add_argument(
        "--repeat", type=_count, default=1, help="runs per point: median and spread (default 1)"
    )
    # bench-stats: intervals, adaptive repeats, honest exits (docs/benchmarking.md "Statistics").
    stats = run.add_argument_group("statistics and exits")
    stats.add_argument(
        "--confidence",
        type=_confidence,
        default=0.95,
        help="confidence of every interval, e.g. 95%% or 0.95 (default 95%%)",
    )
    stats.add_argument(
        "--until-ci",
        type=compare.parse_threshold,
        metavar="PCT",
        help="repeat each point (at least twice, at least --repeat) until the interval of TTFT,"
        " TPOT, ITL p50 and output tok/s is within +-PCT of its mean, e.g. 2%%",
    )
    stats.add_argument(
        "--max-repeats",
        type=_count,
        default=10,
        help="with --until-ci: the most runs per point (default 10)",
    )
    stats.add_argument(
        "--max-error-rate",
        type=compare.parse_threshold,
        default=0.01,
        help="exit 3 when more than this share of the measured requests failed (default 1%%)",
    )
    stats.add_argument(
        "--down-after",
        type=_positive,
        default=DOWN_AFTER,
        help="seconds of failures without an answer (refused, reset, 502, 504) after which the"
        " target counts as gone: the run stops and saves what it measured"
        f" (default {DOWN_AFTER:g})",
    )
    load.add_argument("--slo", help="e.g. 'ttft_p99<=2s,tpot_p50<=100ms' (judges points)")
    load.add_argument(
        "--knee-gain",
        type=compare.parse_threshold,
        default=0.10,
        help="throughput growth per doubling below which it is flat (default 10%%)",
    )
    load.add_argument(
        "--max-in-flight",
        type=_count,
        default=256,
        help="rate shapes: the most requests in flight; arrivals past it fail",
    )
    load.add_argument(
        "--arrival-seed", type=int, default=1234, help="rate shapes: seed of the arrivals"
    )
    load.add_argument(
        "--arrivals",
        choices=("poisson", "constant"),
        default="poisson",
        help="rate shapes: Poisson arrivals (seeded) or a constant rate (default poisson)",
    )

    more = run.add_argument_group("also measure")
    more.add_argument("--cold-load", action="store_true", help="the model's cold load first")
    more.add_argument("--quality", action="store_true", help="the quality probe (builtin-12)")
    # bench-out (issue 30 item 3): the probe's endpoint and question set, the sizes.
    more.add_argument(
        "--quality-endpoint",
        choices=("chat", "completions"),
        default="chat",
        help="ask the probe through the chat template (chat, default) or as plain text"
        " (completions: /v1/completions, Ollama raw)",
    )
    more.add_argument(
        "--quality-file",
        type=Path,
        metavar="QA.jsonl",
        help="your own questions for the probe: JSONL of {question|prompt, answer|answers};"
        " implies --quality",
    )
    more.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="[MODEL=]SIZE|PATH",
        help="a model's size where the server tells none: 4.1GB, or a model file's path;"
        " repeat per model",
    )
    more.add_argument("--no-gpu", action="store_true", help="do not sample GPUs")
    more.add_argument(
        "--sample-interval",
        type=_interval,
        default=1.0,
        help="seconds between resource samples (default 1)",
    )

    policy = run.add_argument_group("policy")
    policy.add_argument(
        "--queue-wait", type=float, default=2.0, help="target queue wait, seconds (default 2)"
    )
    policy.add_argument(
        "--replicas",
        type=_count,
        default=1,
        help="gateway processes sharing the upstream (default 1)",
    )
    policy.add_argument(
        "--upstream-url", help="name this upstream's GATEWAY_UPSTREAMS entry in the policy"
    )

    out = run.add_argument_group("output")
    out.add_argument(
        "--out", type=Path, help="run document path (default bench-results/run-<time>.json)"
    )
    out.add_argument("--no-save", action="store_true", help="do not save the run document")
    out.add_argument(
        "--format",
        choices=("table", "md", "csv", "json"),
        default="table",
        help="the report on stdout",
    )
    out.add_argument("--plots", type=Path, help="write PNG plots into this directory")
    out.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write a self-contained HTML report (tables and plots, no network)",
    )
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")
    run.set_defaults(bench_handler=_run)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `bench` command with `run`, `compare` and `report`.

    Each leaf sets `bench_handler(args) -> int`; `gateway.cli.main` calls it without loading
    the gateway's settings (a benchmark may run on a machine that serves nothing).
    """
    bench = subparsers.add_parser(
        "bench",
        help="measure a model server or the gateway: TTFT, tokens/s, the knee, regressions",
    )
    commands = bench.add_subparsers(title="commands", metavar="COMMAND", required=True)
    _add_run(commands)
    cmp = commands.add_parser(
        "compare",
        help="compare two saved runs; exit 1 on a regression, 2 when refused (mismatched setups,"
        " NEW lacking what BASE measured) or on a bad file",
    )
    compare.add_arguments(cmp)
    cmp.set_defaults(bench_handler=compare.main_compare)
    rep = commands.add_parser("report", help="print a saved run as a table, Markdown, CSV, JSON")
    report.add_arguments(rep)
    rep.set_defaults(bench_handler=html.main_report)
    # No prefixes: `--key gw_...` would be taken as `--key-file` and the key echoed back.
    bench.allow_abbrev = False
    for leaf in commands.choices.values():
        leaf.allow_abbrev = False


def read_key(key_file: Path | None) -> str | None:
    """The key from `--key-file` (first line, stripped) or `GATEWAY_BENCH_API_KEY`, or None.

    Raises:
        KeyInputError: `read_client_key` refuses the file or the key (a usage error: exit 2).
    """
    return read_client_key(key_file, KEY_ENV) or None


async def detect_api(url: str, key: str | None, wait: float = 10.0) -> Api:
    """Ollama when `GET /api/version` answers with a version, else OpenAI when `/v1/models` does.

    Args:
        url: The target's base URL.
        key: Sent as `Authorization: Bearer` when given.
        wait: Seconds the whole detection may take (both requests, however slowly the server
            trickles its answers).

    Raises:
        BenchError: neither answers (unreachable, too slow, or not a model server).
    """
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with (
            asyncio.timeout(wait),
            httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=wait) as client,
        ):
            async with client.stream("GET", "/api/version") as answer:
                if answer.status_code == 200 and _has_version(await _head_of(answer)):
                    return "ollama"
            # Only the status counts here: the body is never read, however large.
            async with client.stream("GET", "/v1/models") as answer:
                pass
    except TimeoutError:
        raise BenchError(f"{url} did not answer within {wait:g} s") from None
    except httpx.ConnectError as exc:
        # httpx wraps the OS error; its text tells a refused port from a name that never
        # resolved ("Name or service not known").
        reason = str(exc)
        if not reason or reason == "All connection attempts failed":  # httpx's word for refused
            reason = "connection refused or host unreachable"
        raise BenchError(f"cannot reach {url}: {escape_error(reason)}") from None
    except httpx.TransportError as exc:
        raise BenchError(f"cannot reach {url}: {type(exc).__name__}") from None
    if answer.status_code in (401, 403):
        raise BenchError(_refused(answer.status_code, key))
    if answer.status_code == 200:
        return "openai"
    raise BenchError(
        f"{url} answers neither /api/version (Ollama) nor /v1/models (OpenAI): "
        f"HTTP {answer.status_code}; pass --api"
    )


def _refused(status: int, key: str | None) -> str:
    """Why a 401/403 stopped the run: a key refused, or none sent where one is needed."""
    if key is None:
        return f"the target wants an API key ({status}): set {KEY_ENV} or pass --key-file"
    return f"the target refused the key ({status}): check {KEY_ENV} or --key-file"


#: Bytes of `/api/version` read for auto-detection: Ollama's answer is about 20; a larger one
#: is no version, and reading it all would let the target fill memory.
MAX_VERSION_ANSWER = 64 * 1024


async def _head_of(answer: httpx.Response) -> bytes:
    """The start of a streamed answer's body: at most `MAX_VERSION_ANSWER` bytes (more: none)."""
    body = bytearray()
    async for piece in answer.aiter_bytes():
        body += piece
        if len(body) > MAX_VERSION_ANSWER:
            return b""
    return bytes(body)


def _has_version(body: bytes) -> bool:
    try:
        found = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(found, dict) and "version" in found


def _plan(args: argparse.Namespace, target: Target) -> Plan:
    models = tuple(m.strip() for group in args.models for m in group.split(",") if m.strip())
    sampling = Sampling(temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens)
    workload = build_workload(
        args.workload,
        sampling,
        DatasetOptions(
            prompt_words=args.prompt_words,
            output_tokens=args.output_tokens,
            prompts=args.prompts,
            conversations=args.conversations,
            turns=args.turns,
            system_words=args.system_words,
            seed=args.workload_seed,
        ),
    )
    if workload.conversations and (args.rate is not None or args.max_rate is not None):
        raise ValueError("multi-turn conversations run in a closed loop: use --concurrency")
    mode: Mode
    shape: Shape
    levels: tuple[float, ...]
    knee_only = {
        "--max-concurrency": args.max_concurrency,
        "--max-rate": args.max_rate,
        "--rate-start": args.rate_start,
    }
    if not args.knee and (given := [name for name, value in knee_only.items() if value]):
        verb = "applies" if len(given) == 1 else "apply"
        raise ValueError(f"{', '.join(given)} {verb} only with --knee")
    if args.knee:
        mode = "knee"
        if args.max_rate is not None:
            shape, levels = "rate", (args.rate_start or 0.5, args.max_rate)
        else:
            shape, levels = "concurrency", (1.0, float(args.max_concurrency or 64))
    elif args.rate is not None:
        shape, levels = "rate", args.rate
        mode = "fixed" if len(levels) == 1 else "sweep"
    else:
        shape, levels = "concurrency", args.concurrency or (1.0,)
        mode = "fixed" if len(levels) == 1 else "sweep"
    duration = None if args.requests is not None else (args.duration or 30.0)
    if shape == "rate" and duration is not None and min(levels) * duration < 1:
        # The first counted arrival would wait one gap (1/rate s) past the window's end.
        raise ValueError(
            f"a rate of {min(levels):g}/s sends under one request in --duration {duration:g} s"
        )
    if shape == "concurrency":
        _check_descriptors(max(levels))
    if shape == "concurrency" and all(level == int(level) for level in levels):
        levels = tuple(int(level) for level in levels)  # "concurrency 4", not "4.0"
    if args.until_ci is None and args.max_repeats != 10:
        raise ValueError("--max-repeats applies only with --until-ci")
    options = ShapeOptions(
        repeat=args.repeat,
        slo=None if args.slo is None else parse_slo(args.slo),
        knee_gain=args.knee_gain,
        confidence=args.confidence,
        until_ci=args.until_ci,
        max_repeats=args.max_repeats,
    )
    return Plan(
        target=target,
        models=models,
        workload=workload,
        mode=mode,
        shape=shape,
        levels=tuple(levels),
        duration=duration,
        requests=args.requests,
        warmup=args.warmup,
        options=options,
        cold_load=args.cold_load,
        quality=args.quality or args.quality_file is not None,
        sizes=_sizes(args.size, models),
        probe=_probe(args),
        gpu=not args.no_gpu,
        sample_interval=args.sample_interval,
        max_in_flight=args.max_in_flight,
        rate_seed=args.arrival_seed,
        arrivals=args.arrivals,
        target_queue_wait=args.queue_wait,
        replicas=args.replicas,
        upstream_url=args.upstream_url,
        down_after=args.down_after,
        max_error_rate=args.max_error_rate,
    )


def _check_descriptors(connections: float) -> None:
    """Refuse more connections than the open-file limit leaves room for (`FD_HEADROOM`).

    Past it every connection beyond the limit fails with EMFILE and the run measures the
    client's limit, not the server (RLIMIT_NOFILE, getrlimit(2); `ulimit -n` raises it).

    Raises:
        ValueError: `connections` above the soft limit less `FD_HEADROOM`.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and connections > soft - FD_HEADROOM:
        raise ValueError(
            f"{connections:g} connections need more open files than this process may have"
            f" ({soft}, less {FD_HEADROOM} kept free): raise it with `ulimit -n` or ask less"
        )


def _sizes(given: Sequence[str], models: Sequence[str]) -> dict[str, SizeHint]:
    """`--size` values by model (`""`: every model).

    Raises:
        ValueError: a value `parse_size` refuses, or one naming a model not measured (a typo
            would leave the size out silently); a usage error.
    """
    found: dict[str, SizeHint] = {}
    for text in given:
        model, hint = parse_size(text)
        if model is not None and model not in models:
            raise ValueError(f"--size names {model!r}, which is not among --models")
        found[model or ""] = hint
    return found


def _probe(args: argparse.Namespace) -> QualityProbe:
    """The quality probe's endpoint and questions. Raises QuestionFileError (a usage error)."""
    if args.quality_file is None:
        return QualityProbe(endpoint=args.quality_endpoint)
    questions, name = load_questions(args.quality_file)
    return QualityProbe(endpoint=args.quality_endpoint, questions=questions, question_set=name)


def _say(quiet: bool) -> Any:
    if quiet:
        return None
    tty = sys.stderr.isatty()

    def say(text: str) -> None:
        if text.startswith("\r") and not text.endswith("\n") and not tty:
            return  # an in-place update only makes sense on a terminal
        if text.startswith("\r") and tty:
            # Erase what a longer line before it left (ECMA-48 EL, "erase in line").
            text = text.rstrip("\n") + "\x1b[K" + ("\n" if text.endswith("\n") else "")
        sys.stderr.write(text if text.startswith("\r") or text.endswith("\n") else text + "\n")
        sys.stderr.flush()

    return say


def _out_path(out: Path | None) -> Path:
    """Where the run document goes, checked before anything is measured.

    Raises:
        ValueError: its directory cannot be made or written (a long run must not be lost to a
            typo found only at the end).
    """
    path = out or Path("bench-results") / time.strftime("run-%Y%m%dT%H%M%SZ.json", time.gmtime())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {path}: cannot make {path.parent}: {exc.strerror}") from None
    if path.is_dir():
        raise ValueError(f"--out {path} is a directory")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {path}: {path.parent} is not writable")
    return path


def _save(doc: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A non-finite number (a server's nonsense) becomes null: NaN and Infinity are not JSON.
    text = json.dumps(compare.json_safe(doc), indent=2, ensure_ascii=False, allow_nan=False)
    # Through a new file and a rename: a symlink planted at `path` is replaced, not followed.
    plots.replace_file(path, lambda handle: handle.write(text.encode("utf-8") + b"\n"))
    return path


def _surface_hint(doc: dict[str, Any], surface: str) -> str:
    """A hint when `--endpoint responses|messages` met 404s: the server may not serve the path.

    The gateway serves `/v1/responses` and `/v1/messages`; the emulator and most engines
    (Ollama before its own, llama.cpp, vLLM builds without them) answer those paths 404.
    """
    if surface not in ("responses", "messages"):
        return ""
    examples = (
        str(example)
        for entry in doc.get("models", [])
        for point in entry.get("points", [])
        for repeat in point.get("repeats", [])
        for example in repeat.get("error_examples", [])
    )
    if not any(example.startswith("HTTP 404") for example in examples):
        return ""
    return (
        f" (HTTP 404 on /v1/{surface}: the server may not serve that path; the gateway does,"
        " the emulator and most engines do not: benchmark through `gateway serve`)"
    )


def _run(args: argparse.Namespace) -> int:
    """`gateway bench run`: the exit status of docs/benchmarking.md "Exit status".

    0 done; 1 the target failed (unreachable, key refused, model missing, stopped answering
    mid-run: the part measured is saved, marked partial), no request succeeded, or the document
    could not be saved; 2 a usage error; 3 more failed requests than `--max-error-rate`.
    """
    say = _say(args.quiet)
    key: str | None = None
    try:
        key = read_key(args.key_file)
        parts = urlsplit(args.target)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            shown = escape_error(args.target, 80)
            raise ValueError(f"--target must be an http:// or https:// URL, got {shown!r}")
        if parts.username is not None or parts.password is not None:
            # It would land in the saved run, the report and this process's visible argv.
            raise ValueError(f"--target must not carry a user or password; use ${KEY_ENV}")
        api: Api = args.api
        if args.api == "auto" and args.endpoint in ("responses", "messages"):
            api = "openai"  # the agent surfaces are /v1 ones, whatever else the target speaks
        elif args.api == "auto":
            api = asyncio.run(detect_api(args.target, key))
        target = Target(
            url=args.target,
            api=api,
            key=key,
            chat=args.endpoint != "generate",
            timeout=args.timeout,
            surface=args.endpoint if args.endpoint in ("responses", "messages") else "",
        )
        plan = _plan(args, target)
        out = None if args.no_save else _out_path(args.out)
    except (BenchError, WorkloadError, ValueError) as exc:
        print(f"gateway bench: {redact(str(exc), key)}", file=sys.stderr)
        return 2 if not isinstance(exc, BenchError) else 1
    try:
        doc = asyncio.run(run_benchmark(plan, say=say))
    except BenchError as exc:
        print(f"gateway bench: {redact(str(exc), target.key)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gateway bench: interrupted; nothing saved", file=sys.stderr)
        return 130
    saved = True
    if out is not None:
        try:
            _save(doc, out)
            if say is not None:
                say(f"saved {out}")
        except OSError as exc:  # the report below still shows what was measured
            saved = False
            print(f"gateway bench: could not save {out}: {exc.strerror or exc}", file=sys.stderr)
    sys.stdout.write(report.RENDERERS[args.format](doc))
    if args.plots is not None:
        notes: list[str] = []
        try:
            for written in plots.plot_run(doc, args.plots, notes=notes):
                if say is not None:
                    say(f"plot {written}")
            for note in notes:
                print(f"gateway bench: {note}", file=sys.stderr)
        except (plots.PlotError, OSError) as exc:
            print(f"gateway bench: no plots: {exc}", file=sys.stderr)
    if args.html is not None:
        try:
            for note in html.write_report(doc, args.html):
                print(f"gateway bench: {note}", file=sys.stderr)
            if say is not None:
                say(f"html {args.html}")
        except OSError as exc:
            print(f"gateway bench: no HTML report: {exc.strerror or exc}", file=sys.stderr)
    completed = sum(
        (repeat.get("requests", 0) - repeat.get("errors", 0))
        for entry in doc["models"]
        for point in entry["points"]
        for repeat in point["repeats"]
    )
    if doc.get("partial"):
        where = f"saved in {out} (marked partial)" if out is not None and saved else "not saved"
        reason = redact(str(doc.get("partial_reason")), plan.target.key)
        print(f"gateway bench: stopped: {reason}; the part measured is {where}", file=sys.stderr)
        return 1
    hint = _surface_hint(doc, plan.target.surface)
    if completed == 0:
        print(f"gateway bench: no request succeeded{hint}", file=sys.stderr)
        return 1
    if not saved:
        return 1
    too_many = error_verdict(doc, plan.max_error_rate)
    if too_many is not None:
        print(f"gateway bench: too many failed requests: {too_many}{hint}", file=sys.stderr)
        return EXIT_TOO_MANY_ERRORS
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run `gateway bench ...` on its own (tests; `gateway.cli` is the usual entry)."""
    parser = argparse.ArgumentParser(prog="gateway", allow_abbrev=False)
    add_parser(parser.add_subparsers(required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    handler = args.bench_handler
    return int(handler(args))

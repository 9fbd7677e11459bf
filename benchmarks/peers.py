# ruff: noqa: T201 (a benchmark prints its table)
"""`gateway bench` side by side with GuideLLM: same server, same load, one run; TTFT and tokens/s.

Usage (GuideLLM in its own venv, never the project's; it pulls torch)::

    python3 -m venv /work/peer-venv && /work/peer-venv/bin/pip install guidellm==0.8.1
    python -m benchmarks.peers --target emulator --guidellm /work/peer-venv/bin/guidellm
    python -m benchmarks.peers --target model    --guidellm /work/peer-venv/bin/guidellm
    python -m benchmarks.peers --url http://127.0.0.1:11434 --model M --guidellm ...

The script starts the target (the emulator with a fixed TTFT and inter-token time, or Gemma 3
270M on llama-cpp-python with `--interrupt_requests false` so that concurrent requests queue
instead of cutting each other short), writes one JSONL workload that both tools read, sends one
warm-up request that neither tool measures, runs GuideLLM, then `gateway bench run`, and prints
each measure, the relative difference |ours - peer| / peer and whether it is within `--tolerance`
(5% by default). It exits 1 when a measure is outside the tolerance, 2 when a side has no value.

Same load on both sides: `/v1/chat/completions`, stream, the same `messages` in the same order
(the JSONL file, exactly `--requests` rows, cycled from a fixed prompt list), `max_tokens`,
temperature 0 and seed 1234 in every body, `--concurrency` closed-loop workers that all start at
once, no warm-up inside either run, every request counted.

How each tool defines the two measures, and why they compare like with like:

* TTFT. GuideLLM (`backends/openai/http.py`): `time.time()` just before the HTTP request is
  opened to the arrival of the first SSE line whose delta has content (role-only chunks such as
  llama-cpp-python's first one do not count); per request, its
  `time_to_first_token_ms.successful.median` is a nearest-rank median (CDF search, no
  interpolation). `gateway bench`: request sent to first chunk with content, per request;
  `ttft_seconds.p50` is an interpolated median; with one repeat its `summary` median is that
  value. Both include the connection set-up and any queueing at the server, so on a server that
  runs one generation at a time (llama-cpp-python) both include the queue wait. The script also
  recomputes GuideLLM's interpolated median from its per-request timings (`detail`).
* Output tokens/s. GuideLLM's `output_tokens_per_second.successful.mean` is a time-weighted mean
  of a rate series, which works out to (sum of output tokens of the successful requests) /
  (benchmark `end_time` - `start_time`), the window from the first request's start to the last
  request's end. Its token count is the server's `usage.completion_tokens`, or the number of
  content chunks when the stream has no usage (llama-cpp-python's stream has none).
  `gateway bench`'s `output_tokens_per_second` is the sum of output tokens of the requests that
  completed in the window / window seconds, with the server's count where reported. Both are
  aggregate throughput (not a per-request decode rate), over the same kind of window, from the
  same counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.peer_guidellm import Load, Measures, read_guidellm, run_guidellm

# Fixed prompts, English and Chinese, short and longer; cycled into the workload in this order.
PROMPTS = [
    "Explain what a hash table is in two sentences.",
    "Name three uses of a reverse proxy.",
    "用两句话解释什么是首个令牌延迟。",
    "Summarise the rules of chess for a child who has never played.",
    "Why does a GPU speed up the decoding of a language model? Answer briefly.",
    "请列出三种缓存淘汰策略并简要说明。",
]


def write_workload(path: Path, requests: int) -> Path:
    """Write `requests` JSONL rows `{"id", "messages"}` cycling `PROMPTS`; return `path`."""
    with path.open("w", encoding="utf-8") as out:
        for i in range(requests):
            prompt = PROMPTS[i % len(PROMPTS)]
            row = {"id": f"peer-{i}", "messages": [{"role": "user", "content": prompt}]}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def warm_up(load: Load) -> None:
    """Send one streamed chat request that neither tool measures (model load, caches)."""
    body = {
        "model": load.model,
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        "max_tokens": load.max_tokens,
        "temperature": load.temperature,
        "seed": load.seed,
        "stream": True,
    }
    request = urllib.request.Request(  # noqa: S310 - loopback URL given by the caller
        f"{load.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310
        response.read()


# --- our side -------------------------------------------------------------------------------
def run_gateway_bench(load: Load, workdir: Path) -> Measures:
    """Run `gateway bench run` on `load` and read the contract's run document.

    Returns:
        The measures from `models[0].points[0].summary` (`ttft_seconds.p50` and
        `output_tokens_per_second` medians) and the first repeat's counts.

    Raises:
        RuntimeError: The command exited non-zero (its log is named in the message).
    """
    output = workdir / "gateway-bench.json"
    argv = [sys.executable, "-m", "gateway", "bench", "run", "--target", load.url]
    argv += ["--api", "openai", "--model", load.model, "--concurrency", str(load.concurrency)]
    argv += ["--requests", str(load.requests), "--max-tokens", str(load.max_tokens)]
    argv += ["--workload", str(load.workload), "--warmup", "0", "--repeat", "1"]
    argv += ["--no-gpu", "--quiet", "--format", "json", "--out", str(output)]
    log = workdir / "gateway-bench.log"
    with log.open("wb") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)  # noqa: S603
    if done.returncode != 0:
        raise RuntimeError(f"gateway bench exited {done.returncode}; see {log}")
    point = json.loads(output.read_text())["models"][0]["points"][0]
    summary, repeat = point["summary"], point["repeats"][0]
    ttft = repeat["metrics"].get("ttft_seconds", {}).get("p50")
    tokens = repeat["metrics"].get("output_tokens", {})
    return Measures(
        ttft_p50=summary["ttft_seconds.p50"]["median"],
        output_tokens_per_second=summary["output_tokens_per_second"]["median"],
        completed=int(repeat["completed"]),
        errors=int(repeat["errors"]),
        output_tokens=(
            round(tokens["mean"] * tokens["count"]) if tokens.get("mean") is not None else None
        ),
        window_seconds=repeat["window_seconds"],
        detail={"ttft_p50_first_repeat": ttft},
    )


# --- targets and the table ------------------------------------------------------------------


@contextlib.contextmanager
def target(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, str]]:
    """Start (or name) the server; yield (base URL, model name)."""
    if args.url:
        yield args.url.rstrip("/"), args.model
        return
    if args.target == "emulator":
        from benchmarks.servers import MODEL, emulator_process

        server = emulator_process(
            workdir, ttft=args.ttft, inter_token=args.inter_token, tokens=args.max_tokens
        )
        with server:
            yield server.url, MODEL
        return
    from gateway.testing.stack import MODEL_ALIAS, model_server

    (workdir / "model").mkdir(exist_ok=True)
    model = model_server(workdir / "model")
    model.argv += ["--interrupt_requests", "false"]
    with model:
        yield model.url, MODEL_ALIAS


def relative(ours: float | None, peer: float | None) -> float | None:
    """|ours - peer| / peer, or None when either is missing or the peer's value is 0."""
    if ours is None or peer is None or peer == 0:
        return None
    return abs(ours - peer) / peer


def table(peer: Measures, ours: Measures | None, tolerance: float) -> tuple[list[str], int]:
    """Render the side-by-side lines and the exit status (0 ok, 1 outside, 2 missing)."""
    rows = [
        ("TTFT p50 (s)", peer.ttft_p50, ours.ttft_p50 if ours else None),
        (
            "output tokens/s",
            peer.output_tokens_per_second,
            ours.output_tokens_per_second if ours else None,
        ),
    ]
    lines = [f"{'measure':<18}{'GuideLLM':>12}{'gateway':>12}{'diff':>9}  within"]
    status = 0
    for name, theirs, mine in rows:
        diff = relative(mine, theirs)
        verdict = "n/a" if diff is None else ("yes" if diff <= tolerance else "NO")
        status = max(status, 2 if diff is None else (1 if diff > tolerance else 0))
        show = [f"{v:>12.4f}" if v is not None else f"{'-':>12}" for v in (theirs, mine)]
        pct = f"{diff:>8.1%}" if diff is not None else f"{'-':>8}"
        lines.append(f"{name:<18}{show[0]}{show[1]} {pct}  {verdict}")
    for label, m in (("GuideLLM", peer), ("gateway", ours)):
        if m is not None:
            lines.append(
                f"{label}: {m.completed} completed, {m.errors} errors, {m.output_tokens} output "
                f"tokens in {m.window_seconds:.3f} s; {m.detail}"
            )
    return lines, status


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("--target", choices=("emulator", "model"), default="emulator")
    parser.add_argument("--url", help="an already running OpenAI-compatible server instead")
    parser.add_argument("--model", default="bench:latest", help="model name with --url")
    parser.add_argument("--guidellm", default="guidellm", help="the GuideLLM executable")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ttft", type=float, default=0.2, help="emulator seconds to first token")
    parser.add_argument("--inter-token", type=float, default=0.02, help="emulator seconds")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--workdir", type=Path, help="keep reports and logs here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run both tools on one target and print the comparison; return the exit status."""
    args = build_parser().parse_args(argv)
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        workdir.mkdir(parents=True, exist_ok=True)
        workload = write_workload(workdir / "workload.jsonl", args.requests)
        url, model = stack.enter_context(target(args, workdir))
        load = Load(url, model, workload, args.concurrency, args.requests, args.max_tokens)
        warm_up(load)
        print(f"GuideLLM on {url} ({model}) @{load.concurrency} ...", file=sys.stderr)
        peer = read_guidellm(run_guidellm(args.guidellm, load, workdir))
        print("gateway bench ...", file=sys.stderr)
        ours = run_gateway_bench(load, workdir)
    lines, status = table(peer, ours, args.tolerance)
    print(f"{model} @{load.concurrency}, {load.requests} requests, max_tokens {load.max_tokens}")
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    raise SystemExit(main())

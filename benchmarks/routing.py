# ruff: noqa: T201 (a benchmark prints its progress and tables)
"""`python -m benchmarks.routing`: routing policies compared over emulated GPU servers (issue 28).

Starts K emulators (`--servers`, 2 and 4) as GPU servers (`--gpu-profile rtx3090-llama3.1-8b`,
`gateway.testing.emulator.profiles`), one `gateway serve` in front of them per policy
(`GATEWAY_UPSTREAMS`, and `GATEWAY_ROUTING` unless the policy is the default,
`least_in_flight`), and drives each workload (`benchmarks.routing_load`) at each concurrency
(a multiple of K, `--levels`), resetting the emulators (`POST /emulator/reset`) before each
point. One table per workload:

* `shared`: conversations of 6 turns of 300 words (pasted code, a tool's output), each resending
  its history, with a 1,500-word system prompt shared by every user, 3 of 4 conversations on
  one model and 1 on a second; both models preloaded on every server. The shared prompt is soon
  cached everywhere; each conversation's own history only where it was served.
* `agents`: sessions of 10 turns of 400 words (an agent's tool outputs), a pause of 2 s on
  average between them (the tool running, exponential), behind the same shared system prompt
  and model mix. With the pause, the turn that just ended no longer hands its own server to the
  next turn (it is least loaded only by accident, without one), and the histories (up to 7,000
  tokens each) outgrow a server's prefix cache when every server serves every session.
* `agents8k`: `agents` cut to 8 turns, the most whose last prompt (8,119 tokens) fits the
  preset's context of 8,192 tokens (`num_ctx` 8192, whose KV cache x 4 slots is the 32,768
  tokens a server caches): a real Ollama truncates the history past it (its `truncate`
  defaults to true), so `agents`' turns 9 and 10 (8,835 and 9,540 tokens) could not be sent
  whole to the server the preset describes. Everything else is `agents`': a coding agent's
  session as Claude Code sends it (the same system prompt and tools first in every session,
  then a history that grows by a tool result a turn, short tool-call answers), its shared
  part cut from Claude Code's 49 KB (about 12,000 tokens, more than the whole context here)
  to `agents`' 2,400 tokens.
* `unique`: single-turn 600-word prompts, each unique from its first token: no prefix to
  reuse, so affinity can only cost.
* `models`: three models over 2 servers, each preloading one of the first two; the third is
  loaded where it is asked for (memory holds two). `avoidable` counts cold loads of a model
  started while another server held it loaded with a free slot (`/emulator/events`).

Columns: TTFT p50/p90 seen by the clients (sent to first content chunk) of every request started
in the run (those running at its end finish and count), output tokens/s over the run and that
drain, prefix hit rate (cached / prompt tokens, the emulators'
counters), cold loads, and load imbalance (the busiest server's requests / the mean); under
each row, the gateway's route decisions in the point per reason
(`gateway_route_decisions_total`), also in `--out`. The default run (2 and 4 servers, levels 2,
4 and 8 per server: the last past the 4 slots per model of the preset, three policies, 10 s a
point) takes over 10 minutes; `--quick` (2 servers, level 2, 4 s) about one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

from benchmarks.routing_load import Workload, drive
from benchmarks.servers import gateway_with_key
from gateway.clients.bench.quantiles import percentile
from gateway.testing.stack import ManagedProcess, free_port

PRESET = "rtx3090-llama3.1-8b"
POLICIES = ("least_in_flight", "round_robin", "scored")
MODELS = ("llama3.1:8b", "qwen2.5:7b", "gemma3:4b")

WORKLOADS = {
    "shared": Workload("shared", ((MODELS[0], 3), (MODELS[1], 1)), 6, 1500, 300, 48),
    "agents": Workload("agents", ((MODELS[0], 3), (MODELS[1], 1)), 10, 1500, 400, 48, 2.0),
    "agents8k": Workload("agents8k", ((MODELS[0], 3), (MODELS[1], 1)), 8, 1500, 400, 48, 2.0),
    "unique": Workload("unique", ((MODELS[0], 1),), 1, 0, 600, 48),
    "models": Workload("models", ((MODELS[0], 2), (MODELS[1], 2), (MODELS[2], 1)), 1, 0, 100, 48),
}
"""The workloads (module docstring): name, model shares, turns, system, user and answer sizes."""


@dataclass(frozen=True)
class Row:
    """One point of a table: a workload at one concurrency, over K servers, under one policy."""

    workload: str
    servers: int
    policy: str
    concurrency: int
    requests: int
    errors: int
    ttft_p50: float | None
    ttft_p90: float | None
    output_tps: float
    prefix_hit_rate: float
    cold_loads: int
    avoidable_loads: int
    imbalance: float
    failures: dict[str, int]
    decisions: dict[str, int]


def preloads(workload: str, index: int) -> str:
    """The models server `index` loads at start for a workload."""
    if workload == "models":
        return MODELS[index % 2]
    return f"{MODELS[0]},{MODELS[1]}"


def emulator(workdir: Path, workload: str, index: int) -> ManagedProcess:
    """One GPU emulator of the workload's fleet on a free port."""
    port = free_port()
    argv = [sys.executable, "-m", "gateway.testing.emulator", "--port", str(port)]
    argv += ["--log-level", "warning", "--models", ",".join(MODELS), "--gpu-profile", PRESET]
    argv += ["--preload", preloads(workload, index), "--tokens", "256"]
    url = f"http://127.0.0.1:{port}"
    log = workdir / f"emulator-{workload}-{index}.log"
    return ManagedProcess(f"emulator {index}", argv, url, f"{url}/api/version", log_path=log)


def _state_at(events: list[dict[str, Any]], model: str, moment: float) -> tuple[bool, int]:
    """(loaded, slots held) of `model` at `moment`, from one server's journal."""
    loaded, slots = False, 0
    for event in events:
        if event["t"] >= moment:
            break
        if event["model"] != model:
            continue
        kind = event["kind"]
        if kind == "ready":
            loaded = True
        elif kind == "load":
            loaded = event["value"] <= moment
        elif kind in ("evict", "unload"):
            loaded = False
        elif kind == "slots":
            slots = int(event["value"])
    return loaded, slots


#: Seconds after a cold load's start in which a slot taken on another server was already
#: taken: the gateway counts a request from its choice, a server from the request's arrival,
#: so a request on its way (tens of milliseconds on a busy 2-core machine) shows there late.
IN_TRANSIT = 0.1


def _held_until(events: list[dict[str, Any]], model: str, start: float, end: float) -> int:
    """The most slots of `model` held at any moment in [start, end], from one journal."""
    _, most = _state_at(events, model, start)
    for event in events:
        if start <= event["t"] <= end and event["model"] == model and event["kind"] == "slots":
            most = max(most, int(event["value"]))
    return most


def avoidable_loads(journals: list[list[dict[str, Any]]], parallel: int) -> int:
    """Cold loads started while another server had the model loaded and a slot of it free.

    Free means free at the load's start and for `IN_TRANSIT` seconds after (a request then
    arriving there was already on its way when the load was decided).
    """
    count = 0
    for index, events in enumerate(journals):
        for event in events:
            if event["kind"] != "load":
                continue
            for other, their in enumerate(journals):
                if other == index:
                    continue
                model, moment = event["model"], event["t"]
                loaded, _ = _state_at(their, model, moment)
                if loaded and _held_until(their, model, moment, moment + IN_TRANSIT) < parallel:
                    count += 1
                    break
    return count


def decisions(gateway: str) -> dict[str, int]:
    """The gateway's route decisions so far, per reason (`gateway_route_decisions_total`)."""
    text = httpx.get(f"{gateway}/metrics", timeout=10).text
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("gateway_route_decisions_total{"):
            labels, _, value = line.rpartition(" ")
            reason = labels.split('reason="', 1)[1].split('"', 1)[0]
            counts[reason] = counts.get(reason, 0) + int(float(value))
    return counts


def point(
    urls: list[str], gateway: str, key: str, workload: str, policy: str, level: int, seconds: float
) -> Row:
    """Reset the emulators, drive one run, and read back what the servers did."""
    for url in urls:
        httpx.post(f"{url}/emulator/reset", timeout=10).raise_for_status()
    # A reset is a restart the gateway cannot see (the server never went down): until its
    # monitor polls `/api/ps` again it still holds the previous point's loaded models.
    time.sleep(SETTLE)
    before = decisions(gateway)
    load = WORKLOADS[workload]
    result = anyio.run(
        lambda: drive(gateway, key, load, concurrency=level, seconds=seconds, seed=level)
    )
    stats = [httpx.get(f"{url}/emulator/stats", timeout=10).json() for url in urls]
    journals = [httpx.get(f"{url}/emulator/events", timeout=30).json()["events"] for url in urls]
    served = [s["total"]["requests"] for s in stats]
    prompt = sum(s["total"]["prompt_tokens"] for s in stats)
    cached = sum(s["total"]["cached_tokens"] for s in stats)
    mean = sum(served) / len(served)
    after = decisions(gateway)
    return Row(
        workload=workload,
        servers=len(urls),
        policy=policy,
        concurrency=level,
        requests=result.requests,
        errors=result.errors,
        ttft_p50=percentile(result.ttft, 50),
        ttft_p90=percentile(result.ttft, 90),
        output_tps=result.output_tokens / result.seconds if result.seconds else 0.0,
        prefix_hit_rate=cached / prompt if prompt else 0.0,
        cold_loads=sum(s["total"]["cold_loads"] for s in stats),
        avoidable_loads=avoidable_loads(journals, int(stats[0]["parallel"])),
        imbalance=max(served) / mean if mean else 0.0,
        failures=result.failures,
        decisions={r: n - before.get(r, 0) for r, n in after.items() if n > before.get(r, 0)},
    )


#: Seconds `GATEWAY_UPSTREAM_POLL_INTERVAL` is set to in the benchmarked gateways.
POLL_INTERVAL = 1.0

#: Seconds waited after the emulators' reset: two polls, so every gateway read them anew.
SETTLE = 2.5 * POLL_INTERVAL


def gateway_env(urls: list[str], policy: str) -> dict[str, str]:
    """The gateway's upstreams and its routing policy, named even when it is the default."""
    return {
        "GATEWAY_UPSTREAMS": json.dumps([{"url": url} for url in urls]),
        "GATEWAY_UPSTREAM_POLL_INTERVAL": str(POLL_INTERVAL),
        "GATEWAY_ROUTING": policy,
    }


def run(args: argparse.Namespace, workdir: Path) -> list[Row]:
    """Every workload, fleet size, policy and level; progress on stdout."""
    rows: list[Row] = []
    for workload in args.workloads:
        for count in args.servers:
            if workload == "models" and count != 2:
                continue  # three models over two servers, by definition
            with ExitStack() as fleet:
                urls = [
                    fleet.enter_context(emulator(workdir, workload, i)).url for i in range(count)
                ]
                for policy in args.policies:
                    where = workdir / f"gw-{workload}-{count}-{policy}"
                    process, key = gateway_with_key(
                        where, urls[0], extra_env=gateway_env(urls, policy)
                    )
                    with process:
                        for multiple in args.levels:
                            row = point(
                                urls,
                                process.url,
                                key,
                                workload,
                                policy,
                                multiple * count,
                                args.duration,
                            )
                            print(f"  {format_row(row)}", flush=True)
                            print(f"    decisions: {row.decisions}", flush=True)
                            for reason, failed in row.failures.items():
                                print(f"    {failed} failed: {reason}", flush=True)
                            rows.append(row)
    return rows


HEADER = (
    f"{'servers':>7} {'policy':<16} {'conc':>4} {'reqs':>5} {'err':>4} {'TTFT p50':>9} "
    f"{'TTFT p90':>9} {'out tok/s':>9} {'prefix hit':>10} {'cold':>4} {'avoidable':>9} "
    f"{'imbalance':>9}"
)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def format_row(row: Row) -> str:
    """One table line."""
    return (
        f"{row.servers:>7} {row.policy:<16} {row.concurrency:>4} {row.requests:>5} "
        f"{row.errors:>4} {_seconds(row.ttft_p50):>9} {_seconds(row.ttft_p90):>9} "
        f"{row.output_tps:>9.1f} {row.prefix_hit_rate:>10.1%} {row.cold_loads:>4} "
        f"{row.avoidable_loads:>9} {row.imbalance:>9.2f}"
    )


def tables(rows: Sequence[Row]) -> str:
    """One table per workload, in the order the workloads ran."""
    out: list[str] = []
    for workload in dict.fromkeys(row.workload for row in rows):
        out += [f"workload {workload}", HEADER]
        out += [format_row(row) for row in rows if row.workload == workload]
        out.append("")
    return "\n".join(out)


def _names(known: Sequence[str]) -> Any:
    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",") if part.strip()]
        unknown = sorted(set(names) - set(known))
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {','.join(known)}: {text}")
        return names

    return parse


def _integers(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not integers: {text}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("positive integers, comma-separated")
    return values


def build_parser() -> argparse.ArgumentParser:
    """The `python -m benchmarks.routing` arguments."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routing", description=__doc__)
    parser.add_argument("--policies", type=_names(POLICIES), default=list(POLICIES))
    parser.add_argument("--workloads", type=_names(tuple(WORKLOADS)), default=list(WORKLOADS))
    parser.add_argument("--servers", type=_integers, default=[2, 4], help="fleet sizes")
    parser.add_argument(
        "--levels", type=_integers, default=[2, 4, 8], help="concurrency per server"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per point")
    parser.add_argument("--quick", action="store_true", help="2 servers, level 2, 4 s a point")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp dir)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison, print the tables, optionally save JSON; 1 if any request failed."""
    args = build_parser().parse_args(argv)
    if args.quick:
        args.servers, args.levels, args.duration = [2], [2], 4.0
    with tempfile.TemporaryDirectory(prefix="routing-") as temp:
        workdir = args.workdir or Path(temp)
        workdir.mkdir(parents=True, exist_ok=True)
        rows = run(args, workdir)
    print()
    print(tables(rows))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(row) for row in rows], indent=2) + "\n")
    return 1 if any(row.errors for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

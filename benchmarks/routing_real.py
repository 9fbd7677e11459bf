# ruff: noqa: T201 (a benchmark prints its progress and table)
"""`python -m benchmarks.routing_real`: routing policies over two real llama.cpp servers (issue 28).

Starts two llama-cpp-python servers with the demo's model (Gemma 3 270M Q4_K_M,
`gateway.testing.stack.model_server`; one thread each, so the two share the 2 cores), and for
each policy a `gateway serve` in front of both (`GATEWAY_UPSTREAMS`, dialect `openai`). Then
two users chat at once: each turn, both conversations send their next message together, in
an order drawn from a seeded shuffle (which user types first is chance). Each conversation
opens with its own document of about `--words` words (a pasted file: its prefix is what a
server can reuse) and asks `--turns` short questions about it, resending the whole history
each turn as chat clients do; answers are capped at `--answer-tokens`.

llama.cpp keeps the KV cache of the last prompt it evaluated and reuses its longest common
prefix with the next one (llama-cpp-python logs `prefix-match hit`): a conversation that comes
back to the server that served its previous turn prefills only the new tail; sent to the
other server, it prefills its whole history again, which on a CPU takes seconds. So the
policies differ in TTFT: least-in-flight sends the two concurrent requests to different
servers, but which conversation gets which is the order they arrive in; the scored policy's
prefix affinity keeps each conversation where its prefix is.

Output: per policy, TTFT p50/p90/max over the turns after the first (the first turn has no
prefix anywhere), the mean, how many turns went back to the server of their previous turn
(from the access log's `upstream` field), and the wall time. About 3 minutes per policy at the
defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import gateway_with_key
from gateway.clients.bench.quantiles import percentile
from gateway.testing.stack import MODEL_ALIAS, ManagedProcess, model_server

POLICIES = ("least_in_flight", "scored")

_TOPICS = (
    "harbour logistics",
    "alpine botany",
    "railway signalling",
    "medieval bookbinding",
    "reef ecology",
    "tidal power",
)


def document(conversation: int, words: int) -> str:
    """A deterministic document of about `words` words, distinct from its first word on."""
    topic = _TOPICS[conversation % len(_TOPICS)]
    rng = random.Random(conversation)  # noqa: S311 - a reproducible text, not a secret
    vocabulary = [
        *topic.split(),
        "ledger", "survey", "measure", "season", "record", "station", "sample", "method",
        "north", "south", "early", "late", "report", "detail", "change", "pattern",
    ]  # fmt: skip
    body = " ".join(rng.choice(vocabulary) for _ in range(words))
    return f"Document {conversation} about {topic}: {body}"


def _ask(
    client: httpx.Client, key: str, messages: list[dict[str, str]], tokens: int
) -> tuple[float, str, str]:
    """One streamed chat turn: (TTFT in seconds, the answer's text, the gateway's request id)."""
    body = {
        "model": MODEL_ALIAS,
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    headers = {"Authorization": f"Bearer {key}"}
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.read().decode()[:300]}")
        request_id = response.headers.get("x-request-id", "")
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            if delta.get("content"):
                first = first if first is not None else time.perf_counter() - started
                text.append(delta["content"])
    return (
        (first if first is not None else time.perf_counter() - started),
        "".join(text),
        request_id,
    )


def _upstreams(log: Path) -> dict[str, str]:
    """Request id -> the upstream that served it, from the gateway's JSON access log."""
    served = {}
    for line in log.read_text(errors="replace").splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            record = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("request_id") and record.get("upstream"):
            served[str(record["request_id"])] = str(record["upstream"])
    return served


def chat(url: str, key: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Two conversations, turn by turn, both turns of a round sent together."""
    conversations = [
        [{"role": "user", "content": document(c, args.words) + " What is it about?"}]
        for c in range(2)
    ]
    rng = random.Random(args.seed)  # noqa: S311 - a reproducible order, not a secret
    turns: list[dict[str, Any]] = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for turn in range(args.turns):
            order = [0, 1]
            rng.shuffle(order)
            results: dict[int, tuple[float, str, str]] = {}

            def run(c: int, results: dict[int, tuple[float, str, str]] = results) -> None:
                results[c] = _ask(client, key, conversations[c], args.answer_tokens)

            threads = []
            for c in order:  # the first to type is the first to arrive
                thread = threading.Thread(target=run, args=(c,))
                thread.start()
                threads.append(thread)
                time.sleep(0.05)
            for thread in threads:
                thread.join()
            for c in range(2):
                ttft, text, request_id = results[c]
                turns.append({"conversation": c, "turn": turn, "ttft": ttft, "id": request_id})
                conversations[c] += [
                    {"role": "assistant", "content": text or "..."},
                    {"role": "user", "content": f"And point {turn + 1}? Answer briefly."},
                ]
            print(f"    turn {turn}: " + ", ".join(f"{t['ttft']:.2f} s" for t in turns[-2:]))
    return turns


def measure(
    policy: str, servers: list[ManagedProcess], workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One gateway with `policy` in front of `servers`; the chat; what it shows."""
    for server in servers:  # a fresh KV cache: evaluate something unrelated on each
        httpx.post(
            f"{server.url}/v1/completions",
            json={"model": MODEL_ALIAS, "prompt": f"Reset {policy}.", "max_tokens": 1},
            timeout=300,
        ).raise_for_status()
    env = {
        "GATEWAY_UPSTREAMS": json.dumps([{"url": s.url, "dialect": "openai"} for s in servers]),
        "GATEWAY_UPSTREAM_DIALECT": "openai",
        "GATEWAY_LOG_LEVEL": "info",
        "GATEWAY_FIRST_BYTE_TIMEOUT": "600",
    }
    if policy != "least_in_flight":
        env["GATEWAY_ROUTING"] = policy
    where = workdir / f"gateway-{policy}"
    process, key = gateway_with_key(where, servers[0].url, dialect="openai", extra_env=env)
    with process:
        started = time.perf_counter()
        turns = chat(process.url, key, args)
        wall = time.perf_counter() - started
        time.sleep(0.5)  # the access log line is written after the answer's end
        served = _upstreams(process.log_path)
    previous: dict[int, str] = {}
    returned = 0
    for turn in turns:
        upstream = served.get(turn["id"], "?")
        if turn["turn"] > 0 and previous.get(turn["conversation"]) == upstream:
            returned += 1
        previous[turn["conversation"]] = upstream
    later = [t["ttft"] for t in turns if t["turn"] > 0]
    return {
        "policy": policy,
        "turns": len(later),
        "ttft_p50": percentile(later, 50),
        "ttft_p90": percentile(later, 90),
        "ttft_max": max(later),
        "ttft_mean": sum(later) / len(later),
        "same_server": returned,
        "wall_s": wall,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Start the two servers, measure each policy, print the table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routing_real", description=__doc__)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation (default 5)")
    parser.add_argument("--words", type=int, default=250, help="document words (default 250)")
    parser.add_argument("--answer-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the rows here (JSON)")
    args = parser.parse_args(argv)
    if args.turns < 2:
        parser.error("--turns must be at least 2")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gateway-routing-real-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        servers = []
        for i in range(2):
            (workdir / f"server{i}").mkdir()
            servers.append(stack.enter_context(model_server(workdir / f"server{i}", n_ctx=4096)))
        for policy in args.policies.split(","):
            print(f"  {policy} ...", flush=True)
            rows.append(measure(policy, servers, workdir, args))
    print("policy            turns  TTFT p50     p90     max    mean  same server    wall")
    for row in rows:
        same = f"{row['same_server']}/{row['turns']}"
        print(
            f"{row['policy']:<16} {row['turns']:>6} {row['ttft_p50']:>8.2f}s"
            f" {row['ttft_p90']:>6.2f}s {row['ttft_max']:>6.2f}s {row['ttft_mean']:>6.2f}s"
            f" {same:>12} {row['wall_s']:>6.1f}s"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

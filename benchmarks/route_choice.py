# ruff: noqa: T201 (a benchmark prints its table)
"""Per-request cost of choosing an upstream: each routing policy, side by side.

Run: `.venv/bin/python -m benchmarks.route_choice [--choices 20000] [--upstreams 4]`.

A pool of emulated upstreams (no network: the choice is pure CPU) with 64 requests in
flight, spread over them. Each measured request builds its ticket as admission does, is
chosen (`UpstreamPool.choose`), answered (`UpstreamPool.answering`, the relay's first chunk:
most of the 64 are decoding) and finished (`UpstreamPool.finished`), while one of the 64
in flight finishes and another starts, so the in-flight counts move. The prompts are those
of multi-turn conversations (a shared system prompt, a history growing by a turn per request,
64 conversations), in two sizes: a chat (~4 kB) and a coding agent (~50 kB, Claude Code's
system prompt and tools' order of size). `scored` hashes each prompt once, message by message;
a string caches its hash, so the columns that reuse their request objects leave out hashing
the text itself, which `agent, new` (each request parsed anew, untimed) counts. `200
messages`: coding-agent sessions deep in their work (a tool call and its result per turn),
where hashing costs per message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack

import httpx

from gateway.metering.metrics import Metrics
from gateway.neutral import GenerationRequest
from gateway.policies import PoolPolicy
from gateway.settings import Settings
from gateway.upstream.pool import Upstream, UpstreamPool, open_pool
from gateway.upstream.scheduling.ticket import RouteTicket

MODEL = "qwen3:8b"
STREAMS = 64
ROUNDS = 10


def _conversations(system_chars: int, turn_chars: int, turns: int) -> list[GenerationRequest]:
    """`STREAMS` conversations of `turns` turns each, interleaved: one request per turn."""
    system = ("You are a careful assistant; follow the rules. " * 10_000)[:system_chars]
    requests = []
    for turn in range(1, turns + 1):
        for talk in range(STREAMS):
            messages = [{"role": "system", "content": system}]
            for n in range(turn):
                text = (f"conversation {talk} turn {n}: " + "words " * turn_chars)[:turn_chars]
                messages.append({"role": "user" if n % 2 == 0 else "assistant", "content": text})
            body = {"model": MODEL, "messages": messages}
            requests.append(GenerationRequest("openai", "chat", body, MODEL))
    return requests


def _tool_sessions(system_chars: int, calls: int, turns: int) -> list[GenerationRequest]:
    """`STREAMS` coding-agent sessions deep in their work: `calls` tool calls and results each.

    Each request is one of a session's last `turns` turns: the system prompt, then an OpenAI
    `tool_calls` message and its result per call made so far (about 2 * `calls` messages).
    """
    system = ("You are a coding agent; read before you edit. " * 10_000)[:system_chars]
    sessions = []
    for talk in range(STREAMS):
        messages: list[dict[str, object]] = [{"role": "system", "content": system}]
        for n in range(calls):
            call = {
                "id": f"call_{talk}_{n}",
                "type": "function",
                "function": {"name": "Read", "arguments": json.dumps({"path": f"/src/m{n}.py"})},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            result = f"def f{n}(x):  # module {n} of session {talk}\n    return x\n" * 8
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        sessions.append(messages)
    requests = []
    for turn in range(turns, 0, -1):  # one request per session and turn, as `_conversations`
        for messages in sessions:
            body = {"model": MODEL, "messages": messages[: len(messages) - 2 * (turn - 1)]}
            requests.append(GenerationRequest("openai", "chat", body, MODEL))
    return requests


async def _pool(mode: str, upstreams: int, stack: AsyncExitStack) -> UpstreamPool:
    settings = Settings(
        _env_file=None,
        upstreams=[{"url": f"http://127.0.0.1:{11000 + n}"} for n in range(upstreams)],
        routing=mode,
    )
    policy = PoolPolicy.of(settings)
    transport = httpx.MockTransport(lambda _: httpx.Response(200, json={"models": []}))
    pool = await open_pool(policy, Metrics(), stack, transport)
    assert pool.scheduler.mode == mode  # noqa: S101 - the policy under test
    return pool


def _cost(
    pool: UpstreamPool, requests: list[GenerationRequest], choices: int, *, fresh: bool = False
) -> float:
    """Mean seconds of ticket + choose + finished, with `STREAMS` requests in flight.

    CPU time of this process (`time.process_time`), the best of `ROUNDS` rounds: the
    machine's other work only ever adds time, and a wall clock counts the time it waits.
    Timed by batches of `STREAMS` requests; with `fresh`, each batch's requests are parsed
    anew from JSON first (untimed), so their strings are new objects, as a request's are: a
    string caches its hash, and a reused request would hash its prompt only the first time.
    """
    held = []
    for n in range(STREAMS):
        ticket = RouteTicket(MODEL, tokens=500, output=256, request=requests[n % len(requests)])
        upstream = pool.choose(MODEL, set(), ticket=ticket)
        assert upstream is not None  # noqa: S101
        pool.answering(upstream, MODEL, ticket)
        held.append((upstream, ticket))
    raw = [json.dumps(request.body) for request in requests] if fresh else []
    per_round = max(choices // ROUNDS, 1)
    best = float("inf")
    for first in range(0, per_round * ROUNDS, per_round):
        spent = 0.0
        for start in range(first, first + per_round, STREAMS):
            numbers = range(start, min(start + STREAMS, first + per_round))
            batch = [requests[n % len(requests)] for n in numbers]
            if fresh:
                batch = [
                    GenerationRequest("openai", "chat", json.loads(raw[n % len(raw)]), MODEL)
                    for n in numbers
                ]
            started = time.process_time()
            _requests(pool, batch, held, numbers)
            spent += time.process_time() - started
        best = min(best, spent / per_round)
    return best


def _requests(
    pool: UpstreamPool,
    batch: list[GenerationRequest],
    held: list[tuple[Upstream | None, RouteTicket]],
    numbers: range,
) -> None:
    for request, n in zip(batch, numbers, strict=True):
        ticket = RouteTicket(
            MODEL, tokens=request.prompt_bytes // 4 + 256, output=256, request=request
        )
        upstream = pool.choose(MODEL, set(), ticket=ticket)
        assert upstream is not None  # noqa: S101
        # Its first chunk (as the relay reports it): most of the 64 in flight are decoding.
        pool.answering(upstream, MODEL, ticket)
        old, old_ticket = held[n % STREAMS]
        assert old is not None  # noqa: S101
        pool.finished(old, True, ticket=old_ticket)
        held[n % STREAMS] = (upstream, ticket)


async def _run(choices: int, upstreams: int) -> None:
    chat = _conversations(2_000, 400, 5)
    agent = _conversations(48_000, 1_000, 5)
    workloads = {
        "chat ~4 kB": (chat, False),
        "agent ~50 kB": (agent, False),
        "agent, new": (agent, True),
        "200 messages": (_tool_sessions(20_000, 100, 5), False),
    }
    print(f"{upstreams} upstreams, {STREAMS} in flight; microseconds per request (choose+finish)")
    print(f"{'policy':<16}" + "".join(f"{name:>16}" for name in workloads))
    for mode in ("least_in_flight", "round_robin", "scored"):
        row = f"{mode:<16}"
        for requests, fresh in workloads.values():
            async with AsyncExitStack() as stack:
                pool = await _pool(mode, upstreams, stack)
                row += f"{_cost(pool, requests, choices, fresh=fresh) * 1e6:>16.1f}"
        print(row)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table (module docstring)."""
    parser = argparse.ArgumentParser(prog="benchmarks.route_choice", description=__doc__)
    parser.add_argument("--choices", type=int, default=20_000)
    parser.add_argument("--upstreams", type=int, default=4)
    args = parser.parse_args(argv)
    asyncio.run(_run(args.choices, args.upstreams))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The routing benchmark's workloads and its closed-loop driver (`benchmarks.routing` runs them).

Owns what the clients ask (`Workload`: multi-turn conversations with a shared system prompt over
a mix of models, unique single-turn prompts, or three models over servers that each hold one) and
`drive`: C workers, each playing a conversation turn after turn (every turn resends the whole
history with the answers the server gave) until the run's time is up, measuring TTFT (request
sent to the first content chunk) and output tokens (`eval_count`) per request.

`gateway bench run` has the conversations and the shared system prompt but one model per run;
a routing policy must also see the models mixed on one server, so this driver mixes them.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

WORDS = [
    "cache",
    "route",
    "server",
    "model",
    "token",
    "prefix",
    "batch",
    "queue",
    "load",
    "memory",
    "prompt",
    "answer",
    "system",
    "user",
    "turn",
    "history",
    "latency",
    "throughput",
    "slot",
    "weight",
    "graph",
    "vector",
    "kernel",
    "tensor",
    "block",
    "hash",
]


DRAIN = 120.0
"""Seconds the requests running at the end of a run may take to finish."""


@dataclass(frozen=True)
class Workload:
    """What the clients ask in one workload.

    Attributes:
        name: `shared`, `unique` or `models`.
        models: Model names and their shares of the conversations, e.g. `(("m1", 3), ("m2", 1))`.
        turns: User turns per conversation (1: single-turn).
        system_words: Words of the system prompt every conversation shares (0: none).
        user_words: Words of each user message.
        answer_tokens: Tokens per answer (`num_predict`).
        think_s: Mean seconds between an answer and the conversation's next turn (exponential:
            a person reading and typing, an agent running its tool); 0 sends the next turn at
            once. Without it a closed loop flatters least-in-flight: the turn that just ended
            freed a slot on exactly its own server, so the next turn finds that server the
            least loaded and returns to its cache by accident.
    """

    name: str
    models: tuple[tuple[str, int], ...]
    turns: int
    system_words: int
    user_words: int
    answer_tokens: int
    think_s: float = 0.0

    def conversations(self, seed: int) -> Iterator[tuple[str, list[str], str | None]]:
        """Endless `(model, user turns, system prompt)`; every text unique to `seed`."""
        rng = random.Random(seed)  # noqa: S311 - workload text, not a secret
        system = None
        if self.system_words:
            shared = random.Random(0)  # noqa: S311 - the same system prompt in every run
            system = " ".join(shared.choice(WORDS) for _ in range(self.system_words))
        models = [name for name, share in self.models for _ in range(share)]
        for number in itertools.count():
            model = models[number % len(models)]
            turns = [
                f"[{seed}-{number}-{turn}] "
                + " ".join(rng.choice(WORDS) for _ in range(self.user_words))
                for turn in range(self.turns)
            ]
            yield model, turns, system


@dataclass
class Result:
    """What the clients saw in one run.

    Attributes:
        ttft: Seconds to the first content chunk, per completed request.
        output_tokens: Answer tokens of the requests completed.
        requests: Requests completed.
        errors: Requests that failed (a status other than 200, a broken stream).
        failures: Why they failed: `status 503`, an exception's class and text, counted.
        seconds: From the start to the last request's end.
    """

    ttft: list[float] = field(default_factory=list)
    output_tokens: int = 0
    requests: int = 0
    errors: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


async def _ask(
    client: httpx.AsyncClient, model: str, messages: list[dict[str, str]], tokens: int
) -> tuple[float, int, str]:
    """Stream one `/api/chat`; return (TTFT, eval_count, answer text). Raises on failure."""
    body = {
        "model": model,
        "messages": messages,
        "stream": True,
        "options": {"num_predict": tokens, "temperature": 0},
    }
    start = time.monotonic()
    first: float | None = None
    text: list[str] = []
    count = 0
    async with client.stream("POST", "/api/chat", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            message = f"status {response.status_code}: {response.text[:200]}"
            raise httpx.HTTPStatusError(message, request=response.request, response=response)
        async for line in response.aiter_lines():
            if not line:
                continue
            chunk: dict[str, Any] = json.loads(line)
            if "error" in chunk:
                raise httpx.StreamError(str(chunk["error"]))
            content = chunk.get("message", {}).get("content", "")
            if content and first is None:
                first = time.monotonic() - start
            text.append(content)
            if chunk.get("done"):
                count = int(chunk.get("eval_count", 0))
    if first is None:
        raise httpx.StreamError("no content")
    return first, count, "".join(text)


async def drive(
    url: str, key: str, workload: Workload, *, concurrency: int, seconds: float, seed: int
) -> Result:
    """Run `concurrency` closed-loop workers for `seconds` against `url` (`/api/chat`).

    Each worker takes the next conversation and plays its turns, pausing `workload.think_s`
    on average between them; a failed turn ends the conversation. No request starts after
    `seconds`; those running then finish and count (so a slow request, e.g. one behind a cold
    load, is not left out of the TTFT percentiles), and `Result.seconds` runs to the last
    one's end, at most `DRAIN` seconds later.
    """
    result = Result()
    source = workload.conversations(seed)
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=concurrency + 4)
    timeout = httpx.Timeout(120.0, connect=10.0)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=timeout
    ) as client:

        async def worker(number: int) -> None:
            pause = random.Random(seed * 1000 + number)  # noqa: S311 - think time, not a secret
            while time.monotonic() < stop_at:
                model, turns, system = next(source)
                history = [{"role": "system", "content": system}] if system else []
                for text in turns:
                    if len(history) > 1 and workload.think_s:
                        await anyio.sleep(pause.expovariate(1 / workload.think_s))
                    if time.monotonic() >= stop_at:
                        return
                    history.append({"role": "user", "content": text})
                    try:
                        ttft, count, answer = await _ask(
                            client, model, history, workload.answer_tokens
                        )
                    except (httpx.HTTPError, ValueError) as exc:
                        result.errors += 1
                        reason = f"{type(exc).__name__}: {exc}"[:300]
                        result.failures[reason] = result.failures.get(reason, 0) + 1
                        break
                    result.ttft.append(ttft)
                    result.output_tokens += count
                    result.requests += 1
                    history.append({"role": "assistant", "content": answer})

        start = time.monotonic()
        stop_at = start + seconds
        with anyio.move_on_after(seconds + DRAIN):
            async with anyio.create_task_group() as group:
                for number in range(concurrency):
                    group.start_soon(worker, number)
        result.seconds = time.monotonic() - start
    return result

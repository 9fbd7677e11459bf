"""A simulated model server for the load-shape tests: exact, deterministic, no sleeping.

It runs at most `slots` generations at once and queues the rest (FIFO), like Ollama with
`OLLAMA_NUM_PARALLEL`. Generation goes in lockstep iterations, as a GPU batch does: one iteration
gives every running generation one token and lasts `t(b) = base * (1 + k * (b - 1))` seconds
with `b` generations running, so per-token time grows with the batch. A request that arrives (or
is queued) joins the batch at the next iteration boundary; its first token comes at the end of
its first iteration. Clock times start at 0; with dyadic `base` and `k` (1/64, 1/4) every time is
exact in binary floating point, so tests can compare against arithmetic done by hand.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.shapes import Measure, Measurement

QUEUE_FULL = "HTTP 503: upstream is at capacity and its queue is full"


@dataclass
class _Generation:
    client: int
    arrival: float
    times: list[float] = field(default_factory=list)
    busy: float = 0.0


@dataclass(frozen=True)
class SimulatedServer:
    """The server (see the module docstring).

    Attributes:
        slots: Generations run at once.
        base: Seconds per token with one generation running.
        k: Growth of the per-token time per extra generation in the batch.
        tokens: Output tokens of every answer.
        prompt_tokens: Prompt tokens the server reports.
        queue_limit: Requests allowed to wait; one more is refused (open loop). None: no limit.
    """

    slots: int
    base: float
    k: float
    tokens: int
    prompt_tokens: int = 16
    queue_limit: int | None = None

    def step(self, batch: int) -> float:
        """Seconds of one iteration with `batch` generations running."""
        return self.base * (1 + self.k * (batch - 1))

    def closed_loop(self, concurrency: int, duration: float) -> Measurement:
        """`concurrency` clients, each sending its next request when its answer ends.

        No request is sent at or after `duration`; those in flight then finish after it.
        """
        return self._run([0.0] * concurrency, duration, closed=True)

    def open_loop(self, rate: float, duration: float, seed: int = 1) -> Measurement:
        """Poisson arrivals at `rate` requests/s (seeded) during `duration` seconds."""
        rng, arrivals, t = random.Random(seed), [], 0.0  # noqa: S311 - a seeded simulation
        while (t := t + rng.expovariate(rate)) < duration:
            arrivals.append(t)
        return self._run(arrivals, duration, closed=False)

    def _run(self, arrivals: list[float], duration: float, *, closed: bool) -> Measurement:
        pending = deque(enumerate(arrivals))
        queue: deque[_Generation] = deque()
        active: list[_Generation] = []
        records: list[RequestRecord] = []
        now = 0.0
        while pending or queue or active:
            while pending and pending[0][1] <= now:
                client, arrival = pending.popleft()
                if self.queue_limit is not None and len(queue) >= self.queue_limit:
                    records.append(_refused(arrival))
                else:
                    queue.append(_Generation(client, arrival))
            while queue and len(active) < self.slots:
                active.append(queue.popleft())
            if not active:
                now = pending[0][1]
                continue
            dt = self.step(len(active))
            now += dt
            for generation in active:
                generation.times.append(now)
                generation.busy += dt
            done = [g for g in active if len(g.times) == self.tokens]
            active = [g for g in active if len(g.times) < self.tokens]
            for generation in done:
                records.append(self._record(generation))
                if closed and now < duration:
                    queue.append(_Generation(generation.client, now))
        return Measurement(records=records, window_start=0.0, window_end=duration)

    def _record(self, generation: _Generation) -> RequestRecord:
        return RequestRecord(
            start=generation.arrival,
            end=generation.times[-1],
            ok=True,
            status=200,
            error=None,
            first_token=generation.times[0],
            chunk_times=tuple(generation.times),
            output_tokens=self.tokens,
            output_source="ollama",
            prompt_tokens=self.prompt_tokens,
            prompt_source="ollama",
            decode_seconds=generation.busy,
            timing_source="ollama",
            model="sim",
        )


def _refused(arrival: float) -> RequestRecord:
    return RequestRecord(
        start=arrival,
        end=arrival,
        ok=False,
        status=503,
        error=QUEUE_FULL,
        first_token=None,
        chunk_times=(),
        output_tokens=None,
        output_source="client",
        model="sim",
    )


# The hand-computed server: 4 slots, 8 tokens an answer, t(b) = 1/64 * (1 + (b - 1) / 4) s per
# token: t(1) = 4/256, t(2) = 5/256, t(3) = 6/256, t(4) = 7/256 (exact in binary). With 4 or
# more clients every batch is full, so answers come in waves of 4 every 8 * 7/256 = 7/32 s.
HAND = SimulatedServer(slots=4, base=1 / 64, k=1 / 4, tokens=8)
WAVE = 8 * 7 / 256
WINDOW = 10 * WAVE  # 2.1875 s: exactly 10 waves


def closed(server: SimulatedServer, duration: float) -> Measure:
    """The driver at one concurrency on `server`, each run `duration` simulated seconds."""

    async def measure(level: float) -> Measurement:
        return server.closed_loop(int(level), duration)

    return measure

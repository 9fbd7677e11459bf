"""The emulator's capacity model: parallel slots, a FIFO queue, a batch-bound decode rate, loads.

Owns what a known-capacity server does to a generation's timing, so a benchmark can be checked
against a truth computed from the knobs (`EmulatorConfig.parallel`, `batch_slowdown`,
`max_queue`, `cold_load`, and the GPU knobs `memory`, `model_size`, `load_rate`, `keep_alive`,
`preload`). Each model has its own `Runner` (`gateway.testing.emulator.runner`; Ollama gives
each loaded model its own `OLLAMA_NUM_PARALLEL` slots):

* admission at arrival: a slot when one is free (`parallel` at once; 0 is unlimited), else a
  place in a FIFO queue, else None when `max_queue` requests already wait (the caller answers
  503 with Ollama's busy text);
* a cold load: the first request after start, or after an unload (`keep_alive: 0`), waits
  `cold_load` seconds (with `load_rate`, the model's size / `load_rate`); requests arriving
  during that load wait for the same load;
* residency (`EmulatorConfig.resident`): the loaded models' sizes fit in `memory`; a load that
  does not fit first evicts the least recently used idle model (no generation holding a slot),
  and when every loaded model is busy it waits until one is idle, as Ollama's scheduler waits for
  a runner to finish before unloading it (server/sched.go `findRunnerToUnload`); a model bigger
  than `memory` is refused by the caller (`too_big`). A model idle past `keep_alive` is unloaded.
  Eviction and unload drop the model's prefix cache (`gateway.testing.emulator.prefix`);
* the decode rate: the gap after each token is `inter_token * (1 + batch_slowdown * (b - 1))`,
  where b is the number of the model's generations holding a slot (in prefill or decode) when
  the token goes out, so a change of batch takes effect at the next token.

With concurrency C held in a closed loop, P = `parallel` (C when 0), b = min(C, P), prefill
`ttft`, n tokens and t_i = `inter_token`, the truth is: TPOT = t_i * (1 + k * (b - 1)), service
time S = ttft + n * TPOT, output tokens/s = b * n / S, and mean TTFT = ttft + max(0, C/P - 1) * S
(Little's law). The engine (`gateway.testing.emulator.engine`) drives a `Seat` per generation;
`counters` and `journal` record what happened for `GET /emulator/stats` and `/emulator/events`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio

from gateway.testing.emulator.catalog import canonical
from gateway.testing.emulator.counters import Journal, ModelCounters
from gateway.testing.emulator.runner import Runner, Ticket

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from gateway.testing.emulator.config import EmulatorConfig
    from gateway.testing.emulator.prefix import PromptTokens


_PREFILL_STEP = 0.01
"""Seconds between two shares of a shared prefill: a change of the sharers counts from then."""


class Capacity:
    """The runners of all models, by canonical lower-case name (`EmulatorState.capacity`).

    Attributes:
        journal: The server's events (`counters.Journal`).
    """

    def __init__(self) -> None:
        self._runners: dict[str, Runner] = {}
        self.journal = Journal()
        self._idle: anyio.Event | None = None  # set when a runner went idle or unloaded
        self._prefilling = 0  # generations in a shared prefill now (`share_prefill`)

    def runner(self, model: str) -> Runner:
        """The model's runner, created on first use."""
        key = canonical(model).lower()
        if key not in self._runners:
            self._runners[key] = Runner(key, self.journal)
        return self._runners[key]

    def runners(self) -> dict[str, Runner]:
        """Every runner used so far, by canonical lower-case name."""
        return dict(self._runners)

    def preload(self, config: EmulatorConfig) -> None:
        """Load `config.preload`'s models at once, as if loaded before the start."""
        for name in config.preload or ():
            self.runner(name).preload()

    def seat(self, model: str, config: EmulatorConfig) -> Seat | None:
        """Admit a generation at arrival; None when the model's queue is full (503 busy)."""
        runner = self.runner(model)
        ticket = runner.admit(config)
        return None if ticket is None else Seat(self, runner, ticket, config)

    def expire(self, config: EmulatorConfig) -> None:
        """Unload the idle models whose `keep_alive` ran out (residency only)."""
        if not config.resident or config.keep_alive < 0:
            return
        deadline = time.monotonic() - config.keep_alive
        for runner in self._runners.values():
            if runner.holds_memory and runner.idle and runner.last_used < deadline:
                runner.unload()

    def _try_load(self, runner: Runner, config: EmulatorConfig) -> float | None:
        """Start the model's load if memory allows (evicting idle models); None: must wait."""
        if runner.holds_memory:
            return runner.load(0.0)
        self.expire(config)
        if config.memory is not None:
            while config.size_of(runner.name) + self._used(config) > config.memory:
                idle = [
                    r
                    for r in self._runners.values()
                    if r is not runner and r.holds_memory and r.idle and r.loaded(config)
                ]
                if not idle:
                    return None
                victim = min(idle, key=lambda r: r.last_used)
                victim.unload("evict")
                victim.counters.evictions += 1
        return runner.load(config.load_seconds(runner.name))

    def _used(self, config: EmulatorConfig) -> float:
        """GB taken by the models loaded or loading."""
        return sum(config.size_of(r.name) for r in self._runners.values() if r.holds_memory)

    async def load(self, runner: Runner, config: EmulatorConfig) -> float:
        """Load the model (evicting, or waiting for memory); return when it is ready."""
        while (ready := self._try_load(runner, config)) is None:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()
        return ready

    async def share_prefill(self, tokens: int, rate: float) -> None:
        """Prefill `tokens` at `rate` tokens/s shared by all generations prefilling at once.

        Processor sharing in steps of at most `_PREFILL_STEP` seconds: each step advances
        every prefill by its share of `rate` for the step's length, as llama.cpp's one
        `n_batch` step carries every slot's prompt tokens (`EmulatorConfig.prefill_shared`).
        """
        self._prefilling += 1
        try:
            left, last = float(tokens), time.monotonic()
            while left > 0:
                await anyio.sleep(min(_PREFILL_STEP, left * self._prefilling / rate))
                now = time.monotonic()
                left -= (now - last) * rate / self._prefilling
                last = now
        finally:
            self._prefilling -= 1

    def wake(self) -> None:
        """Tell loads waiting for memory that a runner went idle or unloaded."""
        if self._idle is not None:
            self._idle.set()
            self._idle = None

    def counters(self) -> dict[str, ModelCounters]:
        """Each model's counters, busy time up to now included."""
        now = time.monotonic()
        result: dict[str, ModelCounters] = {}
        for name, runner in self._runners.items():
            counters = ModelCounters(**vars(runner.counters))
            counters.busy_seconds += runner.busy_for(now)
            result[name] = counters
        return result


class Seat:
    """One generation's use of its model's runner: load wait, slot, decode gaps, release.

    Attributes:
        load_seconds: Seconds this request waited for a cold load (0 when warm).
        prefill_start: Monotonic time prefill began: the latest of arrival, load end, slot grant.
    """

    def __init__(
        self, capacity: Capacity, runner: Runner, ticket: Ticket, config: EmulatorConfig
    ) -> None:
        self._capacity = capacity
        self._runner = runner
        self._ticket = ticket
        self._config = config
        self._left = False
        self.load_seconds = 0.0
        self.prefill_start = 0.0

    async def take(self, arrived: float) -> None:
        """Wait for the model's load, then for a slot; set `load_seconds` and `prefill_start`."""
        ready = await self._capacity.load(self._runner, self._config)
        self.load_seconds = max(0.0, ready - arrived)
        await anyio.sleep(max(0.0, ready - time.monotonic()))
        granted = await self._runner.take(self._ticket)
        self.prefill_start = max(arrived, ready, granted)

    def prefill(self, prompt: PromptTokens) -> int:
        """Count this generation's prefill; return its prompt tokens found in the cache."""
        return self._runner.prefill(prompt, self._config)

    async def share_prefill(self, tokens: int) -> None:
        """Prefill `tokens` at the server's rate shared with the others prefilling now."""
        await self._capacity.share_prefill(tokens, self._config.prefill_rate)

    def gap(self) -> float:
        """Seconds until the next token, for the batch running as this token goes out."""
        return self._runner.gap(self._config)

    def leave(self, *, unload: bool = False) -> None:
        """Release the slot or the queue place, once; `unload` forgets the model's load."""
        if self._left:
            return
        self._left = True
        self._runner.release(self._ticket)
        if unload:
            self._runner.unload()
        if unload or self._runner.idle:
            self._capacity.wake()


class AfterLoad:
    """An ASGI app that sends `app`'s answer once the model is loaded (the load shortcut, §2.5).

    Args:
        capacity: The server's runners (a load may evict, or wait for memory).
        runner: The model's runner.
        config: The request's config snapshot.
        app: The answer to send then.
    """

    def __init__(
        self, capacity: Capacity, runner: Runner, config: EmulatorConfig, app: ASGIApp
    ) -> None:
        self._capacity = capacity
        self._runner = runner
        self._config = config
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Wait for the load, then let `app` answer."""
        ready = await self._capacity.load(self._runner, self._config)
        await anyio.sleep(max(0.0, ready - time.monotonic()))
        await self._app(scope, receive, send)

"""The emulator's capacity model: parallel slots, a FIFO queue, a batch-bound decode rate, loads.

Owns what a known-capacity server does to a generation's timing, so a benchmark can be checked
against a truth computed from the knobs (`EmulatorConfig.parallel`, `batch_slowdown`,
`max_queue`, `cold_load`). Each model has its own `Runner` (Ollama gives each loaded model its
own `OLLAMA_NUM_PARALLEL` slots):

* admission at arrival: a slot when one is free (`parallel` at once; 0 is unlimited), else a
  place in a FIFO queue, else None when `max_queue` requests already wait (the caller answers
  503 with Ollama's busy text);
* a cold load: the first request after start, or after an unload (`keep_alive: 0`), waits
  `cold_load` seconds; requests arriving during that load wait for the same load;
* the decode rate: the gap after each token is `inter_token * (1 + batch_slowdown * (b - 1))`,
  where b is the number of the model's generations holding a slot (in prefill or decode) when
  the token goes out, so a change of batch takes effect at the next token.

With concurrency C held in a closed loop, P = `parallel` (C when 0), b = min(C, P), prefill
`ttft`, n tokens and t_i = `inter_token`, the truth is: TPOT = t_i * (1 + k * (b - 1)), service
time S = ttft + n * TPOT, output tokens/s = b * n / S, and mean TTFT = ttft + max(0, C/P - 1) * S
(Little's law). The engine (`gateway.testing.emulator.engine`) drives a `Seat` per generation.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

import anyio

from gateway.testing.emulator.catalog import canonical

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from gateway.testing.emulator.config import EmulatorConfig


class _Ticket:
    """One generation's claim on a slot: granted at once, or when it reaches the queue's head."""

    def __init__(self) -> None:
        self.granted_at: float | None = None
        self.event = anyio.Event()


class Runner:
    """One model's slots, queue, batch and load state. Lives on the server's event loop only.

    Attributes:
        running: Generations holding a slot (in prefill or decode): the batch size b.
    """

    def __init__(self) -> None:
        self.running = 0
        self._parallel = 0
        self._queue: deque[_Ticket] = deque()
        self._ready_at: float | None = None  # monotonic time the load ends; None: unloaded
        self._touched = False  # loaded or unloaded since the start

    def admit(self, config: EmulatorConfig) -> _Ticket | None:
        """Claim a slot at arrival: granted now, queued, or None when the queue is full."""
        self._parallel = config.parallel
        ticket = _Ticket()
        self._queue.append(ticket)
        self._grant()
        limit = config.max_queue
        if ticket.granted_at is None and limit is not None and len(self._queue) > limit:
            self._queue.remove(ticket)
            return None
        return ticket

    async def take(self, ticket: _Ticket) -> float:
        """Wait for the ticket's slot; return the monotonic time it was granted."""
        await ticket.event.wait()
        assert ticket.granted_at is not None  # noqa: S101 - set before the event
        return ticket.granted_at

    def release(self, ticket: _Ticket) -> None:
        """Give the slot back (or the place in the queue), and grant the next ones in order."""
        if ticket.granted_at is None:
            if ticket in self._queue:
                self._queue.remove(ticket)
            return
        self.running -= 1
        ticket.granted_at = None
        self._grant()

    def _grant(self) -> None:
        now = time.monotonic()
        while self._queue and (self._parallel <= 0 or self.running < self._parallel):
            ticket = self._queue.popleft()
            ticket.granted_at = now
            self.running += 1
            ticket.event.set()

    def gap(self, config: EmulatorConfig) -> float:
        """Seconds from the token going out now to the next one, for the batch of this moment."""
        return config.inter_token * (1 + config.batch_slowdown * max(0, self.running - 1))

    def load(self, cold_load: float) -> float:
        """Start a load unless the model is loaded or loading; return when it is ready."""
        self._touched = True
        if self._ready_at is None:
            self._ready_at = time.monotonic() + max(0.0, cold_load)
        return self._ready_at

    def unload(self) -> None:
        """Forget the load (`keep_alive: 0`): the next request pays `cold_load` again."""
        self._touched = True
        self._ready_at = None

    def loaded(self, config: EmulatorConfig) -> bool:
        """Loaded now (`/api/ps`); without a cold load, every model counts as loaded at start."""
        if not self._touched:
            return config.cold_load <= 0
        return self._ready_at is not None and self._ready_at <= time.monotonic()


class Capacity:
    """The runners of all models, by canonical lower-case name (`EmulatorState.capacity`)."""

    def __init__(self) -> None:
        self._runners: dict[str, Runner] = {}

    def runner(self, model: str) -> Runner:
        """The model's runner, created on first use."""
        return self._runners.setdefault(canonical(model).lower(), Runner())

    def seat(self, model: str, config: EmulatorConfig) -> Seat | None:
        """Admit a generation at arrival; None when the model's queue is full (503 busy)."""
        runner = self.runner(model)
        ticket = runner.admit(config)
        return None if ticket is None else Seat(runner, ticket, config)


class Seat:
    """One generation's use of its model's runner: load wait, slot, decode gaps, release.

    Attributes:
        load_seconds: Seconds this request waited for a cold load (0 when warm).
        prefill_start: Monotonic time prefill began: the latest of arrival, load end, slot grant.
    """

    def __init__(self, runner: Runner, ticket: _Ticket, config: EmulatorConfig) -> None:
        self._runner = runner
        self._ticket = ticket
        self._config = config
        self._left = False
        self.load_seconds = 0.0
        self.prefill_start = 0.0

    async def take(self, arrived: float) -> None:
        """Wait for the model's load, then for a slot; set `load_seconds` and `prefill_start`."""
        ready = self._runner.load(self._config.cold_load)
        self.load_seconds = max(0.0, ready - arrived)
        await anyio.sleep(max(0.0, ready - time.monotonic()))
        granted = await self._runner.take(self._ticket)
        self.prefill_start = max(arrived, ready, granted)

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


class AfterLoad:
    """An ASGI app that sends `app`'s answer once a load ends (the load shortcut, §2.5).

    Args:
        ready_at: Monotonic time the model's load ends (`Runner.load`).
        app: The answer to send then.
    """

    def __init__(self, ready_at: float, app: ASGIApp) -> None:
        self._ready_at = ready_at
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Wait for the load, then let `app` answer."""
        await anyio.sleep(max(0.0, self._ready_at - time.monotonic()))
        await self._app(scope, receive, send)

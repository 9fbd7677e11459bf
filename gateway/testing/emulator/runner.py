"""One model's runner on the emulated server: its slots, FIFO queue, batch, load and prefix cache.

Owns `Runner`, the per-model state the capacity model (`gateway.testing.emulator.capacity`)
drives: admission to a slot or the queue, the batch size behind the decode rate, whether the
model is loaded (and since when it was last used, for LRU eviction and `keep_alive`), its
prefix cache (`gateway.testing.emulator.prefix`), its counters and its journal entries
(`gateway.testing.emulator.counters`). It lives on the server's event loop only.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

import anyio

from gateway.testing.emulator.counters import Journal, ModelCounters
from gateway.testing.emulator.prefix import PrefixCache, PromptTokens

if TYPE_CHECKING:
    from gateway.testing.emulator.config import EmulatorConfig


class Ticket:
    """One generation's claim on a slot: granted at once, or when it reaches the queue's head."""

    def __init__(self) -> None:
        self.granted_at: float | None = None
        self.event = anyio.Event()


class Runner:
    """One model's slots, queue, batch, load state and prefix cache; on the server's loop only.

    Attributes:
        name: The canonical lower-case model name.
        running: Generations holding a slot (in prefill or decode): the batch size b.
        counters: What it served (`GET /emulator/stats`).
        cache: Its prefix cache, created at the first prefill with the config's capacity.
        last_used: Monotonic time a slot was last taken or given back (LRU and `keep_alive`).
    """

    def __init__(self, name: str = "", journal: Journal | None = None) -> None:
        self.name = name
        self.running = 0
        self.counters = ModelCounters()
        self.cache: PrefixCache | None = None
        self.last_used = time.monotonic()
        self._journal = journal or Journal(0)
        self._busy_since = 0.0
        self._parallel = 0
        self._queue: deque[Ticket] = deque()
        self._ready_at: float | None = None  # monotonic time the load ends; None: unloaded
        self._touched = False  # loaded or unloaded since the start

    def admit(self, config: EmulatorConfig) -> Ticket | None:
        """Claim a slot at arrival: granted now, queued, or None when the queue is full."""
        self._parallel = config.parallel
        ticket = Ticket()
        self._queue.append(ticket)
        self._grant()
        limit = config.max_queue
        if ticket.granted_at is None and limit is not None and len(self._queue) > limit:
            self._queue.remove(ticket)
            return None
        return ticket

    async def take(self, ticket: Ticket) -> float:
        """Wait for the ticket's slot; return the monotonic time it was granted."""
        await ticket.event.wait()
        assert ticket.granted_at is not None  # noqa: S101 - set before the event
        return ticket.granted_at

    def release(self, ticket: Ticket) -> None:
        """Give the slot back (or the place in the queue), and grant the next ones in order."""
        if ticket.granted_at is None:
            if ticket in self._queue:
                self._queue.remove(ticket)
            return
        self._set_running(self.running - 1)
        ticket.granted_at = None
        self._grant()

    def _grant(self) -> None:
        now = time.monotonic()
        while self._queue and (self._parallel <= 0 or self.running < self._parallel):
            ticket = self._queue.popleft()
            ticket.granted_at = now
            self._set_running(self.running + 1)
            ticket.event.set()

    def _set_running(self, running: int) -> None:
        now = time.monotonic()
        if self.running == 0 and running > 0:
            self._busy_since = now
        elif self.running > 0 and running == 0:
            self.counters.busy_seconds += now - self._busy_since
        self.running = running
        self.last_used = now
        self._journal.record(self.name, "slots", running)

    def busy_for(self, now: float) -> float:
        """Seconds of the current busy stretch up to `now` (0 when no slot is held)."""
        return now - self._busy_since if self.running else 0.0

    @property
    def waiting(self) -> int:
        """Generations queued for a slot (`vllm:num_requests_waiting` on `/metrics`)."""
        return len(self._queue)

    @property
    def idle(self) -> bool:
        """No generation holds a slot or waits for one."""
        return self.running == 0 and not self._queue

    def gap(self, config: EmulatorConfig) -> float:
        """Seconds from the token going out now to the next one, for the batch of this moment."""
        return config.inter_token * (1 + config.batch_slowdown * max(0, self.running - 1))

    def load(self, cold_load: float) -> float:
        """Start a load unless the model is loaded or loading; return when it is ready."""
        self._touched = True
        if self._ready_at is None:
            self._ready_at = time.monotonic() + max(0.0, cold_load)
            if cold_load > 0:
                self.counters.cold_loads += 1
                self._journal.record(self.name, "load", time.time() + cold_load)
        return self._ready_at

    def unload(self, kind: str = "unload") -> None:
        """Forget the load (`keep_alive: 0`, expiry or eviction) and the prefix cache."""
        self._touched = True
        if self._ready_at is not None:
            self._journal.record(self.name, "evict" if kind == "evict" else "unload")
        self._ready_at = None
        if self.cache is not None:
            self.cache.clear()

    def preload(self) -> None:
        """Loaded at start (`EmulatorConfig.preload`): no cold load, no counter."""
        self._touched = True
        self._ready_at = time.monotonic()
        self._journal.record(self.name, "ready")

    @property
    def holds_memory(self) -> bool:
        """Loaded or loading: its size counts against `EmulatorConfig.memory`."""
        return self._ready_at is not None

    def loaded(self, config: EmulatorConfig) -> bool:
        """Loaded now (`/api/ps`); without residency or a cold load, every model is at start."""
        if not self._touched:
            return config.cold_load <= 0 and not config.resident
        return self._ready_at is not None and self._ready_at <= time.monotonic()

    def prefill(self, prompt: PromptTokens, config: EmulatorConfig) -> int:
        """Count a generation's prefill and return its cached prompt tokens."""
        if self.cache is None:
            self.cache = PrefixCache(config.cache_tokens)
        cached = self.cache.admit(prompt)
        self.counters.requests += 1
        self.counters.prompt_tokens += prompt.count
        self.counters.cached_tokens += cached
        return cached

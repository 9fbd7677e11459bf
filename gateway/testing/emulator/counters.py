"""What an emulated server did, for a benchmark to read: counters per model and a journal.

Owns `ModelCounters` (requests, prompt tokens total and cached, cold loads, evictions, busy
seconds) and `Journal`, a bounded log of the moments a model's slots, load or eviction changed,
stamped with the wall clock so a harness can line up several emulators on one machine (e.g. "was
a cold load here triggered while another server held the model with a free slot?"). Both are
served by `GET /emulator/stats` and `GET /emulator/events` (`gateway.testing.emulator.control`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Literal

EventKind = Literal["load", "ready", "evict", "unload", "slots"]
"""`load` a cold load started (value: the Unix time it ends), `ready` loaded at start
(`preload`), `evict` dropped for memory, `unload` (`keep_alive` 0 or expired), `slots` the
generations holding a slot changed (value: how many)."""

JOURNAL_LENGTH = 100_000
"""Events kept; older ones are dropped (a long benchmark reads them per run)."""


@dataclass
class ModelCounters:
    """One model's counters on one server since the start or the last reset.

    Attributes:
        requests: Generations that began prefill.
        prompt_tokens: Their prompt tokens (`prompt_eval_count`).
        cached_tokens: Of those, the tokens found in the prefix cache.
        cold_loads: Loads started (not counting preloads).
        evictions: Times it was evicted to make room for another model.
        busy_seconds: Seconds with at least one generation holding a slot (loading included).
    """

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cold_loads: int = 0
    evictions: int = 0
    busy_seconds: float = 0.0

    def add(self, other: ModelCounters) -> None:
        """Add `other`'s counts to these (a server's totals)."""
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


class Journal:
    """A bounded log of `(wall time, model, kind, value)` events, oldest first."""

    def __init__(self, length: int = JOURNAL_LENGTH) -> None:
        self._events: deque[tuple[float, str, EventKind, float]] = deque(maxlen=length)

    def record(self, model: str, kind: EventKind, value: float = 0.0) -> None:
        """Log one event now."""
        self._events.append((time.time(), model, kind, value))

    def dump(self) -> list[dict[str, Any]]:
        """The events as `{"t", "model", "kind", "value"}` objects (`t` in Unix seconds)."""
        return [
            {"t": t, "model": model, "kind": kind, "value": value}
            for t, model, kind, value in self._events
        ]

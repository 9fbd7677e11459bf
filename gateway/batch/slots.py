"""Slots for the Files and Batch APIs' heavy work: so many at once per key, and per process.

Uploads, downloads and batch checks each have their own `KeySlots`, so that one kind of work
never waits behind another (a batch creation never waits on another key's slow uploads). A key
past its own share is refused at once (429: its own doing); a process with every slot taken
makes the request wait a bounded time, then answers 503 (docs/batch.md, "Limits").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from gateway.errors import RateLimitedError, ServiceUnavailableError


class KeySlots:
    """At most `per_key` holders per key and `total` in the process.

    Args:
        what: What a slot is for, as said in refusals (`uploads`, `downloads`, ...).
        per_key: Slots one key may hold at once.
        total: Slots in the process.
        wait: Seconds a request waits for a process slot before its 503.
    """

    def __init__(self, what: str, *, per_key: int, total: int, wait: float) -> None:
        self.what = what
        self.per_key = per_key
        self.wait = wait
        self._process = anyio.Semaphore(total)
        self._held: dict[str, int] = {}

    def held(self, key_id: str) -> int:
        """Slots `key_id` holds now (waiting for one counts as holding it)."""
        return self._held.get(key_id, 0)

    @asynccontextmanager
    async def slot(self, key_id: str) -> AsyncIterator[None]:
        """Hold one slot of `key_id`'s for the block.

        Raises:
            RateLimitedError: the key holds `per_key` slots already (429, `Retry-After: 1`).
            ServiceUnavailableError: no process slot came free within `wait` seconds (503).
        """
        if self.held(key_id) >= self.per_key:
            held = f"{self.per_key} {self.what}" if self.per_key > 1 else f"one of its {self.what}"
            raise RateLimitedError(
                f"this key has {held} in progress already, as many as it may: "
                "wait for one to finish",
                headers={"Retry-After": "1"},
            )
        # Counted before waiting, so that a key's waiting requests cannot queue up either.
        self._held[key_id] = self.held(key_id) + 1
        try:
            acquired = False
            with anyio.move_on_after(self.wait):
                await self._process.acquire()
                acquired = True
            if not acquired:
                raise ServiceUnavailableError(
                    f"the gateway has no room for more {self.what} now; retry shortly",
                    headers={"Retry-After": "5"},
                )
        except BaseException:
            self._drop(key_id)
            raise
        try:
            yield
        finally:
            self._process.release()
            self._drop(key_id)

    def _drop(self, key_id: str) -> None:
        left = self.held(key_id) - 1
        if left > 0:
            self._held[key_id] = left
        else:
            self._held.pop(key_id, None)

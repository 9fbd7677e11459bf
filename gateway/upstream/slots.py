"""The per-upstream concurrency gate: at most N requests in flight, a bounded FIFO queue behind.

A GPU serves a few requests at a time, and Ollama queues requests for a loaded model without any
bound (reference section 8), so the gateway keeps its own bounded queue in front: a request
waits for a slot at most `GATEWAY_UPSTREAM_QUEUE_TIMEOUT` seconds, and is refused at once with
503 and `Retry-After` when `GATEWAY_UPSTREAM_QUEUE_SIZE` requests are already waiting. The gate
is per gateway process; with several replicas, size it per replica.

Batch lines (`gateway.batch`) take slots only through `try_acquire_background`: never while
someone waits, and only while more than the reserved slots are free; an interactive request
that finds no slot free cancels (preempts) a running batch line, whose slot then comes to it.
"""

from __future__ import annotations

import anyio

from gateway.errors import ServiceUnavailableError
from gateway.metering.metrics import Metrics
from gateway.neutral import Outcome


class NoSpareCapacity(ServiceUnavailableError):
    """A batch line found no slot that interactive traffic leaves free (it waits, untried)."""

    outcome: Outcome = "deferred"


class UpstreamSlots:
    """Counts requests in flight to one upstream and queues the excess.

    Args:
        name: The `upstream` label value.
        capacity: Requests in flight at once; 0 means no gate.
        queue_size: Requests allowed to wait for a slot.
        queue_timeout: Seconds a request may wait.
        metrics: For `gateway_upstream_queue_length` and `gateway_upstream_slots_in_use`.
    """

    def __init__(
        self, name: str, capacity: int, queue_size: int, queue_timeout: float, metrics: Metrics
    ) -> None:
        self._capacity = capacity
        self._queue_size = queue_size
        self._queue_timeout = queue_timeout
        self._semaphore = anyio.Semaphore(capacity) if capacity else None
        self._waiting = 0
        self._queue_gauge = metrics.upstream_queue_length.labels(name)
        self._in_use_gauge = metrics.upstream_slots_in_use.labels(name)
        self._refused = metrics.rate_limited
        # Batch lines holding a slot (or running on an ungated upstream): their cancel scopes.
        self._background: list[anyio.CancelScope] = []

    @property
    def capacity(self) -> int:
        """Requests in flight at once; 0: no gate."""
        return self._capacity

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        return self._waiting

    def background_room(self, reserve: int, ungated_limit: int) -> bool:
        """Whether a batch line could start now (`try_acquire_background`'s rule)."""
        if self._semaphore is None:
            return len(self._background) < ungated_limit
        return not self._waiting and self._semaphore.value > reserve

    def try_acquire_background(
        self, holder: anyio.CancelScope, reserve: int, ungated_limit: int
    ) -> bool:
        """Take a slot for a batch line without waiting; True if one must later be released.

        Args:
            holder: The line's cancel scope: an interactive request that finds no free slot
                cancels it to take its slot.
            reserve: Slots that must stay free for interactive requests.
            ungated_limit: On an ungated upstream, the most batch lines at once.

        Raises:
            NoSpareCapacity: no slot is spare now.
        """
        if not self.background_room(reserve, ungated_limit):
            raise NoSpareCapacity("no upstream capacity spare for batch lines")
        self._background.append(holder)
        if self._semaphore is None:
            return False
        self._semaphore.acquire_nowait()
        self._in_use_gauge.inc()
        return True

    def release_background(self, holder: anyio.CancelScope, *, holds_slot: bool) -> None:
        """Give back what `try_acquire_background` took for `holder`."""
        if holder in self._background:
            self._background.remove(holder)
        if holds_slot:
            self.release()

    def _preempt(self) -> None:
        """Cancel the newest batch line holding a slot: its release wakes the first waiter."""
        for holder in reversed(self._background):
            if not holder.cancel_called:
                holder.cancel()
                return

    async def acquire(self) -> bool:
        """Take a slot, waiting in line if needed; True if a slot must later be released.

        Raises:
            ServiceUnavailableError: the queue is full, or no slot came free in time (503).
        """
        if self._semaphore is None:
            return False
        if self._semaphore.value and not self._waiting:  # a free slot and nobody ahead
            self._semaphore.acquire_nowait()
            self._in_use_gauge.inc()
            return True
        if self._semaphore.value == 0 and self._waiting >= self._queue_size:
            self._refused.labels("queue_full").inc()
            raise ServiceUnavailableError(
                "upstream is at capacity and its queue is full", headers={"Retry-After": "1"}
            )
        self._waiting += 1
        self._queue_gauge.set(self._waiting)
        if self._semaphore.value == 0:
            self._preempt()
        try:
            with anyio.fail_after(self._queue_timeout):
                await self._semaphore.acquire()
        except TimeoutError:
            self._refused.labels("queue_timeout").inc()
            raise ServiceUnavailableError(
                f"no upstream capacity within {self._queue_timeout:g} s",
                headers={"Retry-After": str(max(int(self._queue_timeout), 1))},
            ) from None
        finally:
            self._waiting -= 1
            self._queue_gauge.set(self._waiting)
        self._in_use_gauge.inc()
        return True

    def release(self) -> None:
        """Give a slot back (only after `acquire` returned True)."""
        if self._semaphore is not None:
            self._in_use_gauge.dec()
            self._semaphore.release()

"""`IdleDeadline`: a per-wait deadline for a stream's chunks, with one timer per stream.

The relay waits for each upstream chunk under a deadline (`GATEWAY_IDLE_TIMEOUT`, or less when
`GATEWAY_REQUEST_TIMEOUT` is nearer). `asyncio.timeout` around each wait creates and cancels a
timer and a context object per chunk: about a fifth of the relay's per-chunk Python time
(docs/performance.md). Here one timer serves the whole stream. Each wait only records when it
must end; the timer is re-armed when it fires before that (so about once per idle period, not
once per chunk), or moved earlier when a wait's deadline is nearer than the armed one.

When a wait does run over, the waiting task is cancelled and the cancellation becomes
`TimeoutError`, as `asyncio.timeout` does it (Python 3.11 `Task.uncancel`): if anything else
cancelled the task too (the client left, the server is stopping), the `CancelledError` goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class IdleDeadline:
    """Deadlines for successive waits of the current task; call `close()` when done.

    Must be created and used in the task that does the waiting (the relay's response task).
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("IdleDeadline needs a running task")
        self._task = task
        self._due: float | None = None  # loop time the current wait must end by
        # The armed timer and when it fires. uvloop's `call_at` returns a plain `Handle`, with
        # no `when()`, for a delay under a millisecond; so the time is kept here.
        self._timer: asyncio.Handle | None = None
        self._timer_due = 0.0
        self._expired = False

    async def wait(self, awaitable: Awaitable[T], seconds: float) -> T:
        """Await `awaitable`, for at most `seconds`.

        Raises:
            TimeoutError: it took longer; `awaitable` was cancelled.
        """
        due = self._loop.time() + seconds
        self._due = due
        if self._timer is None or self._timer_due > due:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(due)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._expired and self._task.uncancel() == 0:
                raise TimeoutError from None
            raise
        finally:
            self._due = None
            self._expired = False

    def _fire(self) -> None:
        self._timer = None
        due = self._due
        if due is None:  # not waiting now: the next wait arms a new timer
            return
        if self._loop.time() < due:  # the current wait began after this timer was armed
            self._arm(due)
            return
        self._expired = True
        self._task.cancel()

    def _arm(self, due: float) -> None:
        self._timer = self._loop.call_at(due, self._fire)
        self._timer_due = due

    def close(self) -> None:
        """Drop the timer (the stream ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

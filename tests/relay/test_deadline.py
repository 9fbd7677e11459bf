"""IdleDeadline: per-wait deadlines on one timer, on the real asyncio event loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio
import pytest

from gateway.relay.deadline import IdleDeadline

pytestmark = pytest.mark.anyio


class CountingLoop:
    """The running loop, counting the timers asked of it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.timers = 0

    def call_at(self, when: float, callback: Any) -> asyncio.TimerHandle:
        self.timers += 1
        return self.loop.call_at(when, callback)

    def time(self) -> float:
        return self.loop.time()


async def _value_after(seconds: float, value: int) -> int:
    await asyncio.sleep(seconds)
    return value


async def _value_now(value: int) -> int:
    """`value`, without ever yielding to the loop (so no timer can fire meanwhile)."""
    return value


async def test_many_timely_waits_share_one_timer():
    deadline = IdleDeadline()
    loop = CountingLoop(asyncio.get_running_loop())
    deadline._loop = loop  # type: ignore[assignment]  # count the timers it arms
    try:
        values = [await deadline.wait(_value_after(0.001, n), 5.0) for n in range(50)]
    finally:
        deadline.close()
    assert values == list(range(50))
    assert loop.timers == 1


async def test_a_wait_that_runs_over_raises_timeout_error_and_cancels_the_awaitable():
    deadline = IdleDeadline()
    cancelled = asyncio.Event()

    async def silent() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    start = time.perf_counter()
    try:
        with pytest.raises(TimeoutError):
            await deadline.wait(silent(), 0.1)
    finally:
        deadline.close()
    assert 0.09 <= time.perf_counter() - start < 2
    assert cancelled.is_set()
    assert await deadline.wait(_value_after(0, 7), 1.0) == 7  # usable after a timeout


async def test_a_nearer_deadline_than_the_armed_timer_is_kept():
    deadline = IdleDeadline()
    try:
        assert await deadline.wait(_value_after(0, 1), 30.0) == 1  # arms a timer 30 s out
        start = time.perf_counter()
        with pytest.raises(TimeoutError):
            await deadline.wait(asyncio.sleep(30), 0.1)  # the request deadline is near
    finally:
        deadline.close()
    assert time.perf_counter() - start < 2


async def test_time_spent_between_waits_does_not_count():
    deadline = IdleDeadline()
    try:
        assert await deadline.wait(_value_after(0, 1), 0.1) == 1
        await asyncio.sleep(0.3)  # the consumer is busy (a slow client): not a wait
        assert await deadline.wait(_value_after(0.05, 2), 0.1) == 2
    finally:
        deadline.close()


async def test_a_cancellation_from_outside_is_not_turned_into_a_timeout():
    deadline = IdleDeadline()
    outcome: list[str] = []
    try:
        with anyio.CancelScope() as scope:
            asyncio.get_running_loop().call_later(0.05, scope.cancel)  # the client left
            try:
                await deadline.wait(asyncio.sleep(30), 1.0)
            except TimeoutError:
                outcome.append("timeout")
            except asyncio.CancelledError:
                outcome.append("cancelled")
                raise
    finally:
        deadline.close()
    assert scope.cancelled_caught
    assert outcome == ["cancelled"]


def test_uvloop_sub_millisecond_deadlines() -> None:
    """uvloop (what `gateway serve` runs on) returns a `Handle` without `when()` for a delay
    under a millisecond: a request timeout that is almost used up must still end the wait with
    `TimeoutError`, not `AttributeError`."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> list[str]:
        deadline = IdleDeadline()
        seen = []
        # A wait that ends before its sub-millisecond timer fires leaves that timer armed; the
        # next wait compares its own deadline with the armed one. The first wait never yields,
        # so a busy machine cannot let the 0.2 ms timer fire before it ends.
        assert await deadline.wait(_value_now(7), 0.0002) == 7
        for seconds in (0.0005, 0.0, 0.05):
            try:
                await deadline.wait(asyncio.sleep(1), seconds)
            except TimeoutError:
                seen.append("timeout")
        deadline.close()
        return seen

    assert uvloop.run(main()) == ["timeout"] * 3

"""An idle batch runner's look is one query: with no batch to run it neither counts nor claims.

Before: every `GATEWAY_BATCH_POLL_SECONDS` the look ran three transactions (the batches to end,
the queue depth, a claim) whatever the queue held, most of an idle gateway's CPU (about 3 of
8 ms a second, docs/performance.md).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.batch.files import FileStore
from gateway.batch.finalize import Finalizer
from gateway.batch.queue import LineQueue
from gateway.batch.runner import BatchRunner
from gateway.policies import BatchPolicy
from tests.batch.test_batch_claim import _queue

pytestmark = pytest.mark.anyio

POLICY = BatchPolicy(
    max_concurrent=4,
    reserved_slots=0,
    max_attempts=3,
    retry_base_seconds=1.0,
    retry_max_seconds=10.0,
    lease_seconds=60.0,
    poll_seconds=1.0,
    idle_poll_seconds=10.0,
)


class Depth:
    """`gateway_batch_queue_depth`'s stand-in: the last value set."""

    value: float | None = None

    def set(self, value: float) -> None:
        self.value = value


def _runner(engine: AsyncEngine, depth: Depth) -> BatchRunner:
    """A runner whose upstreams never have room: a look counts the queue, claims nothing."""
    relay: Any = SimpleNamespace(
        lifecycle=SimpleNamespace(draining=False), pool=SimpleNamespace(upstreams=[])
    )
    metrics: Any = SimpleNamespace(batch_queue_depth=depth)
    finalizer = Finalizer(engine, FileStore(engine, None))
    keys: Any = None
    return BatchRunner(LineQueue(engine), finalizer, keys, relay, {}, metrics, POLICY)


def _statements(engine: AsyncEngine) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    return seen


async def test_with_no_batch_the_look_is_one_query_and_the_depth_is_zero(
    engine: AsyncEngine,
) -> None:
    depth = Depth()
    runner = _runner(engine, depth)
    seen = _statements(engine)
    async with anyio.create_task_group() as lines:
        await runner._look(lines, POLICY.lease_seconds)
    assert len(seen) == 1, seen
    assert "FROM gateway_batches" in seen[0]
    assert depth.value == 0
    assert runner.finalizer.open_batches == 0


async def test_a_running_batch_is_counted_again(engine: AsyncEngine) -> None:
    depth = Depth()
    runner = _runner(engine, depth)
    await _queue(engine, "k", "batch_one", 3, age=1)
    seen = _statements(engine)
    async with anyio.create_task_group() as lines:
        await runner._look(lines, POLICY.lease_seconds)
    assert runner.finalizer.open_batches == 1
    assert depth.value == 3
    assert len(seen) > 1  # the queue depth was read
    assert runner._next_look() == POLICY.poll_seconds  # an open batch keeps the usual pace


async def test_with_no_batch_open_the_next_look_waits_the_idle_interval(
    engine: AsyncEngine,
) -> None:
    runner = _runner(engine, Depth())
    async with anyio.create_task_group() as lines:
        await runner._look(lines, POLICY.lease_seconds)
    assert runner._next_look() == POLICY.idle_poll_seconds
    runner.running = 1  # a line still running (its batch may have ended meanwhile)
    assert runner._next_look() == POLICY.poll_seconds

"""A batch claim reads a bounded number of lines, however long the queue, in the same order.

Before: each claim ranked every runnable line of every key (`row_number() over (partition by
key_id ...)`), 1.0-1.5 s on SQLite with 200,000 queued lines, run every poll second; batch
throughput for every key fell to ~2.5 lines/s and interactive requests waited on the busy DB.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from gateway.batch.queue import LineQueue
from gateway.db.tables import Base, BatchLineRow, BatchRow, as_utc

pytestmark = pytest.mark.anyio


async def _queue(engine: AsyncEngine, key_id: str, batch_id: str, lines: int, age: int) -> None:
    """Queue a running batch of `lines` pending lines (two models, interleaved) for `key_id`."""
    now = as_utc(None)
    created = now - timedelta(seconds=age)
    async with engine.begin() as conn:
        await conn.execute(
            insert(BatchRow),
            [
                {
                    "id": batch_id,
                    "key_id": key_id,
                    "endpoint": "/v1/chat/completions",
                    "input_file_id": "file-x",
                    "completion_window": "24h",
                    "status": "in_progress",
                    "total": lines,
                    "created_at": created,
                    "expires_at": now + timedelta(hours=1),
                }
            ],
        )
        rows = [
            {
                "batch_id": batch_id,
                "line_no": n,
                "custom_id": f"c{n}",
                "model": f"m{n % 2}",
                "body": b"{}",
                "state": "pending",
                "attempts": 0,
            }
            for n in range(lines)
        ]
        for start in range(0, len(rows), 5000):
            await conn.execute(insert(BatchLineRow), rows[start : start + 5000])


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_keys_take_turns_and_a_key_runs_its_oldest_batch_by_model_then_line(
    engine: AsyncEngine,
) -> None:
    store = LineQueue(engine)
    await _queue(engine, "big", "batch_big_old", 300, age=30)
    await _queue(engine, "big", "batch_big_new", 300, age=20)
    await _queue(engine, "small", "batch_small", 2, age=10)
    await _queue(engine, "held", "batch_held", 5, age=40)
    first = await store.claim("r1", 4, 60, skip_keys=["held"])
    # Each key's first line before any key's second; the older key's line first in a turn.
    assert [(c.key_id, c.batch_id, c.model, c.line_no) for c in first] == [
        ("big", "batch_big_old", "m0", 0),
        ("small", "batch_small", "m0", 0),
        ("big", "batch_big_old", "m0", 2),
        ("small", "batch_small", "m1", 1),
    ]
    more = await store.claim("r1", 298, 60, skip_keys=["held"])
    assert {c.batch_id for c in more} == {"batch_big_old"}  # the oldest batch first
    assert [c.line_no for c in more[:3]] == [4, 6, 8]  # its model m0 first, then m1
    assert [c.line_no for c in more[-2:]] == [297, 299]
    rest = await store.claim("r1", 10, 60)
    assert [(c.key_id, c.line_no) for c in rest[:3]] == [("held", 0), ("big", 0), ("held", 2)]
    assert rest[1].batch_id == "batch_big_new"


async def _claim_steps(tmp_path_factory: pytest.TempPathFactory, lines: int) -> int:
    """SQLite VM steps (in thousands) one claim of 4 lines costs with `lines` queued."""
    path = tmp_path_factory.mktemp("claim") / "gw.db"
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}", poolclass=StaticPool)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        await _queue(engine, "flood", "batch_flood", lines, age=10)
        await _queue(engine, "victim", "batch_victim", 2, age=5)
        steps = 0

        def tick() -> int:
            nonlocal steps
            steps += 1
            return 0

        async with engine.connect() as conn:  # the pool's one connection
            raw = await conn.get_raw_connection()
            await raw.driver_connection.set_progress_handler(tick, 1000)
        claimed = await LineQueue(engine).claim("r1", 4, 60)
        assert {c.key_id for c in claimed} == {"flood", "victim"}
        return steps
    finally:
        await engine.dispose()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_a_claim_reads_a_bounded_number_of_lines_however_long_the_queue(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    small = await _claim_steps(tmp_path_factory, 500)
    large = await _claim_steps(tmp_path_factory, 50_000)
    # 100 times the queue: before, ~100 times the work (every line ranked); now about the same.
    assert large <= 2 * small + 20, (small, large)

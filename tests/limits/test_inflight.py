"""In-flight counts per key: in one process, and as renewed leases in a real Redis.

Each Redis test uses a key prefix of its own. A "process" here is a `LeasedInFlight` with a
client of its own; one that dies is one that stops renewing (what kill -9 leaves behind).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
import redis
import redis.asyncio as aioredis

from gateway.auth.principal import Principal
from gateway.errors import RateLimitedError
from gateway.limits.inflight import LeasedInFlight, LocalInFlight
from gateway.limits.limiter import KeyLimiter
from gateway.limits.storage import build_storage, close_storage
from gateway.metering.metrics import Metrics
from gateway.policies import LimitPolicy
from gateway.settings import Settings
from tests.support.servers import REDIS_URL

pytestmark = pytest.mark.anyio

DEADLINE = 30.0  # seconds a lapse may take on a loaded machine, far above any lease here


@asynccontextmanager
async def leased(prefix: str, lease: float) -> AsyncIterator[LeasedInFlight]:
    counts = LeasedInFlight(aioredis.Redis.from_url(REDIS_URL), prefix, lease)
    try:
        yield counts
    finally:
        await counts.aclose()


async def _until(condition: Callable[[], Awaitable[object]], what: str) -> float:
    """Await `condition` until it is true; return the seconds it took; fail after DEADLINE."""
    start = time.monotonic()
    while time.monotonic() - start < DEADLINE:
        if await condition():
            return time.monotonic() - start
        await anyio.sleep(0.05)
    pytest.fail(f"timed out after {DEADLINE} s waiting for {what}")


async def test_local_counts_up_to_the_limit_per_key_and_releases() -> None:
    counts = LocalInFlight()
    first = await counts.acquire("k", 2)
    second = await counts.acquire("k", 2)
    assert first is not None
    assert second is not None
    assert await counts.acquire("k", 2) is None
    assert await counts.acquire("other", 1) is not None  # keys are counted apart
    await counts.release("k", first)
    assert await counts.acquire("k", 2) is not None


async def test_leases_are_shared_between_processes_and_released(redis_prefix: str) -> None:
    async with leased(redis_prefix, 30) as a, leased(redis_prefix, 30) as b:
        first = await a.acquire("k", 2)
        assert first is not None
        assert await b.acquire("k", 2) is not None
        assert await a.acquire("k", 2) is None
        assert await b.acquire("k", 2) is None
        await a.release("k", first)
        assert await b.acquire("k", 2) is not None


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_a_dead_processs_leases_lapse_and_free_the_keys_slots(redis_prefix: str) -> None:
    async with leased(redis_prefix, 3) as dead, leased(redis_prefix, 3) as live:
        assert await dead.acquire("k", 1) is not None
        assert await live.acquire("k", 1) is None  # counted while its lease runs
        # `dead` never renews and never releases: its lease lapses on Redis' clock.
        waited = await _until(lambda: live.acquire("k", 1), "the dead lease to lapse")
        assert waited > 1  # a lapse, not an early admission (the lease ran for 3 s)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_a_live_process_renews_its_leases_past_many_lease_times(redis_prefix: str) -> None:
    async with leased(redis_prefix, 1.5) as holder, leased(redis_prefix, 1.5) as other:
        assert await holder.acquire("k", 1) is not None
        for _ in range(8):  # 4 s: almost three leases, renewed every 0.5 s
            await holder.renew()
            assert await other.acquire("k", 1) is None
            await anyio.sleep(holder.renew_interval)


async def test_a_renewal_never_brings_back_a_released_lease(redis_prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    async with leased(redis_prefix, 30) as counts:
        ticket = await counts.acquire("k", 1)
        assert ticket is not None
        # The renewal's snapshot was taken before the release reached Redis: replay it after.
        renewal = counts._renew_some([("k", [ticket])])
        await counts.release("k", ticket)
        await renewal
        assert client.zcard(f"{redis_prefix}:inflight/k") == 0
        assert await counts.acquire("k", 1) is not None
    client.close()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_an_acquire_whose_answer_was_lost_lapses(redis_prefix: str) -> None:
    """The script ran in Redis but nobody knows the ticket to renew (nor to sweep: a process
    that died): it lapses within a lease."""
    async with leased(redis_prefix, 2) as counts, leased(redis_prefix, 2) as other:
        key = f"{redis_prefix}:inflight/k"
        void = f"{redis_prefix}:inflight-void/lost/0"
        await counts._acquire(keys=[key, void], args=["lost/0", 1, 2000])
        await counts.renew()  # renews what this process knows of: not the lost one
        assert await other.acquire("k", 1) is None
        await _until(lambda: other.acquire("k", 1), "the lost lease to lapse")


async def test_the_set_expires_with_its_last_lease(redis_prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    async with leased(redis_prefix, 5) as counts:
        assert await counts.acquire("k", 3) is not None
        ttl = client.pttl(f"{redis_prefix}:inflight/k")
        assert 0 < ttl <= 5000  # no counter left behind for longer than a lease
    client.close()


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
async def test_the_limiter_renews_in_the_background_and_counts_renewal_failures(
    redis_prefix: str,
) -> None:
    settings = Settings(
        rate_limit_storage=REDIS_URL,
        rate_limit_key_prefix=redis_prefix,
        rate_limit_lease_seconds=1.5,
    )
    principal = Principal(key_id="k", name="k", models=None, max_concurrent=1)
    storage = build_storage(LimitPolicy.of(settings))
    metrics = Metrics()
    limiter = KeyLimiter(storage, LimitPolicy.of(settings), metrics)
    try:
        async with anyio.create_task_group() as background:
            background.start_soon(limiter.run)
            admission = await limiter.admit(principal)
            await anyio.sleep(4)  # over two leases: only renewals keep it counted
            with pytest.raises(RateLimitedError, match="at most 1 in flight"):
                await limiter.admit(principal)
            await limiter.release(admission, 0)
            await limiter.release(await limiter.admit(principal), 0)
            background.cancel_scope.cancel()
    finally:
        await limiter.aclose()
        await close_storage(storage)

    # A renewal against a Redis that is gone is logged and counted, and the loop goes on.
    broken = LeasedInFlight(aioredis.Redis.from_url("redis://127.0.0.1:1/0"), redis_prefix, 1.0)
    broken._held["k"] = {"ticket"}
    limiter = KeyLimiter(storage, LimitPolicy.of(settings), metrics, in_flight=broken)
    with anyio.move_on_after(2.5):
        await limiter.run()
    assert metrics.rate_limit_storage_errors._value.get() >= 2
    await limiter.aclose()


async def test_a_failed_release_is_retried_by_the_sweep(redis_prefix: str) -> None:
    """The release never reached Redis (the connection was cut): its ticket waits for `sweep`."""
    async with leased(redis_prefix, 60) as counts, leased(redis_prefix, 60) as other:
        ticket = await counts.acquire("k", 1)
        assert ticket is not None
        real = counts._client
        counts._client = aioredis.Redis.from_url("redis://127.0.0.1:1/0")  # Redis unreachable
        with pytest.raises(redis.RedisError):
            await counts.release("k", ticket)
        await counts._client.aclose()
        counts._client = real
        assert await other.acquire("k", 1) is None  # still counted: the release was lost
        await counts.sweep()
        assert await other.acquire("k", 1) is not None  # at once, not a lease later


async def test_an_acquire_redis_runs_after_the_sweep_adds_nothing(redis_prefix: str) -> None:
    """A stall held the acquire in Redis past its caller's deadline; it may run before or after
    the sweep: either way the slot is free once both ran."""
    client = redis.Redis.from_url(REDIS_URL)
    async with leased(redis_prefix, 60) as counts, leased(redis_prefix, 60) as other:
        key = f"{redis_prefix}:inflight/k"
        for sweep_first in (True, False):
            counts._orphan("k", lost := f"lost/{sweep_first}")
            late = counts._acquire(keys=[key, counts._void_mark(lost)], args=[lost, 1, 60_000])
            if sweep_first:
                await counts.sweep()
                assert await late == 0
            else:
                assert await late == 1
                await counts.sweep()
            assert client.zcard(key) == 0
            ticket = await other.acquire("k", 1)
            assert ticket is not None
            await other.release("k", ticket)
    client.close()

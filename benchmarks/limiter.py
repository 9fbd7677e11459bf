# ruff: noqa: T201 (a benchmark prints its table)
"""Per-request cost of the key limiter: none, in-memory, Redis (async), and slowapi's sync path.

Run: `.venv/bin/python -m benchmarks.limiter [--requests 2000] [--redis redis://127.0.0.1:6379/0]`.

Each request does what the gateway does for a key with RPM, TPM and a concurrency cap: admit
(RPM hit, TPM check, in-flight +1) and release (TPM charge, in-flight -1). The last row is the
synchronous `limits` strategy on Redis that slowapi uses (slowapi issue #130): its time per
request is time the event loop would be blocked, for every request in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Sequence

from limits import RateLimitItemPerMinute
from limits.storage import RedisStorage as SyncRedisStorage
from limits.strategies import MovingWindowRateLimiter as SyncMovingWindow

from gateway.auth.principal import Principal
from gateway.limits.limiter import KeyLimiter
from gateway.limits.storage import build_storage, close_storage
from gateway.metering.metrics import Metrics
from gateway.policies import LimitPolicy
from gateway.settings import Settings

BIG = 10**9  # limits high enough never to refuse during the benchmark


async def _async_cost(storage_url: str | None, requests: int) -> float:
    """Mean seconds per admit+release; `None` = a key with no limits (the limiter short-cuts)."""
    settings = Settings(
        _env_file=None,
        rate_limit_storage=storage_url or "memory://",
        rate_limit_key_prefix=f"bench-{uuid.uuid4().hex}",
        rate_limit_timeout=5,
    )
    storage = build_storage(LimitPolicy.of(settings))
    limiter = KeyLimiter(storage, LimitPolicy.of(settings), Metrics())
    limits = (0, 0, 0) if storage_url is None else (BIG, BIG, BIG)  # 0: unlimited
    principal = Principal("bench", "bench", None, *limits)
    for _ in range(50):  # warm up connections
        await limiter.release(await limiter.admit(principal), 10)
    start = time.perf_counter()
    for _ in range(requests):
        admission = await limiter.admit(principal)
        await limiter.release(admission, 42)
    elapsed = time.perf_counter() - start
    await limiter.aclose()
    await close_storage(storage)
    return elapsed / requests


def _sync_redis_cost(redis_url: str, requests: int) -> float:
    """Mean seconds per RPM hit with the synchronous strategy slowapi uses on Redis."""
    storage = SyncRedisStorage(redis_url, key_prefix=f"bench-{uuid.uuid4().hex}")
    limiter = SyncMovingWindow(storage)
    item = RateLimitItemPerMinute(BIG)
    for _ in range(50):
        limiter.hit(item, "bench")
    start = time.perf_counter()
    for _ in range(requests):
        limiter.hit(item, "bench")
    return (time.perf_counter() - start) / requests


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; returns 0."""
    parser = argparse.ArgumentParser(prog="benchmarks.limiter", description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args(argv)
    rows = [
        ("no limits on the key", asyncio.run(_async_cost(None, args.requests)), "no"),
        ("memory:// (async)", asyncio.run(_async_cost("memory://", args.requests)), "no"),
        ("redis:// (limits.aio)", asyncio.run(_async_cost(args.redis, args.requests)), "no"),
        ("redis, sync (slowapi path)", _sync_redis_cost(args.redis, args.requests), "YES"),
    ]
    print(f"{args.requests} requests each (RPM + TPM + concurrency; sync row: RPM hit only)\n")
    print(f"{'limiter':30} {'per request':>12}   blocks the event loop")
    for name, seconds, blocks in rows:
        print(f"{name:30} {seconds * 1e6:9.1f} µs   {blocks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

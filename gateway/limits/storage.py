"""The storage of the per-key limits' counters: in this process, or Redis for every replica.

Owns `build_storage` (`GATEWAY_RATE_LIMIT_STORAGE`), `close_storage`, the in-process storage the
gateway uses instead of `limits`' own (`HousekeptMemoryStorage`), and `counters_for`: the four
counter operations `gateway.limits.limiter` is written in (`Counters`). On a shared storage
(Redis) they are `limits`' own strategy and storage calls (`StorageCounters`), one round trip
each; in process they read and write `HousekeptMemoryStorage`'s counters directly
(`MemoryCounters`): the same keys, values and expiry rules as `limits.aio.storage.MemoryStorage`,
without its per-call decorator, lock, rate-limit item and key building (about 0.1 ms of CPU a
request for the eight calls a generation makes: docs/performance.md, "Per request").
"""

from __future__ import annotations

import time
from collections import deque
from functools import lru_cache
from itertools import repeat
from typing import Protocol

from limits import RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

from gateway.policies import LimitPolicy


def build_storage(policy: LimitPolicy) -> Storage:
    """Open the limits storage named by `GATEWAY_RATE_LIMIT_STORAGE`.

    `memory://` keeps counters in this process; `redis://host:port/db` (or `rediss://`) shares
    them between replicas, through redis-py's asyncio client.
    """
    url = policy.storage_url
    if url.startswith(("redis://", "rediss://")):
        return RedisStorage(
            f"async+{url}",
            implementation="redispy",
            key_prefix=policy.key_prefix,
            socket_timeout=policy.timeout,
            socket_connect_timeout=policy.timeout,
        )
    return HousekeptMemoryStorage()


class HousekeptMemoryStorage(MemoryStorage):
    """`limits`' in-memory async storage, pruning at most once a second, moving windows in O(1).

    `limits.aio.storage.MemoryStorage` schedules a pruning pass on every counter update, and the
    pass hands a `bisect` per key to a worker thread (`asyncio.to_thread`): a thread wake-up and
    a loop wake-up per request, about 1 ms of added latency per request on the benchmark's VM
    (docs/performance.md). Pruning only frees memory: every read compares expiry times itself,
    so limits stay exact when it runs less often. This overrides the private, name-mangled
    `__schedule_expiry` (limits 5.x); `tests/limits/test_ratelimit.py` fails if it disappears.

    Its moving window (RPM) keeps one `asyncio.Lock` per hit in a list, newest first, and each
    hit and each read of the window walks, copies or shifts the whole list: O(hits in the last
    minute) per request, about 0.2 ms at 100 requests a second of one key (docs/performance.md,
    "Per request"). Here a key's window is its hits' times in a deque, oldest first, trimmed
    from the left as they leave the window: the same answers (a hit is refused when the hits
    within `expiry` seconds and its own exceed `limit`; the window starts at its oldest hit
    within `expiry`), in constant time per hit.
    """

    #: Seconds between two pruning passes.
    PRUNE_INTERVAL = 1.0

    def __init__(self) -> None:
        super().__init__()
        self._next_prune = 0.0
        #: Moving windows: key -> (hit times, oldest first; the window's length in seconds).
        self._windows: dict[str, tuple[deque[float], float]] = {}

    async def prune(self) -> None:
        """Drop what has expired, at most once every `PRUNE_INTERVAL` seconds."""
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + self.PRUNE_INTERVAL
        wall = time.time()
        for key in [k for k, (hits, expiry) in self._windows.items() if _trim(hits, wall - expiry)]:
            del self._windows[key]
        # getattr: mypy cannot see a name-mangled private method of the base class
        await getattr(super(), "_MemoryStorage__schedule_expiry")()  # noqa: B009

    async def _MemoryStorage__schedule_expiry(self) -> None:
        await self.prune()

    def value(self, key: str, now: float) -> int:
        """A fixed window's count (0 once expired), as `MemoryStorage.get` reads it."""
        if self.expirations.get(key, 0) <= now:
            self.storage.pop(key, None)
            self.expirations.pop(key, None)
            self.locks.pop(key, None)
        return self.storage.get(key, 0)

    def add(self, key: str, expiry: float, amount: int, now: float) -> int:
        """Add `amount` to a fixed window's count; return it (`MemoryStorage.incr`'s rules).

        A count that becomes `amount` (a new window, or one brought back to 0) starts a window
        of `expiry` seconds, as `MemoryStorage.incr` does.
        """
        value = self.value(key, now) + amount
        self.storage[key] = value
        if value == amount:
            self.expirations[key] = now + expiry
        return value

    def take(self, key: str, limit: int, expiry: float, now: float) -> bool:
        """Count one hit in the key's moving window unless it holds `limit` already."""
        hits = self._window(key, expiry, now)
        if len(hits) + 1 > limit:
            return False
        hits.append(now)
        return True

    def moving(self, key: str, expiry: float, now: float) -> tuple[float, int]:
        """(when the window's oldest hit was, the hits in it); (now, 0) when empty."""
        hits = self._window(key, expiry, now) if key in self._windows else None
        return (hits[0], len(hits)) if hits else (now, 0)

    def _window(self, key: str, expiry: float, now: float) -> deque[float]:
        """The key's hits within the last `expiry` seconds, oldest first (made when missing)."""
        entry = self._windows.get(key)
        if entry is None:
            entry = self._windows[key] = (deque(), expiry)
        _trim(entry[0], now - expiry)
        return entry[0]

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        """Count `amount` hits in the key's moving window unless that would pass `limit`."""
        if amount > limit:
            return False
        await self.prune()
        now = time.time()
        hits = self._window(key, expiry, now)
        if len(hits) + amount > limit:
            return False
        hits.extend(repeat(now, amount))
        return True

    async def get_num_acquired(self, key: str, expiry: int) -> int:
        """The hits in the key's moving window."""
        return self.moving(key, expiry, time.time())[1]

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:  # noqa: ARG002 - limits' signature
        """(when the window's oldest hit was, the hits in it); (now, 0) when empty."""
        return self.moving(key, expiry, time.time())

    async def clear(self, key: str) -> None:
        """Forget the key's counter and moving window."""
        self._windows.pop(key, None)
        await super().clear(key)

    async def reset(self) -> int | None:
        """Forget every counter and moving window; return how many keys there were."""
        windows = len(self._windows)
        self._windows.clear()
        cleared = await super().reset()
        return max(cleared or 0, windows)


def _trim(hits: deque[float], start: float) -> bool:
    """Drop the hits before `start` (oldest first); True when none is left."""
    while hits and hits[0] < start:
        hits.popleft()
    return not hits


#: Seconds of every window the limiter counts in (RPM, TPM: per minute).
MINUTE = 60


@lru_cache(maxsize=4096)
def window_key(name: str, key_id: str, limit: int) -> str:
    """The storage key of a key's per-minute counter: `limits`' own (`RateLimitItem.key_for`).

    Cached: a few keys are in use, each asked several times per request; bounded all the same.
    """
    return RateLimitItemPerMinute(limit).key_for(name, key_id)


class Counters(Protocol):
    """The per-minute counters the limiter counts in, by counter name, key id and limit."""

    async def hit_moving(self, name: str, key_id: str, limit: int) -> tuple[bool, int, float]:
        """Count one hit in a moving window unless it is full.

        Returns:
            (counted, hits the window has left, epoch seconds when its oldest hit leaves).
        """
        ...

    async def add(self, name: str, key_id: str, limit: int, amount: int) -> int:
        """Add `amount` (negative: take back) to a fixed window's count; return the count."""
        ...

    async def fixed(self, name: str, key_id: str, limit: int) -> tuple[int, float]:
        """A fixed window's (count left below `limit`, at least 0; epoch seconds it ends)."""
        ...

    async def expiry(self, name: str, key_id: str, limit: int) -> float:
        """Epoch seconds a fixed window ends (now when there is none)."""
        ...


class StorageCounters:
    """`Counters` as `limits`' strategies and storage calls: one storage call each (Redis)."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._moving = MovingWindowRateLimiter(storage)
        self._fixed = FixedWindowRateLimiter(storage)

    async def hit_moving(self, name: str, key_id: str, limit: int) -> tuple[bool, int, float]:
        """`MovingWindowRateLimiter.hit`, then its `get_window_stats`."""
        item = RateLimitItemPerMinute(limit)
        counted = await self._moving.hit(item, name, key_id)
        stats = await self._moving.get_window_stats(item, name, key_id)
        return counted, stats.remaining, stats.reset_time

    async def add(self, name: str, key_id: str, limit: int, amount: int) -> int:
        """`Storage.incr`: atomic in Redis."""
        return await self._storage.incr(window_key(name, key_id, limit), MINUTE, amount=amount)

    async def fixed(self, name: str, key_id: str, limit: int) -> tuple[int, float]:
        """`FixedWindowRateLimiter.get_window_stats`."""
        stats = await self._fixed.get_window_stats(RateLimitItemPerMinute(limit), name, key_id)
        return stats.remaining, stats.reset_time

    async def expiry(self, name: str, key_id: str, limit: int) -> float:
        """`Storage.get_expiry`."""
        return await self._storage.get_expiry(window_key(name, key_id, limit))


class MemoryCounters:
    """`Counters` read and written in place in a `HousekeptMemoryStorage` (module docstring)."""

    def __init__(self, storage: HousekeptMemoryStorage) -> None:
        self._storage = storage

    async def hit_moving(self, name: str, key_id: str, limit: int) -> tuple[bool, int, float]:
        """Count the hit and read the window in one step (nothing runs in between)."""
        storage = self._storage
        await storage.prune()
        key = window_key(name, key_id, limit)
        now = time.time()
        counted = storage.take(key, limit, MINUTE, now)
        start, hits = storage.moving(key, MINUTE, now)
        return counted, limit - hits, start + MINUTE

    async def add(self, name: str, key_id: str, limit: int, amount: int) -> int:
        """Add to the count (`MemoryStorage.incr`'s rules)."""
        await self._storage.prune()
        return self._storage.add(window_key(name, key_id, limit), MINUTE, amount, time.time())

    async def fixed(self, name: str, key_id: str, limit: int) -> tuple[int, float]:
        """What is left and when the window ends (`FixedWindowRateLimiter.get_window_stats`)."""
        key = window_key(name, key_id, limit)
        now = time.time()
        left = max(0, limit - self._storage.value(key, now))
        return left, self._storage.expirations.get(key, now)

    async def expiry(self, name: str, key_id: str, limit: int) -> float:
        """When the window ends (`MemoryStorage.get_expiry`)."""
        return self._storage.expirations.get(window_key(name, key_id, limit), time.time())


def counters_for(storage: Storage) -> Counters:
    """The counters on `storage`: in place for the gateway's in-process storage."""
    if isinstance(storage, HousekeptMemoryStorage):
        return MemoryCounters(storage)
    return StorageCounters(storage)


async def close_storage(storage: Storage) -> None:
    """Close the storage's connections, if it holds any (Redis)."""
    bridge = getattr(storage, "bridge", None)
    client = getattr(bridge, "storage", None)
    close = getattr(client, "aclose", None)
    if close is not None:
        await close()

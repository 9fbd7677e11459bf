"""`KeyAuthenticator`: the key store's `authenticate`, with a short cache of verified keys.

Reading the key store on every request cost about 1.3 ms of CPU and 4.7 ms of wall time on
SQLite (an ORM lookup through aiosqlite's worker thread; docs/performance.md, "The first
run"), more than the rest of the gateway's per-request work together. A key verified in the last
`GATEWAY_KEY_CACHE_SECONDS` is therefore served from memory:

- **The bound.** Revocation, rotation, limit and permission (`manage_models`) changes take
  effect on every replica within `key_cache_seconds` (default 1 s; field failure F-27 asks for a
  stated, tested bound). With 0 every request reads the store, as before.
- **Expiry stays exact:** every hit checks the cached `expires_at` against the clock, so an
  expired key is refused at once (F-28).
- **Only successes are cached.** A wrong, unknown, revoked or expired key always goes to the
  store, so a newly created key works at once and a failure is never remembered.
- **No secret is kept:** entries are indexed by `sha256(presented key)`; a hit is a dict lookup
  of that digest, which reveals no more than the store's own hash compare does.
- **Bounded and single-flight:** at most `max_entries` keys (least recently verified dropped
  first), and concurrent misses for one key share a single store lookup, so a burst of
  streams with the same key after the entry ages out costs one query, not one per stream.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import anyio

from gateway.keys.store import InvalidKeyError, KeyRecord, KeyStore

#: Most verified keys kept in memory; far above the number of keys a gateway usually serves.
DEFAULT_MAX_ENTRIES = 10_000


@dataclass(slots=True)
class _Entry:
    record: KeyRecord
    fresh_until: float  # monotonic seconds


class KeyAuthenticator:
    """Check presented keys against a `KeyStore`, caching each verified key for `ttl` seconds.

    Args:
        store: Where keys live; its `authenticate` does the constant-time secret check.
        ttl: Seconds a verified key is served from memory (`GATEWAY_KEY_CACHE_SECONDS`); 0
            turns the cache off.
        last_used_interval: Seconds; a key's `last_used_at` is written at most this often
            (`GATEWAY_LAST_USED_INTERVAL`).
        max_entries: Most keys cached at once.
        clock: Monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        store: KeyStore,
        *,
        ttl: float,
        last_used_interval: float,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._ttl = ttl
        self._last_used_interval = last_used_interval
        self._max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._pending: dict[bytes, anyio.Event] = {}

    async def authenticate(self, presented: str) -> KeyRecord:
        """Return the record of an active key, and note its use (`last_used_at`).

        Args:
            presented: The credential as the client sent it.

        Returns:
            The key's record, at most `ttl` seconds old.

        Raises:
            InvalidKeyError: `malformed`, `unknown`, `revoked` or `expired`
                (see `KeyStore.authenticate`).
        """
        if self._ttl <= 0:
            record = await self._store.authenticate(presented)
        else:
            record = await self._cached(hashlib.sha256(presented.encode()).digest(), presented)
        if _touch_due(record.last_used_at, self._last_used_interval):
            await self._store.touch(record.id, min_interval=self._last_used_interval)
            self._touched(record.id)
        return record

    async def _cached(self, digest: bytes, presented: str) -> KeyRecord:
        while True:
            entry = self._entries.get(digest)
            if entry is not None and entry.fresh_until > self._clock():
                status = entry.record.status()
                if status != "active":  # expired since it was cached
                    del self._entries[digest]
                    raise InvalidKeyError(status)
                return entry.record
            pending = self._pending.get(digest)
            if pending is None:
                break
            await pending.wait()  # the lookup in flight fills the entry, or fails: look again
        event = self._pending[digest] = anyio.Event()
        try:
            record = await self._store.authenticate(presented)
        except BaseException:
            self._entries.pop(digest, None)
            raise
        finally:
            del self._pending[digest]
            event.set()
        self._entries[digest] = _Entry(record, self._clock() + self._ttl)
        self._entries.move_to_end(digest)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return record

    def forget(self, key_id: str) -> None:
        """Drop every cached credential of `key_id`.

        So an admin change made on this replica applies to its next request at once; other
        replicas see it within `ttl`.
        """
        for digest in [d for d, entry in self._entries.items() if entry.record.id == key_id]:
            del self._entries[digest]

    def _touched(self, key_id: str) -> None:
        """Mark cached copies of `key_id` as used now, so the next hits skip the write."""
        now = datetime.now(UTC)
        for entry in self._entries.values():
            if entry.record.id == key_id:
                entry.record = replace(entry.record, last_used_at=now)

    def __len__(self) -> int:
        """The number of keys cached now (fresh or not yet dropped)."""
        return len(self._entries)


def _touch_due(last_used_at: datetime | None, interval: float) -> bool:
    """Whether `last_used_at` is old enough to write again; spares the hot path a write."""
    return last_used_at is None or datetime.now(UTC) - last_used_at >= timedelta(seconds=interval)

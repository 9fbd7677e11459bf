"""A key's requests in flight: counted in this process, or as leases in Redis.

In one process (`memory://`) the count is a dictionary: nothing outlives the process, so
nothing can leak. Shared by replicas or workers (`redis://`), each request in flight is one
member of the key's sorted set, scored with the moment its lease lapses; the count is the
number of members whose lease still runs. A live process renews its own members' leases every
third of `GATEWAY_RATE_LIMIT_LEASE_SECONDS`; a process that dies (kill -9, OOM, a lost node)
renews nothing, so its requests stop counting one lease after its last renewal instead of
holding the key's slots until a counter expires.

Each step is one atomic Redis call (a Lua script, or `ZREM`), and every script reads the time
from Redis itself (`TIME`), so replicas with skewed clocks agree on which leases run. Renewal
uses `ZADD XX`, which never brings back a member a release removed.

A call that fails must not hold a slot for a lease after its request ended. When Redis stalls
(a slow disk, `DEBUG SLEEP`, a failover), a call that timed out may still run once Redis wakes:
an acquire whose caller gave up adds a member nobody renews or releases, and a release that did
not get through leaves its member counted. Both tickets are kept as "orphans" and voided by
`sweep`, which the limiter retries every `SWEEP_INTERVAL` seconds until Redis answers: it
removes the member and marks the ticket void for a lease, and the acquire script adds nothing
for a void ticket, so an acquire Redis runs after the sweep cannot bring the slot back. A slot
is therefore usable again within a sweep interval of Redis answering, not a lease later.
Needs Redis 5 or later (scripts replicated by their effects, so `TIME` may precede writes).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from itertools import count
from typing import TYPE_CHECKING, Protocol

from gateway.policies import LimitPolicy

if TYPE_CHECKING:  # imported when used: redis-py 8 imports the OpenTelemetry SDK with it
    import redis.asyncio as aioredis

# KEYS[1] the key's set, KEYS[2] the member's void mark; ARGV[1] the member, ARGV[2] the limit,
# ARGV[3] the lease (ms). Returns 1 (admitted, the member added) or 0 (the limit is reached, or
# the member was voided: its caller gave up long ago).
_ACQUIRE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], lease) end
return 1
"""

# KEYS: the sets this process holds members in; ARGV[1] the lease (ms), then for each key in
# order the number of its members and the members. Extends only members still present.
_RENEW = """
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local lease = tonumber(ARGV[1])
local at = 2
for i = 1, #KEYS do
  local n = tonumber(ARGV[at])
  for j = 1, n do
    redis.call('ZADD', KEYS[i], 'XX', deadline, ARGV[at + j])
  end
  at = at + n + 1
  if redis.call('PTTL', KEYS[i]) < lease then redis.call('PEXPIRE', KEYS[i], lease) end
end
return #KEYS
"""

# KEYS[1] the key's set, then each member's void mark; ARGV[1] the lease (ms), then the members
# in the marks' order. Removes each member and marks it void for a lease.
_VOID = """
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('SET', KEYS[i], '1', 'PX', lease)
end
return #ARGV - 1
"""

#: Seconds between two tries to void the tickets of failed calls (`LeasedInFlight.sweep`).
SWEEP_INTERVAL = 0.5

#: Most tickets kept for `sweep`; beyond it (Redis down for long under load) a failed call's
#: member, if Redis ever ran it, lapses one lease later, as with no sweep at all.
MAX_ORPHANS = 10_000

#: Keys renewed (or tickets voided) per script call: bounds one call's size and the time it
#: holds Redis.
_RENEW_BATCH = 200


class InFlight(Protocol):
    """Counts a key's requests in flight against its limit.

    `acquire` returns a ticket (a string) when the request may run, None when the key already
    has `limit` in flight; the ticket goes back to `release` exactly once.
    """

    async def acquire(self, key_id: str, limit: int) -> str | None:
        """Count one more request of `key_id` unless `limit` (> 0) are in flight; its ticket."""
        ...

    async def release(self, key_id: str, ticket: str) -> None:
        """Count the request holding `ticket` no more."""
        ...

    async def renew(self) -> None:
        """Keep this process's requests counted for another lease."""
        ...

    async def sweep(self) -> None:
        """Void what failed calls may have left counted; a no-op when nothing failed."""
        ...

    async def aclose(self) -> None:
        """Close any connection."""
        ...

    @property
    def renew_interval(self) -> float | None:
        """Seconds between two `renew` calls; None: nothing to renew."""
        ...


class LocalInFlight:
    """In-flight counts of this process only (`GATEWAY_RATE_LIMIT_STORAGE=memory://`)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    @property
    def renew_interval(self) -> None:
        """Nothing to renew: the counts live and die with the process."""
        return None

    async def acquire(self, key_id: str, limit: int) -> str | None:
        """Count one more request of `key_id` unless `limit` are in flight already."""
        held = self._counts.get(key_id, 0)
        if held >= limit:
            return None
        self._counts[key_id] = held + 1
        return ""

    async def release(self, key_id: str, ticket: str) -> None:  # noqa: ARG002 - the protocol's
        """Count one request of `key_id` less (the ticket carries nothing here)."""
        held = self._counts.get(key_id, 0) - 1
        if held > 0:
            self._counts[key_id] = held
        else:
            self._counts.pop(key_id, None)

    async def renew(self) -> None:
        """Nothing to renew."""

    async def sweep(self) -> None:
        """Nothing can fail here."""

    async def aclose(self) -> None:
        """Nothing to close."""


class LeasedInFlight:
    """In-flight counts shared through Redis, one lease per request (see the module docstring).

    Args:
        client: A redis-py asyncio client (its socket timeouts bound every call).
        prefix: `GATEWAY_RATE_LIMIT_KEY_PREFIX`; a key's set is `<prefix>:inflight/<key id>`.
        lease: Seconds a request counts without being renewed (> 0).

    Raises (from every call): `redis.RedisError` or `OSError` when Redis fails; the limiter
    applies `GATEWAY_RATE_LIMIT_FAIL_OPEN`.
    """

    def __init__(self, client: aioredis.Redis, prefix: str, lease: float) -> None:
        self._client = client
        self._prefix = prefix
        self._lease_ms = max(int(lease * 1000), 1)
        self._interval = lease / 3
        # Host, pid and a random part: an operator reading the set sees whose leases they are.
        self._holder = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        self._serial = count()
        self._held: dict[str, set[str]] = {}
        # Tickets of acquires and releases that failed, per key id, until `sweep` voids them.
        self._orphans: dict[str, set[str]] = {}
        self._orphan_count = 0
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._void = client.register_script(_VOID)

    @classmethod
    def from_policy(cls, policy: LimitPolicy) -> LeasedInFlight:
        """A client of its own on `GATEWAY_RATE_LIMIT_STORAGE`, with the limiter's timeouts."""
        import redis.asyncio as aioredis  # here, not at the top: see the module's imports

        client = aioredis.Redis.from_url(
            policy.storage_url,
            socket_timeout=policy.timeout,
            socket_connect_timeout=policy.timeout,
        )
        return cls(client, policy.key_prefix, policy.lease_seconds)

    @property
    def renew_interval(self) -> float:
        """Seconds between two renewals: a third of the lease, so two may fail in a row."""
        return self._interval

    def _key(self, key_id: str) -> str:
        return f"{self._prefix}:inflight/{key_id}"

    def _void_mark(self, ticket: str) -> str:
        return f"{self._prefix}:inflight-void/{ticket}"

    def _orphan(self, key_id: str, ticket: str) -> None:
        if self._orphan_count < MAX_ORPHANS:
            self._orphans.setdefault(key_id, set()).add(ticket)
            self._orphan_count += 1

    async def acquire(self, key_id: str, limit: int) -> str | None:
        """Add a leased member for one request of `key_id` unless `limit` leases run.

        A call that fails (or is cancelled: the limiter's deadline) leaves its ticket to
        `sweep`: Redis may still run the script later.
        """
        ticket = f"{self._holder}/{next(self._serial)}"
        try:
            admitted = await self._acquire(
                keys=[self._key(key_id), self._void_mark(ticket)],
                args=[ticket, limit, self._lease_ms],
            )
        except BaseException:
            self._orphan(key_id, ticket)
            raise
        if not admitted:
            return None
        self._held.setdefault(key_id, set()).add(ticket)
        return ticket

    async def release(self, key_id: str, ticket: str) -> None:
        """Remove the request's member; it is no longer renewed even if this call fails.

        A release that fails leaves its ticket to `sweep`, which removes the member as soon
        as Redis answers again (not a lease later).
        """
        members = self._held.get(key_id)
        if members is not None:
            members.discard(ticket)
            if not members:
                del self._held[key_id]
        try:
            await self._client.zrem(self._key(key_id), ticket)
        except BaseException:
            self._orphan(key_id, ticket)
            raise

    async def sweep(self) -> None:
        """Remove and void the members of failed acquires and releases (module docstring).

        Raises:
            redis.RedisError, OSError: Redis failed; the tickets not voided stay for the next
                sweep.
        """
        while self._orphans:
            key_id, tickets = self._orphans.popitem()
            members = sorted(tickets)[:_RENEW_BATCH]
            rest = tickets.difference(members)
            if rest:
                self._orphans.setdefault(key_id, set()).update(rest)
            try:
                await self._void(
                    keys=[self._key(key_id), *map(self._void_mark, members)],
                    args=[self._lease_ms, *members],
                )
            except BaseException:
                self._orphans.setdefault(key_id, set()).update(members)
                raise
            self._orphan_count -= len(members)

    async def renew(self) -> None:
        """Extend the lease of every request this process has in flight (none: no call)."""
        held = [(key_id, sorted(members)) for key_id, members in self._held.items() if members]
        for start in range(0, len(held), _RENEW_BATCH):
            await self._renew_some(held[start : start + _RENEW_BATCH])

    async def _renew_some(self, held: Sequence[tuple[str, list[str]]]) -> None:
        args: list[str | int] = [self._lease_ms]
        for _, members in held:
            args += [len(members), *members]
        await self._renew(keys=[self._key(key_id) for key_id, _ in held], args=args)

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._client.aclose()

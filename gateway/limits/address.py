"""Per-address budgets of failed authentications: what an anonymous client may try.

Per-key limits (`gateway.limits.limiter`) start once a key is known; before that, a client
could try keys or admin tokens as fast as the gateway answers, each well-formed key costing a
key-store read. `AddressLimiter` counts each *failed* authentication against the client's
address, in a moving minute, and once an address has spent its budget its further failures get
429 with `Retry-After` instead of 401:

- **Failures only.** A valid key (or admin token) is never counted and never refused here, even
  from an address over its budget: clients behind one NAT, or one proxy that sends no
  `X-Forwarded-For`, share an address, and one of them failing must not lock out the others.
  The check therefore runs after the credential was checked, on the failure path only: a
  success costs nothing here. The one exception is `over_budget`, a look without a count, for
  an endpoint whose check itself costs a call elsewhere (the admin page's SSO code exchange
  asks the identity provider): there an address past its budget is refused before that call.
- **Two budgets, counted apart:** `api` (API keys, `GATEWAY_AUTH_FAILURES_PER_MINUTE`) and
  `admin` (admin tokens on `/admin/v1`, `GATEWAY_ADMIN_AUTH_FAILURES_PER_MINUTE`, tighter).
- **The address** is `gateway.wire.address.client_address`: the peer, or for a peer in
  `GATEWAY_TRUSTED_PROXIES` the nearest untrusted `X-Forwarded-For` hop, so a client cannot
  escape by writing the header itself. An IPv6 client is counted by its /64 (one host or one
  subscriber usually has a whole /64); an IPv4-mapped address as the IPv4 one.
- **Shared** through the limit storage (`GATEWAY_RATE_LIMIT_STORAGE`): with Redis every worker
  and replica spends the same budget.
- **Never in the way of an answer:** a storage failure or timeout (`GATEWAY_RATE_LIMIT_TIMEOUT`)
  is logged and counted (`gateway_rate_limit_storage_errors_total`) and the failure keeps its
  own answer (401); whatever `GATEWAY_RATE_LIMIT_FAIL_OPEN` says, since the request is refused
  either way.

Each refusal is counted in `gateway_address_limited_total{budget}`; the first one of an address
and budget in each minute is logged (through the storage, so once for all workers).

Why not slowapi, which the product brief names: its limiter checks `limits`' synchronous storage
on the event loop (slowapi issue #130: a Redis round trip blocks every request of the process),
and it counts every request a route receives, where this budget must count failures only, after
the credential check; the gateway's key limits already use `limits.aio`, the library under
slowapi, and this shares their storage.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import time
from contextlib import AbstractContextManager
from typing import Literal

import anyio
from limits import RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter
from starlette.types import Scope

from gateway.errors import GatewayError, RateLimitedError
from gateway.metering.metrics import Metrics
from gateway.policies import AuthFailurePolicy
from gateway.wire.address import client_address

logger = logging.getLogger("gateway.ratelimit")

Budget = Literal["api", "admin"]
"""Which credentials failed: `api` (API keys) or `admin` (admin tokens)."""

#: Prefix length an IPv6 client is counted by: what one host or subscriber usually holds.
IPV6_PREFIX = 64
#: One log line per address and budget per fixed minute.
_ONCE_A_MINUTE = RateLimitItemPerMinute(1)
_WHAT = {"api": "API keys", "admin": "admin tokens"}


class AddressLimiter:
    """Counts failed authentications per client address; see the module docstring.

    Args:
        storage: The `limits.aio` storage the key limits use (memory or Redis).
        policy: The budgets, trusted proxies and storage timeout.
        metrics: For `gateway_address_limited_total` and storage errors.
    """

    def __init__(self, storage: Storage, policy: AuthFailurePolicy, metrics: Metrics) -> None:
        self._moving = MovingWindowRateLimiter(storage)
        self._fixed = FixedWindowRateLimiter(storage)
        self._budgets: dict[Budget, int] = {
            "api": policy.api_per_minute,
            "admin": policy.admin_per_minute,
        }
        self._trusted = policy.trusted_proxies
        self._timeout = policy.timeout
        # The in-process storage never waits on anything: no deadline to arm for it.
        self._remote = not isinstance(storage, MemoryStorage)
        self._metrics = metrics

    async def failed(
        self, scope: Scope, budget: Budget, error: GatewayError, *, valid_served: bool = True
    ) -> GatewayError:
        """Count a failed authentication of `scope`'s client; return the error to answer with.

        Args:
            scope: The request's ASGI scope (its peer and headers name the client).
            budget: Which budget the failure spends.
            error: The refusal the failure earned (401, or 400 for repeated credentials).
            valid_served: Whether the 429's message may say a valid credential is still served
                (False where `over_budget` is asked first).

        Returns:
            `error` while the address is within its budget (or the budget is 0, the server gave
            no peer address, or the storage failed); else a `RateLimitedError` (429 with
            `Retry-After`, whole seconds until the oldest counted failure leaves the minute).
            Never raises.
        """
        return await self._check(scope, budget, count=True, valid_served=valid_served) or error

    async def over_budget(self, scope: Scope, budget: Budget) -> RateLimitedError | None:
        """Whether `scope`'s client has already spent `budget`, without counting anything.

        For an endpoint whose check of the credential itself costs something (a call to the
        identity provider, `gateway.api.admin.oidc`): asked first, so an address past its budget
        is answered 429 without that cost. Unlike `failed`, this refuses a request that might
        have been valid: only for an endpoint where that trade is documented.

        Returns:
            The 429 to answer with (as `failed`'s, logged at most once a minute per address),
            or None while within the budget (or the budget is 0, no peer address, the storage
            failed). Never raises.
        """
        return await self._check(scope, budget, count=False, valid_served=False)

    async def _check(
        self, scope: Scope, budget: Budget, *, count: bool, valid_served: bool
    ) -> RateLimitedError | None:
        """`failed` (`count`: hit, then refuse past the budget) and `over_budget` (only look)."""
        limit = self._budgets[budget]
        address = client_address(scope, self._trusted)
        if not limit or address is None:
            return None
        bucket = address_bucket(address)
        item = RateLimitItemPerMinute(limit)
        namespace = f"address-{budget}"
        try:
            with self._deadline():
                if count:
                    within = await self._moving.hit(item, namespace, bucket)
                else:
                    within = await self._moving.test(item, namespace, bucket)
                if within:
                    return None
                stats = await self._moving.get_window_stats(item, namespace, bucket)
                first = await self._fixed.hit(_ONCE_A_MINUTE, "address-logged", budget, bucket)
        except Exception as exc:  # storage down or slow: the request keeps its own answer
            self._metrics.rate_limit_storage_errors.inc()
            logger.warning(
                "rate-limit storage unavailable for the per-address budget (%s)",
                type(exc).__name__ or "timeout",
            )
            return None
        self._metrics.address_limited.labels(budget).inc()
        if first:
            logger.warning(
                "client %s made more than %d failed authentications with %s in a minute: "
                "answering its %s with 429 (logged once a minute)",
                bucket,
                limit,
                _WHAT[budget],
                "failures" if count else "requests",
            )
        retry_after = max(math.ceil(stats.reset_time - time.time()), 1)
        served = " (a valid credential is served at once)" if valid_served else ""
        return RateLimitedError(
            f"too many failed authentications from this address: at most {limit} a minute; "
            f"try again in {retry_after} s{served}",
            headers={"Retry-After": str(retry_after)},
        )

    def _deadline(self) -> AbstractContextManager[object]:
        """`GATEWAY_RATE_LIMIT_TIMEOUT` around a shared storage's calls; nothing in-process."""
        if self._remote:
            return anyio.fail_after(self._timeout)
        return contextlib.nullcontext()


def address_bucket(address: str) -> str:
    """What an address is counted as: an IPv4 address, or an IPv6 /64 (`2001:db8::/64`).

    An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) counts as its IPv4 address; a peer that is
    not an IP address (a Unix socket's) is counted as given.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)

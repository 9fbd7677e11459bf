"""Per-key limits: requests per minute, tokens per minute, requests in flight.

Built on `limits`' async strategies and storages (the library slowapi itself uses). slowapi's
own Redis path is synchronous (slowapi issue #130) and would block the event loop on every
request, so the gateway calls `limits.aio` directly; the storage is in memory (one process) or
Redis (`GATEWAY_RATE_LIMIT_STORAGE=redis://...`, shared by every replica). It counts through
four counter operations (`gateway.limits.storage.Counters`): on Redis `limits`' own calls, in
memory the same counters read and written in place.

* RPM: a moving window over the last 60 s (exact), one hit per request, counted at admission
  (`admit`), before the body is read: a flood of junk bodies spends the key's own RPM. Routes
  that spend no tokens but make an upstream work (model lists, `/api/show`, management) count
  too (`admitted`).
* Concurrency: a count per key, taken at admission and given back when the response ends;
  in Redis one lease per request that its process renews, so the requests of a process that
  died stop counting one lease later, and what a storage stall left counted is voided as soon
  as the storage answers again (`gateway.limits.inflight`).
* TPM: fixed one-minute windows. Once the body is parsed, the request reserves what it will
  most likely use (`reserve`): its prompt's estimate (bytes / 4, `gateway.limits.estimate`)
  plus, for its answer, what the key's last answers on that model needed
  (`gateway.limits.history`; before any, `GATEWAY_TPM_RESERVE_TOKENS`), at most its own
  bound (`num_predict`, `max_tokens`). It is refused when the window has not that much left
  (429), or for good when its prompt alone exceeds the key's whole TPM (413: no window could
  ever hold it). A declared bound above what was reserved is not refused: the answer may grow
  past its reservation by headroom taken from a second counter of the key (`tpm-headroom`,
  also TPM per window, given back when the request ends), and the bound the upstream is
  sent is lowered to what was reserved plus the headroom granted (never above the client's
  own bound, nor above the window's TPM less the prompt); a request with no bound is sent
  that one. So what the gateway checked is what the upstream is told, and an answer never
  outgrows it. When it ends, `release` settles the reservation with what it really used
  (`RequestMeter.charged_tokens`: output tokens, plus the prompt at least at its estimate once
  the upstream took it, a client that hung up included): the difference is refunded, or the
  excess charged, and a completed answer's output joins the key's history. Parallel requests
  therefore share the window instead of all passing the same "tokens left" check (issue 11,
  class 5). Worst case: the requests admitted in one window spend at most twice the TPM, the
  reservations (at most TPM) plus the headroom (at most TPM); a request still running when its
  window ends charges its excess to the next one. The reservation and the refund are one
  counter's increments (`Storage.incr`, a refund with a negative amount on the same key),
  atomic in Redis, so every replica sees them at once (the answer history is per process).

When the storage fails or is slower than `GATEWAY_RATE_LIMIT_TIMEOUT`, the configured policy
applies (`GATEWAY_RATE_LIMIT_FAIL_OPEN`): admit (open) or answer 503 (closed); each such event
is logged and counted in `gateway_rate_limit_storage_errors_total`.

Over ~300 lines for one reason: `KeyLimiter` is one class whose admit, reserve and release
share the window arithmetic, the in-flight counts and the storage-failure policy.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import anyio
from limits.aio.storage import MemoryStorage, Storage

from gateway.auth.principal import Principal
from gateway.errors import (
    GatewayError,
    OverTokenLimitError,
    RateLimitedError,
    ServiceUnavailableError,
)
from gateway.limits.estimate import TokenEstimate
from gateway.limits.history import AnswerHistory
from gateway.limits.inflight import SWEEP_INTERVAL, InFlight, LeasedInFlight, LocalInFlight
from gateway.limits.storage import counters_for
from gateway.metering.metrics import Metrics
from gateway.policies import LimitPolicy

logger = logging.getLogger("gateway.ratelimit")

#: Seconds two reads of one TPM window's end may differ by (Redis TTLs are whole seconds).
_WINDOW_SLACK = 5.0


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's effective limits; 0 means unlimited."""

    rpm: int
    tpm: int
    max_concurrent: int

    @classmethod
    def of(cls, principal: Principal, policy: LimitPolicy) -> Limits:
        """Resolve the key's own limits, falling back to the policy's defaults for None."""

        def pick(own: int | None, default: int) -> int:
            return default if own is None else own

        return cls(
            pick(principal.rpm, policy.default_rpm),
            pick(principal.tpm, policy.default_tpm),
            pick(principal.max_concurrent, policy.default_max_concurrent),
        )


@dataclass
class Admission:
    """What admission granted: response headers, and what to undo or settle at the end.

    Attributes:
        reserved: Tokens reserved against TPM and not yet settled.
        window_ends: When the TPM window holding `reserved` ends (epoch seconds).
        ticket: The in-flight count's ticket (`InFlight.acquire`) while the request holds one.
        model: The model whose answer history the reservation read, and the answer joins.
        headroom: Tokens of the key's headroom counter the request holds (given back at the
            end), by which its answer may outgrow its reservation.
        headroom_ends: When the headroom counter's window holding `headroom` ends.
        released: `KeyLimiter.release` ran; later calls do nothing.
    """

    key_id: str
    limits: Limits
    headers: dict[str, str] = field(default_factory=dict)
    ticket: str | None = None
    reserved: int = 0
    window_ends: float = 0.0
    model: str | None = None
    headroom: int = 0
    headroom_ends: float = 0.0
    released: bool = False


class KeyLimiter:
    """Admits or refuses requests per key, and settles their tokens after them.

    A request calls `admit` (RPM, in-flight), then `reserve` (TPM) once its body is known, and
    `release` exactly once after `admit` succeeded, whatever happened since: it gives the
    in-flight slot back and settles the reservation. With a shared storage, `run` must run
    for as long as the limiter serves: it renews the leases of the requests in flight.

    Args:
        storage: A `limits.aio` storage (memory or Redis).
        policy: Defaults, fail policy, storage timeout and lease (seconds).
        metrics: For `gateway_rate_limited_total{kind}` and storage errors.
        in_flight: The in-flight counts; by default in this process with the memory storage,
            else leases in the Redis of `GATEWAY_RATE_LIMIT_STORAGE`.
        history: What each key's recent answers needed, per model (this process's).
    """

    def __init__(
        self,
        storage: Storage,
        policy: LimitPolicy,
        metrics: Metrics,
        in_flight: InFlight | None = None,
        history: AnswerHistory | None = None,
    ) -> None:
        self._storage = storage
        self.history = AnswerHistory() if history is None else history
        self._policy = policy
        self._metrics = metrics
        self._counters = counters_for(storage)
        # The in-process storage never waits on anything: no deadline to arm for it.
        self._remote = not isinstance(storage, MemoryStorage)
        if in_flight is None:
            in_flight = LeasedInFlight.from_policy(policy) if self._remote else LocalInFlight()
        self._in_flight = in_flight

    async def run(self) -> None:
        """Renew this process's in-flight leases until cancelled; returns at once in memory.

        A renewal that fails is logged and counted (`gateway_rate_limit_storage_errors_total`)
        and tried again at the next interval: with a third of the lease between renewals, two
        may fail before a request stops counting. Between renewals, every `SWEEP_INTERVAL`
        seconds, what failed acquires and releases may have left counted is voided
        (`InFlight.sweep`), so a storage stall does not hold a key's slots for a lease after;
        a sweep that keeps failing is counted each time and logged once per renewal interval.
        """
        interval = self._in_flight.renew_interval
        if interval is None:
            return
        renew_at = time.monotonic() + interval
        quiet_until = 0.0  # a failing sweep is retried twice a second: log it once an interval
        while True:
            await anyio.sleep(max(min(SWEEP_INTERVAL, renew_at - time.monotonic()), 0))
            now = time.monotonic()
            if not await self._upkeep(
                "voiding failed calls", self._in_flight.sweep, interval, log=now >= quiet_until
            ):
                quiet_until = max(quiet_until, now + interval)
            if time.monotonic() >= renew_at:
                renew_at = time.monotonic() + interval
                await self._upkeep("renewing leases", self._in_flight.renew, interval)

    async def _upkeep(
        self, what: str, call: Callable[[], Awaitable[None]], deadline: float, *, log: bool = True
    ) -> bool:
        """Run one in-flight upkeep call within `deadline` s; False if it failed.

        A failure is counted (`gateway_rate_limit_storage_errors_total`), and logged if `log`.
        """
        try:
            with anyio.fail_after(deadline):
                await call()
        except Exception as exc:
            self._metrics.rate_limit_storage_errors.inc()
            if log:
                logger.warning(
                    "rate-limit storage failed while %s: %s",
                    what,
                    type(exc).__name__ or "timeout",
                )
            return False
        return True

    async def aclose(self) -> None:
        """Close the in-flight counts' own connections (the storage is closed apart)."""
        await self._in_flight.aclose()

    def _deadline(self) -> AbstractContextManager[object]:
        """`GATEWAY_RATE_LIMIT_TIMEOUT` around a shared storage's calls; nothing in-process."""
        if self._remote:
            return anyio.fail_after(self._policy.timeout)
        return contextlib.nullcontext()

    def _shield(self) -> AbstractContextManager[object]:
        """A shield for a take-back that must happen; nothing in-process.

        The in-process counters never suspend, so nothing can cancel them midway: the shield
        would cost an anyio cancel scope per request for nothing.
        """
        if self._remote:
            return anyio.CancelScope(shield=True)
        return contextlib.nullcontext()

    async def admit(self, principal: Principal) -> Admission:
        """Check and count RPM, take an in-flight slot; needs nothing of the body.

        Raises:
            RateLimitedError: a limit is reached (429 with `Retry-After` and `X-RateLimit-*`).
            ServiceUnavailableError: the storage failed and the policy is fail-closed (503).
        """
        limits = Limits.of(principal, self._policy)
        admission = Admission(principal.key_id, limits)
        if not (limits.rpm or limits.max_concurrent):
            return admission
        try:
            with self._deadline():
                await self._check(principal.key_id, limits, admission)
        except GatewayError:
            raise
        except Exception as exc:  # storage down or slow: apply the policy
            self._storage_failed(exc)
        return admission

    @contextlib.asynccontextmanager
    async def admitted(self, principal: Principal) -> AsyncIterator[Admission]:
        """`admit` around a request that spends no tokens (model lists, management), then release.

        Every route that can make an upstream work counts against its key's RPM and holds an
        in-flight slot while it runs, so a key cannot call its upstreams faster than its limit
        through a route that carries no generation (`/api/tags`: 300 upstream calls in 0.8 s
        from a 5-per-minute key).

        Raises:
            RateLimitedError, ServiceUnavailableError: as `admit`.
        """
        admission = await self.admit(principal)
        try:
            yield admission
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled request still gives its slot back
                await self.release(admission, 0)

    async def _check(self, key_id: str, limits: Limits, admission: Admission) -> None:
        if limits.rpm:
            allowed, remaining, reset_time = await self._counters.hit_moving(
                "rpm", key_id, limits.rpm
            )
            admission.headers = _headers(limits.rpm, remaining, reset_time)
            if not allowed:
                what = f"{limits.rpm} requests per minute"
                raise self._refuse("rpm", what, admission.headers, reset_time)
        if limits.max_concurrent:
            admission.ticket = await self._in_flight.acquire(key_id, limits.max_concurrent)
            if admission.ticket is None:
                what = f"at most {limits.max_concurrent} in flight"
                raise self._refuse("concurrency", what, admission.headers, time.time() + 1)

    async def reserve(
        self, admission: Admission, estimate: TokenEstimate, model: str | None = None
    ) -> int | None:
        """Reserve the request's expected tokens in its key's TPM window (module docstring).

        The reservation is the prompt's estimate plus the answer this key's last answers on
        `model` needed (`AnswerHistory.expected`; before any, `estimate.output`), at most the
        client's bound, and at most the key's TPM in all. A request whose estimated prompt alone
        exceeds the key's TPM can never fit a window and is refused before anything is counted
        (admitting it would let one request overshoot by any amount, once per window). A bound
        above the reservation takes headroom from the key's second counter, up to the bound and
        to the TPM less the prompt; the bound to send upstream is the reservation's output plus
        the headroom granted. `X-RateLimit-Tokens-Remaining` is what the window had left before
        this reservation.

        Args:
            admission: The request's admission (`admit`); its reservation and headroom are
                noted on it for `release`.
            estimate: The request's estimate (`gateway.limits.estimate`).
            model: The model that runs (an alias's target): whose answer history counts.

        Returns:
            The output bound the upstream must be sent, when it differs from the client's own
            (lowered, or set where the client set none); None: send the request as it is (no
            TPM, an embedding, the storage failed open, or the client's bound was granted).

        Raises:
            OverTokenLimitError: the prompt exceeds the key's TPM (413; the message says so).
            RateLimitedError: the window has less left than the reservation (429).
            ServiceUnavailableError: the storage failed and the policy is fail-closed (503).
        """
        tpm = admission.limits.tpm
        if not tpm:
            return None
        if estimate.prompt > tpm:
            raise self._never(tpm, estimate)
        output = 0
        if estimate.bound != 0:  # 0: an embedding generates nothing
            admission.model = model
            seen = None if model is None else self.history.expected(admission.key_id, model)
            output = max(estimate.output if seen is None else seen, 1)
            if estimate.bound is not None:
                output = min(output, estimate.bound)
        try:
            with self._deadline():
                return await self._reserve(admission, estimate, output)
        except GatewayError:
            raise
        except Exception as exc:  # fail open: no reservation, the whole use is charged later
            self._storage_failed(exc)
        return None

    def _never(self, tpm: int, estimate: TokenEstimate) -> OverTokenLimitError:
        """Count and build the refusal of a request no TPM window of its key can hold."""
        self._metrics.rate_limited.labels("tpm").inc()
        return OverTokenLimitError(
            f"request exceeds this key's limit of {tpm} tokens per minute and can never be "
            f"admitted; its prompt is about {estimate.prompt} tokens: shorten the prompt"
        )

    async def _reserve(
        self, admission: Admission, estimate: TokenEstimate, output: int
    ) -> int | None:
        tpm = admission.limits.tpm
        counters, key_id = self._counters, admission.key_id
        cost = max(min(estimate.prompt + output, tpm), 1)  # at least one token must be left
        refusal = ""
        if await counters.add("tpm", key_id, tpm, cost) > tpm:
            # The cost was counted even though it did not fit: take it back at once, or this
            # refusal would crowd out requests that fit.
            with self._shield():
                await counters.add("tpm", key_id, tpm, -cost)
            refusal = f"; this request needs about {cost}"
        else:
            admission.reserved = cost
        remaining, reset_time = await counters.fixed("tpm", key_id, tpm)
        admission.window_ends = reset_time
        left = min(remaining + admission.reserved, tpm)
        admission.headers.update(_headers(tpm, left, reset_time, prefix="Tokens-"))
        if refusal:
            what = f"{tpm} tokens per minute"
            raise self._refuse("tpm", what, admission.headers, reset_time, refusal)
        if not output:
            return None
        reserved = max(cost - estimate.prompt, 0)  # the answer's part of the reservation
        ceiling = max(tpm - estimate.prompt, 1)  # what one window holds beside the prompt
        if estimate.bound is not None:
            ceiling = min(ceiling, estimate.bound)
        granted = await self._take_headroom(admission, ceiling - reserved)
        bound = max(reserved + granted, 1)
        return None if bound == estimate.bound else bound

    async def _take_headroom(self, admission: Admission, wanted: int) -> int:
        """Take up to `wanted` tokens of the key's headroom counter; return what was taken.

        One increment, then what went past the TPM is given back: each caller sees the count
        with every earlier increment in it, so concurrent takers never get more than the TPM
        together, in memory or in Redis.
        """
        if wanted <= 0:
            return 0
        tpm, counters, key_id = admission.limits.tpm, self._counters, admission.key_id
        total = await counters.add("tpm-headroom", key_id, tpm, wanted)
        over = min(max(total - tpm, 0), wanted)
        if over:
            with self._shield():
                await counters.add("tpm-headroom", key_id, tpm, -over)
        admission.headroom = wanted - over
        if admission.headroom:
            admission.headroom_ends = await counters.expiry("tpm-headroom", key_id, tpm)
        return admission.headroom

    async def release(self, admission: Admission, tokens: int, answered: int | None = None) -> None:
        """Settle the TPM reservation with `tokens` (prompt + output) and give back the slot.

        Args:
            admission: The request's admission.
            tokens: What it used (`RequestMeter.charged_tokens`).
            answered: A completed answer's output tokens, for the key's answer history on the
                model it reserved for; None: it did not complete (nothing learnt).

        Only the first call counts (a request's tokens are charged once). Never raises: a storage
        failure here is logged and counted, not shown to a client.
        """
        if admission.released:
            return
        admission.released = True
        if answered is not None and admission.model is not None:
            self.history.record(admission.key_id, admission.model, answered)
        settles = admission.limits.tpm and (tokens or admission.reserved or admission.headroom)
        if not settles and admission.ticket is None:
            return
        try:
            if self._remote:  # the caller may be cancelled; the charge must still happen
                with self._deadline(), anyio.CancelScope(shield=True):
                    await self._charge(admission, tokens)
            else:
                await self._charge(admission, tokens)
        except Exception as exc:
            self._metrics.rate_limit_storage_errors.inc()
            logger.warning("rate-limit storage failed while releasing: %s", type(exc).__name__)

    async def _charge(self, admission: Admission, tokens: int) -> None:
        if admission.limits.tpm:
            reserved, admission.reserved = admission.reserved, 0
            await self._settle(admission, tokens - reserved)
            headroom, admission.headroom = admission.headroom, 0
            await self._give_back_headroom(admission, headroom)
        if admission.ticket is not None:
            ticket, admission.ticket = admission.ticket, None
            await self._in_flight.release(admission.key_id, ticket)

    async def _settle(self, admission: Admission, extra: int) -> None:
        """Charge `extra` tokens beyond the reservation, or refund `-extra` of it.

        A refund goes back only into the window that holds the reservation: once that window
        has ended, the new one never held it. Windows are told apart by their end, read back
        from the storage (Redis rounds it to the second; two windows end at least 60 s apart).
        """
        tpm, counters, key_id = admission.limits.tpm, self._counters, admission.key_id
        if extra > 0:
            await counters.add("tpm", key_id, tpm, extra)
            return
        if not extra or not _same_window(await counters.expiry("tpm", key_id, tpm), admission):
            return
        left = await counters.add("tpm", key_id, tpm, extra)
        if left < 0:  # the window ended between the two calls: give the new one no credit
            await counters.add("tpm", key_id, tpm, -left)

    async def _give_back_headroom(self, admission: Admission, headroom: int) -> None:
        """Give the request's headroom back to the key's counter, if its window still runs."""
        if not headroom:
            return
        tpm, counters, key_id = admission.limits.tpm, self._counters, admission.key_id
        ends = await counters.expiry("tpm-headroom", key_id, tpm)
        if not (ends > time.time() and abs(ends - admission.headroom_ends) < _WINDOW_SLACK):
            return
        left = await counters.add("tpm-headroom", key_id, tpm, -headroom)
        if left < 0:  # the window ended between the two calls: give the new one no credit
            await counters.add("tpm-headroom", key_id, tpm, -left)

    def _refuse(
        self,
        kind: str,
        what: str,
        headers: dict[str, str],
        reset_time: float,
        detail: str = "",
    ) -> RateLimitedError:
        """Count the refusal and build the 429 with `Retry-After` (RFC 9110 section 10.2.3).

        Args:
            kind: The `kind` label of `gateway_rate_limited_total`.
            what: The limit, e.g. `60 requests per minute`.
            headers: The `X-RateLimit-*` headers so far; `Retry-After` is added.
            reset_time: When retrying can succeed (epoch seconds).
            detail: Appended to the message, e.g. how much this request needed.
        """
        self._metrics.rate_limited.labels(kind).inc()
        retry_after = str(max(math.ceil(reset_time - time.time()), 1))
        return RateLimitedError(
            f"rate limit exceeded: {what} for this key{detail}",
            headers={**headers, "Retry-After": retry_after},
        )

    def _storage_failed(self, exc: Exception) -> None:
        self._metrics.rate_limit_storage_errors.inc()
        policy = "open" if self._policy.fail_open else "closed"
        logger.warning(
            "rate-limit storage unavailable (%s); failing %s",
            type(exc).__name__ or "timeout",
            policy,
        )
        if not self._policy.fail_open:
            raise ServiceUnavailableError(
                "rate limiting is unavailable; try again later", headers={"Retry-After": "5"}
            ) from exc


def _same_window(ends: float, admission: Admission) -> bool:
    """The TPM window ending at `ends` is the one `admission` reserved in (and still runs)."""
    return ends > time.time() and abs(ends - admission.window_ends) < _WINDOW_SLACK


def _headers(limit: int, remaining: int, reset_time: float, prefix: str = "") -> dict[str, str]:
    """`X-RateLimit-*` headers: the limit, what is left, and seconds until the window resets."""
    reset = max(math.ceil(reset_time - time.time()), 0)
    return {
        f"X-RateLimit-{prefix}Limit": str(limit),
        f"X-RateLimit-{prefix}Remaining": str(max(remaining, 0)),
        f"X-RateLimit-{prefix}Reset": str(reset),
    }

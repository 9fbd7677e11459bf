"""The batch runner: claims lines, runs them through the relay, records each result once.

One runner per gateway process (`GATEWAY_BATCH_WORKER`). Each look (every
`GATEWAY_BATCH_POLL_SECONDS`, or `GATEWAY_BATCH_IDLE_POLL_SECONDS` while no batch is open on any
replica, or at once when a line ends or a batch is created here) it ends the batches that are
done, and claims as many lines as it has room for
(`GATEWAY_BATCH_MAX_CONCURRENT`) while some upstream has a slot spare for batch work. A line's
outcome decides what happens next:

- answered (200): `succeeded`, its body kept for the output file;
- no spare slot, preempted by an interactive request, or the key's own RPM/TPM/in-flight
  limit: back to `pending`, not an attempt (interactive traffic and the key's limits come
  first); a key's limit holds all of that key's lines back until its `Retry-After`;
- a line that can never pass the key's TPM (it asks for more output tokens): `failed` at once;
- upstream 429 (its `Retry-After` honoured), 5xx, timeout, dropped connection: an attempt;
  retried with jittered exponential backoff up to `GATEWAY_BATCH_MAX_ATTEMPTS`, then
  `failed` with the last reason;
- the request's own fault (400, 403, 404, 413, 422, or any failure blamed on the request, such as
  its own `GATEWAY_REQUEST_TIMEOUT` running out): `failed` at once.

Over ~300 lines for one reason: `BatchRunner`'s loop and the outcome table above are one concern:
each outcome decides the line's next state and what the loop may claim at its next look.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from datetime import timedelta

import anyio

from gateway.auth.principal import Principal
from gateway.batch.finalize import Finalizer
from gateway.batch.line import run_line
from gateway.batch.queue import ClaimedLine, LineQueue
from gateway.db.tables import as_utc
from gateway.errors import (
    GatewayError,
    RateLimitedError,
    UpstreamError,
    UpstreamStatusError,
    openai_error_body,
    parse_retry_after,
)
from gateway.keys.store import KeyNotFoundError, KeyStore
from gateway.metering.metrics import Metrics
from gateway.policies import BatchPolicy
from gateway.relay.pipeline import Relay
from gateway.relay.surface import Endpoint
from gateway.upstream.slots import NoSpareCapacity

logger = logging.getLogger("gateway.batch")

#: Statuses worth another attempt: the upstream may answer next time.
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})


class BatchRunner:
    """Runs batch lines in this process; see the module docstring.

    Args:
        queue: The batch lines' queue.
        finalizer: Ends the batches that are done.
        keys: The key store: each line runs as its batch's key is now (revoked: failed).
        relay: The interactive pipeline's services.
        endpoints: The Endpoint for each batch endpoint path.
        metrics: `gateway_batch_*`.
        policy: How many lines at once, their leases, attempts and backoff.
    """

    def __init__(
        self,
        queue: LineQueue,
        finalizer: Finalizer,
        keys: KeyStore,
        relay: Relay,
        endpoints: dict[str, Endpoint],
        metrics: Metrics,
        policy: BatchPolicy,
    ) -> None:
        self.queue = queue
        self.finalizer = finalizer
        self.keys = keys
        self.relay = relay
        self.endpoints = endpoints
        self.metrics = metrics
        self.policy = policy
        self.owner = f"replica-{secrets.token_hex(6)}"
        self.running = 0
        self._wake = anyio.Event()
        self._stopping = False
        self._stopped = anyio.Event()
        self._holders: set[anyio.CancelScope] = set()  # the running lines' relay calls
        self._held: dict[str, float] = {}  # key id -> monotonic time its own limit lifts

    def wake(self) -> None:
        """Look for work now (a batch was created, a line ended)."""
        self._wake.set()

    def _room(self) -> bool:
        reserve = self.policy.reserved_slots
        limit = self.policy.max_concurrent
        return any(u.slots.background_room(reserve, limit) for u in self.relay.pool.upstreams)

    async def run(self) -> None:
        """Loop until `stop` (or until cancelled, the lifespan's last resort)."""
        lease = self.policy.lease_seconds
        try:
            async with anyio.create_task_group() as lines:
                lines.start_soon(self._renew_leases)
                while not self._stopping:
                    wait = self.policy.poll_seconds
                    try:
                        await self._look(lines, lease)
                        wait = self._next_look()
                    except Exception:  # the database went away: try again next look
                        logger.exception("batch runner: a look for work failed")
                    with anyio.move_on_after(wait):
                        await self._wake.wait()
                    self._wake = anyio.Event()
                # Only the relay calls are cut short: a database call cancelled halfway can
                # leave an aiosqlite connection that never closes, so each line ends on its own,
                # handing its line back to `pending`, and then the lease renewal stops.
                for holder in list(self._holders):
                    holder.cancel()
                while self.running:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                lines.cancel_scope.cancel()
        finally:
            self._stopped.set()

    def _next_look(self) -> float:
        """Seconds to the next look unless woken: longer while no batch is open anywhere.

        Why: an idle gateway's look was most of its CPU when idle (docs/performance.md, "Idle
        CPU"); a batch created here wakes the runner, and one created through another replica
        waits at most `idle_poll_seconds`. An open batch (its lines, expiry, cancel) or a
        running line keeps the usual pace.
        """
        if self.finalizer.open_batches or self.running:
            return self.policy.poll_seconds
        return self.policy.idle_poll_seconds

    async def stop(self, grace: float = 10.0) -> None:
        """Stop looking, hand the running lines back to `pending`, and return once done.

        Waits at most `grace` seconds (a database that hangs); the caller then cancels `run`.
        """
        self._stopping = True
        self.wake()
        with anyio.move_on_after(grace):
            await self._stopped.wait()

    async def _look(self, lines: anyio.abc.TaskGroup, lease: float) -> None:
        for batch_id in await self.finalizer.finalize():
            logger.info("batch %s ended", batch_id)
        if not self.finalizer.open_batches:
            # No batch left to run, on any replica: nothing is queued or can be claimed. The
            # idle look is this one query, not three (it was most of an idle gateway's CPU).
            self.metrics.batch_queue_depth.set(0)
            return
        self.metrics.batch_queue_depth.set(await self.queue.queue_depth())
        room = self.policy.max_concurrent - self.running
        if room <= 0 or self.relay.lifecycle.draining or not self._room():
            return
        now = time.monotonic()
        self._held = {key: until for key, until in self._held.items() if until > now}
        for line in await self.queue.claim(self.owner, room, lease, skip_keys=list(self._held)):
            self.running += 1
            self.metrics.batch_lines_running.set(self.running)
            lines.start_soon(self._run, line)

    async def _renew_leases(self) -> None:
        every = self.policy.lease_seconds / 3
        while True:
            await anyio.sleep(every)
            try:
                with anyio.CancelScope(shield=True):  # never cut a database call halfway
                    await self.queue.renew(self.owner, self.policy.lease_seconds)
            except Exception:
                logger.exception("batch runner: lease renewal failed")

    async def _principal(self, key_id: str) -> Principal | None:
        try:
            record = await self.keys.get_key(key_id)
        except KeyNotFoundError:
            return None
        return Principal.from_record(record) if record.status() == "active" else None

    async def _run(self, line: ClaimedLine) -> None:
        try:
            await self._attempt(line)
        except anyio.get_cancelled_exc_class():  # the process is stopping: the line waits
            with anyio.CancelScope(shield=True):
                await self._retry_later(line, line.attempts, 0.0, None, None)
            raise
        except Exception:
            logger.exception("batch %s line %d: unexpected failure", line.batch_id, line.line_no)
            with anyio.CancelScope(shield=True):
                await self._retry_later(line, line.attempts, 1.0, None, None)
        finally:
            self.running -= 1
            self.metrics.batch_lines_running.set(self.running)
            self.wake()

    async def _retry_later(
        self,
        line: ClaimedLine,
        attempts: int,
        delay: float,
        event: str | None,
        error: GatewayError | None,
    ) -> None:
        await self.queue.release_line(
            self.owner,
            line,
            not_before=as_utc(None) + timedelta(seconds=delay),
            attempts=attempts,
            event=event,
            status_code=None if error is None else error.status_code,
            message=None if error is None else error.message[:500],
        )

    async def _attempt(self, line: ClaimedLine) -> None:
        request_id = f"batch_req_{secrets.token_hex(12)}"
        principal = await self._principal(line.key_id)
        endpoint = self.endpoints[line.endpoint]
        if principal is None:
            await self._fail(line, line.attempts, request_id, 401, "the batch's API key is revoked")
            return
        holder = anyio.CancelScope()
        answer = None
        error: GatewayError | None = None
        self._holders.add(holder)
        if self._stopping:  # started by the last look, after `stop` cut the others short
            holder.cancel()
        try:
            with holder:
                try:
                    answer = await run_line(
                        self.relay,
                        principal,
                        endpoint,
                        line.body,
                        request_id=request_id,
                        holder=holder,
                    )
                except RateLimitedError as exc:
                    # The key's own limit: none of its lines is claimed before it lifts (one at
                    # a time, they would crowd out every other key's lines). A line no window
                    # could admit is a 413 (OverTokenLimitError) and fails below.
                    wait = max(float(exc.headers.get("Retry-After", "0") or 0), 0.2)
                    self._held[line.key_id] = time.monotonic() + wait
                    self.metrics.batch_lines.labels("deferred").inc()
                    with anyio.CancelScope(shield=True):
                        await self._retry_later(line, line.attempts, wait, None, None)
                    return
                except NoSpareCapacity as exc:
                    wait = float(exc.headers.get("Retry-After", "0") or 0)
                    self.metrics.batch_lines.labels("deferred").inc()
                    with anyio.CancelScope(shield=True):
                        await self._retry_later(line, line.attempts, max(wait, 0.2), None, None)
                    return
                except GatewayError as exc:
                    error = exc
        finally:
            self._holders.discard(holder)
        if answer is None and error is None and self._stopping:  # this process is stopping
            with anyio.CancelScope(shield=True):
                await self._retry_later(line, line.attempts, 0.0, None, None)
            return
        if answer is None and error is None:  # preempted by an interactive request
            self.metrics.batch_lines.labels("preempted").inc()
            with anyio.CancelScope(shield=True):
                await self._retry_later(line, line.attempts, 0.2, "preempted", None)
            return
        if answer is not None:
            recorded = await self.queue.finish_line(
                self.owner,
                line,
                succeeded=True,
                request_id=request_id,
                status_code=answer.status,
                result=answer.body,
                attempts=line.attempts + 1,
            )
            self.metrics.batch_lines.labels("succeeded" if recorded else "superseded").inc()
            return
        assert error is not None  # noqa: S101
        attempts = line.attempts + 1
        # A failure the line's own request caused (an answer too large for what it asked, its
        # own total deadline run out) fails the same way on every try; an upstream 429 is the
        # upstream's load, whatever its blame (docs/operations.md, "Whose fault is a failure").
        own = (
            isinstance(error, UpstreamError)
            and error.blame == "request"
            and error.status_code != 429
        )
        if error.status_code in RETRYABLE and attempts < self.policy.max_attempts and not own:
            base = self.policy.retry_base_seconds * 2 ** (attempts - 1)
            delay = min(self.policy.retry_max_seconds, base) * random.uniform(0.5, 1.0)  # noqa: S311
            # The upstream's own Retry-After, or the gateway's (503 while the circuit breaker
            # holds every upstream out of rotation: retrying sooner only burns attempts).
            if isinstance(error, UpstreamStatusError):
                retry_after = error.retry_after or 0
            else:
                retry_after = parse_retry_after(error.headers.get("Retry-After")) or 0
            self.metrics.batch_lines.labels("retried").inc()
            await self._retry_later(line, attempts, max(delay, float(retry_after)), "retry", error)
            return
        await self._fail(line, attempts, request_id, error.status_code, error.message)

    async def _fail(
        self, line: ClaimedLine, attempts: int, request_id: str, status: int, message: str
    ) -> None:
        await self.queue.finish_line(
            self.owner,
            line,
            succeeded=False,
            request_id=request_id,
            status_code=status,
            result=openai_error_body(message, status),
            error_message=message[:500],
            attempts=attempts,
        )
        self.metrics.batch_lines.labels("failed").inc()

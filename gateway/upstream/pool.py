"""Several upstreams: model-aware routing, least-in-flight balancing, health and failover state.

For each request the pool picks, among the upstreams whose circuit lets a request through and
that are up (their monitor's last probe answered, or none ran yet; if none is, all of them), those
that list the model
(all of them when none does: the lists may be stale, and the upstream answers 404 itself); then
the first in the routing policy's order (`GATEWAY_ROUTING`, `gateway.upstream.scheduling`; by
default the fewest requests in flight per unit of weight). A failed choice is excluded and
the next one tried (`gateway.relay.generation`).

An upstream that asked to be left alone (a 429 or 503 with `Retry-After`) is skipped until that
time while another upstream is left to try. Panic mode (Envoy's panic threshold, at zero): when
a request's failover has no upstream left whose circuit lets a request through (at its start,
or after the closed ones failed it), it goes on with the half-open and open ones, nearest to
closing first, rather than giving up, so an upstream that serves again is used at once instead
of after the whole cooldown, and its success closes its circuit. A single upstream keeps its
breaker (fast 503s while it is down, one trial after the cooldown): there is no other upstream
whose recovery panic mode could find.

Over ~300 lines for one reason: `UpstreamPool`'s choice, failover order and breaker
bookkeeping read the same per-upstream state; `open_pool` beside it is what builds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import cached_property

import anyio
import httpx

from gateway.metering.metrics import OTHER_MODEL, Metrics
from gateway.policies import PoolPolicy, SchedulingPolicy
from gateway.settings import UpstreamSpec
from gateway.upstream.breaker import CircuitBreaker, CircuitState
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.client import (
    GenerationClient,
    build_upstream_client,
    build_upstream_transport,
)
from gateway.upstream.dialects.base import Dialect, ModelInfo
from gateway.upstream.dialects.ollama import OllamaDialect
from gateway.upstream.dialects.openai import OpenAIDialect
from gateway.upstream.monitor import LoadedModel, UpstreamMonitor
from gateway.upstream.reported import ServerReport
from gateway.upstream.scheduling.residency import MIN_LOAD_SECONDS, slot_key
from gateway.upstream.scheduling.scheduler import Scheduler
from gateway.upstream.scheduling.ticket import RouteTicket
from gateway.upstream.slots import UpstreamSlots

logger = logging.getLogger("gateway.upstream")


@dataclass
class Upstream:
    """One model server and everything the gateway keeps about it."""

    spec: UpstreamSpec
    client: httpx.AsyncClient
    generation: GenerationClient
    dialect: Dialect
    catalog: ModelCatalog
    monitor: UpstreamMonitor
    slots: UpstreamSlots
    breaker: CircuitBreaker
    in_flight: int = 0
    #: Estimated tokens of work the requests in flight brought it: their prompt tokens it did
    #: not hold (the prefix matched at the choice is cached there) and their expected output
    #: (`RouteTicket.work`).
    tokens_in_flight: int = 0
    #: Of those, each request's uncached prompt tokens while it is not answered yet (prefill).
    prefills: list[int] = field(default_factory=list)
    #: Requests in flight per model (`slot_key`: spellings of one model counted together; no
    #: entry at 0, so a client varying names cannot grow it past its own requests).
    models_in_flight: dict[str, int] = field(default_factory=dict)
    #: `time.monotonic()` before which the upstream asked not to be sent requests (Retry-After).
    not_before: float = 0.0

    @cached_property
    def name(self) -> str:
        """`host:port`, the `upstream` label (kept: the spec computes it from its URL)."""
        return self.spec.name

    @property
    def weight(self) -> float:
        """Its share of the load (`GATEWAY_UPSTREAMS` `weight`)."""
        return self.spec.weight

    @property
    def capacity(self) -> int:
        """Requests its gate lets through at once; 0: no gate."""
        return self.slots.capacity

    def model_in_flight(self, model: str) -> int:
        """Requests in flight to it for `model`, however the clients spelled it (`slot_key`)."""
        return self.models_in_flight.get(slot_key(model), 0)

    @property
    def loaded(self) -> list[LoadedModel] | None:
        """The models loaded as its last `/api/ps` said; None: unknown."""
        return self.monitor.loaded

    @property
    def loaded_at(self) -> float:
        """`time.monotonic()` when that `/api/ps` was asked."""
        return self.monitor.loaded_at

    @property
    def report(self) -> ServerReport | None:
        """Its own load as its `/metrics` last said (`UpstreamMonitor.report`); None: none."""
        return self.monitor.report

    @property
    def downs(self) -> int:
        """Times its monitor saw it go down."""
        return self.monitor.downs


READY_REUSE_SECONDS = 1.0
"""How long a ready `/readyz` result answers later callers (`UpstreamPool.probe`)."""


class UpstreamPool:
    """The upstreams of this gateway and the choice between them.

    Args:
        upstreams: At least one.
        metrics: For the per-upstream in-flight and circuit-state gauges.
        scheduling: The routing policy (default: least in flight).
    """

    def __init__(
        self,
        upstreams: list[Upstream],
        metrics: Metrics,
        scheduling: SchedulingPolicy | None = None,
    ) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is needed")
        self.upstreams = upstreams
        self.scheduler = Scheduler(scheduling or SchedulingPolicy(), metrics, len(upstreams))
        # Each upstream's series, bound once: `labels` takes a lock and builds a key, and these
        # two are set several times per request (neither series is ever removed).
        self._in_flight_gauges = {
            u.name: metrics.upstream_in_flight.labels(u.name) for u in upstreams
        }
        self._state_gauges = {
            u.name: metrics.upstream_circuit_state.labels(u.name) for u in upstreams
        }
        self._panicking = False
        self._probing: asyncio.Future[tuple[bool, dict[str, str]]] | None = None
        self._ready_until = 0.0  # monotonic time until which `_ready` answers `probe`
        self._ready: tuple[bool, dict[str, str]] = (False, {})

    def named(self, name: str) -> Upstream | None:
        """The upstream whose `name` (`host:port`, the `upstream` label) is `name`, or None."""
        return next((u for u in self.upstreams if u.name == name), None)

    def label(self, model: str) -> str:
        """The `model` label: an id some upstream lists for `model`, else `other`."""
        for upstream in self.upstreams:
            label = upstream.catalog.label(model)
            if label != OTHER_MODEL:
                return label
        return OTHER_MODEL

    def choose(
        self,
        model: str,
        tried: set[str],
        *,
        panic: bool = True,
        ticket: RouteTicket | None = None,
    ) -> Upstream | None:
        """Pick the upstream for the next try, or None when none is left.

        The routing policy orders the candidates (`gateway.upstream.scheduling`); `ticket`
        carries what it needs and gets the choice's reason (`failover` on a later try).

        Takes the circuit's permission (a half-open circuit admits one trial at a time) and
        counts the request in flight to the chosen upstream at once, so that requests choosing
        at the same moment see each other; `finished` must follow. When no upstream left to
        this request has a circuit that lets it through, and the pool has several, the others
        are tried anyway (panic mode, module docstring): half-open before open, the one opened
        longest ago first. So with several upstreams each one is tried once before None.
        `panic=False` keeps to closed circuits: the caller already holds a busy answer (503 or
        429 with when to come back), which beats waiting on an upstream whose circuit is open.
        """
        now = time.monotonic()
        untried = [u for u in self.upstreams if u.name not in tried]
        # An upstream's Retry-After steers requests elsewhere, but is no reason to refuse when
        # nothing else is left: the 429 may have been about one request (too large for its
        # limit), and one key must not take the upstream away from every other key.
        left = [u for u in untried if u.not_before <= now] or untried
        self._note_panic()
        usable = [u for u in left if u.breaker.available()]
        # Panic within this request: its failover ran out of closed circuits (or never had
        # one), yet a server it has not tried may answer.
        panic = panic and not usable and len(self.upstreams) > 1
        if panic:
            usable = left
        # Prefer upstreams whose last probe answered; when none did, still try the others: the
        # client then gets the upstream's real error rather than a guess.
        usable = [u for u in usable if u.monitor.up is not False] or usable
        knowing = [u for u in usable if u.catalog.label(model) != OTHER_MODEL]
        candidates = knowing or usable
        if not candidates:
            return None
        ticket = RouteTicket(model) if ticket is None else ticket
        if panic:
            random.shuffle(candidates)  # ties go to a random upstream, not always the first
            order = sorted(
                candidates, key=lambda u: (u.breaker.recovery_rank(), u.in_flight / u.spec.weight)
            )
            reason = "panic"
            ticket.prefix_tokens = 0  # not scored
        else:
            order, reason = self.scheduler.order(candidates, ticket)
        if tried:
            reason = "failover"
        for upstream in order:
            if panic or upstream.breaker.acquire():
                self._set_state(upstream)
                # The candidates are the upstreams that list the model, when any does.
                self.scheduler.chosen(upstream, ticket, reason, catalogued=bool(knowing))
                self._started(upstream, ticket)
                return upstream
        return None

    def _note_panic(self) -> None:
        """Log when the whole pool enters or leaves panic mode (every circuit open)."""
        panic = len(self.upstreams) > 1 and not any(u.breaker.available() for u in self.upstreams)
        if panic != self._panicking:
            self._panicking = panic
            if panic:
                logger.warning("panic mode: every circuit is open; trying the upstreams anyway")
            else:
                logger.info("panic mode over: a circuit lets requests through")

    def _started(self, upstream: Upstream, ticket: RouteTicket) -> None:
        """A request was assigned to `upstream`."""
        upstream.in_flight += 1
        ticket.charged = ticket.work
        upstream.tokens_in_flight += ticket.charged
        ticket.prefill = ticket.charged - min(ticket.charged, ticket.output)
        if ticket.prefill:
            upstream.prefills.append(ticket.prefill)
        models = upstream.models_in_flight
        slot = slot_key(ticket.model)
        models[slot] = models.get(slot, 0) + 1
        self._in_flight_gauges[upstream.name].set(upstream.in_flight)

    def finished(
        self,
        upstream: Upstream,
        healthy: bool | None,
        key: str | None = None,
        *,
        ticket: RouteTicket | None = None,
        load_ns: int | None = None,
    ) -> None:
        """A request to `upstream` ended: True answered well, False failed, None unknown.

        Args:
            upstream: As returned by `choose`.
            healthy: The result for the circuit breaker.
            key: With `healthy=False`, the API key id of a request that may itself have caused
                the failure (`CircuitBreaker.record_failure`); None when the upstream is at fault.
            ticket: The ticket given to `choose` (its tokens leave the upstream's load).
            load_ns: The answer's `load_duration` (nanoseconds), when it reported one: a
                sample of the upstream's model load rate.
        """
        upstream.in_flight -= 1
        if ticket is not None:
            upstream.tokens_in_flight -= ticket.charged
            _prefilled(upstream, ticket)
            models = upstream.models_in_flight
            slot = slot_key(ticket.model)
            left = models.get(slot, 0) - 1
            if left > 0:
                models[slot] = left
            else:
                models.pop(slot, None)
            if ticket.answered_at is None:
                # Ended before any answer (failed, refused, the client gone, a 4xx): no load
                # counts as under way for it, or cheap requests that never reach the model
                # could keep every key's requests waiting on a cold server.
                self.scheduler.residency.failed(upstream.name, ticket.model)
            if healthy and ticket.answered_at is not None:
                self.scheduler.held(upstream.name, time.monotonic() - ticket.answered_at)
            ticket.answered_at = None  # a failover's next try measures its own
            if load_ns and load_ns >= MIN_LOAD_SECONDS * 1e9:  # a real load, not a lookup
                residency = self.scheduler.residency
                size = residency.size(self.upstreams, ticket.model)
                residency.learn(upstream.name, size, load_ns)
        self._in_flight_gauges[upstream.name].set(upstream.in_flight)
        self._record(upstream, healthy, key)
        # The upstream's own failure, or one that opened its circuit: it may come back empty,
        # so its prompts and models say nothing now. A failure one key may have caused
        # (`key`) leaves everyone's routing alone, as it leaves the circuit closed.
        if healthy is False and (key is None or upstream.breaker.state is not CircuitState.CLOSED):
            self.scheduler.forget(upstream.name)

    def defer(self, upstream: Upstream, seconds: float) -> None:
        """Send `upstream` nothing for `seconds` (its `Retry-After`); it stays healthy."""
        upstream.not_before = max(upstream.not_before, time.monotonic() + seconds)

    def retry_after(self, cooldown: float) -> int:
        """Whole seconds (at least 1) until some upstream may take requests again.

        Args:
            cooldown: The circuit cooldown, the wait when no upstream asked for a time.
        """
        now = time.monotonic()
        waits = [u.not_before - now for u in self.upstreams if u.not_before > now]
        if len(waits) < len(self.upstreams):
            waits.append(cooldown)
        return max(math.ceil(min(waits)), 1)

    def _record(self, upstream: Upstream, healthy: bool | None, key: str | None) -> None:
        """Feed the circuit breaker one result."""
        if healthy is True:
            upstream.breaker.record_success()
        elif healthy is False:
            upstream.breaker.record_failure(key)
        else:
            upstream.breaker.record_neutral()
        self._set_state(upstream)

    def answering(
        self, upstream: Upstream, model: str | None = None, ticket: RouteTicket | None = None
    ) -> None:
        """`upstream` sent a request's first chunk: a success for its circuit breaker now.

        With `model`, the upstream has that model loaded now (`Residency.served`); with
        `ticket`, the answer's start is noted on it (the slot's hold is measured at the end).

        A half-open circuit closes at the trial's first chunk rather than at its end, so one
        long stream does not keep every other request away from a recovered upstream. A
        failure later in the stream is still recorded when the request ends.
        """
        # A name the upstream's list lacks says nothing about what it holds (and a client could
        # vary it without end).
        if model is not None and upstream.catalog.label(model) != OTHER_MODEL:
            self.scheduler.residency.served(upstream.name, model)
        if ticket is not None:
            ticket.answered_at = time.monotonic()
            # Prefilled: its prompt is no longer work a request sent there would wait behind,
            # only its output is (a long history counted to its end made every session homed
            # on that server look expensive for the whole answer, and move).
            left = min(ticket.charged, ticket.output)
            upstream.tokens_in_flight -= ticket.charged - left
            ticket.charged = left
            _prefilled(upstream, ticket)
        if upstream.breaker.state is not CircuitState.CLOSED:
            upstream.breaker.record_success()
            self._set_state(upstream)

    def _set_state(self, upstream: Upstream) -> None:
        self._state_gauges[upstream.name].set(upstream.breaker.state)

    async def catalogued_models(self) -> list[ModelInfo]:
        """Every upstream's model list as its monitor last fetched it, merged by id.

        Only an upstream whose list was never fetched is asked now (`ModelCatalog.current`).

        Raises:
            httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError: as `models`.
        """
        return await self.models(refresh=False)

    async def models(self, *, refresh: bool = True) -> list[ModelInfo]:
        """Every upstream's model list, refreshed (or as cached: `refresh=False`), merged by id.

        Raises:
            httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError: no upstream could
                list its models and none was ever listed.
        """
        lists: list[list[ModelInfo]] = []
        errors: list[Exception] = []

        async def fetch(upstream: Upstream) -> None:
            catalog = upstream.catalog
            try:
                lists.append(await (catalog.refresh() if refresh else catalog.current()))
            except (httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError) as exc:
                errors.append(exc)

        async with anyio.create_task_group() as group:
            for upstream in self.upstreams:
                group.start_soon(fetch, upstream)
        if not lists and errors:
            raise errors[0]
        merged: dict[str, ModelInfo] = {}
        for models in lists:
            for info in models:
                merged.setdefault(info.id, info)
        return sorted(merged.values(), key=lambda info: info.id)

    async def probe(self) -> tuple[bool, dict[str, str]]:
        """Probe every upstream; ready when at least one answers. Returns (ready, details).

        `/readyz` is public, so its callers share the upstreams' probes: callers arriving while
        a probe runs wait for that one, and a ready result answers for `READY_REUSE_SECONDS`
        after it started. An anonymous flood of `/readyz` thus makes each upstream answer at
        most one probe at a time, and about one a second while it is up. An unready result is
        not reused: the next caller probes again, so a recovery shows at once.
        """
        if time.monotonic() < self._ready_until:
            return self._ready
        if self._probing is None:
            started = time.monotonic()
            self._probing = asyncio.ensure_future(self._probe_all())

            def done(future: asyncio.Future[tuple[bool, dict[str, str]]]) -> None:
                self._probing = None
                if not future.cancelled() and future.exception() is None and future.result()[0]:
                    self._ready = future.result()
                    self._ready_until = started + READY_REUSE_SECONDS

            self._probing.add_done_callback(done)
        # Shielded: one caller leaving (its client hung up) does not cancel the others' probe.
        return await asyncio.shield(self._probing)

    async def _probe_all(self) -> tuple[bool, dict[str, str]]:
        """Probe every upstream now, concurrently (`probe`)."""
        details: dict[str, str] = {}

        async def one(upstream: Upstream) -> None:
            up, detail = await upstream.monitor.probe()
            details[upstream.name] = detail if up else f"down: {detail}"

        async with anyio.create_task_group() as group:
            for upstream in self.upstreams:
                group.start_soon(one, upstream)
        ready = any(upstream.monitor.up for upstream in self.upstreams)
        return ready, dict(sorted(details.items()))


def build_dialect(spec: UpstreamSpec) -> Dialect:
    """The dialect object for an upstream's `dialect`."""
    return OpenAIDialect() if spec.dialect == "openai" else OllamaDialect()


async def open_pool(
    policy: PoolPolicy,
    metrics: Metrics,
    stack: AsyncExitStack,
    transport: httpx.AsyncBaseTransport | None = None,
) -> UpstreamPool:
    """Open one client and transport per upstream (closed by `stack`) and assemble the pool.

    Args:
        policy: The upstreams, timeouts, transport, the per-upstream gate and the breakers.
        metrics: Shared by the monitors, gates and the pool.
        stack: Owns the clients' lifetimes (the app's lifespan).
        transport: An httpx transport for every client (tests).
    """
    upstreams = []
    for spec in policy.upstreams:
        http = transport or build_upstream_transport(spec, policy, metrics)
        client = await stack.enter_async_context(build_upstream_client(spec, policy.timeouts, http))
        dialect = build_dialect(spec)
        logger.info(
            "upstream %s: %s dialect, over %s",
            spec.name,
            dialect.name,
            "a test transport" if transport is not None else policy.http_client,
        )
        catalog = ModelCatalog(dialect, client, timeout=policy.timeouts.connect)
        capacity = policy.max_concurrent
        upstreams.append(
            Upstream(
                spec=spec,
                client=client,
                generation=GenerationClient(spec, policy.timeouts, http),
                dialect=dialect,
                catalog=catalog,
                monitor=UpstreamMonitor(
                    name=spec.name,
                    client=client,
                    dialect=dialect,
                    catalog=catalog,
                    metrics=metrics,
                    interval=policy.poll_interval,
                    timeout=policy.timeouts.connect,
                ),
                slots=UpstreamSlots(
                    spec.name,
                    capacity if spec.max_concurrent is None else spec.max_concurrent,
                    policy.queue_size,
                    policy.queue_timeout,
                    metrics,
                ),
                breaker=CircuitBreaker(policy.circuit_failures, policy.circuit_cooldown),
            )
        )
    if len(upstreams) > 1:
        scheduling = policy.scheduling
        weights = ",".join(f"{name}={weight:g}" for name, weight in scheduling.weights)
        logger.info(
            "routing over %d upstreams: %s%s",
            len(upstreams),
            scheduling.mode,
            f" ({weights})" if scheduling.mode == "scored" else "",
        )
    return UpstreamPool(upstreams, metrics, policy.scheduling)


def _prefilled(upstream: Upstream, ticket: RouteTicket) -> None:
    """The ticket's prompt is no longer being prefilled at `upstream` (answered, or ended)."""
    if ticket.prefill:
        # Never raises into `finished`: its bookkeeping after this must run whatever happens.
        with contextlib.suppress(ValueError):
            upstream.prefills.remove(ticket.prefill)
        ticket.prefill = 0

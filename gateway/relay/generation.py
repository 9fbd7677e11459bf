"""One admitted generation request: the upstream it runs on and everything it gives back.

`Relay.handle` (`gateway.relay.pipeline`) admits the request and builds its `Generation`;
`RelayResponse` (`gateway.relay.response`) then drives it: `connect` (choose an upstream, its
slot, open the exchange with failover), the stream or `collect`, and `finish` or `withdraw`,
which give back the slot and the key's limits exactly once. It is handed the services it uses
(`Services`), not the `Relay`, so that no module of the relay imports back up into the pipeline.

Over ~300 lines for one reason: `Generation` is one lifecycle (`connect` with failover,
`collect`, `finish` or `withdraw`) whose steps share the upstream, its slot (`_release`) and
the key's limits, given back exactly once (`done`); split, that exactly-once would span files.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass

import anyio
from opentelemetry.trace import Span

from gateway.context import RequestContext
from gateway.errors import (
    AnswerTooLargeError,
    GatewayError,
    ServiceUnavailableError,
    UntranslatableRequestError,
    UpstreamError,
    UpstreamStatusError,
)
from gateway.limits.limiter import Admission, KeyLimiter
from gateway.metering.meter import RequestMeter
from gateway.metering.metrics import Metrics
from gateway.metering.usage import UsageSink
from gateway.neutral import Chunk, GenerationRequest, Outcome
from gateway.relay.exchange import Exchange
from gateway.relay.surface import Codec
from gateway.settings import Settings
from gateway.tracing.spans import Tracing, end_upstream, end_upstream_failure
from gateway.upstream.dialects.base import MAX_LINE_BYTES
from gateway.upstream.pool import Upstream, UpstreamPool
from gateway.upstream.scheduling.ticket import RouteTicket
from gateway.wire.json import INLINE_PARSE_BYTES


@dataclass(frozen=True, slots=True)
class Services:
    """The app-wide services a `Generation` uses, built once (`gateway.relay.pipeline.Relay`).

    Attributes:
        pool: Chooses the upstream, and hears how each attempt went (its circuit breaker).
        limiter: Settles the key's in-flight count and TPM when the request ends.
        metrics: `gateway_upstream_failovers_total`, and the meter's series.
        settings: The batch slot policy, the circuit cooldown (Retry-After when no upstream
            is left), and the exchange's timeouts and retry policy.
        usage: Where the finished request's summary is written; None when usage is off.
        tracing: Starts each attempt's CLIENT span; None when tracing is off.
    """

    pool: UpstreamPool
    limiter: KeyLimiter
    metrics: Metrics
    settings: Settings
    usage: UsageSink | None = None
    tracing: Tracing | None = None


class Generation:
    """One admitted generation request: its upstream, and everything it must give back.

    Attributes:
        context: The request's own state (`gateway.context`): the SERVER span it finds its
            parent in, and where `finish` leaves the summary.
        meter: The request's measurements.
        headers: Extra response headers (the key's rate-limit headers).
        request: The neutral request.
        streams: The client asked for a stream (NDJSON, SSE) rather than one object.
        key: The API key's id, given to the circuit breaker with a failure the request may
            have caused (`gateway.upstream.breaker`).
        background: For a batch line (`gateway.batch.line`), its cancel scope: it takes
            only a spare upstream slot, and an interactive request may cancel it for the slot.
        routing: What the upstream choice reads (`gateway.upstream.scheduling`), and the
            reason of the last choice.
        span: The current upstream attempt's CLIENT span, when tracing (`gateway.tracing`);
            ended by the attempt's failure or by `finish`.
        observe: What each chunk passes through before the client gets it: the meter's
            `observe`, or, with `GATEWAY_OTEL_CAPTURE_CONTENT`, one that also keeps the text
            for the span (chosen once here, so no chunk pays for a test).
        tick: All that `observe` does with a chunk that carries text and neither ends nor
            fails the answer: the token clock's `tick`; None when `observe` does more (it keeps
            the text), so that a decoder's lane (`gateway.upstream.dialects.base.Lane`) may
            stand in for it only when nothing is skipped.
    """

    def __init__(
        self,
        services: Services,
        context: RequestContext,
        request: GenerationRequest,
        upstream_headers: dict[str, str],
        meter: RequestMeter,
        admission: Admission,
        *,
        key: str,
        background: anyio.CancelScope | None = None,
        routing: RouteTicket | None = None,
    ) -> None:
        self.services = services
        self.routing = RouteTicket(request.model) if routing is None else routing
        self.background = background
        self.key = key  # the API key's id: whose request an ambiguous upstream failure was
        self.context = context
        self.request = request
        self.upstream_headers = upstream_headers
        self.meter = meter
        self.admission = admission
        self.headers = admission.headers
        self.streams = request.stream
        self.upstream: Upstream | None = None
        self.exchange: Exchange | None = None
        self.holds_slot = False
        self.holds_background = False
        self.done = False
        self.span: Span | None = None
        self.answer: list[str] | None = None  # the text, kept only for a span that shows it
        self.observe: Callable[[Chunk], None] = meter.observe
        self.tick: Callable[[float], None] | None = meter.tokens.tick
        if services.tracing is not None and services.tracing.capture_content:
            self.answer = []
            self.observe = self._observe_keeping_text
            self.tick = None

    async def connect(self) -> Exchange:
        """Open an exchange with the best upstream, failing over to the next ones.

        An upstream that fails before the first byte (after its own retries) is left for the
        next choice: unreachable, timed out, 5xx, its queue full, rate-limited (429), or unable
        to take the request in its dialect. What the request caused (a 4xx other than 429, a
        500 that blames it, its own deadline) is raised at once (`_fails_over`). A 500 gets
        one more try, on another upstream when one is left (else on the same one, by the
        exchange's retry); a second 500 is raised. Each upstream is tried at most once; when
        no closed circuit is left, the pool's panic mode offers the open ones. A `Retry-After`
        the upstream sent keeps it out of rotation that long. The breaker hears only what the
        upstream is to blame for (`_verdict`). The meter keeps the upstreams tried, in order,
        for the access log. The caller watches for the client leaving.

        Raises:
            GatewayError: the first "busy" answer (429, 503: it says when to come back) if an
                upstream gave one, else the last upstream's failure; 503 when none is available.
        """
        services = self.services
        tried: set[str] = set()
        last: GatewayError | None = None
        busy: GatewayError | None = None  # an upstream that turned it away for load
        server_errors = 0  # upstream 500s this request got, on any upstream
        # After a busy answer no open circuit is tried (panic=False): the client gets that
        # answer's Retry-After at once rather than after a dead upstream's first-byte timeout.
        while (
            upstream := services.pool.choose(
                self.request.model, tried, panic=busy is None, ticket=self.routing
            )
        ) is not None:
            if tried:
                services.metrics.upstream_failovers.inc()
            tried.add(upstream.name)
            self.meter.upstream_timings = upstream.dialect.reports_timings
            self.meter.upstream = upstream.name
            self.meter.tried.append(upstream.name)
            self.meter.route_reason = self.routing.reason
            self.upstream = upstream
            exchange = None
            try:
                if self.background is None:
                    self.holds_slot = await upstream.slots.acquire()
                else:
                    self.holds_slot = upstream.slots.try_acquire_background(
                        self.background,
                        services.settings.batch_reserved_slots,
                        services.settings.batch_max_concurrent,
                    )
                    self.holds_background = True
                headers = self.upstream_headers
                if services.tracing is not None:  # the span starts once the upstream's slot is held
                    span = self.span = services.tracing.start_upstream(
                        self.context.span, self.request, upstream, self.routing.reason
                    )
                    headers = services.tracing.inject(span, headers)
                self.exchange = exchange = Exchange(
                    client=upstream.generation,
                    dialect=upstream.dialect,
                    request=self.request,
                    headers=headers,
                    settings=services.settings,
                    meter=self.meter,
                    # A 500's one more try goes to another upstream while one is left.
                    retry_server_error=not server_errors
                    and len(tried) == len(services.pool.upstreams),
                )
                await exchange.open()
                services.pool.answering(upstream, self.request.model, self.routing)
            except UntranslatableRequestError as exc:
                self._end_span(exc)
                await self._release(None)  # another upstream's dialect may express it
                last = exc
                continue
            except (UpstreamError, ServiceUnavailableError) as exc:
                self._end_span(exc)
                retry_after = getattr(exc, "retry_after", None)
                if retry_after:
                    services.pool.defer(upstream, retry_after)
                if exc.status_code < 500 and getattr(exc, "upstream_status", None) != 429:
                    raise  # the upstream answered (a 4xx): `finish` records it as an answer
                await self._release(*self._verdict(exc))
                if exchange is not None:
                    server_errors += exchange.server_errors
                if not _fails_over(exc) or server_errors > 1:
                    raise
                last = exc
                if busy is None and exc.status_code in (429, 503):
                    busy = exc
                continue
            return exchange
        # A busy upstream's 503 or 429 says when to come back; an open circuit tried after it
        # (panic mode) failing too says less.
        if busy is not None:
            raise busy
        if last is not None:
            raise last
        wait = services.pool.retry_after(services.settings.circuit_cooldown)
        raise ServiceUnavailableError(
            "no upstream is available: all are down or out of rotation",
            headers={"Retry-After": str(wait)},
        )

    def _observe_keeping_text(self, chunk: Chunk) -> None:
        self.meter.observe(chunk)
        if chunk.text and self.answer is not None:
            self.answer.append(chunk.text)

    def _end_span(self, error: BaseException) -> None:
        """End the attempt's CLIENT span, if tracing, with the failure that ended it."""
        if self.span is not None:
            end_upstream_failure(self.span, error)
            self.span = None

    def _verdict(self, error: GatewayError | None) -> tuple[bool | None, str | None]:
        """What the circuit breaker hears of a failure: (healthy, key), see `_release`.

        The upstream's fault (refused, reset, silent, malformed) is a failure from any request.
        An overloaded upstream (its queue, the gate's, a 503 or 429 answer) is not a broken one,
        and a failure the request caused (its total deadline ran out) says nothing about it.
        A failure either side may have caused (a 500, an error line) is a failure attributed
        to this key (`gateway.upstream.breaker`).
        """
        if not isinstance(error, UpstreamError):
            return None, None  # the gateway's own limits, or nothing known
        if error.status_code in (429, 503) or getattr(error, "upstream_status", 0) in (429, 503):
            return None, None
        if error.blame == "request":
            return None, None
        return False, self.key if error.blame == "either" else None

    async def collect(self, codec: Codec) -> bytes:
        """Aggregate the whole stream for `stream:false` (reference section 2.4); JSON bytes.

        At most `MAX_LINE_BYTES` of upstream answer are collected: how long an answer is
        follows from the request (its output bound, its logprobs), and a streamed answer has
        no such limit. A large answer is written in a worker thread, in steps that leave the
        event loop free (`gateway.upstream.dialects.framing.encode_json_stepwise`).

        Raises:
            AnswerTooLargeError: the answer passed `MAX_LINE_BYTES` (413, the request's fault;
                the upstream request is closed by the caller's `finish`).
            GatewayError: the upstream failed mid-answer; nothing was sent yet, so the client
                gets a real status and the partial text is discarded, as Ollama does.
        """
        exchange = self.exchange  # the one `connect` returned
        assert exchange is not None  # noqa: S101 - called after a successful `connect`
        async with aclosing(exchange.batches()) as batches:
            async for batch in batches:
                for chunk in batch:
                    self.observe(chunk)
                    if chunk.error is None:
                        codec.add(chunk)
                if exchange.received > MAX_LINE_BYTES:
                    raise AnswerTooLargeError(
                        f"the answer is larger than the gateway's {MAX_LINE_BYTES // 2**20} MiB "
                        'limit for one non-streamed answer: ask for it with "stream": true, '
                        "or for fewer tokens"
                    )
        if exchange.failure is not None:
            raise exchange.failure
        if exchange.received <= INLINE_PARSE_BYTES:
            return codec.result()
        return await anyio.to_thread.run_sync(codec.result)

    async def _release(self, healthy: bool | None, key: str | None = None) -> None:
        """Give the current upstream back: close the exchange, free the slot, tell the pool.

        Args:
            healthy: For the circuit breaker: True answered, False failed, None neither.
            key: With a failure, the API key id when the request may have caused it.
        """
        with anyio.CancelScope(shield=True):
            await self._give_back(healthy, key)

    async def _give_back(self, healthy: bool | None, key: str | None) -> None:
        """`_release` without its shield, for a caller that holds one already (`finish`)."""
        if self.exchange is not None:
            await self.exchange.aclose()
        if self.upstream is not None:
            if self.holds_background and self.background is not None:
                self.upstream.slots.release_background(self.background, holds_slot=self.holds_slot)
            elif self.holds_slot:
                self.upstream.slots.release()
            final = self.meter.final
            self.services.pool.finished(
                self.upstream,
                healthy,
                key,
                ticket=self.routing,
                load_ns=None if final is None or not healthy else final.load_duration,
            )
        self.holds_slot = self.holds_background = False
        self.upstream = self.exchange = None

    async def withdraw(self) -> None:
        """End a request that never reached an upstream, recording nothing (shielded; once).

        For a batch line that found no spare slot (`NoSpareCapacity`): it is not a request
        the key made yet, so neither metrics nor usage hear of it; it runs again later.
        """
        if self.done:
            return
        self.done = True
        if self.span is not None:  # not the key's request: the attempt is left unmeasured
            self.span.end()
            self.span = None
        self.meter.drop()  # nor is it in flight any more (the gauge, the live view)
        with anyio.CancelScope(shield=True):
            try:
                await self._give_back(None, None)
            finally:
                await self.services.limiter.release(self.admission, 0)

    async def finish(self, outcome: Outcome, status: int | None = None) -> None:
        """Release the upstream, charge tokens, record metrics (shielded); once."""
        if self.done:
            return
        self.done = True
        healthy = {"completed": True, "client_error": True}.get(outcome)
        key = None
        if outcome in ("upstream_error", "timeout"):
            # An idle timeout or a broken stream is the upstream's; the request's total
            # deadline running out while tokens flowed is not; an error line may be either.
            failure = self.exchange.failure if self.exchange is not None else None
            healthy, key = self._verdict(failure) if failure is not None else (False, None)
        with anyio.CancelScope(shield=True):
            try:
                await self._give_back(healthy, key)
                summary = self.meter.finish(outcome, status)
                self.context.finish(summary)
                if self.services.usage is not None:
                    self.services.usage.record(summary)
                if self.span is not None:
                    end_upstream(
                        self.span,
                        summary,
                        finish_reason=self.meter.finish_reason,
                        response_model=self.meter.response_model,
                        answer=None if self.answer is None else "".join(self.answer),
                    )
                    self.span = None
            finally:  # whatever failed above, the key's in-flight count and TPM are settled
                answered = self.meter.output_tokens if outcome == "completed" else None
                await self.services.limiter.release(
                    self.admission, self.meter.charged_tokens, answered
                )


def _fails_over(error: GatewayError) -> bool:
    """Whether another upstream may be tried after `error`, a 5xx or 429, before the first byte.

    Not after what the request caused (`blame == "request"`, such as its own deadline running
    out): it fails the same way anywhere, or has no time left. An upstream 429 is load, not
    the request's fault, although it is passed on as a 4xx.
    """
    if isinstance(error, UpstreamStatusError) and error.upstream_status == 429:
        return True
    return getattr(error, "blame", "upstream") != "request"

"""The flow of one generation request, from a checked body to the finished response.

The flow is the same for every client surface and upstream dialect: the surface's `Endpoint`
(`gateway.relay.surface`) parses the body into a neutral `GenerationRequest` and supplies the
codec that writes the answer; the upstream's dialect translates both ways.

the drain check -> per-key RPM and in-flight limits -> read and check the body -> the key's
model allow-list -> reserve its expected tokens in the key's TPM (the one admission path,
`gateway.relay.admission`, shared with batch lines and model management) -> (the response
starts running: `gateway.relay.response`) -> choose an upstream (gateway.upstream.pool) -> its
slot (bounded queue) -> open the exchange (retries, first-byte deadline; on failure the next
upstream) -> stream (the codec's NDJSON or SSE), or aggregate for `stream:false` ->
finish: metrics, usage and the upstream's trace span (the summary), TPM settled (refund or
charge), slots back. A refusal on the way (after authentication) is recorded in usage too
(`Relay.handle`).

`Relay.handle` does the checks and builds a `RelayResponse` for a `Generation`; everything from
choosing an upstream on runs inside that response, under the one watcher for the client going
away that covers the whole request (one watcher task per request, not one per phase).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request, Response

from gateway.auth.principal import Principal
from gateway.context import RequestContext, request_context
from gateway.errors import ServiceUnavailableError
from gateway.lifecycle import Lifecycle
from gateway.limits.limiter import KeyLimiter
from gateway.metering.metrics import Metrics
from gateway.metering.usage import UsageSink
from gateway.relay.admission import admit_generation
from gateway.relay.generation import Services
from gateway.relay.response import RelayResponse
from gateway.relay.surface import Endpoint
from gateway.settings import Settings
from gateway.tracing.spans import Tracing
from gateway.upstream.pool import UpstreamPool


@dataclass(frozen=True)
class Relay:
    """The app-wide services a generation request needs (built once by the lifespan)."""

    settings: Settings
    metrics: Metrics
    pool: UpstreamPool
    limiter: KeyLimiter
    lifecycle: Lifecycle
    usage: UsageSink | None = None
    #: None when tracing is off: then the only cost per request is testing this.
    tracing: Tracing | None = None
    #: What each `Generation` is handed: the part of these services it uses.
    services: Services = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        services = Services(
            self.pool, self.limiter, self.metrics, self.settings, self.usage, self.tracing
        )
        object.__setattr__(self, "services", services)  # a frozen dataclass's derived field

    async def handle(self, request: Request, principal: Principal, endpoint: Endpoint) -> Response:
        """Check and admit one generation or embedding request; return its response.

        Args:
            request: The client's request (its body not read yet).
            principal: The authenticated key.
            endpoint: The surface's endpoint the route names: parses the body, encodes the
                answer.

        The returned `RelayResponse` does the rest when the server runs it (module docstring).

        Raises:
            GatewayError: every refusal before an upstream is chosen (recorded in usage).
        """
        context = request_context(request.scope)
        try:
            return await self._admit(request, principal, endpoint, context)
        except Exception as exc:
            if self.usage is not None:
                self.usage.record_rejection(
                    principal.key_id,
                    context.model,
                    status=getattr(exc, "status_code", 500),
                    outcome=getattr(exc, "outcome", "error"),
                    elapsed_s=time.perf_counter() - context.arrival,
                    # Bounded like the metrics: made-up model names make one `other` row.
                    label=None if context.model is None else self.pool.label(context.model),
                )
            raise

    async def _admit(
        self, request: Request, principal: Principal, endpoint: Endpoint, context: RequestContext
    ) -> Response:
        if self.lifecycle.draining:
            raise ServiceUnavailableError(
                "gateway is shutting down", headers={"Retry-After": "1", "Connection": "close"}
            )
        generation = await admit_generation(
            self.services, principal, endpoint, request, context=context
        )
        return RelayResponse(
            generation,
            endpoint.codec(generation.request),
            self.lifecycle,
            idle_timeout=self.settings.idle_timeout,
        )

"""The flow of one generation request, from a checked body to the finished response.

The flow is the same for every client surface and upstream dialect: the surface's `Endpoint`
(`gateway.relay.surface`) parses the body into a neutral `GenerationRequest` and supplies the
codec that writes the answer; the upstream's dialect translates both ways.

per-key RPM and in-flight limits -> read and check the body -> the key's model allow-list ->
reserve its expected tokens in the key's TPM -> (the response starts running:
`gateway.relay.response`) -> choose an upstream (gateway.upstream.pool) -> its slot (bounded
queue) -> open the exchange (retries, first-byte deadline; on failure the next upstream) ->
stream (the codec's NDJSON or SSE), or aggregate for `stream:false` ->
finish: metrics, usage and the upstream's trace span (the summary), TPM settled (refund or
charge), slots back. A refusal on the way (after authentication) is recorded in usage too
(`Relay.handle`).

The endpoint does the checks and returns a `RelayResponse` for a `Generation`; everything from
choosing an upstream on runs inside that response, under the one watcher for the client going
away that covers the whole request (one watcher task per request, not one per phase).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import Request, Response

from gateway.auth.principal import Principal
from gateway.errors import (
    ForbiddenError,
    ServiceUnavailableError,
)
from gateway.lifecycle import Lifecycle
from gateway.limits.estimate import estimate_tokens
from gateway.limits.limiter import KeyLimiter
from gateway.metering.meter import RequestMeter
from gateway.metering.metrics import ALL_KEYS, Metrics
from gateway.metering.usage import UsageSink
from gateway.relay.generation import Generation, Services
from gateway.relay.response import RelayResponse
from gateway.relay.surface import Endpoint
from gateway.settings import Settings
from gateway.tracing.spans import Tracing
from gateway.upstream.headers import upstream_request_headers
from gateway.upstream.pool import UpstreamPool
from gateway.wire.body import read_body
from gateway.wire.json import parse_request_body


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
        state: dict[str, Any] = request.scope.setdefault("state", {})
        try:
            return await self._admit(request, principal, endpoint, state)
        except Exception as exc:
            if self.usage is not None:
                arrival = state.get("arrival")
                self.usage.record_rejection(
                    principal.key_id,
                    state.get("model"),
                    status=getattr(exc, "status_code", 500),
                    outcome=getattr(exc, "outcome", "error"),
                    elapsed_s=0.0 if arrival is None else time.perf_counter() - arrival,
                )
            raise

    async def _admit(
        self, request: Request, principal: Principal, endpoint: Endpoint, state: dict[str, Any]
    ) -> Response:
        if self.lifecycle.draining:
            raise ServiceUnavailableError(
                "gateway is shutting down", headers={"Retry-After": "1", "Connection": "close"}
            )
        # RPM and in-flight need nothing of the body: decided before it is read, so a flood of
        # slow or junk bodies spends the key's own limits (issue 11); TPM needs num_predict.
        admission = await self.limiter.admit(principal)
        try:
            raw = await read_body(request, self.settings.max_body_bytes)
            generation_request = await parse_request_body(endpoint.parse, raw, self.settings)
            model = generation_request.model
            state["model"] = model
            if not principal.allows_model(model):
                raise ForbiddenError(f"this API key may not use model '{model}'")
            # Only what the upstream hop can carry is forwarded (a bad value is left out).
            headers = upstream_request_headers(
                request.headers.items(), request_id=state.get("request_id", "-")
            )
            expected = estimate_tokens(generation_request, self.settings.tpm_reserve_tokens)
            await self.limiter.reserve(admission, expected)
        except BaseException:  # refused (or cancelled) after admission: no leaked slot
            with anyio.CancelScope(shield=True):  # a cancelled scope would skip the release
                await self.limiter.release(admission, 0)
            raise
        meter = RequestMeter(
            metrics=self.metrics,
            route=endpoint.route,
            model=self.pool.label(model),
            key=principal.name if self.settings.metrics_per_key else ALL_KEYS,
            arrival=state.get("arrival", time.perf_counter()),
            key_id=principal.key_id,
            requested_model=model,
            prompt_estimate=expected.prompt,
        )
        generation = Generation(
            self.services,
            state,
            generation_request,
            headers,
            meter,
            admission,
            key=principal.key_id,
        )
        return RelayResponse(
            generation,
            endpoint.codec(generation_request),
            self.lifecycle,
            idle_timeout=self.settings.idle_timeout,
        )

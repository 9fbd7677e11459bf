"""The Responses API's route: `POST /v1/responses` through the relay.

It binds an `Endpoint` (the body translator and codec of `gateway.api.responses`) to the one
pipeline, so a Responses request has every generation route's keys, allow-lists, limits,
retries, failover, metrics (route label `/v1/responses`), usage, tracing and access log.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.api.relayed import relayed
from gateway.api.responses.codec import ResponsesCodec
from gateway.api.responses.schema import parse_responses
from gateway.neutral import GenerationRequest
from gateway.relay.surface import Codec
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class Responses:
    """`/v1/responses`: a Responses body as a chat request, the answer as Responses events."""

    route: str = "/v1/responses"

    def parse(self, raw: bytes, settings: Settings) -> GenerationRequest:
        """Check and translate the body (`gateway.api.responses.schema.parse_responses`)."""
        return parse_responses(raw, settings)

    def codec(self, request: GenerationRequest) -> Codec:
        """SSE events, or one `response` object."""
        return ResponsesCodec(request)


generation_routes = [relayed("/v1/responses", Responses())]
"""The Responses routes, mounted by `create_app` beside the OpenAI generation routes."""

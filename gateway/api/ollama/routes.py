"""Ollama's generation routes, and the same bodies at `/v1/generate` and `/v1/chat`.

`/api/generate`, `/api/chat`, `/api/embed` and `/api/embeddings` are Ollama's own paths;
`/v1/generate` and `/v1/chat` were the gateway's first ones.

Routes are names for one pipeline (`gateway.relay.pipeline.Relay.handle`): each binds a path to
an `Endpoint` (the body parser and the codec of `gateway.api.ollama`), nothing more. Every route
needs an API key (`require_principal`).

They are plain Starlette routes (`gateway.api.relayed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.api.ollama.codec import EmbedCodec, NdjsonCodec
from gateway.api.ollama.schema import parse_embed, parse_generation
from gateway.api.relayed import relayed
from gateway.neutral import GenerationRequest, Operation
from gateway.relay.surface import Codec
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class Generate:
    """`/api/generate` or `/api/chat`: Ollama's bodies and NDJSON answers (sections 2, 3)."""

    route: str
    operation: Operation

    def parse(self, raw: bytes, settings: Settings) -> GenerationRequest:
        """Check the body (`gateway.api.ollama.schema.parse_generation`)."""
        return parse_generation(raw, self.operation, settings)

    def codec(self, request: GenerationRequest) -> Codec:
        """NDJSON, or one object for `stream:false`."""
        return NdjsonCodec(request)


@dataclass(frozen=True, slots=True)
class Embed:
    """`/api/embed`, or the legacy `/api/embeddings` (section 6.6)."""

    route: str
    legacy: bool = False

    def parse(self, raw: bytes, settings: Settings) -> GenerationRequest:
        """Check the body (`gateway.api.ollama.schema.parse_embed`)."""
        return parse_embed(raw, settings, legacy=self.legacy)

    def codec(self, request: GenerationRequest) -> Codec:
        """One JSON object."""
        return EmbedCodec(request)


generation_routes = [
    relayed(path, endpoint)
    for path, endpoint in (
        ("/api/generate", Generate("/api/generate", "generate")),
        ("/api/chat", Generate("/api/chat", "chat")),
        ("/api/embed", Embed("/api/embed")),
        ("/api/embeddings", Embed("/api/embeddings", legacy=True)),
        ("/v1/generate", Generate("/v1/generate", "generate")),
        ("/v1/chat", Generate("/v1/chat", "chat")),
    )
]
"""Ollama's generation and embedding routes, in the order `create_app` mounts them."""

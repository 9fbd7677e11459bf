"""The OpenAI API's routes: completions and embeddings through the relay, models from the catalogue.

`/v1/chat/completions`, `/v1/completions` and `/v1/embeddings` bind an `Endpoint` (the body
parser and codec of `gateway.api.openai`) to the one pipeline; `/v1/models` and
`/v1/models/{model}` answer from the gateway's own catalogue of every upstream's models, so
they work in front of an upstream that has no such endpoint. Every route needs an API key and
counts against its RPM: a catalogue never fetched (its upstream down since the start) is fetched
on the request's path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import httpx
from fastapi import APIRouter, Depends

from gateway.api.auth import PrincipalDep, require_principal
from gateway.api.openai.codec import CompletionCodec, EmbeddingsCodec
from gateway.api.openai.schema import parse_chat, parse_completion, parse_embeddings
from gateway.api.relayed import relayed
from gateway.deps import PoolDep, RelayDep
from gateway.errors import NotFoundError, UpstreamUnavailableError
from gateway.neutral import GenerationRequest
from gateway.relay.surface import Codec
from gateway.settings import Settings
from gateway.upstream.dialects.base import ModelInfo
from gateway.upstream.pool import UpstreamPool


@dataclass(frozen=True, slots=True)
class Completions:
    """`/v1/chat/completions` (`chat`) or `/v1/completions` (reference sections 7.1, 7.2)."""

    route: str
    chat: bool

    def parse(self, raw: bytes, settings: Settings) -> GenerationRequest:
        """Check the body (`gateway.api.openai.schema`)."""
        return parse_chat(raw, settings) if self.chat else parse_completion(raw, settings)

    def codec(self, request: GenerationRequest) -> Codec:
        """SSE, or one completion object."""
        return CompletionCodec(request)


@dataclass(frozen=True, slots=True)
class Embeddings:
    """`/v1/embeddings` (section 7.4)."""

    route: str = "/v1/embeddings"

    def parse(self, raw: bytes, settings: Settings) -> GenerationRequest:
        """Check the body (`gateway.api.openai.schema.parse_embeddings`)."""
        return parse_embeddings(raw, settings)

    def codec(self, request: GenerationRequest) -> Codec:
        """One list object."""
        return EmbeddingsCodec(request)


generation_routes = [
    relayed("/v1/chat/completions", Completions("/v1/chat/completions", chat=True)),
    relayed("/v1/completions", Completions("/v1/completions", chat=False)),
    relayed("/v1/embeddings", Embeddings()),
]
"""The OpenAI generation and embedding routes, in the order `create_app` mounts them."""

router = APIRouter(prefix="/v1", dependencies=[Depends(require_principal)])


async def _catalogue(pool: UpstreamPool) -> list[ModelInfo]:
    try:
        return await pool.catalogued_models()
    except (httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError) as exc:
        raise UpstreamUnavailableError("could not list the upstream's models") from exc


def _model(info: ModelInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "object": "model",
        "created": info.created,
        "owned_by": info.owned_by or "gateway",
    }


@router.get("/models")
async def list_models(principal: PrincipalDep, pool: PoolDep, relay: RelayDep) -> dict[str, Any]:
    """List the models this key may use (OpenAI list shape), from every upstream's catalogue.

    An exact alias (`GATEWAY_MODEL_ALIASES`) is listed, with its target's details, when the key
    may use the target and an upstream offers it; a pattern alias cannot be listed (no name).
    A catalogued model whose name an alias takes is left out: asking for it runs the target.
    """
    async with relay.limiter.admitted(principal):
        models = await _catalogue(pool)
    aliases = relay.settings.aliases
    allowed = [m for m in models if principal.allows_model(m.id)]
    data = [_model(m) for m in allowed if aliases.target(m.id) is None]
    for alias, target in aliases.exact.items():
        info = next((m for m in allowed if _same(m.id, target)), None)
        if info is not None:
            data.append(_model(replace(info, id=alias)))
    return {"object": "list", "data": data}


@router.get("/models/{model:path}")
async def get_model(
    model: str, principal: PrincipalDep, pool: PoolDep, relay: RelayDep
) -> dict[str, Any]:
    """One model this key may use (section 7.3); an alias (exact or pattern) as its target.

    Raises:
        NotFoundError: no upstream offers `model`, or the key may not use it (the same 404:
            a key does not learn which models exist beyond its own).
    """
    target = relay.settings.aliases.target(model)  # an alias is found as its target is
    async with relay.limiter.admitted(principal):
        wanted = model if target is None else target
        models = await _catalogue(pool) if principal.allows_model(wanted) else []
    for info in models:
        if info.id == wanted or _same(info.id, wanted):
            return _model(info if target is None else replace(info, id=model))
    raise NotFoundError(f"The model '{model}' does not exist")


def _same(catalogued: str, asked: str) -> bool:
    """Whether two names are one model: `name` is `name:latest` (section 2.1), case-blind.

    Case-blind as the key's allow-list is (`Principal.allows_model`).
    """
    return catalogued.lower().removesuffix(":latest") == asked.lower().removesuffix(":latest")

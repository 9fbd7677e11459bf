"""The app-facing API: `POST /v1/generate`, `POST /v1/chat`, `GET /v1/models`.

Every route needs an API key (`require_principal` on the router); the flow of a generation is
in `gateway.relay.pipeline`.
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request, Response

from gateway.auth.dependencies import PrincipalDep, require_principal
from gateway.deps import PoolDep, RelayDep
from gateway.errors import UpstreamUnavailableError

router = APIRouter(prefix="/v1", dependencies=[Depends(require_principal)])


@router.post("/generate")
async def generate(request: Request, principal: PrincipalDep, relay: RelayDep) -> Response:
    """Generate a completion (Ollama /api/generate body and answer)."""
    return await relay.handle(request, principal, "generate")


@router.post("/chat")
async def chat(request: Request, principal: PrincipalDep, relay: RelayDep) -> Response:
    """Chat with a model (Ollama /api/chat body and answer)."""
    return await relay.handle(request, principal, "chat")


@router.get("/models")
async def list_models(principal: PrincipalDep, pool: PoolDep) -> dict[str, Any]:
    """List the models this key may use (OpenAI list shape), from every upstream."""
    try:
        models = await pool.models()
    except (httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError) as exc:
        raise UpstreamUnavailableError("could not list the upstream's models") from exc
    data = [
        {"id": m.id, "object": "model", "created": m.created, "owned_by": m.owned_by or "gateway"}
        for m in models
        if principal.allows_model(m.id)
    ]
    return {"object": "list", "data": data}

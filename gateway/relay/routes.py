"""The app-facing API: `POST /v1/generate`, `POST /v1/chat`, `GET /v1/models`.

Every route needs an API key (`require_principal`); the flow of a generation is in
`gateway.relay.pipeline`.

The two generation routes are plain Starlette routes (`generation_routes`) that call the same
getters FastAPI would inject: FastAPI's dependency solver and its request wrapper cost about
60 µs of CPU per request (docs/performance.md), on the path every token's TTFT waits for.
Errors raised in them go through the app's error handlers like any other route's.
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request, Response
from starlette.routing import Route

from gateway.auth.dependencies import PrincipalDep, require_principal
from gateway.deps import PoolDep, get_authenticator, get_relay
from gateway.errors import UpstreamUnavailableError

router = APIRouter(prefix="/v1", dependencies=[Depends(require_principal)])


async def generate(request: Request) -> Response:
    """Generate a completion (Ollama /api/generate body and answer)."""
    principal = await require_principal(request, await get_authenticator(request))
    return await (await get_relay(request)).handle(request, principal, "generate")


async def chat(request: Request) -> Response:
    """Chat with a model (Ollama /api/chat body and answer)."""
    principal = await require_principal(request, await get_authenticator(request))
    return await (await get_relay(request)).handle(request, principal, "chat")


generation_routes = [
    Route("/v1/generate", generate, methods=["POST"]),
    Route("/v1/chat", chat, methods=["POST"]),
]


@router.get("/models")
async def list_models(principal: PrincipalDep, pool: PoolDep) -> dict[str, Any]:
    """List the models this key may use (OpenAI list shape), from every upstream's catalogue."""
    try:
        models = await pool.catalogued_models()
    except (httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError) as exc:
        raise UpstreamUnavailableError("could not list the upstream's models") from exc
    data = [
        {"id": m.id, "object": "model", "created": m.created, "owned_by": m.owned_by or "gateway"}
        for m in models
        if principal.allows_model(m.id)
    ]
    return {"object": "list", "data": data}

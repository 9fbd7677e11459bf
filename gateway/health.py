"""`/healthz` (the process is alive) and `/readyz` (the upstream answers); both public."""

from __future__ import annotations

import httpx
from fastapi import APIRouter, Response

from gateway.deps import ClientDep, DialectDep, MetricsDep, SettingsDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process serves HTTP."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(
    response: Response,
    settings: SettingsDep,
    client: ClientDep,
    dialect: DialectDep,
    metrics: MetricsDep,
) -> dict[str, str]:
    """Readiness: the upstream answers its cheap probe (Ollama /api/version, OpenAI /v1/models)."""
    timeout = httpx.Timeout(settings.connect_timeout, read=settings.connect_timeout)
    try:
        probe = await client.get(dialect.readiness_path, timeout=timeout)
        ready = probe.status_code == 200
        detail = f"upstream answered {probe.status_code}"
    except httpx.HTTPError as exc:
        ready, detail = False, f"upstream unreachable ({type(exc).__name__})"
    metrics.upstream_up.set(1 if ready else 0)
    if not ready:
        response.status_code = 503
    return {"status": "ready" if ready else "unready", "upstream": detail}

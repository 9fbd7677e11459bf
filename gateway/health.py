"""`/healthz` (the process is alive) and `/readyz` (the upstream answers); both public."""

from __future__ import annotations

from fastapi import APIRouter, Response

from gateway.deps import MonitorDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process serves HTTP."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(response: Response, monitor: MonitorDep) -> dict[str, str]:
    """Readiness: the upstream answers its cheap probe (Ollama /api/version, OpenAI /v1/models)."""
    ready, detail = await monitor.probe()
    if not ready:
        response.status_code = 503
    return {"status": "ready" if ready else "unready", "upstream": detail}

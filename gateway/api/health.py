"""`/healthz` (the process is alive) and `/readyz` (the upstream answers); both public."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from gateway.deps import LifecycleDep, PoolDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process serves HTTP."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(response: Response, pool: PoolDep, lifecycle: LifecycleDep) -> dict[str, Any]:
    """Readiness: not draining, and at least one upstream answers its cheap probe."""
    if lifecycle.draining:
        response.status_code = 503
        return {"status": "draining", "upstreams": {}}
    ready, details = await pool.probe()
    if not ready:
        response.status_code = 503
    return {"status": "ready" if ready else "unready", "upstreams": details}

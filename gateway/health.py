"""`/healthz` (the process is alive) and `/readyz` (the upstream answers); both public."""

from __future__ import annotations

from fastapi import APIRouter, Response

from gateway.deps import LifecycleDep, MonitorDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process serves HTTP."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(
    response: Response, monitor: MonitorDep, lifecycle: LifecycleDep
) -> dict[str, str]:
    """Readiness: not draining, and the upstream answers its cheap probe."""
    if lifecycle.draining:
        response.status_code = 503
        return {"status": "draining", "upstream": "not asked"}
    ready, detail = await monitor.probe()
    if not ready:
        response.status_code = 503
    return {"status": "ready" if ready else "unready", "upstream": detail}

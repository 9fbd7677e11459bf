"""`gateway serve`: run the app under uvicorn, one worker per process (STYLE section 8)."""

from __future__ import annotations

import logging

import uvicorn

from gateway.app import create_app
from gateway.settings import Settings


def serve(settings: Settings, *, host: str | None = None, port: int | None = None) -> int:
    """Serve the gateway until SIGINT/SIGTERM; returns the process exit code.

    One uvicorn worker: Prometheus and in-process limit state live in the process, so scale
    out with more processes or replicas behind a load balancer, not with `--workers`
    (docs/operations.md). uvloop and httptools are used when installed (`uvicorn[standard]`).

    Args:
        settings: Configuration.
        host: Bind address; default `GATEWAY_HOST` (127.0.0.1).
        port: Port; default `GATEWAY_PORT` (8080).
    """
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # httpx logs every request at INFO, which would be the upstream monitor's probes every few
    # seconds; the gateway's own access log already has one line per request.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = uvicorn.Config(
        create_app(settings),
        host=host or settings.host,
        port=port or settings.port,
        loop="auto",
        http="auto",
        workers=1,
        access_log=False,
        log_level=settings.log_level,
        timeout_graceful_shutdown=30,
        server_header=False,
    )
    uvicorn.Server(config).run()
    return 0

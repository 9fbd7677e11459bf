"""`python -m benchmarks.floor`: the least a relay on the gateway's own stack can cost.

A bare ASGI app on uvicorn (httptools, uvloop: as `gateway serve` runs) that forwards each
request to the upstream with aiohttp (as the gateway's default transport) and copies the answer's
bytes through as they arrive. No FastAPI, no auth, metrics, limits, parsing, deadlines or
disconnect watching: the gap between this row and nginx is what the Python stack costs, the
gap between the gateway and this row is what the gateway's own work costs (docs/performance.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import aiohttp
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send


def build_app(upstream: str) -> ASGIApp:
    """The relay app in front of `upstream` (a base URL such as `http://127.0.0.1:11434`)."""
    sessions: list[aiohttp.ClientSession] = []

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                sessions.append(aiohttp.ClientSession(auto_decompress=False))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for session in sessions:
                    await session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {"content-type": "application/json"} if body else {}
        async with sessions[0].request(
            scope["method"], upstream + scope["path"], data=body or None, headers=headers
        ) as answer:
            content_type = answer.headers.get("content-type", "application/octet-stream")
            await send(
                {
                    "type": "http.response.start",
                    "status": answer.status,
                    "headers": [(b"content-type", content_type.encode("latin-1"))],
                }
            )
            async for piece in answer.content.iter_any():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the floor relay on 127.0.0.1 until stopped."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="upstream base URL")
    args = parser.parse_args(argv)
    uvicorn.run(
        build_app(args.upstream.rstrip("/")),
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="uvloop",
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

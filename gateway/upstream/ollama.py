"""The `ollama` dialect: relay to Ollama's native `/api/generate` and `/api/chat`.

The body is forwarded as the client sent it, except that `stream` is forced to true: the gateway
always streams from upstream so it can measure TTFT and notice a client going away, and builds a
`stream:false` answer itself the way Ollama does (reference section 2.4). Each NDJSON line is
relayed with the upstream's own bytes (reference section 1) and parsed only to observe it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Any

import httpx

from gateway.upstream.dialect import (
    Chunk,
    ModelInfo,
    Route,
    StreamBrokenError,
    drain,
    encode_json,
    iter_lines,
)

_PATHS: dict[Route, str] = {"generate": "/api/generate", "chat": "/api/chat"}


class OllamaDialect:
    """Ollama's native API (reference sections 2, 3, 6.3)."""

    name = "ollama"
    readiness_path = "/api/version"
    reports_timings = True

    def build_request(
        self, client: httpx.AsyncClient, route: Route, body: dict[str, Any], headers: dict[str, str]
    ) -> httpx.Request:
        """Return a POST to `/api/generate` or `/api/chat` with `stream: true`."""
        content = encode_json({**body, "stream": True})
        headers = {**headers, "content-type": "application/json"}
        return client.build_request("POST", _PATHS[route], content=content, headers=headers)

    async def chunks(
        self,
        response: httpx.Response,
        route: Route,  # noqa: ARG002 - part of the Dialect contract
        body: dict[str, Any],  # noqa: ARG002
        started: float,  # noqa: ARG002
        sent: float,  # noqa: ARG002
    ) -> AsyncGenerator[Chunk, None]:
        """Yield each NDJSON line as a chunk; stop after `done:true` or an error line.

        Raises:
            StreamBrokenError: a line is not a JSON object, or EOF came before `done:true`
                (reference sections 4.3 and 9.2).
        """
        lines = iter_lines(response.aiter_bytes())
        async for line in lines:
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise StreamBrokenError("upstream sent malformed NDJSON") from exc
            if not isinstance(data, dict):
                raise StreamBrokenError("upstream sent a non-object NDJSON line")
            if not line.endswith(b"\n"):
                line += b"\n"
            chunk = Chunk(data, line)
            yield chunk
            if chunk.is_done or chunk.is_error:
                await drain(lines)  # Ollama ends the body right after; keep the connection
                return
        raise StreamBrokenError("upstream closed the stream before it finished")

    async def list_models(self, client: httpx.AsyncClient) -> list[ModelInfo]:
        """Read `GET /api/tags` (reference section 6.3).

        Raises:
            httpx.HTTPError: the request failed or returned an error status.
            ValueError: the answer is not `{"models": [...]}`.
        """
        response = await client.get("/api/tags")
        response.raise_for_status()
        data = response.json()
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, list):
            raise ValueError("upstream /api/tags has no models list")
        result = []
        for entry in models:
            if not isinstance(entry, dict):
                continue
            name = entry.get("model") or entry.get("name")
            if not isinstance(name, str):
                continue
            result.append(ModelInfo(name, _unix_time(entry.get("modified_at")), "ollama"))
        return result


def _unix_time(value: object) -> int:
    """Parse an RFC 3339 timestamp into Unix seconds; 0 when missing or malformed."""
    if not isinstance(value, str):
        return 0
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0

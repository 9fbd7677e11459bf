"""The `ollama` dialect: relay to Ollama's native `/api/generate` and `/api/chat`.

The body is forwarded as the client sent it, except that `stream` is forced to true: the gateway
always streams from upstream so it can measure TTFT and notice a client going away, and builds a
`stream:false` answer itself the way Ollama does (reference section 2.4). Each NDJSON line is
relayed with the upstream's own bytes (reference section 1) and parsed only to observe it
(`NdjsonDecoder`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx

from gateway.upstream.dialect import (
    Chunk,
    LineSplitter,
    ModelInfo,
    Route,
    StreamBrokenError,
    UpstreamCall,
    decode_object,
    encode_json,
)

_PATHS: dict[Route, str] = {"generate": "/api/generate", "chat": "/api/chat"}


class OllamaDialect:
    """Ollama's native API (reference sections 2, 3, 6.3)."""

    name = "ollama"
    readiness_path = "/api/version"
    reports_timings = True

    def build_request(
        self, route: Route, body: dict[str, Any], headers: dict[str, str]
    ) -> UpstreamCall:
        """Return a POST to `/api/generate` or `/api/chat` with `stream: true`."""
        content = encode_json({**body, "stream": True})
        return UpstreamCall(_PATHS[route], content, {**headers, "content-type": "application/json"})

    def decoder(
        self,
        route: Route,  # noqa: ARG002 - part of the Dialect contract
        body: dict[str, Any],  # noqa: ARG002
        started: float,  # noqa: ARG002
        sent: float,  # noqa: ARG002
    ) -> NdjsonDecoder:
        """Return a decoder for one NDJSON answer."""
        return NdjsonDecoder()

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


class NdjsonDecoder:
    """Ollama's NDJSON answer as chunks: one per line, the upstream's own bytes relayed.

    Blank lines are skipped. The chunk `done: true` or `{"error": ...}` is the last one
    (reference sections 1 and 4.3); what follows it is ignored.

    Raises (from `feed` and `end`):
        StreamBrokenError: a line is not a JSON object, or EOF came before `done:true`
            (reference sections 4.3 and 9.2).
    """

    def __init__(self) -> None:
        self.finished = False
        self._lines = LineSplitter()

    def feed(self, data: bytes) -> list[Chunk]:
        """Return the chunks of the lines `data` completes (see `StreamDecoder.feed`)."""
        if self.finished:
            return []
        chunks: list[Chunk] = []
        try:
            for line in self._lines.feed(data):
                parsed = decode_object(line, "NDJSON line")
                if parsed is None:
                    continue
                chunk = Chunk(parsed, line)
                chunks.append(chunk)
                if chunk.is_done or chunk.is_error:
                    self.finished = True
                    break
        except StreamBrokenError as exc:
            exc.chunks = chunks
            raise
        return chunks

    def end(self) -> list[Chunk]:
        """Return the chunk of an unterminated last line; raise if none ended the answer."""
        if self.finished:
            return []
        rest = self._lines.rest()
        chunks = self.feed(rest + b"\n") if rest else []
        if not self.finished:
            raise StreamBrokenError("upstream closed the stream before it finished")
        return chunks


def _unix_time(value: object) -> int:
    """Parse an RFC 3339 timestamp into Unix seconds; 0 when missing or malformed."""
    if not isinstance(value, str):
        return 0
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0

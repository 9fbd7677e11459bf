"""The `ollama` dialect: Ollama's native `/api/generate`, `/api/chat`, `/api/embed`.

A body from an Ollama client is forwarded as the client sent it, except that `stream` is forced
to true: the gateway always streams from upstream so it can measure TTFT and notice a client
going away, and builds a `stream:false` answer itself the way Ollama does (reference section
2.4). A body from an OpenAI client is translated (`gateway.upstream.dialects.ollama_request`), so
the
meter keeps Ollama's exact counters and durations whatever the client speaks. Each NDJSON line
becomes a neutral chunk that keeps the upstream's own bytes (reference section 1), relayed
unchanged to an Ollama client (`NdjsonDecoder`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import orjson

from gateway.neutral import Chunk, GenerationRequest, ToolCall
from gateway.upstream.dialects.base import (
    Lane,
    ModelInfo,
    StreamBrokenError,
    TextEvent,
    UpstreamCall,
)
from gateway.upstream.dialects.framing import (
    BodyDecoder,
    LineSplitter,
    encode_body,
    ollama_stats,
)
from gateway.upstream.dialects.json_codec import decode_object, encode_json, orjson_decides
from gateway.upstream.dialects.ollama_request import to_ollama_request
from gateway.wire.json import parse_listing

_PATHS = {"generate": "/api/generate", "chat": "/api/chat", "embed": "/api/embed"}


class OllamaDialect:
    """Ollama's native API (reference sections 2, 3, 6.3)."""

    name = "ollama"
    readiness_path = "/api/version"
    reports_timings = True

    def build_request(self, request: GenerationRequest, headers: dict[str, str]) -> UpstreamCall:
        """Return the POST for `request`: generations with `stream: true`, embeddings as asked.

        Raises:
            ValueError: an OpenAI body that Ollama's API cannot express.
        """
        headers = {**headers, "content-type": "application/json"}
        if request.surface == "openai":
            path, payload = to_ollama_request(request)
            return UpstreamCall(path, encode_body(payload, request), headers)
        if request.operation == "embed":
            path = "/api/embeddings" if request.legacy else "/api/embed"
            return UpstreamCall(path, encode_body(request.body, request), headers)
        content = encode_body({**request.body, "stream": True}, request)
        return UpstreamCall(_PATHS[request.operation], content, headers)

    def decoder(
        self,
        request: GenerationRequest,
        started: float,  # noqa: ARG002 - part of the Dialect contract
        sent: float,  # noqa: ARG002
    ) -> NdjsonDecoder | BodyDecoder:
        """Return a decoder for one answer: NDJSON for generations, one object for embeddings."""
        if request.operation == "embed":
            legacy = request.legacy and request.surface == "ollama"
            return BodyDecoder(_legacy_embedding if legacy else _embeddings)
        return NdjsonDecoder()

    async def list_models(self, client: httpx.AsyncClient) -> list[ModelInfo]:
        """Read `GET /api/tags` (reference section 6.3).

        Raises:
            httpx.HTTPError: the request failed or returned an error status.
            ValueError: the answer is not `{"models": [...]}`.
        """
        response = await client.get("/api/tags")
        response.raise_for_status()
        data = parse_listing(response.content)
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
                chunk = from_ollama(parsed, line)
                chunks.append(chunk)
                if chunk.done or chunk.error is not None:
                    self.finished = True
                    break
        except StreamBrokenError as exc:
            exc.chunks = chunks
            raise
        return chunks

    def lane(
        self,
        tick: Callable[[float], None],
        write: Callable[[bytes], None],
        text_event: TextEvent | None = None,
    ) -> Lane:
        """The one-call relay of a token's line (`Lane`).

        Why: the usual read of a streamed answer is one line, one token; decoded into a chunk,
        metered, encoded and written it passes through about 15 Python calls, and their cost
        with the CPU's caches cold between two reads is most of the gateway's CPU per chunk
        (docs/performance.md, issue 27). The lane takes a read that is one whole JSON object
        line, with no unfinished line before it, neither final (`done: true`) nor an error, and
        without tool calls: the same test of the line `feed` makes (orjson, on the lines
        `decode_object` gives orjson: `orjson_decides`; a line orjson refuses goes to `feed`,
        and so does one with a run of 19 digits, which `feed` parses with the standard
        library, whose nesting limit is lower), and the same token rule
        as `from_ollama` and the meter (`content` or `thinking` text). Without `text_event` it
        writes the line itself, as `NdjsonCodec` writes a chunk's `raw`; with it, only a line
        whose one output is text (no thinking, no `logprobs`) is taken, and written as
        `text_event(text)` says.
        """
        pending = self._lines.pending
        loads = orjson.loads
        now = time.perf_counter

        def relay(piece: bytes) -> bool:
            if pending or self.finished or piece.find(b"\n") != len(piece) - 1:
                return False
            if not orjson_decides(piece):  # `feed` parses it with `json`, whose limits differ
                return False
            try:
                data = loads(piece)
            except orjson.JSONDecodeError:
                return False
            if type(data) is not dict or "error" in data or data.get("done") is True:
                return False
            message = data.get("message")
            source = message if type(message) is dict else data
            if source.get("tool_calls"):
                return False
            text = source.get("content") if source is message else data.get("response")
            thinking = source.get("thinking")
            if text_event is not None:  # a translated surface: text alone, or the long way
                if type(text) is not str or not text or thinking or data.get("logprobs"):
                    return False
                body = text_event(text)
                if body is None:
                    return False
                tick(now())
                write(body)
                return True
            if (type(text) is str and text) or (type(thinking) is str and thinking):
                tick(now())
            write(piece)
            return True

        return relay

    def end(self) -> list[Chunk]:
        """Return the chunk of an unterminated last line; raise if none ended the answer."""
        if self.finished:
            return []
        rest = self._lines.rest()
        chunks = self.feed(rest + b"\n") if rest else []
        if not self.finished:
            raise StreamBrokenError("upstream closed the stream before it finished")
        return chunks


def from_ollama(data: dict[str, Any], line: bytes | None = None) -> Chunk:
    """The neutral chunk of one Ollama stream object (reference sections 2.3, 3.2, 4.3)."""
    if "error" in data:
        return Chunk(error=str(data["error"]), native=data, raw=line)
    message = data.get("message")
    source = message if isinstance(message, dict) else data
    text = source.get("content") if source is message else data.get("response")
    thinking = source.get("thinking")
    chunk = Chunk(
        text=text if isinstance(text, str) else "",
        thinking=thinking if isinstance(thinking, str) else "",
        native=data,
        raw=line,
    )
    calls = source.get("tool_calls")
    if isinstance(calls, list) and calls:
        chunk.tool_calls = [_tool_call(i, call) for i, call in enumerate(calls)]
    logprobs = data.get("logprobs")
    if isinstance(logprobs, list):
        chunk.logprobs = logprobs
    if data.get("done") is True:
        chunk.done = True
        reason = data.get("done_reason")
        chunk.done_reason = reason if isinstance(reason, str) else "stop"
        chunk.stats = ollama_stats(data)
        chunk.model = _model(data)
    return chunk


def _model(data: dict[str, Any]) -> str | None:
    model = data.get("model")
    return model if isinstance(model, str) else None


def _tool_call(index: int, call: object) -> ToolCall:
    """A native tool call (`arguments` an object, section 3.1) in neutral form."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return ToolCall(name="", arguments="{}", index=index)
    arguments = function.get("arguments", {})
    text = arguments if isinstance(arguments, str) else encode_json(arguments).decode()
    call_id = call.get("id") if isinstance(call, dict) else None
    position = function.get("index")
    return ToolCall(
        name=str(function.get("name") or ""),
        arguments=text,
        id=call_id if isinstance(call_id, str) else None,
        index=position if isinstance(position, int) else index,
    )


def _embeddings(data: dict[str, Any], raw: bytes) -> Chunk:
    """`/api/embed`'s answer (section 6.6) as the final chunk."""
    if "error" in data:
        return Chunk.failure(str(data["error"]))
    vectors = data["embeddings"]
    if not isinstance(vectors, list):
        raise ValueError("embeddings is not a list")
    return Chunk(
        done=True,
        embeddings=vectors,
        stats=ollama_stats(data),
        model=_model(data),
        native=data,
        raw=raw,
    )


def _legacy_embedding(data: dict[str, Any], raw: bytes) -> Chunk:
    """Legacy `/api/embeddings`' answer `{"embedding": [...]}` (section 6.6) as the final chunk."""
    if "error" in data:
        return Chunk.failure(str(data["error"]))
    vector = data["embedding"]
    if not isinstance(vector, list):
        raise ValueError("embedding is not a list")
    return Chunk(done=True, embeddings=[vector], native=data, raw=raw)


def _unix_time(value: object) -> int:
    """Parse an RFC 3339 timestamp into Unix seconds; 0 when missing or malformed."""
    if not isinstance(value, str):
        return 0
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0

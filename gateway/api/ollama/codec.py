"""Neutral chunks written as Ollama answers: NDJSON streams, `stream:false` objects, embeddings.

From an Ollama upstream a chunk keeps the upstream's own line, relayed unchanged (reference
section 1: the bytes a client of Ollama would get); from an OpenAI-compatible upstream each line
is built here in Ollama's shape (sections 2.3, 3.2), compact as Go's encoder writes it.

A `stream:false` answer is built as Ollama builds it (section 2.4): `response` and `thinking`
are concatenated across chunks, `logprobs` too, and every other field is taken from the last
chunk; for chat, `message.content`, `message.thinking` and `message.tool_calls` are accumulated
(section 3.2, `writeChatResponse`).
"""

from __future__ import annotations

from typing import Any

from gateway.neutral import Chunk, GenerationRequest, ToolCall
from gateway.upstream.dialects.base import TextEvent
from gateway.upstream.dialects.framing import (
    JsonList,
    encode_json_stepwise,
    rfc3339_now,
)
from gateway.upstream.dialects.json_codec import encode_json
from gateway.wire.json import parse_arguments

NDJSON = b"application/x-ndjson"


class NdjsonCodec:
    """The answer to one `/api/generate` or `/api/chat` request (`gateway.relay.surface.Codec`)."""

    media_type = NDJSON
    writes_raw = True  # an Ollama upstream's lines, as they came
    text_event: TextEvent | None = None

    def __init__(self, request: GenerationRequest) -> None:
        self._chat = request.operation == "chat"
        self._model = request.model
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._tool_calls: list[Any] = []
        self._logprobs = JsonList()
        self._last: Chunk | None = None

    def encode(self, chunks: list[Chunk]) -> bytes:
        """One NDJSON line per chunk: the upstream's own when it spoke Ollama's API."""
        if len(chunks) == 1:  # the usual read: one token
            chunk = chunks[0]
            return chunk.raw if chunk.raw is not None else self._line(chunk)
        return b"".join([c.raw if c.raw is not None else self._line(c) for c in chunks])

    def _line(self, chunk: Chunk) -> bytes:
        if chunk.error is not None:
            return encode_json({"error": chunk.error}) + b"\n"
        return (
            encode_json(self._object(chunk, chunk.text, chunk.thinking, chunk.tool_calls)) + b"\n"
        )

    def _object(
        self, chunk: Chunk, text: str, thinking: str, calls: list[ToolCall] | None
    ) -> dict[str, Any]:
        """Ollama's stream object for `chunk` with the given text fields."""
        data: dict[str, Any] = {"model": self._model, "created_at": rfc3339_now()}
        if self._chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = [ollama_tool_call(call) for call in calls]
            data["message"] = message
        else:
            data["response"] = text
            if thinking:
                data["thinking"] = thinking
        if chunk.logprobs:
            data["logprobs"] = chunk.logprobs
        data["done"] = chunk.done
        if chunk.done:
            data["done_reason"] = chunk.done_reason or "stop"
            if chunk.stats is not None:
                data.update(chunk.stats.as_ollama())
        return data

    def add(self, chunk: Chunk) -> None:
        """Fold in one non-error chunk (module docstring)."""
        self._text.append(chunk.text)
        self._thinking.append(chunk.thinking)
        if chunk.tool_calls:
            self._tool_calls.extend(chunk.tool_calls)
        if chunk.logprobs:
            self._logprobs.extend(chunk.logprobs)
        self._last = chunk

    def result(self) -> bytes:
        """The `stream:false` object: the last chunk with the accumulated text fields."""
        last = self._last or Chunk(done=True)
        text, thinking = "".join(self._text), "".join(self._thinking)
        if last.native is None:
            data = self._object(last, text, thinking, self._tool_calls)
            if self._logprobs:
                data["logprobs"] = self._logprobs.placeholder
            return self._logprobs.splice(encode_json_stepwise(data))
        result = dict(last.native)  # the upstream's own final object: `context` and all
        if self._logprobs:
            result["logprobs"] = self._logprobs.placeholder
        message = result.get("message")
        if isinstance(message, dict):
            message = dict(message)
            message["content"] = text
            if thinking:
                message["thinking"] = thinking
            if self._tool_calls:
                message["tool_calls"] = [ollama_tool_call(call) for call in self._tool_calls]
            result["message"] = message
        else:
            result["response"] = text
            if thinking:
                result["thinking"] = thinking
        return self._logprobs.splice(encode_json_stepwise(result))


class EmbedCodec:
    """The answer to `/api/embed` or the legacy `/api/embeddings` (reference section 6.6)."""

    media_type = b"application/json; charset=utf-8"
    writes_raw = False
    text_event: TextEvent | None = None

    def __init__(self, request: GenerationRequest) -> None:
        self._request = request
        self._chunk: Chunk | None = None

    def encode(self, chunks: list[Chunk]) -> bytes:
        """Embeddings never stream; only an error could be written this way."""
        return b"".join(encode_json({"error": c.error}) + b"\n" for c in chunks if c.error)

    def add(self, chunk: Chunk) -> None:
        """Keep the answer's one chunk."""
        self._chunk = chunk

    def result(self) -> bytes:
        """The upstream's own answer when it spoke Ollama's API, else built in Ollama's shape."""
        chunk = self._chunk or Chunk(done=True, embeddings=[])
        if chunk.raw is not None:
            return chunk.raw
        vectors = chunk.embeddings or []
        if self._request.legacy:
            return encode_json_stepwise({"embedding": vectors[0] if vectors else []})
        data: dict[str, Any] = {"model": self._request.model, "embeddings": vectors}
        if chunk.stats is not None:
            data.update(chunk.stats.as_ollama())
        return encode_json_stepwise(data)


def ollama_tool_call(call: ToolCall) -> dict[str, Any]:
    """A neutral tool call in Ollama's form: `arguments` an object (reference section 3.1)."""
    text = call.arguments
    try:
        arguments = parse_arguments(text) if text.strip() else {}
    except ValueError:  # invalid, too deep or too many values: passed on as text
        arguments = {"_raw": text}
    result: dict[str, Any] = {
        "function": {"index": call.index, "name": call.name, "arguments": arguments}
    }
    if call.id:
        result["id"] = call.id
    return result

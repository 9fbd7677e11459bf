"""Neutral chunks written as OpenAI answers: SSE streams, completion objects, embeddings.

Streams follow OpenAI's wire form (reference section 7.1): `data: <json>` events, the role on
the first delta, a finish event with `finish_reason`, a usage event with `choices: []` only
when `stream_options.include_usage` was set, then `data: [DONE]`. A failure after the first
byte is one `data: {"error": {...}}` event, and the stream ends without `[DONE]`: the openai
SDK raises `APIError` on such an event. Thinking text is sent as `reasoning_content` (vLLM's
and DeepSeek's name). Non-streamed answers always carry `usage`.
"""

from __future__ import annotations

import base64
import math
import secrets
import struct
import time
from typing import Any

from gateway.neutral import Chunk, GenerationRequest, ToolCall
from gateway.upstream.dialects.base import TextEvent
from gateway.upstream.dialects.framing import JsonList, encode_json_stepwise
from gateway.upstream.dialects.json_codec import encode_json, text_splice

SSE = b"text/event-stream; charset=utf-8"
_DONE = b"data: [DONE]\n\n"


def error_object(message: str, kind: str = "server_error") -> dict[str, Any]:
    """OpenAI's error object `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class CompletionCodec:
    """The answer to `/v1/chat/completions` or `/v1/completions` (`relay.surface.Codec`)."""

    media_type = SSE
    writes_raw = False

    def __init__(self, request: GenerationRequest) -> None:
        self._chat = request.operation == "chat"
        self._model = request.model
        self._include_usage = request.include_usage
        prefix = "chatcmpl-" if self._chat else "cmpl-"
        self._id = prefix + secrets.token_hex(12)
        self._created = int(time.time())
        self._role_sent = False
        self._called = False  # tool calls were made: finish_reason "tool_calls"
        self._generated = 0
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._tool_calls: list[ToolCall] = []
        self._logprobs = JsonList()  # in OpenAI's shape already (`_token_logprobs`)
        self._last: Chunk | None = None
        self._around_text: tuple[bytes, bytes] | None = None  # a text event but its text
        self._no_text_events = False  # the event's other fields cannot be kept apart
        self.text_event: TextEvent | None = self._text_event

    def _text_event(self, text: str) -> bytes | None:
        """A text delta's event (`TextEvent`): `encode([Chunk(text=text)])`, in one splice.

        None until the role went out with the first delta (chat), and for a stream whose
        other fields the JSON encoder would write differently around another text (a model
        name it can write only ASCII-escaped: never with `_around_text`'s splice).
        """
        around = self._around_text
        if around is None:
            if self._no_text_events or (self._chat and not self._role_sent):
                return None
            around = self._text_frame()
            if around is None:
                self._no_text_events = True
                return None
        self._generated += 1
        return around[0] + encode_json(text) + around[1]

    def _text_frame(self) -> tuple[bytes, bytes] | None:
        """The bytes of a text delta's event before and after its JSON string, if they hold."""
        key = "content" if self._chat else "text"
        return text_splice(lambda text: _event(self._frame({key: text}, None, None)))

    def encode(self, chunks: list[Chunk]) -> bytes:
        """SSE events for `chunks` (module docstring)."""
        events: list[bytes] = []
        for chunk in chunks:
            if chunk.error is not None:
                events.append(_event(error_object(chunk.error)))
                continue
            if chunk.generates:
                self._generated += 1
                events.append(_event(self._frame(self._delta(chunk), None, chunk.logprobs)))
            if chunk.done:
                empty: dict[str, Any] = {} if self._chat else {"text": ""}
                events.append(_event(self._frame(empty, self._finish_reason(chunk), None)))
                if self._include_usage:
                    usage = {**self._head(), "choices": [], "usage": self._usage(chunk)}
                    events.append(_event(usage))
                events.append(_DONE)
        return b"".join(events)

    def _head(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self._chat else "text_completion"
        return {"id": self._id, "object": kind, "created": self._created, "model": self._model}

    def _frame(self, delta: dict[str, Any], reason: str | None, logprobs: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self._chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta.get("text", "")
        choice["logprobs"] = {"content": _token_logprobs(logprobs)} if logprobs else None
        choice["finish_reason"] = reason
        return {**self._head(), "choices": [choice]}

    def _delta(self, chunk: Chunk) -> dict[str, Any]:
        if not self._chat:
            return {"text": chunk.text}
        delta: dict[str, Any] = {}
        if not self._role_sent:
            delta["role"] = "assistant"
            self._role_sent = True
        if chunk.text or not (chunk.thinking or chunk.tool_calls):
            delta["content"] = chunk.text
        if chunk.thinking:
            delta["reasoning_content"] = chunk.thinking
        if chunk.tool_calls:
            self._called = True
            delta["tool_calls"] = [
                openai_tool_call(call, streamed=True) for call in chunk.tool_calls
            ]
        return delta

    def _finish_reason(self, chunk: Chunk) -> str:
        if chunk.done_reason == "length":
            return "length"
        return "tool_calls" if self._called else "stop"

    def _usage(self, chunk: Chunk) -> dict[str, int]:
        stats = chunk.stats
        prompt = (stats.prompt_eval_count if stats else None) or 0
        completion = (stats.eval_count if stats else None) or self._generated
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def add(self, chunk: Chunk) -> None:
        """Fold in one non-error chunk."""
        if chunk.generates:
            self._generated += 1
        self._text.append(chunk.text)
        self._thinking.append(chunk.thinking)
        if chunk.tool_calls:
            self._called = True
            self._tool_calls.extend(chunk.tool_calls)
        if chunk.logprobs:
            self._logprobs.extend(_token_logprobs(chunk.logprobs))
        self._last = chunk

    def result(self) -> bytes:
        """The `chat.completion` or `text_completion` object, with `usage`."""
        last = self._last or Chunk(done=True)
        text = "".join(self._text)
        choice: dict[str, Any] = {"index": 0}
        if self._chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            thinking = "".join(self._thinking)
            if thinking:
                message["reasoning_content"] = thinking
            if self._tool_calls:
                message["tool_calls"] = [openai_tool_call(c) for c in self._tool_calls]
                message["content"] = text or None  # OpenAI sends null content with tool calls
            choice["message"] = message
        else:
            choice["text"] = text
        logprobs = self._logprobs
        choice["logprobs"] = {"content": logprobs.placeholder} if logprobs else None
        choice["finish_reason"] = self._finish_reason(last)
        kind = "chat.completion" if self._chat else "text_completion"
        answer = {**self._head(), "object": kind, "choices": [choice], "usage": self._usage(last)}
        return logprobs.splice(encode_json_stepwise(answer))


class EmbeddingsCodec:
    """The answer to `/v1/embeddings` (section 7.4): `float` lists or `base64` float32."""

    media_type = b"application/json; charset=utf-8"
    writes_raw = False
    text_event: TextEvent | None = None

    def __init__(self, request: GenerationRequest) -> None:
        body = request.body
        self._model = request.model
        self._base64 = body.get("encoding_format") == "base64"
        dimensions = body.get("dimensions")
        self._dimensions = dimensions if isinstance(dimensions, int) else None
        self._chunk: Chunk | None = None

    def encode(self, chunks: list[Chunk]) -> bytes:
        """Embeddings never stream; only an error could be written this way."""
        return b"".join(_event(error_object(c.error)) for c in chunks if c.error)

    def add(self, chunk: Chunk) -> None:
        """Keep the answer's one chunk."""
        self._chunk = chunk

    def result(self) -> bytes:
        """The list object, each vector cut to `dimensions` if the upstream did not."""
        chunk = self._chunk or Chunk(done=True, embeddings=[])
        data = []
        for index, vector in enumerate(chunk.embeddings or []):
            values = _shorten(vector, self._dimensions)
            encoded: Any = values
            if self._base64:
                encoded = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = (chunk.stats.prompt_eval_count if chunk.stats else None) or 0
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return encode_json_stepwise(
            {"object": "list", "data": data, "model": self._model, "usage": usage}
        )


def openai_tool_call(call: ToolCall, *, streamed: bool = False) -> dict[str, Any]:
    """A neutral tool call in OpenAI's form: `arguments` a JSON string (reference section 3.1)."""
    result: dict[str, Any] = {
        "id": call.id or f"call_{secrets.token_hex(8)}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    if streamed:
        result["index"] = call.index
    return result


def _token_logprobs(entries: list[Any]) -> list[Any]:
    """`logprobs.content` entries as OpenAI sends them: `top_logprobs` always a list.

    Ollama leaves an empty `top_logprobs` out (`omitempty`, reference section 2.1: none are
    asked for unless `top_logprobs` is set); OpenAI's clients expect the list, empty or not.
    """
    return [
        {**entry, "top_logprobs": []}
        if isinstance(entry, dict) and "top_logprobs" not in entry
        else entry
        for entry in entries
    ]


def _shorten(vector: list[Any], dimensions: int | None) -> list[float]:
    """Cut a vector to `dimensions` and re-normalize it, as OpenAI's `dimensions` does."""
    values = [float(v) for v in vector]
    if dimensions is None or len(values) <= dimensions:
        return values
    values = values[:dimensions]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + encode_json(data) + b"\n\n"

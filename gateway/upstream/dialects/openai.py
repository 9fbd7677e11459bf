"""The `openai` dialect: serve every surface's requests from an OpenAI-compatible server.

Works in front of llama.cpp's server, llama-cpp-python, vLLM and LM Studio.

Requests from OpenAI clients pass through, with `stream` forced on (and usage asked for), the
one output bound the surface checked sent as `max_tokens` (the name every OpenAI-compatible
server knows) and under every other name the client used, and `id_slot` dropped; an
embeddings request asks for floats (the OpenAI surface encodes base64 itself). Requests from
Ollama clients are translated (`gateway.upstream.dialects.openai_request`): a chat becomes
`POST /v1/chat/completions`. `/v1/generate` becomes a chat
completion with the prompt as the user turn (and `system` as a system turn), because Ollama's
generate applies the model's chat template to the prompt (reference section 2.1, `raw` and
`template`); with `raw: true` it becomes `POST /v1/completions` with the prompt as is. The upstream
is always asked to stream with `stream_options.include_usage`, so token counts arrive even when the
client asked for neither (field failure F-17).

Answers: SSE events (`data: {...}`, ending in `data: [DONE]`, reference section 7.1) become
neutral chunks, and a final chunk carries `done_reason` and `Stats`: `prompt_eval_count` and
`eval_count` (from the upstream's usage, else counted chunks) and durations in nanoseconds
measured by the gateway: `prompt_eval_duration` from sending the request to the first token,
`eval_duration` from the measured decode rate (see `SseDecoder._eval_seconds`),
`total_duration` from the request's arrival.

Over ~300 lines for one reason: `SseDecoder` decodes what `OpenAIDialect.build_request` asked for (a
stream, with usage), and its `Stats` rely on that request (the upstream's usage, counted chunks as
the fallback); the translation of Ollama bodies is in `openai_request` already.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from gateway.neutral import Chunk, GenerationRequest, Stats, TokenClock, ToolCall
from gateway.upstream.dialects.base import (
    MAX_LINE_BYTES,
    AnswerTooLongError,
    ModelInfo,
    StreamBrokenError,
    UpstreamCall,
    WithoutLane,
)
from gateway.upstream.dialects.framing import (
    BodyDecoder,
    LineSplitter,
    encode_body,
    trusted_count,
)
from gateway.upstream.dialects.json_codec import decode_object
from gateway.upstream.dialects.openai_request import (
    embeds_nothing,
    to_openai_embedding,
    to_openai_request,
)
from gateway.wire.json import parse_listing

#: OpenAI's `finish_reason` in Ollama's `done_reason` terms (the neutral chunk's).
_FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "eos": "stop"}


class OpenAIDialect:
    """An OpenAI-compatible upstream (`/v1/chat/completions`, `/v1/completions`, `/v1/models`)."""

    name = "openai"
    readiness_path = "/v1/models"
    reports_timings = False

    def build_request(self, request: GenerationRequest, headers: dict[str, str]) -> UpstreamCall:
        """Pass an OpenAI body through, or translate an Ollama one (module docstring)."""
        body = request.body
        if request.operation == "embed":
            if request.surface == "openai":
                payload = {k: v for k, v in body.items() if k != "encoding_format"}
            else:
                payload = to_openai_embedding(request)
            headers = {**headers, "content-type": "application/json"}
            return UpstreamCall("/v1/embeddings", encode_body(payload, request), headers)
        if request.surface == "openai":
            path = "/v1/chat/completions" if request.operation == "chat" else "/v1/completions"
            payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
            payload.pop("id_slot", None)  # llama.cpp's slot choice: one key's pick, others' cache
            bound = request.max_output_tokens
            if bound is not None:
                # The one bound the surface checked, under every name the client used, and as
                # `max_tokens`, which every OpenAI-compatible server knows (Ollama's /v1
                # ignores `max_completion_tokens`, reference section 7.1).
                for name in ("max_tokens", "max_completion_tokens", "n_predict"):
                    if name in body or name == "max_tokens":
                        payload[name] = bound
        else:
            path, payload = to_openai_request(request.operation, body)
        headers = {**headers, "content-type": "application/json", "accept": "text/event-stream"}
        return UpstreamCall(path, encode_body(payload, request), headers)

    def decoder(
        self, request: GenerationRequest, started: float, sent: float
    ) -> SseDecoder | BodyDecoder:
        """Return a decoder for one answer: SSE for generations (`SseDecoder`), else JSON."""
        if request.operation == "embed":
            empty = request.surface == "ollama" and embeds_nothing(request)
            return BodyDecoder(_no_embeddings if empty else _embeddings)
        return SseDecoder(started, sent)

    async def list_models(self, client: httpx.AsyncClient) -> list[ModelInfo]:
        """Read `GET /v1/models` (OpenAI list shape; `data` may be null, reference section 7.3).

        Raises:
            httpx.HTTPError: the request failed or returned an error status.
            ValueError: the answer is not a model list.
        """
        response = await client.get("/v1/models")
        response.raise_for_status()
        answer = parse_listing(response.content)
        data = (answer.get("data") if isinstance(answer, dict) else None) or []
        if not isinstance(data, list):
            raise ValueError("upstream /v1/models has no data list")
        return [
            ModelInfo(entry["id"], int(entry.get("created") or 0), str(entry.get("owned_by", "")))
            for entry in data
            if isinstance(entry, dict) and isinstance(entry.get("id"), str)
        ]


class SseDecoder(WithoutLane):
    """One SSE answer translated into neutral chunks. Times are `time.perf_counter()` seconds.

    Events are dispatched at the blank line that ends them; `data: [DONE]` brings the final
    chunk (and one with the collected tool calls before it, if any). An event cut off by EOF is
    dropped, as the SSE specification says.

    Raises (from `feed` and `end`):
        StreamBrokenError: a malformed or over-long event, or EOF before `data: [DONE]`.
    """

    def __init__(self, started: float, sent: float) -> None:
        self.started = started
        self.sent = sent
        self.finished = False
        self.tokens = TokenClock()
        self.finish_reason: str | None = None
        self.model: str | None = None  # as the first event names it
        self.usage: dict[str, Any] = {}
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self._lines = LineSplitter()
        self._data: list[bytes] = []  # the `data:` lines of the event being read
        self._data_bytes = 0  # their length, kept as they come (not summed per line)

    def feed(self, data: bytes) -> list[Chunk]:
        """Return the chunks of the events `data` completes (see `StreamDecoder.feed`)."""
        chunks: list[Chunk] = []
        try:
            for raw in () if self.finished else self._lines.feed(data):
                line = raw.rstrip(b"\r\n")
                if line.startswith(b"data:"):
                    value = line[5:].strip()
                    self._data.append(value)
                    self._data_bytes += len(value) + 1
                    if self._data_bytes > MAX_LINE_BYTES:
                        raise AnswerTooLongError("upstream sent an over-long SSE event")
                    continue
                if line or not self._data:
                    continue  # comments, `event:`/`id:` fields, keep-alive blank lines
                payload, self._data, self._data_bytes = b"\n".join(self._data), [], 0
                if payload == b"[DONE]":
                    self.finished = True
                    chunks.extend(self._finish())
                    break
                translated = self._translate_event(payload)
                if translated is not None:
                    chunks.append(translated)
                    if translated.error is not None:
                        self.finished = True
                        break
        except StreamBrokenError as exc:
            exc.chunks = chunks
            raise
        return chunks

    def end(self) -> list[Chunk]:
        """The body ended: nothing more to return, or `StreamBrokenError` before [DONE]."""
        if not self.finished:
            raise StreamBrokenError("upstream closed the stream before data: [DONE]")
        return []

    def _translate_event(self, payload: bytes) -> Chunk | None:
        event = decode_object(payload, "SSE event")
        if event is None:
            raise StreamBrokenError("upstream sent a malformed SSE event")
        if "error" in event:
            error = event["error"]
            message = error.get("message") if isinstance(error, dict) else error
            return Chunk.failure(str(message or "upstream error"))
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        if self.model is None and isinstance(event.get("model"), str):
            self.model = event["model"]
        choices = event.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._collect_tool_calls(delta.get("tool_calls"))
            text = delta.get("content") or ""
            thinking = delta.get("reasoning_content") or delta.get("reasoning") or ""
        else:
            text, thinking = choice.get("text") or "", ""
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if not isinstance(text, str) or not isinstance(thinking, str) or not (text or thinking):
            return None
        self.tokens.tick(time.perf_counter())
        return Chunk(
            text=text,
            thinking=thinking,
            logprobs=content if isinstance(content, list) else None,
        )

    def _collect_tool_calls(self, calls: object) -> None:
        """Accumulate streamed tool-call fragments (OpenAI streams `arguments` in pieces)."""
        if not isinstance(calls, list):
            return
        for call in calls:
            if not isinstance(call, dict):
                continue
            index = call.get("index")
            # The pieces are joined once in `_finish`: adding each to a string was quadratic
            # (a tool call of 100,000 deltas, a long patch an agent writes: 0.8 s of the loop).
            slot = self.tool_calls.setdefault(
                index if isinstance(index, int) else 0, {"name": [], "args": []}
            )
            function = call.get("function") or {}
            slot["id"] = call.get("id") or slot.get("id")
            slot["name"].append(str(function.get("name") or ""))
            slot["args"].append(str(function.get("arguments") or ""))

    def _finish(self) -> list[Chunk]:
        chunks = []
        if self.tool_calls:
            calls = [
                ToolCall(
                    "".join(slot["name"]), "".join(slot["args"]) or "{}", slot.get("id"), index
                )
                for index, slot in sorted(self.tool_calls.items())
            ]
            chunks.append(Chunk(tool_calls=calls))
        now = time.perf_counter()
        eval_count = trusted_count(self.usage.get("completion_tokens")) or self.tokens.count
        total = now - self.started
        prefill = (self.tokens.first or now) - self.sent
        # The decode time is extrapolated from the measured rate (one gap more than was seen),
        # so it may overshoot when the stream ends right after its last token; Ollama's
        # durations nest (reference section 9.1), so it is capped at what remains of the total.
        decode = min(self._eval_seconds(eval_count), max(total - prefill, 0.0))
        stats = Stats(
            prompt_eval_count=trusted_count(self.usage.get("prompt_tokens")),
            eval_count=eval_count or None,
            total_duration=_ns(total) or None,
            prompt_eval_duration=_ns(prefill) or None,
            eval_duration=_ns(decode) or None,
        )
        reason = _FINISH_REASONS.get(self.finish_reason or "stop", "stop")
        chunks.append(Chunk(done=True, done_reason=reason, stats=stats, model=self.model))
        return chunks

    def _eval_seconds(self, eval_count: int) -> float:
        """Decode time for `eval_count` tokens, from the measured pace (`TokenClock`).

        The first token arrives at the end of prefill, so the pace is measured after it, and
        `eval_duration = eval_count * pace`: a client computing `eval_count / eval_duration *
        1e9` (reference section 9.1) then gets the measured decode rate, without the upward
        bias of counting the first token.
        """
        pace = self.tokens.seconds_per_token()
        return 0.0 if pace is None else eval_count * pace


def _embeddings(data: dict[str, Any], raw: bytes) -> Chunk:  # noqa: ARG001 - BodyDecoder's parse
    """`/v1/embeddings`' answer (reference section 7.4) as the final chunk, vectors in order."""
    if "error" in data:
        error = data["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return Chunk.failure(str(message or "upstream error"))
    entries = sorted(data["data"], key=lambda entry: int(entry.get("index") or 0))
    vectors = [entry["embedding"] for entry in entries]
    if not all(isinstance(vector, list) for vector in vectors):
        raise ValueError("embedding is not a list of numbers")
    usage = data.get("usage") or {}
    stats = Stats(prompt_eval_count=trusted_count(usage.get("prompt_tokens")))
    model = data.get("model")
    return Chunk(
        done=True, embeddings=vectors, stats=stats, model=model if isinstance(model, str) else None
    )


def _no_embeddings(data: dict[str, Any], raw: bytes) -> Chunk:
    """The answer to an empty Ollama input: no vectors, no counts (reference section 6.6).

    The upstream embedded `LOAD_INPUT` in its place (`to_openai_embedding`); only its error,
    if any, is the client's.
    """
    if "error" in data:
        return _embeddings(data, raw)
    return Chunk(done=True, embeddings=[])


def _ns(seconds: float) -> int:
    """Convert seconds to whole nanoseconds, Ollama's duration unit (reference section 1)."""
    return max(int(seconds * 1e9), 0)

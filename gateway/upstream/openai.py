"""The `openai` dialect: serve Ollama-shaped requests from an OpenAI-compatible server.

Works in front of llama.cpp's server, llama-cpp-python, vLLM and LM Studio.

Requests: `/v1/chat` becomes `POST /v1/chat/completions`. `/v1/generate` becomes a chat
completion with the prompt as the user turn (and `system` as a system turn), because Ollama's
generate applies the model's chat template to the prompt (reference section 2.1, `raw` and
`template`); with `raw: true` it becomes `POST /v1/completions` with the prompt as is. The upstream
is always asked to stream with `stream_options.include_usage`, so token counts arrive even when the
client asked for neither (field failure F-17).

Answers: SSE events (`data: {...}`, ending in `data: [DONE]`, reference section 7.1) become
Ollama chunks, and a final `done: true` chunk carries `done_reason`, `prompt_eval_count` and
`eval_count` (from the upstream's usage, else counted chunks) and durations in nanoseconds
measured by the gateway: `prompt_eval_duration` from sending the request to the first token,
`eval_duration` from the measured decode rate (see `SseDecoder._eval_seconds`),
`total_duration` from the request's arrival.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from gateway.upstream.dialect import (
    MAX_LINE_BYTES,
    Chunk,
    LineSplitter,
    ModelInfo,
    Route,
    StreamBrokenError,
    UpstreamCall,
    decode_object,
    encode_json,
    rfc3339_now,
)
from gateway.upstream.openai_request import to_openai_request

_FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "eos": "stop"}


class OpenAIDialect:
    """An OpenAI-compatible upstream (`/v1/chat/completions`, `/v1/completions`, `/v1/models`)."""

    name = "openai"
    readiness_path = "/v1/models"
    reports_timings = False

    def build_request(
        self, route: Route, body: dict[str, Any], headers: dict[str, str]
    ) -> UpstreamCall:
        """Translate the Ollama-shaped body (see the module docstring)."""
        path, payload = to_openai_request(route, body)
        headers = {**headers, "content-type": "application/json", "accept": "text/event-stream"}
        return UpstreamCall(path, encode_json(payload), headers)

    def decoder(
        self, route: Route, body: dict[str, Any], started: float, sent: float
    ) -> SseDecoder:
        """Return a decoder translating one SSE answer into Ollama chunks (`SseDecoder`)."""
        return SseDecoder(route, str(body.get("model", "")), started, sent)

    async def list_models(self, client: httpx.AsyncClient) -> list[ModelInfo]:
        """Read `GET /v1/models` (OpenAI list shape; `data` may be null, reference section 7.3).

        Raises:
            httpx.HTTPError: the request failed or returned an error status.
            ValueError: the answer is not a model list.
        """
        response = await client.get("/v1/models")
        response.raise_for_status()
        answer = response.json()
        data = (answer.get("data") if isinstance(answer, dict) else None) or []
        if not isinstance(data, list):
            raise ValueError("upstream /v1/models has no data list")
        return [
            ModelInfo(entry["id"], int(entry.get("created") or 0), str(entry.get("owned_by", "")))
            for entry in data
            if isinstance(entry, dict) and isinstance(entry.get("id"), str)
        ]


class SseDecoder:
    """One SSE answer translated into NDJSON chunks. Times are `time.perf_counter()` seconds.

    Events are dispatched at the blank line that ends them; `data: [DONE]` brings the final
    chunk (and one with the collected tool calls before it, if any). An event cut off by EOF is
    dropped, as the SSE specification says.

    Raises (from `feed` and `end`):
        StreamBrokenError: a malformed or over-long event, or EOF before `data: [DONE]`.
    """

    def __init__(self, route: Route, model: str, started: float, sent: float) -> None:
        self.route = route
        self.model = model
        self.started = started
        self.sent = sent
        self.finished = False
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.chunks_with_text = 0
        self.finish_reason: str | None = None
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
                        raise StreamBrokenError("upstream sent an over-long SSE event")
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
                    if translated.is_error:
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
            return Chunk.error(str(message or "upstream error"))
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        choices = event.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        delta = choice.get("delta") if self.route == "chat" or "delta" in choice else None
        if isinstance(delta, dict):
            self._collect_tool_calls(delta.get("tool_calls"))
            text = delta.get("content") or ""
            thinking = delta.get("reasoning_content") or delta.get("reasoning") or ""
        else:
            text, thinking = choice.get("text") or "", ""
        if not text and not thinking:
            return None
        now = time.perf_counter()
        self.first_token = self.first_token or now
        self.last_token = now
        self.chunks_with_text += 1
        return Chunk.from_data(self._chunk(text, thinking, done=False))

    def _collect_tool_calls(self, calls: object) -> None:
        """Accumulate streamed tool-call fragments (OpenAI streams `arguments` in pieces)."""
        if not isinstance(calls, list):
            return
        for call in calls:
            if not isinstance(call, dict):
                continue
            index = call.get("index")
            slot = self.tool_calls.setdefault(
                index if isinstance(index, int) else 0, {"name": "", "args": ""}
            )
            function = call.get("function") or {}
            slot["id"] = call.get("id") or slot.get("id")
            slot["name"] += str(function.get("name") or "")
            slot["args"] += str(function.get("arguments") or "")

    def _finish(self) -> list[Chunk]:
        chunks = []
        if self.tool_calls:
            calls = [_ollama_tool_call(i, slot) for i, slot in sorted(self.tool_calls.items())]
            data = self._chunk("", "", done=False)
            data["message"]["tool_calls"] = calls
            chunks.append(Chunk.from_data(data))
        now = time.perf_counter()
        final = self._chunk("", "", done=True)
        final["done_reason"] = _FINISH_REASONS.get(self.finish_reason or "stop", "stop")
        eval_count = int(self.usage.get("completion_tokens") or self.chunks_with_text)
        metrics = {
            "total_duration": _ns(now - self.started),
            "prompt_eval_count": int(self.usage.get("prompt_tokens") or 0),
            "prompt_eval_duration": _ns((self.first_token or now) - self.sent),
            "eval_count": eval_count,
            "eval_duration": _ns(self._eval_seconds(eval_count)),
        }
        # Ollama omits zero metrics (`omitempty`, reference section 1); so do we.
        final.update({name: value for name, value in metrics.items() if value})
        chunks.append(Chunk.from_data(final))
        return chunks

    def _eval_seconds(self, eval_count: int) -> float:
        """Decode time for `eval_count` tokens, from the measured chunk rate.

        The first token arrives at the end of prefill, so the decode rate is measured as
        `(chunks - 1) / (t_last - t_first)` and `eval_duration = eval_count / rate`: a client
        computing `eval_count / eval_duration * 1e9` (reference section 9.1) then gets the
        measured decode rate, without the upward bias of counting the first token.
        """
        if self.first_token is None or self.last_token is None or self.chunks_with_text < 2:
            return 0.0
        span = self.last_token - self.first_token
        return eval_count * span / (self.chunks_with_text - 1)

    def _chunk(self, text: str, thinking: str, *, done: bool) -> dict[str, Any]:
        data: dict[str, Any] = {"model": self.model, "created_at": rfc3339_now()}
        if self.route == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            data["message"] = message
        else:
            data["response"] = text
            if thinking:
                data["thinking"] = thinking
        data["done"] = done
        return data


def _ollama_tool_call(index: int, slot: dict[str, Any]) -> dict[str, Any]:
    """Build a native tool call; `arguments` is an object there (reference section 3.1)."""
    try:
        arguments = json.loads(slot["args"]) if slot["args"] else {}
    except ValueError:
        arguments = {"_raw": slot["args"]}
    call: dict[str, Any] = {
        "function": {"index": index, "name": slot["name"], "arguments": arguments}
    }
    if slot.get("id"):
        call["id"] = slot["id"]
    return call


def _ns(seconds: float) -> int:
    """Convert seconds to whole nanoseconds, Ollama's duration unit (reference section 1)."""
    return max(int(seconds * 1e9), 0)

"""The OpenAI-compatible face of the Ollama emulator: `/v1` wire shapes and generation routes.

Owns how the emulator speaks reference §7 in its current (>= v0.32.6) shape: the chunk, finish,
usage and error objects of `/v1/chat/completions` and `/v1/completions` (with llama.cpp server's
`timings` when `llamacpp_timings` is set), tool calls (streamed as
`delta.tool_calls` fragments whose `arguments` JSON string arrives in pieces, as OpenAI and
vLLM send it; `finish_reason: "tool_calls"`), `logprobs.content`, and the routes that serve
them. Which request fields matter is `gateway.testing.emulator.openai_request`'s business; what
the answer says is `content`'s. Timing, faults and framing (`data: ...` events) live in
`gateway.testing.emulator.engine`, which drives the two dialect classes here through the
`Dialect` protocol (`gateway.testing.emulator.dialect`); the engine imports nothing from here,
so the dependency runs one way. `/v1/models` and `/v1/embeddings` live in `models` and
`embed`.

Over ~300 lines for one reason: the two dialect classes share the envelope, usage, finish reason and
tool-call rendering above them, and the routes at the end (`_openai`) only pick one and hand it to
the engine; split, the shapes of reference §7 would be spread over modules.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from gateway.testing.emulator.content import (
    Shape,
    choose_tool_call,
    json_document,
    token_logprob,
)
from gateway.testing.emulator.engine import Endpoint, answer
from gateway.testing.emulator.openai_request import OpenAIAsk, parse_request
from gateway.testing.emulator.state import request_context
from gateway.testing.emulator.wire import encode_json, json_response, read_json

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp

    from gateway.testing.emulator.dialect import Event, Piece, Summary, ToolCall

# openai/openai.go NewError: 400 and 404 have their own types, every other status is api_error.
_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def error_object(status: int, message: str) -> dict[str, Any]:
    """Build the OpenAI error body Ollama's middleware writes (reference §4.1, §4.4).

    Args:
        status: The HTTP status the error goes out with.
        message: The native error text, passed through unchanged.

    Returns:
        `{"error": {"message", "type", "param": null, "code": null}}`.
    """
    kind = _ERROR_TYPES.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _usage(summary: Summary | None) -> dict[str, Any]:
    """Map the native counts to OpenAI usage (`ToUsage`); a missing final chunk counts as zero.

    With a prefix cache, `prompt_tokens_details.cached_tokens` as OpenAI and vLLM report it.
    """
    prompt = summary.prompt_eval_count if summary else 0
    completion = summary.eval_count if summary else 0
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if summary is not None and summary.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": summary.cached_tokens}
    return usage


def openai_tool_call(call: ToolCall, index: int = 0) -> dict[str, Any]:
    """Render a whole tool call: `arguments` is a JSON string on this face (§3.1, §7.1)."""
    function = {"name": call.name, "arguments": encode_json(call.arguments)}
    return {"id": call.id, "index": index, "type": "function", "function": function}


def _tool_call_deltas(call: ToolCall) -> list[dict[str, Any]]:
    """Stream one call as OpenAI does: id, type and name first, then `arguments` in two pieces."""
    arguments = encode_json(call.arguments)
    half = len(arguments) // 2
    function = {"name": call.name, "arguments": ""}
    head = {"index": 0, "id": call.id, "type": "function", "function": function}
    parts = (arguments[:half], arguments[half:])
    return [head] + [{"index": 0, "function": {"arguments": part}} for part in parts]


def _finish_reason(summary: Summary | None) -> str | None:
    """`tool_calls` when a call was made and the model stopped by itself (§7.1)."""
    if summary is None:
        return None
    return (
        "tool_calls"
        if summary.tool_called and summary.done_reason == "stop"
        else summary.done_reason
    )


class _OpenAIDialect:
    """What both `/v1` generation endpoints share: ids, the chunk envelope and SSE media type."""

    sse = True
    media_type = "text/event-stream"
    _object = ""
    _id_prefix = ""

    def __init__(
        self, ask: OpenAIAsk, *, number: int, created: int, omit_usage: bool, timings: bool = False
    ) -> None:
        self._model = ask.model
        # Ollama draws `rand.Intn(999)`, so ids collide; a counter keeps tests deterministic.
        self._id = f"{self._id_prefix}-{number % 999}"
        self._created = created
        self._omit_usage = omit_usage
        self._stream_usage = ask.include_usage and not omit_usage
        self._logprobs = ask.logprobs
        self._timings = timings  # llama.cpp server's `timings` on the last chunk and the body

    def _logprobs_of(self, pieces: list[Piece]) -> dict[str, Any]:
        """`{"logprobs": {"content": [...]}}` for the pieces' tokens, when asked (§7.1)."""
        if self._logprobs is None:
            return {}
        content = [
            token_logprob(piece.content, self._logprobs) for piece in pieces if piece.content
        ]
        return {"logprobs": {"content": content}} if content else {}

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """Render an error sent before the first byte."""
        return error_object(status, message)

    def _envelope(
        self, choices: list[dict[str, Any]], *, model: str | None = None
    ) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": self._object,
            "created": self._created,
            "model": self._model if model is None else model,
            "system_fingerprint": "fp_ollama",
            "choices": choices,
        }

    def _usage_chunk(self, summary: Summary) -> list[Event]:
        """The `choices: []` usage chunk that follows the finish chunk, when requested."""
        if not self._stream_usage:
            return []
        return [{**self._envelope([]), "usage": _usage(summary)}]

    def _with_usage(self, body: dict[str, Any], summary: Summary | None) -> dict[str, Any]:
        if not self._omit_usage:
            body["usage"] = _usage(summary)
        if self._timings and summary is not None:
            body["timings"] = summary.llamacpp_timings()
        return body

    def _ending(self, finish: Event, summary: Summary) -> list[Event]:
        """The finish chunk, the usage chunk when asked, `[DONE]`; `timings` on the last chunk."""
        chunks = [finish, *self._usage_chunk(summary)]
        if self._timings and isinstance(last := chunks[-1], dict):
            chunks[-1] = {**last, "timings": summary.llamacpp_timings()}
        return [*chunks, "[DONE]"]


class ChatCompletionDialect(_OpenAIDialect):
    """Renders `/v1/chat/completions` (reference §7.1, the >= v0.32.6 chunk shape)."""

    _object = "chat.completion.chunk"
    _id_prefix = "chatcmpl"

    def _delta(self, delta: dict[str, Any], pieces: list[Piece] | None = None) -> Event:
        logprobs = self._logprobs_of(pieces or [])
        return self._envelope([{"index": 0, "delta": delta, **logprobs, "finish_reason": None}])

    def chunk(self, piece: Piece, index: int) -> list[Event]:
        """Render one token: the role rides on the first chunk only; thinking is `reasoning`.

        A tool call becomes three chunks (id and name, then two `arguments` fragments).
        """
        role: dict[str, Any] = {"role": "assistant"} if index == 0 else {}
        if piece.tool_call is not None:
            parts = _tool_call_deltas(piece.tool_call)
            return [
                self._delta({**(role if i == 0 else {}), "tool_calls": [part]})
                for i, part in enumerate(parts)
            ]
        delta = dict(role)
        if piece.content or not piece.thinking:
            delta["content"] = piece.content
        if piece.thinking:
            delta["reasoning"] = piece.thinking
        return [self._delta(delta, [piece])]

    def finish(self, summary: Summary) -> list[Event]:
        """Render the separate `delta: {}` finish chunk, the optional usage chunk, `[DONE]`."""
        choice = {"index": 0, "delta": {}, "finish_reason": _finish_reason(summary)}
        return self._ending(self._envelope([choice]), summary)

    def midstream_error(self, message: str) -> list[Event]:  # noqa: ARG002 - Ollama drops it
        """Render a mid-stream error the way Ollama's middleware does (reference §4.4).

        The `{"error": ...}` line decodes into an all-zero `ChatResponse`, which goes out as an
        ordinary chunk with an empty content delta and an empty model; no `[DONE]` follows.
        """
        choice = {"index": 0, "delta": {"content": ""}, "finish_reason": None}
        return [self._envelope([choice], model="")]

    def body(self, pieces: list[Piece], summary: Summary | None) -> dict[str, Any]:
        """Render the `stream: false` answer; `summary` is None when no final chunk came."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(piece.content for piece in pieces),
        }
        reasoning = "".join(piece.thinking for piece in pieces)
        if reasoning:
            message["reasoning"] = reasoning
        calls = [piece.tool_call for piece in pieces if piece.tool_call is not None]
        if calls:
            message["tool_calls"] = [openai_tool_call(call, i) for i, call in enumerate(calls)]
        choice = {
            "index": 0,
            "message": message,
            **self._logprobs_of(pieces),
            "finish_reason": _finish_reason(summary),
        }
        return self._with_usage({**self._envelope([choice]), "object": "chat.completion"}, summary)


class CompletionDialect(_OpenAIDialect):
    """Renders `/v1/completions` (reference §7.2)."""

    _object = "text_completion"
    _id_prefix = "cmpl"

    def _text_chunk(
        self, text: str, finish_reason: str | None, *, model: str | None = None
    ) -> Event:
        chunk = self._envelope(
            [{"text": text, "index": 0, "finish_reason": finish_reason}], model=model
        )
        if self._stream_usage:
            # CompleteWriter: with include_usage every chunk carries zero usage, not null.
            chunk["usage"] = _usage(None)
        return chunk

    def chunk(self, piece: Piece, index: int) -> list[Event]:  # noqa: ARG002 - protocol
        """Render one token; thinking has no place in a text completion and is dropped."""
        return [self._text_chunk(piece.content, None)]

    def finish(self, summary: Summary) -> list[Event]:
        """Render the empty-text finish chunk, the optional usage chunk, `[DONE]`."""
        return self._ending(self._text_chunk("", summary.done_reason), summary)

    def midstream_error(self, message: str) -> list[Event]:  # noqa: ARG002 - Ollama drops it
        """Render a mid-stream error as an empty-text chunk with no `[DONE]` (reference §4.4)."""
        return [self._text_chunk("", None, model="")]

    def body(self, pieces: list[Piece], summary: Summary | None) -> dict[str, Any]:
        """Render the `stream: false` answer; `summary` is None when no final chunk came."""
        choice = {
            "text": "".join(piece.content for piece in pieces),
            "index": 0,
            "finish_reason": summary.done_reason if summary else None,
        }
        return self._with_usage(self._envelope([choice]), summary)


async def _openai(request: Request, *, chat: bool) -> ASGIApp:
    """`POST /v1/chat/completions` (§7.1) and `POST /v1/completions` (§7.2)."""
    state, config, record = request_context(request)
    struct = "openai.ChatCompletionRequest" if chat else "openai.CompletionRequest"
    # gin's ShouldBindJSON reports an empty body as io.EOF's text; only /api/* rewords it.
    error = await read_json(request, record, struct, "EOF")
    parsed = parse_request(record.body, chat=chat) if error is None else (400, error)
    if isinstance(parsed, tuple):
        return json_response(parsed[0], error_object(*parsed))
    if chat and not parsed.model:
        return json_response(400, error_object(400, "model is required"))
    kind = ChatCompletionDialect if chat else CompletionDialect
    number, created = state.next_id(), int(time.time())
    omit, timings = config.omit_usage, config.llamacpp_timings
    dialect = kind(parsed, number=number, created=created, omit_usage=omit, timings=timings)
    try:
        document = json_document(parsed.format, config.tokens)
    except ValueError as exc:
        return json_response(500, error_object(500, str(exc)))
    messages = record.body.get("messages") if isinstance(record.body, dict) else None
    call = choose_tool_call(parsed.tools, config, f"{number}", messages)
    return answer(
        dialect,
        config,
        record,
        capacity=state.capacity,
        model=parsed.model,
        stream=parsed.stream,
        limit=parsed.max_tokens,
        shape=Shape(document=document, tool_call=call),
    )


async def _chat_completions(request: Request) -> ASGIApp:
    return await _openai(request, chat=True)


async def _completions(request: Request) -> ASGIApp:
    return await _openai(request, chat=False)


ROUTES = (
    Route("/v1/chat/completions", Endpoint(_chat_completions), methods=["POST"]),
    Route("/v1/completions", Endpoint(_completions), methods=["POST"]),
)
"""The `/v1` generation routes, in the order `create_emulator_app` mounts them."""

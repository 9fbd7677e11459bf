"""The OpenAI-compatible face of the Ollama emulator: `/v1` request options, wire shapes, routes.

Owns how the emulator speaks reference §7 in its current (>= v0.32.6) shape: the request fields
that change an answer (`stream`, `stream_options.include_usage`, `max_tokens`), the chunk, finish,
usage and error objects of `/v1/chat/completions` and `/v1/completions`, the `/v1/models` list,
and the routes that serve them. Timing, faults and framing (`data: ...` events) live in
`gateway.testing.emulator_engine`, which drives the two dialect classes here through the
`Dialect` protocol (`gateway.testing.emulator_dialect`); the engine imports nothing from here,
so the dependency runs one way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from gateway.testing.emulator_engine import Endpoint, answer
from gateway.testing.emulator_state import request_context
from gateway.testing.emulator_wire import json_response, read_json

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp

    from gateway.testing.emulator_dialect import Event, Piece, Summary

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


def model_list(models: list[str], created: int) -> dict[str, Any]:
    """Build the `GET /v1/models` body (reference §7.3).

    Args:
        models: Model names as `/api/tags` lists them.
        created: Unix time to report as each model's `created`.

    Returns:
        The list object. `data` is null, not `[]`, when there are no models (Go `var data []Model`).
    """
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": _namespace(name)}
        for name in models
    ]
    return {"object": "list", "data": data or None}


def _namespace(name: str) -> str:
    """Return the namespace part of `[host/]namespace/model:tag`, `library` when there is none."""
    parts = name.split(":", 1)[0].split("/")
    return parts[-2] if len(parts) >= 2 else "library"


@dataclass(frozen=True)
class OpenAIAsk:
    """The parts of a `/v1` request body that change the emulator's answer (reference §7.1, §7.2).

    Attributes:
        model: The requested model name ("" when missing).
        stream: Whether to answer with SSE. `/v1` defaults to false, unlike `/api/*`.
        max_tokens: The output limit (`num_predict`), or None for no limit. There is no
            `max_completion_tokens`: Ollama silently ignores it.
        include_usage: `stream_options.include_usage`.
    """

    model: str
    stream: bool
    max_tokens: int | None
    include_usage: bool


def parse_request(body: dict[str, Any], *, chat: bool) -> OpenAIAsk | tuple[int, str]:
    """Read the answer-changing fields of a decoded `/v1` body.

    Args:
        body: The request body, already decoded to a JSON object.
        chat: True for `/v1/chat/completions`, false for `/v1/completions`.

    Returns:
        The options, or `(status, message)` for a request Ollama's middleware rejects.
    """
    if chat and not body.get("messages"):
        return 400, "[] is too short - 'messages'"
    max_tokens = body.get("max_tokens")
    stream_options = body.get("stream_options")
    return OpenAIAsk(
        model=body.get("model") or "",
        stream=body.get("stream") is True,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        include_usage=isinstance(stream_options, dict)
        and stream_options.get("include_usage") is True,
    )


def _usage(summary: Summary | None) -> dict[str, int]:
    """Map the native counts to OpenAI usage (`ToUsage`); a missing final chunk counts as zero."""
    prompt = summary.prompt_eval_count if summary else 0
    completion = summary.eval_count if summary else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class _OpenAIDialect:
    """What both `/v1` generation endpoints share: ids, the chunk envelope and SSE media type."""

    sse = True
    media_type = "text/event-stream"
    _object = ""
    _id_prefix = ""

    def __init__(self, ask: OpenAIAsk, *, number: int, created: int, omit_usage: bool) -> None:
        self._model = ask.model
        # Ollama draws `rand.Intn(999)`, so ids collide; a counter keeps tests deterministic.
        self._id = f"{self._id_prefix}-{number % 999}"
        self._created = created
        self._omit_usage = omit_usage
        self._stream_usage = ask.include_usage and not omit_usage

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
        return body


class ChatCompletionDialect(_OpenAIDialect):
    """Renders `/v1/chat/completions` (reference §7.1, the >= v0.32.6 chunk shape)."""

    _object = "chat.completion.chunk"
    _id_prefix = "chatcmpl"

    def chunk(self, piece: Piece, index: int) -> list[Event]:
        """Render one token: the role rides on the first chunk only; thinking is `reasoning`."""
        delta: dict[str, Any] = {"role": "assistant"} if index == 0 else {}
        if piece.content or not piece.thinking:
            delta["content"] = piece.content
        if piece.thinking:
            delta["reasoning"] = piece.thinking
        return [self._envelope([{"index": 0, "delta": delta, "finish_reason": None}])]

    def finish(self, summary: Summary) -> list[Event]:
        """Render the separate `delta: {}` finish chunk, the optional usage chunk, `[DONE]`."""
        choice = {"index": 0, "delta": {}, "finish_reason": summary.done_reason}
        return [self._envelope([choice]), *self._usage_chunk(summary), "[DONE]"]

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
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": summary.done_reason if summary else None,
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
        finish = self._text_chunk("", summary.done_reason)
        return [finish, *self._usage_chunk(summary), "[DONE]"]

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
    dialect = kind(parsed, number=number, created=created, omit_usage=config.omit_usage)
    return answer(
        dialect, config, record, model=parsed.model, stream=parsed.stream, limit=parsed.max_tokens
    )


async def _chat_completions(request: Request) -> ASGIApp:
    return await _openai(request, chat=True)


async def _completions(request: Request) -> ASGIApp:
    return await _openai(request, chat=False)


async def _models(request: Request) -> ASGIApp:
    state, config, _ = request_context(request)
    return json_response(200, model_list(config.models, int(state.booted_at)))


ROUTES = (
    Route("/v1/models", Endpoint(_models), methods=["GET"]),
    Route("/v1/chat/completions", Endpoint(_chat_completions), methods=["POST"]),
    Route("/v1/completions", Endpoint(_completions), methods=["POST"]),
)
"""The `/v1` routes, in the order `create_emulator_app` mounts them."""

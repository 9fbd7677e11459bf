"""OpenAI request bodies (reference section 7) checked into neutral requests.

Only what the gateway itself reads is checked; every other field reaches an OpenAI-compatible
upstream as the client sent it, and is translated or dropped for an Ollama upstream
(`gateway.upstream.dialects.ollama_request`). Shape errors are 422 with OpenAI's error object
(`gateway.errors`), naming the parameter.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import BadRequestError, UnprocessableError
from gateway.limits.estimate import prompt_bytes, text_bytes
from gateway.neutral import GenerationRequest
from gateway.settings import Settings
from gateway.wire.json import check_spelling, parse_object


def parse_chat(raw: bytes, settings: Settings) -> GenerationRequest:
    """Check a `/v1/chat/completions` body.

    Raises:
        BadRequestError: see `gateway.wire.json.parse_object`.
        UnprocessableError: `messages` missing, empty or not a list of objects with a string
            `role`; a bad `max_tokens`, `n` or `stream_options`.
    """
    body = _parse(raw, settings)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise UnprocessableError("messages must be a non-empty list")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise UnprocessableError("each message must be an object with a role")
        check_spelling(message, "message")
    return openai_generation(body, "chat", len(raw))


def parse_completion(raw: bytes, settings: Settings) -> GenerationRequest:
    """Check a `/v1/completions` body (`prompt` a string, or a list of one string).

    Raises:
        BadRequestError: see `gateway.wire.json.parse_object`.
        UnprocessableError: `prompt` is neither; a bad `max_tokens`, `n` or `stream_options`.
    """
    body = _parse(raw, settings)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise UnprocessableError("prompt must be a string (token arrays are not supported)")
    return openai_generation(body, "generate", len(raw))


def parse_embeddings(raw: bytes, settings: Settings) -> GenerationRequest:
    """Check a `/v1/embeddings` body (section 7.4).

    Raises:
        BadRequestError: see `gateway.wire.json.parse_object`; `encoding_format` other than
            `float` or `base64` (as Ollama and OpenAI answer it).
        UnprocessableError: `input` not a string or a list of strings (token arrays are not
            supported), `dimensions` not a positive integer.
    """
    body = _parse(raw, settings)
    texts = body.get("input")
    if isinstance(texts, str):
        size = text_bytes(texts)
    elif isinstance(texts, list) and texts and all(isinstance(text, str) for text in texts):
        size = sum(map(text_bytes, texts))
    else:
        raise UnprocessableError("input must be a string or a non-empty list of strings")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise BadRequestError("encoding_format must be 'float' or 'base64'")
    if "dimensions" in body and not _positive(body["dimensions"]):
        raise UnprocessableError("dimensions must be a positive integer")
    return GenerationRequest(
        surface="openai",
        operation="embed",
        body=body,
        model=body["model"],
        stream=False,
        max_output_tokens=0,
        prompt_bytes=size,
        body_bytes=len(raw),
    )


#: The names an output bound goes by: OpenAI's two, and llama.cpp's own (which it reads first).
#: The request's bound is the largest given, and every dialect sends that one bound (what the
#: TPM reservation was made from is what the upstream obeys).
OUTPUT_BOUNDS = ("max_tokens", "max_completion_tokens", "n_predict")


def openai_generation(body: dict[str, Any], operation: Any, body_bytes: int) -> GenerationRequest:
    """The neutral request of a chat or completion body, its common fields checked.

    Also what the surfaces that translate their bodies into a chat body use
    (`gateway.api.responses`, `gateway.api.anthropic`): `body` is then theirs, translated.

    Its prompt size is every field but the few that are not prompt text (tools, tool calls,
    `response_format` and names count: `gateway.limits.estimate.prompt_bytes`).

    Raises:
        UnprocessableError: an output bound that is not a positive integer; `n` or `best_of`
            other than 1 (one choice per request; more would multiply the output the TPM
            reservation counted); `lora` (a per-request adapter would change the model after
            the allow-list check); `stream_options` not an object.
    """
    bounds = []
    for name in OUTPUT_BOUNDS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not _positive(value):
            raise UnprocessableError(f"{name} must be a positive integer")
        bounds.append(value)
    limit = max(bounds) if bounds else None
    for name in ("n", "best_of"):
        if body.get(name) is not None and body[name] != 1:
            raise UnprocessableError(f"{name} must be 1: one choice per request is supported")
    if "lora" in body:
        raise UnprocessableError("lora: per-request adapters are not accepted by the gateway")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise UnprocessableError("stream_options must be an object")
    stream = bool(body.get("stream", False))  # OpenAI's default: one object
    return GenerationRequest(
        surface="openai",
        operation=operation,
        body=body,
        model=body["model"],
        stream=stream,
        include_usage=stream and bool((options or {}).get("include_usage")),
        max_output_tokens=limit,
        prompt_bytes=prompt_bytes(body),
        body_bytes=body_bytes,
    )


def _parse(raw: bytes, settings: Settings) -> dict[str, Any]:
    return parse_object(raw, max_depth=settings.max_json_depth, max_values=settings.max_json_values)


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0

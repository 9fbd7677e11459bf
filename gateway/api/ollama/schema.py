"""Ollama request bodies (reference sections 2.1, 3.1, 6.6) checked into neutral requests.

Only what the gateway itself reads is checked (model, stream, options, messages); every other
field reaches an Ollama upstream as the client sent it. The TPM estimate counts every field but
the few that are not prompt text (`gateway.limits.estimate.prompt_bytes`).
"""

from __future__ import annotations

from typing import Any

from gateway.errors import UnprocessableError
from gateway.limits.estimate import prompt_bytes, text_bytes
from gateway.neutral import GenerationRequest, Operation
from gateway.settings import Settings
from gateway.wire.json import check_spelling, parse_object


def parse_generation(raw: bytes, operation: Operation, settings: Settings) -> GenerationRequest:
    """Check a `/api/generate` or `/api/chat` body (also `/v1/generate`, `/v1/chat`).

    Raises:
        BadRequestError: see `gateway.wire.json.parse_object`; a message key not lowercase.
        UnprocessableError: the wrong shape: `options` not an object, `messages` not a list
            of objects, `prompt` not a string.
    """
    body = _parse(raw, settings)
    options = body.get("options")
    if "options" in body and not isinstance(options, dict | None):
        raise UnprocessableError("options must be an object")
    if operation == "chat":
        messages = body.get("messages")
        if messages is not None and not (
            isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        ):
            raise UnprocessableError("messages must be a list of objects")
        for message in messages or ():
            check_spelling(message, "message")
    elif "prompt" in body and not isinstance(body["prompt"], str | None):
        raise UnprocessableError("prompt must be a string")
    limit = options.get("num_predict") if isinstance(options, dict) else None
    if isinstance(limit, float) and limit.is_integer():
        limit = int(limit)  # Ollama's options decoder takes 1e5 as 100000
    context = body.get("context")
    return GenerationRequest(
        surface="ollama",
        operation=operation,
        body=body,
        model=body["model"],
        stream=body.get("stream", True),
        max_output_tokens=limit if _positive(limit) else None,
        prompt_bytes=prompt_bytes(body),
        prompt_tokens=len(context) if isinstance(context, list) else 0,
        body_bytes=len(raw),
    )


def parse_embed(raw: bytes, settings: Settings, *, legacy: bool = False) -> GenerationRequest:
    """Check a `/api/embed` body, or a legacy `/api/embeddings` one (section 6.6).

    Raises:
        BadRequestError: see `gateway.wire.json.parse_object`.
        UnprocessableError: `input` not a string or a list of strings (`prompt` not a string
            for the legacy route), `dimensions` not a positive integer.
    """
    body = _parse(raw, settings)
    if legacy:
        texts: Any = body.get("prompt", "")
        if not isinstance(texts, str):
            raise UnprocessableError("prompt must be a string")
    else:
        texts = body.get("input", "")
        if not isinstance(texts, str) and not (
            isinstance(texts, list) and all(isinstance(text, str) for text in texts)
        ):
            raise UnprocessableError("invalid input type")  # Ollama's own words (section 6.6)
    if "dimensions" in body and not _positive(body["dimensions"]):
        raise UnprocessableError("dimensions must be a positive integer")
    size = text_bytes(texts) if isinstance(texts, str) else sum(map(text_bytes, texts))
    return GenerationRequest(
        surface="ollama",
        operation="embed",
        body=body,
        model=body["model"],
        stream=False,
        legacy=legacy,
        max_output_tokens=0,
        prompt_bytes=size,
        body_bytes=len(raw),
    )


def _parse(raw: bytes, settings: Settings) -> dict[str, Any]:
    return parse_object(raw, max_depth=settings.max_json_depth, max_values=settings.max_json_values)


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0

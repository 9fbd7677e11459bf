"""Reading and checking app request bodies before anything is sent upstream (field failure F-36).

Status codes: 413 for a body over the size limit, 400 for a body that is not JSON (what Ollama
answers, reference section 1: "Malformed JSON ... → 400"), 422 for JSON of the wrong shape.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import ClientDisconnect, Request

from gateway.errors import (
    BadRequestError,
    ClientClosedRequestError,
    PayloadTooLargeError,
    UnprocessableError,
)
from gateway.upstream.dialect import Route


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read the request body, refusing more than `max_bytes` without buffering the excess.

    Raises:
        PayloadTooLargeError: `Content-Length` or the bytes received exceed `max_bytes`.
        BadRequestError: `Content-Length` is not a number.
        ClientClosedRequestError: the client went away before the body was complete.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequestError("invalid Content-Length")
        if int(declared) > max_bytes:
            raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
    parts: list[bytes] = []
    size = 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > max_bytes:
                raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
            parts.append(part)
    except ClientDisconnect as exc:
        raise ClientClosedRequestError("client closed the connection") from exc
    return b"".join(parts)


#: Longest model name accepted (Ollama names are `namespace/name:tag`, far shorter).
MAX_MODEL_NAME = 256


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """Parse a JSON number; refuse ones that overflow to infinity (`1e999`)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _depth(value: Any, limit: int) -> int:
    """Return the nesting depth of `value`, stopping early once it passes `limit`."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
    return deepest


def parse_body(raw: bytes, route: Route, *, max_depth: int) -> dict[str, Any]:
    """Parse and check an Ollama-shaped generate or chat body (reference sections 2.1, 3.1).

    Args:
        raw: The request body.
        route: `generate` or `chat`.
        max_depth: Deepest nesting accepted.

    Returns:
        The body as a dict, with `model` a non-empty string.

    Raises:
        BadRequestError: empty body, invalid UTF-8, invalid JSON (including `NaN` and numbers
            that overflow), too deep.
        UnprocessableError: not an object, `model` missing, too long or not a string, `stream` not a
            bool, `messages` not a list, `prompt` not a string, `options` not an object.
    """
    if not raw.strip():
        raise BadRequestError("missing request body")
    try:
        body = json.loads(
            raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float
        )
    except UnicodeDecodeError as exc:
        raise BadRequestError("request body is not valid UTF-8") from exc
    except (ValueError, RecursionError) as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise UnprocessableError("request body must be a JSON object")
    if _depth(body, max_depth) > max_depth:
        raise BadRequestError(f"request body is nested deeper than {max_depth} levels")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise UnprocessableError("model is required")
    if len(model) > MAX_MODEL_NAME:
        raise UnprocessableError(f"model name is longer than {MAX_MODEL_NAME} characters")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise UnprocessableError("stream must be true or false")
    if "options" in body and not isinstance(body["options"], dict | None):
        raise UnprocessableError("options must be an object")
    if route == "chat":
        messages = body.get("messages")
        if messages is not None and not (
            isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        ):
            raise UnprocessableError("messages must be a list of objects")
    elif "prompt" in body and not isinstance(body["prompt"], str | None):
        raise UnprocessableError("prompt must be a string")
    return body

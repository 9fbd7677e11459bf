"""Translate Ollama-shaped request bodies into OpenAI-compatible ones (reference sections 2, 3, 7).

Pure functions, no I/O: easy to test field by field.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.neutral import GenerationRequest, Operation

#: Ollama `options` keys and their OpenAI-compatible names. `top_k`, `min_p`, `typical_p` and
#: `repeat_penalty` are extensions that llama.cpp's server, llama-cpp-python and vLLM accept.
_OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repeat_penalty",
}


def to_openai_request(route: Operation, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Return the upstream path and JSON payload for an Ollama-shaped body.

    Args:
        route: `generate` (Ollama `/api/generate` body) or `chat` (`/api/chat` body).
        body: The validated client body; `model` is a string.

    Returns:
        (`/v1/chat/completions` or `/v1/completions`, payload). The payload always streams
        with usage.
    """
    payload: dict[str, Any] = {
        "model": body["model"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if route == "chat":
        path = "/v1/chat/completions"
        payload["messages"] = [
            _message(m) for m in body.get("messages") or [] if isinstance(m, dict)
        ]
        if body.get("tools"):
            payload["tools"] = body["tools"]
        think = body.get("think")
        if isinstance(think, str) or think is False:
            payload["reasoning_effort"] = think or "none"
    elif body.get("raw"):
        path = "/v1/completions"
        payload["prompt"] = body.get("prompt") or ""
        if body.get("suffix"):
            payload["suffix"] = body["suffix"]
    else:
        path = "/v1/chat/completions"
        messages: list[dict[str, Any]] = []
        if body.get("system"):
            messages.append({"role": "system", "content": body["system"]})
        user = {"role": "user", "content": body.get("prompt") or ""}
        if body.get("images"):
            user["images"] = body["images"]
        messages.append(_message(user))
        payload["messages"] = messages
    options: dict[str, Any] = body.get("options") or {}
    payload.update({_OPTIONS[k]: v for k, v in options.items() if k in _OPTIONS})
    num_predict = options.get("num_predict")
    if isinstance(num_predict, int) and num_predict > 0:
        payload["max_tokens"] = num_predict
    elif path == "/v1/completions":
        # Ollama's default is "no limit" (num_predict -1, reference section 2.2); OpenAI-style
        # completion servers default to 16 tokens unless told otherwise. null means "no limit"
        # to llama-cpp-python and vLLM.
        payload["max_tokens"] = None
    if body.get("logprobs"):
        payload["logprobs"] = True
        if isinstance(body.get("top_logprobs"), int):
            payload["top_logprobs"] = body["top_logprobs"]
    response_format = _response_format(body.get("format"))
    if response_format:
        payload["response_format"] = response_format
    return path, payload


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """Translate one Ollama message (reference section 3.1) into an OpenAI chat message."""
    role = str(message.get("role", "user")).lower()
    content: Any = message.get("content") or ""
    images = message.get("images") or []
    if images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": content}]
        parts += [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}
            for image in images
        ]
        content = parts
    result: dict[str, Any] = {"role": role, "content": content}
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        result["tool_calls"] = [_tool_call(i, call) for i, call in enumerate(calls)]
    if role == "tool" and (message.get("tool_call_id") or message.get("tool_name")):
        result["tool_call_id"] = message.get("tool_call_id") or message.get("tool_name")
    return result


def _tool_call(index: int, call: dict[str, Any]) -> dict[str, Any]:
    """Native tool calls carry `arguments` as an object; OpenAI's as a JSON string (section 3.1)."""
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, separators=(",", ":"))
    return {
        "id": call.get("id") or f"call_{index}",
        "type": "function",
        "function": {"name": function.get("name", ""), "arguments": arguments},
    }


def _response_format(fmt: object) -> dict[str, Any] | None:
    """Map Ollama's `format` (`"json"` or a JSON Schema object) to `response_format`."""
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    return None


def to_openai_embedding(request: GenerationRequest) -> dict[str, Any]:
    """The `/v1/embeddings` payload for Ollama's `/api/embed` or legacy `/api/embeddings` body.

    `truncate` has no OpenAI counterpart: OpenAI-compatible servers refuse over-long input,
    which the client then sees as the upstream's 400.
    """
    body = request.body
    text = body.get("prompt", "") if request.legacy else body.get("input", "")
    payload: dict[str, Any] = {"model": body["model"], "input": text, "encoding_format": "float"}
    if isinstance(body.get("dimensions"), int):
        payload["dimensions"] = body["dimensions"]
    return payload

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
        payload["messages"] = _messages(body.get("messages") or [])
        if body.get("tools"):
            payload["tools"] = body["tools"]
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
    think = body.get("think")
    if path == "/v1/chat/completions" and (isinstance(think, str) or think is False):
        # A generate becomes a chat completion too, so its `think` (sections 2.1, 3.1) is as
        # much the model's to honour; `true` (think at the model's default) has no effort name.
        payload["reasoning_effort"] = think or "none"
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


def _messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Translate a chat history, tying each tool result to its call by the call's id.

    OpenAI ties a `tool` message to a call by `tool_call_id`; Ollama's history ties it by the
    tool's name (`tool_name`, reference section 3.1), or only by its place after the calls
    (older clients), and the ollama client sends calls without their ids. So calls without an
    id get one unique in the conversation, and a result without `tool_call_id` answers the
    first unanswered call of the last assistant turn with that tool's name (or with any name,
    when it names none).
    """
    result: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (tool name, call id) of the last calls made
    made = 0  # calls made so far: unique ids for calls that came without one
    for message in messages:
        if not isinstance(message, dict):
            continue
        translated = _message(message)
        calls = translated.get("tool_calls")
        if calls:
            for call in calls:
                if not call["id"]:
                    call["id"] = f"call_{made}"
                made += 1
            unanswered = [(call["function"]["name"], call["id"]) for call in calls]
        elif translated["role"] == "tool" and (call_id := _answered(message, unanswered)):
            translated["tool_call_id"] = call_id
        result.append(translated)
    return result


def _answered(message: dict[str, Any], unanswered: list[tuple[str, str]]) -> str:
    """The id of the call a tool message answers (see `_messages`), taken off `unanswered`."""
    given, name = message.get("tool_call_id"), message.get("tool_name")
    for position, (tool, call_id) in enumerate(unanswered):
        if call_id == given or (not given and (not name or tool == name)):
            del unanswered[position]
            return call_id
    return str(given or name or "")


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
    if role == "assistant" and isinstance(calls, list):
        translated = [_tool_call(call) for call in calls if isinstance(call, dict)]
        if translated:
            result["tool_calls"] = translated
    return result


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """Native tool calls carry `arguments` as an object; OpenAI's as a JSON string (section 3.1).

    `id` is "" when the call came without one (`_messages` gives it one).
    """
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    arguments = function.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, separators=(",", ":"))
    call_id = call.get("id")
    return {
        "id": call_id if isinstance(call_id, str) else "",
        "type": "function",
        "function": {"name": str(function.get("name") or ""), "arguments": arguments},
    }


def _response_format(fmt: object) -> dict[str, Any] | None:
    """Map Ollama's `format` (`"json"` or a JSON Schema object) to `response_format`."""
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    return None


#: What an empty Ollama embed input becomes upstream (see `to_openai_embedding`).
LOAD_INPUT = [" "]


def embeds_nothing(request: GenerationRequest) -> bool:
    """True for an Ollama embed body with no input (`""`, `[]` or none; legacy `prompt: ""`)."""
    body = request.body
    return not (body.get("prompt") if request.legacy else body.get("input"))


def to_openai_embedding(request: GenerationRequest) -> dict[str, Any]:
    """The `/v1/embeddings` payload for Ollama's `/api/embed` or legacy `/api/embeddings` body.

    `truncate` has no OpenAI counterpart: OpenAI-compatible servers refuse over-long input,
    which the client then sees as the upstream's 400. An empty input is Ollama's way to load
    the model: it answers no vectors (reference section 6.6), where OpenAI-compatible servers
    refuse an empty input with 400. So the smallest input they all take (`LOAD_INPUT`) goes
    instead, and `gateway.upstream.dialects.openai` answers no vectors.
    """
    body = request.body
    text = body.get("prompt", "") if request.legacy else body.get("input", "")
    if embeds_nothing(request):
        text = LOAD_INPUT
    payload: dict[str, Any] = {"model": body["model"], "input": text, "encoding_format": "float"}
    if isinstance(body.get("dimensions"), int):
        payload["dimensions"] = body["dimensions"]
    return payload

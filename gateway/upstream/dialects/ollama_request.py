"""Translate OpenAI request bodies into Ollama's native ones (reference sections 2, 3, 6.6, 7).

Pure functions, no I/O. The mapping is the one Ollama's own OpenAI layer applies
(`openai/openai.go`, reference section 7.1), so an OpenAI client gets from an Ollama upstream
behind the gateway what it would get from Ollama's `/v1` directly, except that the gateway
keeps the model's own sampling defaults (Ollama's `/v1` forces temperature and top_p to 1.0).
Fields Ollama has no place for (`tool_choice` other than `none`, `logit_bias`, `user`, `n`)
are dropped, as Ollama drops them.
"""

from __future__ import annotations

from typing import Any

from gateway.neutral import GenerationRequest
from gateway.wire.json import parse_arguments

#: OpenAI sampling fields and their Ollama `options` names (reference section 2.2).
_OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    # llama.cpp-style extensions some OpenAI clients send; Ollama knows them as options.
    "top_k": "top_k",
    "min_p": "min_p",
    "repeat_penalty": "repeat_penalty",
}


def to_ollama_request(request: GenerationRequest) -> tuple[str, dict[str, Any]]:
    """Return the Ollama path and body for an OpenAI-shaped request.

    Args:
        request: A checked request from the OpenAI surface.

    Returns:
        (`/api/chat`, `/api/generate` or `/api/embed`, body). Generations always stream.

    Raises:
        ValueError: a part Ollama cannot take (an image given by remote URL: Ollama accepts
            only inline `data:` images, reference section 7.1).
    """
    body = request.body
    if request.operation == "embed":
        # An empty string is one text to OpenAI, no input to Ollama (section 6.6): Ollama's
        # own layer sends it as [""] (section 7.4, `EmbeddingsMiddleware`), and one vector
        # comes back.
        given = body.get("input", "")
        payload: dict[str, Any] = {"model": body["model"], "input": given or [""]}
        if isinstance(body.get("dimensions"), int):
            payload["dimensions"] = body["dimensions"]
        return "/api/embed", payload
    payload = {"model": body["model"], "stream": True}
    options = {_OPTIONS[k]: v for k, v in body.items() if k in _OPTIONS and v is not None}
    if isinstance(options.get("stop"), str):
        # OpenAI takes one stop string or a list; Ollama's `stop` option is a list only
        # (section 2.2), and refuses a string with 400. Ollama's own layer wraps it too (7.1).
        options["stop"] = [options["stop"]]
    if request.max_output_tokens is not None:  # the bound the surface checked and reserved
        options["num_predict"] = request.max_output_tokens
    if options:
        payload["options"] = options
    fmt = _format(body.get("response_format"))
    if fmt is not None:
        payload["format"] = fmt
    if body.get("logprobs"):
        payload["logprobs"] = True
        if isinstance(body.get("top_logprobs"), int):
            payload["top_logprobs"] = body["top_logprobs"]
    think = _think(body)
    if think is not None:
        payload["think"] = think
    if request.operation == "generate":
        prompt = body.get("prompt", "")
        payload["prompt"] = prompt[0] if isinstance(prompt, list) and prompt else prompt
        payload["raw"] = True  # a completion continues the text as given: no chat template
        if isinstance(body.get("suffix"), str):
            payload["suffix"] = body["suffix"]
        return "/api/generate", payload
    messages = body.get("messages") or []
    names = _call_names(messages)
    payload["messages"] = [_message(m, names) for m in messages]
    tools = body.get("tools")
    if tools and body.get("tool_choice") != "none":
        payload["tools"] = tools
    return "/api/chat", payload


def _call_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """Each tool call id in the conversation and its function's name; a later call wins."""
    names: dict[str, str] = {}
    for message in messages:
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(call.get("id"), str):
                names[call["id"]] = str(function.get("name") or "")
    return names


def _message(message: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """One OpenAI chat message as an Ollama message (section 3.1).

    Ollama matches a tool result to its tool by `tool_name`; an OpenAI tool message names only
    its call (`tool_call_id`), so the name is the one of the call with that id, as Ollama's
    own layer finds it (section 7.1, `nameFromToolCallID`).
    """
    role = str(message.get("role", "user"))
    result: dict[str, Any] = {"role": role}
    content = message.get("content")
    if isinstance(content, list):
        texts, images = [], []
        for part in content:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif part.get("type") == "image_url":
                images.append(_image(part.get("image_url")))
        result["content"] = "\n".join(texts)
        if images:
            result["images"] = images
    else:
        result["content"] = content if isinstance(content, str) else ""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        result["thinking"] = reasoning
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        result["tool_calls"] = [_tool_call(call) for call in calls if isinstance(call, dict)]
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str):
        result["tool_call_id"] = call_id
    if role.lower() == "tool":
        # A user's or assistant's `name` is a participant's, not a tool's: not carried over.
        name = message.get("name")
        if not (isinstance(name, str) and name):
            name = names.get(call_id, "") if isinstance(call_id, str) else ""
        if name:
            result["tool_name"] = name
    return result


def _image(image_url: object) -> str:
    """The base64 payload of a `data:` image URL (Ollama's `images` hold bare base64)."""
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
        raise ValueError("only inline data: image URLs can reach an Ollama upstream")
    return url.split(",", 1)[1]


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `arguments` is a JSON string; Ollama's an object (section 3.1)."""
    function = call.get("function") or {}
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = parse_arguments(arguments) if arguments.strip() else {}
        except ValueError:  # invalid, too deep or too many values: passed on as text
            arguments = {"_raw": arguments}
    result: dict[str, Any] = {
        "function": {"name": function.get("name", ""), "arguments": arguments}
    }
    if isinstance(call.get("id"), str):
        result["id"] = call["id"]
    return result


def _format(response_format: object) -> str | dict[str, Any] | None:
    """`response_format` as Ollama's `format`: `json_object` -> "json", a schema as itself."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return schema if isinstance(schema, dict) else "json"
    return None


def _think(body: dict[str, Any]) -> bool | str | None:
    """`reasoning_effort` (or `reasoning.effort`) as Ollama's `think` (section 7.1)."""
    effort = body.get("reasoning_effort")
    reasoning = body.get("reasoning")
    if effort is None and isinstance(reasoning, dict):
        effort = reasoning.get("effort")
    if not isinstance(effort, str):
        return None
    return False if effort == "none" else effort

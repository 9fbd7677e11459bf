"""Anthropic Messages bodies translated into OpenAI chat bodies, and checked as such.

The surface has no body shape of its own in the engine: a `/v1/messages` body becomes an OpenAI
chat completions body (`to_chat_body`), and the neutral request is the OpenAI surface's
(`gateway.api.openai.schema.openai_generation`), so both upstream dialects take it unchanged
(`/v1/chat/completions`, or `/api/chat` through `gateway.upstream.dialects.ollama_request`).
The chat body is built from scratch: what Anthropic's API has and a local model has no use for
(`cache_control`, `context_management`, `output_config`, `metadata`, `container`,
`mcp_servers`, `service_tier`, server tools, `defer_loading`) never reaches the upstream, and is
never an error. docs/api.md lists every field (translated, ignored, refused).

Shape errors are 400 `invalid_request_error`, as Anthropic answers them (Messages API
reference, "Errors"; ../shared/reference/agent-clients.md, "Claude Code" and "`anthropic`").

Over ~300 lines for one reason: `to_chat_body` is one translation, written as one helper per
Messages field or block (`_turn`, `_user`, `_assistant`, `_tool_result`, `_image`, `_tools`,
`_tool_choice`, `_effort`); split, a block's translation would sit apart from the body translation
that orders the chat messages it makes.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.api.openai.schema import openai_generation
from gateway.errors import BadRequestError, UnprocessableError
from gateway.neutral import GenerationRequest
from gateway.settings import Settings
from gateway.wire.json import parse_object

#: `thinking.budget_tokens` up to each bound is that `reasoning_effort`; above the last, `high`.
_EFFORT_BY_BUDGET = ((4096, "low"), (16384, "medium"))

#: Roles a `messages` entry may have: Claude Code also sends `system` messages inside the list.
_ROLES = frozenset({"user", "assistant", "system"})


def parse_messages(raw: bytes, settings: Settings) -> GenerationRequest:
    """Check a `/v1/messages` body and return the neutral request of its chat translation.

    Args:
        raw: The client's body.
        settings: `max_json_depth` and `max_json_values` bound the parser.

    Returns:
        An OpenAI-surface `chat` request whose body is `to_chat_body(...)`; its output bound
        (the TPM reservation's) is `max_tokens`.

    Raises:
        BadRequestError: not JSON, not an object, or any shape error (400, as Anthropic).
    """
    body = parse_body(raw, settings)
    try:
        return openai_generation(to_chat_body(body), "chat", len(raw))
    except UnprocessableError as exc:
        raise BadRequestError(exc.message) from None


def parse_body(raw: bytes, settings: Settings) -> dict[str, Any]:
    """The body as an object with a `model` (`gateway.wire.json.parse_object`), errors 400.

    Raises:
        BadRequestError: see `parse_object`; its 422s (not an object, no model) are 400 here.
    """
    try:
        return parse_object(
            raw, max_depth=settings.max_json_depth, max_values=settings.max_json_values
        )
    except UnprocessableError as exc:
        raise BadRequestError(exc.message) from None


def to_chat_body(body: dict[str, Any], *, counting: bool = False) -> dict[str, Any]:
    """Translate a Messages body into an OpenAI chat completions body.

    Args:
        body: The parsed Messages body (`model` a non-empty string).
        counting: A `count_tokens` body: `max_tokens` is not required (Anthropic's own rule).

    Returns:
        `model`, `messages` (system first, then each turn), `stream`, and where given
        `max_tokens`, `stop`, `temperature`, `top_p`, `top_k`, `tools`, `tool_choice`,
        `parallel_tool_calls`, `reasoning_effort`.

    Raises:
        BadRequestError: a field of the wrong shape, naming it.
    """
    chat: dict[str, Any] = {"model": body["model"], "stream": bool(body.get("stream", False))}
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not counting:
        raise BadRequestError("max_tokens: Field required")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequestError("max_tokens: must be a positive integer")
        chat["max_tokens"] = max_tokens
    messages = _system(body.get("system"), "system")
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise BadRequestError("messages: must be a non-empty list")
    for index, turn in enumerate(turns):
        messages.extend(_turn(turn, f"messages.{index}"))
    chat["messages"] = messages
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequestError("stop_sequences: must be a list of strings")
        if stop:
            chat["stop"] = stop
    for name in ("temperature", "top_p", "top_k"):
        value = body.get(name)
        if value is None:  # Claude Code sends `temperature: null`
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRequestError(f"{name}: must be a number")
        chat[name] = value
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"))  # checked even when no tool is left
    if tools:
        chat["tools"] = tools
        chat.update(choice)
    effort = _effort(body.get("thinking"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    return chat


def _text_of(content: object, where: str) -> str:
    """A string, or the text of a list of blocks (non-text blocks left out), joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequestError(f"{where}: must be a string or a list of content blocks")
    texts = []
    for index, block in enumerate(content):
        block = _block(block, f"{where}.{index}")
        if block["type"] == "text":
            texts.append(_string(block, "text", f"{where}.{index}"))
    return "\n".join(texts)


def _system(system: object, where: str) -> list[dict[str, Any]]:
    """`system` (a string or text blocks) as at most one system message."""
    if system is None:
        return []
    text = _text_of(system, where)
    return [{"role": "system", "content": text}] if text else []


def _turn(turn: object, where: str) -> list[dict[str, Any]]:
    """One `messages` entry as the chat messages that say the same."""
    # A string first: a list or an object as the role is not hashable (it was a 500).
    if (
        not isinstance(turn, dict)
        or not isinstance(turn.get("role"), str)
        or turn["role"] not in _ROLES
    ):
        raise BadRequestError(f"{where}: must be an object with role user, assistant or system")
    content = turn.get("content")
    if turn["role"] == "system":
        return _system(content, f"{where}.content")
    if isinstance(content, str):
        return [{"role": turn["role"], "content": content}]
    if not isinstance(content, list):
        raise BadRequestError(f"{where}.content: must be a string or a list of content blocks")
    blocks = [_block(block, f"{where}.content.{i}") for i, block in enumerate(content)]
    if turn["role"] == "assistant":
        return [_assistant(blocks, f"{where}.content")]
    return _user(blocks, f"{where}.content")


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """An assistant turn: text, earlier thinking (`reasoning_content`) and tool calls."""
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        kind, at = block["type"], f"{where}.{index}"
        if kind == "text":
            texts.append(_string(block, "text", at))
        elif kind == "thinking":
            thinking.append(_string(block, "thinking", at))
        elif kind == "tool_use":
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise BadRequestError(f"{at}.input: must be an object")
            function = {"name": _string(block, "name", at), "arguments": json.dumps(arguments)}
            calls.append({"id": _string(block, "id", at), "type": "function", "function": function})
        # redacted_thinking (encrypted for Anthropic's models only), server tool blocks: dropped
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if "".join(thinking):  # Claude Code's `display: "omitted"` thinking comes back empty
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
        message["content"] = message["content"] or None  # OpenAI's form beside tool calls
    return message


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages first, then the rest as one user message.

    Images inside a tool result go to that user message: a chat tool message holds text only.
    """
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        kind, at = block["type"], f"{where}.{index}"
        if kind == "text":
            parts.append({"type": "text", "text": _string(block, "text", at)})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            text, images = _tool_result(block, at)
            results.append({"role": "tool", "tool_call_id": _string(block, "tool_use_id", at)})
            results[-1]["content"] = text
            parts.extend(images)
        elif kind == "document" and isinstance(block.get("source"), dict):
            source = block["source"]
            if source.get("type") == "text" and isinstance(source.get("data"), str):
                parts.append({"type": "text", "text": source["data"]})
        # other block types (search results, server tool results, PDFs): dropped
    if not parts:
        return results
    if all(part["type"] == "text" for part in parts):
        return [*results, {"role": "user", "content": "\n".join(p["text"] for p in parts)}]
    return [*results, {"role": "user", "content": parts}]


def _tool_result(block: dict[str, Any], where: str) -> tuple[str, list[dict[str, Any]]]:
    """A `tool_result`'s text (prefixed `Error: ` when `is_error`) and its images."""
    content = block.get("content", "")
    images: list[dict[str, Any]] = []
    if isinstance(content, list):
        for index, part in enumerate(content):
            part = _block(part, f"{where}.content.{index}")
            if part["type"] == "image":
                images.append(_image(part, f"{where}.content.{index}"))
    text = _text_of(content, f"{where}.content")
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return text, images


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An `image` block (base64 or url source) as an OpenAI `image_url` part."""
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        media = source.get("media_type")
        data = source.get("data")
        if isinstance(media, str) and isinstance(data, str):
            return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if (
        isinstance(source, dict)
        and source.get("type") == "url"
        and isinstance(source.get("url"), str)
    ):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise BadRequestError(f"{where}.source: must be a base64 or url image source")


def _tools(tools: object) -> list[dict[str, Any]]:
    """Client tools (`input_schema`) as function tools; server tools left out."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise BadRequestError("tools: must be a list")
    functions = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise BadRequestError(f"tools.{index}: must be an object")
        schema = tool.get("input_schema")
        if tool.get("type", "custom") != "custom" or not isinstance(schema, dict):
            continue  # a server tool (web_search_..., bash_..., ...): nothing here can run it
        function: dict[str, Any] = {"name": _string(tool, "name", f"tools.{index}")}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = schema
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: object) -> dict[str, Any]:
    """`tool_choice` as OpenAI's, and `disable_parallel_tool_use` as `parallel_tool_calls`."""
    if choice is None:
        return {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or kind not in ("auto", "any", "tool", "none"):
        raise BadRequestError("tool_choice: type must be auto, any, tool or none")
    result: dict[str, Any] = {}
    if kind == "tool":
        name = _string(choice, "name", "tool_choice")
        result["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        result["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True:
        result["parallel_tool_calls"] = False
    return result


def _effort(thinking: object) -> str | None:
    """`thinking` as `reasoning_effort` (the Ollama translator makes it `think`), or None."""
    if thinking is None:
        return None
    if not isinstance(thinking, dict):
        raise BadRequestError("thinking: must be an object")
    kind = thinking.get("type")
    if kind == "disabled":
        return "none"
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise BadRequestError("thinking.budget_tokens: must be an integer")
        return next((e for bound, e in _EFFORT_BY_BUDGET if budget <= bound), "high")
    if kind == "adaptive":
        # The model decides: its default. Claude Code sends this on every turn, whatever the
        # model; forcing `think` would make Ollama refuse every turn of a model that cannot
        # think (400 "does not support thinking", reference section 2.1), and Ollama's thinking
        # models think by default anyway.
        return None
    raise BadRequestError("thinking.type: must be enabled, adaptive or disabled")


def _block(block: object, where: str) -> dict[str, Any]:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise BadRequestError(f"{where}: must be a content block object with a type")
    return block


def _string(block: dict[str, Any], name: str, where: str) -> str:
    value = block.get(name)
    if not isinstance(value, str):
        raise BadRequestError(f"{where}.{name}: must be a string")
    return value

"""OpenAI Responses API bodies (`POST /v1/responses`) translated into chat completion bodies.

The Responses surface owns no upstream dialect: a Responses body becomes the OpenAI chat body
that asks the same thing, checked by `gateway.api.openai.schema.openai_generation` (surface
`openai`, operation `chat`). An OpenAI-compatible upstream gets it on `/v1/chat/completions`,
an Ollama upstream on `/api/chat` (`gateway.upstream.dialects.ollama_request`): both dialects
work unchanged. What the answer needs that the chat body cannot carry (the tools' names as the
client gave them, the fields echoed in the `response` object) rides along in a `Plan`.

The mapping (docs/api.md has it field by field; the API is OpenAI's "Responses" reference,
https://platform.openai.com/docs/api-reference/responses/create, and what Codex sends is in
../shared/reference/agent-clients.md, "OpenAI Codex CLI"):

- `instructions` is the first system message; `input` a string (one user message) or items:
  `message` (roles `user`, `assistant`, `system`, `developer` -> `system`; content a string or
  `input_text`/`output_text`/`input_image` parts), `function_call`/`custom_tool_call` (assistant
  `tool_calls`, consecutive calls one message), `function_call_output`/`custom_tool_call_output`
  (`tool` messages), `reasoning` (its summary or text as the next assistant turn's
  `reasoning_content`); other item types are left out.
- `tools`: `function` tools as chat function tools; a `namespace` tool's functions flattened to
  `<namespace>__<name>` (answered back as a `function_call` with `name` and `namespace`, the
  fields OpenAI's `ResponseFunctionToolCall` has); a `custom` (freeform) tool as a function of
  one string parameter `input` (answered back as a `custom_tool_call`); hosted tools
  (`web_search`, `file_search`, `code_interpreter`, `computer_use*`, `image_generation`, `mcp`,
  ...) left out: the upstream cannot run them.
- `max_output_tokens` is `max_tokens` (the TPM reservation's bound), `text.format` is
  `response_format`, `reasoning.effort` is `reasoning_effort`; `temperature`, `top_p`,
  `tool_choice`, `parallel_tool_calls` are mapped; the bookkeeping fields (`include`,
  `metadata`, `store`, `user`, ...) are accepted and not forwarded.

Shape errors are 422 (or 400 for what the gateway refuses to do) with OpenAI's error object
(`gateway.errors`), naming the parameter.

Over ~300 lines for one reason: `parse_responses` is one translation whose parts share the flat tool
names: `_tools` makes them (`ToolName`), `_messages` and `_tool_choice` map the client's names to
them, and the `Plan` carries them to the codec; split, that one mapping would be spread over
modules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.api.openai.schema import openai_generation
from gateway.errors import BadRequestError, UnprocessableError
from gateway.neutral import GenerationRequest
from gateway.settings import Settings
from gateway.wire.json import parse_object

#: Between a namespace and its function's name in the flat name the upstream sees. Two
#: underscores: OpenAI-compatible servers accept `[a-zA-Z0-9_-]` in function names.
NAMESPACE_SEPARATOR = "__"

#: The longest `namespace` tool name: every member's flat name repeats it, so a long one made
#: the chat body (and the upstream's) members x its length (a 1 MB name and 300 members: 287
#: MB from a 1 MB body). Real ones are short (OpenAI's function names are at most 64
#: characters; Codex sends `multi_agent_v1`).
MAX_NAMESPACE_CHARS = 128

#: Fields the gateway cannot honour; a 400 says so rather than answering something else.
REFUSED = {
    "conversation": "conversation objects are not supported by the gateway",
    "prompt": "prompt templates are not supported by the gateway",
    "background": "background responses are not supported by the gateway",
}

#: `reasoning.effort` values as the chat API's `reasoning_effort` (which knows low/medium/high).
_EFFORT = {"minimal": "low", "xhigh": "high"}


@dataclass(frozen=True, slots=True)
class ToolName:
    """What a flat function name the upstream calls stands for in the client's tools.

    Attributes:
        name: The tool's (or the namespace member's) own name.
        namespace: The namespace tool holding it, or None.
        custom: A freeform (`custom`) tool: its call is a `custom_tool_call` with `input`.
    """

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """What the answer needs from the Responses body that the chat body does not carry.

    Attributes:
        tools: Each flat function name sent upstream and what it stands for.
        echo: The request fields the `response` object repeats (`instructions`, `tools`,
            `tool_choice`, `temperature`, `metadata`, ...), as the client sent them.
        store: The response is kept (`gateway.api.responses.store`); False unless the
            gateway stores responses and the client did not send `store: false`.
        previous_response_id: The stored response this one continues, echoed in the answer.
    """

    tools: dict[str, ToolName] = field(default_factory=dict)
    echo: dict[str, Any] = field(default_factory=dict)
    store: bool = False
    previous_response_id: str | None = None


@dataclass(frozen=True, slots=True)
class ResponsesRequest(GenerationRequest):
    """A neutral chat request that came as a Responses body, with its `Plan` for the codec."""

    plan: Plan = field(default_factory=Plan)


def parse_responses(raw: bytes, settings: Settings) -> ResponsesRequest:
    """Check a `/v1/responses` body and translate it into a chat request (module docstring).

    Args:
        raw: The client's body.
        settings: For the JSON parser's bounds (`max_json_depth`, `max_json_values`).

    Returns:
        The neutral request: surface `openai`, operation `chat`, body the chat body.

    Raises:
        BadRequestError: see `gateway.wire.json.parse_object`; `previous_response_id`,
            `conversation` or `prompt` (not supported); an `input_file` part or an image by
            `file_id` (the gateway holds no files for them).
        UnprocessableError: `input` missing or of the wrong shape, an item or part of the
            wrong shape, a bad `tools`, `tool_choice`, `text.format`, `reasoning`,
            `instructions` or `max_output_tokens`.
    """
    body = parse_object(raw, max_depth=settings.max_json_depth, max_values=settings.max_json_values)
    if body.get("previous_response_id") is not None:
        raise BadRequestError(
            "previous_response_id: stored responses are off on this gateway (and never "
            "available in a batch); send the whole conversation in input"
        )
    for name, reason in REFUSED.items():
        if body.get(name) not in (None, False):
            raise BadRequestError(f"{name}: {reason}")
    tools, names = _tools(body.get("tools"))
    chat: dict[str, Any] = {"model": body["model"], "messages": _messages(body, names)}
    if "stream" in body:
        chat["stream"] = body["stream"]
    if tools:
        chat["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"), names)
        if choice is not None:
            chat["tool_choice"] = choice
        if isinstance(body.get("parallel_tool_calls"), bool):
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    bound = body.get("max_output_tokens")
    if bound is not None:
        chat["max_tokens"] = bound  # checked by openai_generation, which names max_tokens
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UnprocessableError(f"{name} must be a number")
            chat[name] = value
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    effort = _effort(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    try:
        request = openai_generation(chat, "chat", len(raw))
    except UnprocessableError as exc:
        raise UnprocessableError(str(exc).replace("max_tokens", "max_output_tokens")) from exc
    return ResponsesRequest(
        surface=request.surface,
        operation=request.operation,
        body=request.body,
        model=request.model,
        stream=request.stream,
        max_output_tokens=request.max_output_tokens,
        prompt_bytes=request.prompt_bytes,
        body_bytes=request.body_bytes,
        plan=Plan(tools=names, echo=_echo(body)),
    )


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    """The request fields the `response` object repeats, with OpenAI's defaults."""
    reasoning = body.get("reasoning")
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "reasoning": {
            "effort": reasoning.get("effort") if isinstance(reasoning, dict) else None,
            "summary": reasoning.get("summary") if isinstance(reasoning, dict) else None,
        },
        "temperature": body.get("temperature"),
        "text": body.get("text")
        if isinstance(body.get("text"), dict)
        else {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") if isinstance(body.get("tools"), list) else [],
        "top_p": body.get("top_p"),
        "truncation": "disabled",
        "user": body.get("user"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }


# --- input ----------------------------------------------------------------------------------


def _messages(body: dict[str, Any], names: dict[str, ToolName]) -> list[dict[str, Any]]:
    """The chat messages of `instructions` and `input` (module docstring)."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise UnprocessableError("instructions must be a string")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        return messages
    if not isinstance(given, list) or not given:
        raise UnprocessableError("input must be a string or a non-empty list of input items")
    flat = {(t.namespace, t.name): flat for flat, t in names.items()}
    reasoning: list[str] = []  # a reasoning item's text, for the assistant turn that follows
    thoughts: dict[int, list[str]] = {}  # an assistant message's reasoning (index in messages)
    for index, item in enumerate(given):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise UnprocessableError(f"{where} must be an object")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"  # EasyInputMessage: `type` is optional
        if kind == "message":
            message = _message(item, where)
            if message["role"] == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning = []
            messages.append(message)
        elif kind in ("function_call", "custom_tool_call"):
            call = _call(item, where, flat)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                last = {"role": "assistant", "content": None, "tool_calls": [call]}
                messages.append(last)
            if reasoning:  # joined once at the end: adding to the string each time was
                # quadratic (8,000 reasoning + call pairs in 15 MiB: 5.7 s of CPU, now 0.2 s)
                at = len(messages) - 1
                pieces = thoughts.setdefault(at, [last.get("reasoning_content", "")])
                pieces.extend(reasoning)
                reasoning = []
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(_output(item, where))
        elif kind == "reasoning":
            reasoning.append(_reasoning_text(item))
        # Any other item type (web_search_call, item_reference, compaction, ...) is left out.
    for at, pieces in thoughts.items():
        messages[at]["reasoning_content"] = "".join(pieces)
    if not any(m["role"] != "system" for m in messages):
        raise UnprocessableError("input must hold at least one message or tool output")
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise UnprocessableError(
            f"{where}.role must be one of 'user', 'assistant', 'system', 'developer'"
        )
    role = "system" if role == "developer" else role
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise UnprocessableError(f"{where}.content must be a string or a list of content parts")
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    images = False
    for number, part in enumerate(content):
        at = f"{where}.content[{number}]"
        if not isinstance(part, dict):
            raise UnprocessableError(f"{at} must be an object")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise UnprocessableError(f"{at}.text must be a string")
            texts.append(text)
            parts.append({"type": "text", "text": text})
        elif kind == "refusal":
            text = part.get("refusal")
            texts.append(text if isinstance(text, str) else "")
            parts.append({"type": "text", "text": texts[-1]})
        elif kind == "input_image":
            parts.append(_image(part, at))
            images = True
        elif kind == "input_file":
            raise BadRequestError(f"{at}: input_file parts are not supported by the gateway")
        # Other part types (audio, ...) are left out.
    if images and role == "user":
        return {"role": role, "content": parts}
    if images:
        raise UnprocessableError(f"{where}: only user messages may hold images")
    return {"role": role, "content": "".join(texts)}


def _image(part: dict[str, Any], at: str) -> dict[str, Any]:
    """An `input_image` part as a chat `image_url` part (a URL or a `data:` URL)."""
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        if part.get("file_id") is not None:
            raise BadRequestError(f"{at}.file_id: images by file id are not supported")
        raise UnprocessableError(f"{at}.image_url must be a URL or a data: URL")
    image: dict[str, Any] = {"url": url}
    if isinstance(part.get("detail"), str):
        image["detail"] = part["detail"]
    return {"type": "image_url", "image_url": image}


def _call(
    item: dict[str, Any], where: str, flat: dict[tuple[str | None, str], str]
) -> dict[str, Any]:
    """A `function_call` or `custom_tool_call` item as a chat tool call."""
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise UnprocessableError(f"{where} must have a string call_id and name")
    namespace = item.get("namespace") if isinstance(item.get("namespace"), str) else None
    if item.get("type") == "custom_tool_call":
        given = item.get("input")
        if not isinstance(given, str):
            raise UnprocessableError(f"{where}.input must be a string")
        arguments = json.dumps({"input": given}, ensure_ascii=False)
    else:
        arguments = item.get("arguments", "")
        if not isinstance(arguments, str):
            raise UnprocessableError(f"{where}.arguments must be a JSON string")
    upstream = flat.get((namespace, name))
    if upstream is None:
        upstream = f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": upstream, "arguments": arguments},
    }


def _output(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A `function_call_output` or `custom_tool_call_output` item as a chat `tool` message."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise UnprocessableError(f"{where}.call_id must be a string")
    output = item.get("output")
    if isinstance(output, list):  # content parts: their text (chat tool messages hold text)
        output = "".join(
            str(part.get("text", ""))
            for part in output
            if isinstance(part, dict) and part.get("type") in ("input_text", "output_text")
        )
    if not isinstance(output, str):
        raise UnprocessableError(f"{where}.output must be a string or a list of content parts")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _reasoning_text(item: dict[str, Any]) -> str:
    """A `reasoning` item's text: its summaries, else its reasoning text (none when encrypted)."""
    for key in ("summary", "content"):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(
                p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
            if text:
                return text
    return ""


# --- tools ----------------------------------------------------------------------------------


def _tools(tools: object) -> tuple[list[dict[str, Any]], dict[str, ToolName]]:
    """Chat function tools for the client's `tools`, and what each flat name stands for."""
    if tools is None:
        return [], {}
    if not isinstance(tools, list):
        raise UnprocessableError("tools must be a list")
    result: list[dict[str, Any]] = []
    names: dict[str, ToolName] = {}
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise UnprocessableError(f"{where} must be an object with a type")
        kind = tool["type"]
        if kind in ("function", "custom"):
            _add(result, names, _function(tool, where, None), where)
        elif kind == "namespace":
            space, members = tool.get("name"), tool.get("tools")
            if not isinstance(space, str) or not space or not isinstance(members, list):
                raise UnprocessableError(f"{where} (namespace) must have a name and tools")
            if len(space) > MAX_NAMESPACE_CHARS:
                raise UnprocessableError(
                    f"{where}.name (namespace) must be at most {MAX_NAMESPACE_CHARS} characters"
                )
            for number, member in enumerate(members):
                at = f"{where}.tools[{number}]"
                if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                    continue  # only functions can be flattened
                _add(result, names, _function(member, at, space), at)
        # Hosted tools (web_search, file_search, mcp, ...) and unknown types: left out, never
        # an error (the upstream cannot run them).
    return result, names


def _add(
    result: list[dict[str, Any]],
    names: dict[str, ToolName],
    entry: tuple[dict[str, Any], str, ToolName],
    where: str,
) -> None:
    tool, flat, meaning = entry
    if flat in names:
        raise UnprocessableError(f"{where}: a tool named {flat!r} is given twice")
    names[flat] = meaning
    result.append(tool)


def _function(
    tool: dict[str, Any], where: str, namespace: str | None
) -> tuple[dict[str, Any], str, ToolName]:
    """One `function` or `custom` tool as a chat function tool, its flat name and meaning."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise UnprocessableError(f"{where}.name must be a non-empty string")
    flat = f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name
    function: dict[str, Any] = {"name": flat}
    description = tool.get("description")
    custom = tool["type"] == "custom"
    if custom:
        description = _custom_description(description, tool.get("format"))
        function["parameters"] = {
            "type": "object",
            "properties": {"input": {"type": "string", "description": "The tool's whole input."}},
            "required": ["input"],
        }
    else:
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise UnprocessableError(f"{where}.parameters must be a JSON schema object")
        function["parameters"] = parameters or {"type": "object", "properties": {}}
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
    if isinstance(description, str) and description:
        function["description"] = description
    meaning = ToolName(name=name, namespace=namespace, custom=custom)
    return {"type": "function", "function": function}, flat, meaning


def _custom_description(description: object, fmt: object) -> str:
    """A custom tool's description, with its input grammar when it has one (the model's guide)."""
    text = description if isinstance(description, str) else ""
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        definition = fmt.get("definition")
        if isinstance(definition, str) and definition:
            syntax = fmt.get("syntax", "grammar")
            text += f"\n\nThe input must follow this {syntax} grammar:\n{definition}"
    return text.strip()


def _tool_choice(choice: object, names: dict[str, ToolName]) -> str | dict[str, Any] | None:
    """`tool_choice` as the chat API's; None leaves it to the upstream (`auto`)."""
    if choice is None:
        return None
    if choice in ("auto", "none", "required"):
        return str(choice)
    if not isinstance(choice, dict):
        raise UnprocessableError("tool_choice must be 'auto', 'none', 'required' or an object")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = choice.get("name")
        if not isinstance(name, str):
            raise UnprocessableError("tool_choice.name must be a string")
        namespace = choice.get("namespace")
        flat = f"{namespace}{NAMESPACE_SEPARATOR}{name}" if isinstance(namespace, str) else name
        if flat not in names:
            raise UnprocessableError(f"tool_choice names {name!r}, which is not in tools")
        return {"type": "function", "function": {"name": flat}}
    if kind == "allowed_tools":
        mode = choice.get("mode")
        return mode if mode in ("auto", "required") else None
    return None  # a hosted tool's choice: that tool is left out


# --- output options -------------------------------------------------------------------------


def _response_format(text: object) -> dict[str, Any] | None:
    """`text.format` as the chat API's `response_format`; None for plain text."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise UnprocessableError("text must be an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise UnprocessableError("text.format must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise UnprocessableError("text.format.schema must be a JSON schema object")
        spec: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": schema}
        for key in ("strict", "description"):
            if fmt.get(key) is not None:
                spec[key] = fmt[key]
        return {"type": "json_schema", "json_schema": spec}
    raise UnprocessableError("text.format.type must be 'text', 'json_object' or 'json_schema'")


def _effort(reasoning: object) -> str | None:
    """`reasoning.effort` as `reasoning_effort` (Ollama's `think` for an Ollama upstream)."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise UnprocessableError("reasoning must be an object")
    effort = reasoning.get("effort")
    if effort is None:
        return None
    if not isinstance(effort, str):
        raise UnprocessableError("reasoning.effort must be a string")
    return _EFFORT.get(effort, effort)

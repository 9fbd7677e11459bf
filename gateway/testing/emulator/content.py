"""What an emulated generation says: plain tokens, a JSON document, or a tool call, and logprobs.

Owns how the request fields that shape the output become the engine's plan of `Piece`s: the
JSON `format` (reference §2.1; `response_format` on the OpenAI face, §7.1) makes the text one
valid JSON object, `tools` (§3.1) with the `tool_call` knob make the answer a call to the first
tool, and `logprobs` / `top_logprobs` get deterministic per-token values. Arguments and schema
documents come from `sample_value`, so a test can predict them. Both faces use these helpers;
how each renders the result lives in `native` and `openai`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import string
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.testing.emulator.dialect import Piece, ToolCall

if TYPE_CHECKING:
    from gateway.testing.emulator.config import EmulatorConfig

FORMAT_ERROR = 'invalid format: expected "json" or a valid JSON Schema object'
TOP_LOGPROBS_ERROR = "top_logprobs must be between 0 and 20"
_ID_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class Shape:
    """What the request asks the output to be; the default is plain `tok<i> ` tokens.

    Attributes:
        document: A JSON text to generate instead of tokens (a JSON `format` was asked).
        tool_call: The call to make instead of text.
    """

    document: str | None = None
    tool_call: ToolCall | None = None


PLAIN = Shape()


def sample_value(schema: object) -> Any:
    """A fixed value that fits a JSON schema: `"emulated"`, 1, 1.5, true, one item, each property.

    Args:
        schema: A JSON schema (only `type`, `enum`, `properties` and `items` are read).

    Returns:
        The value; an object schema without properties gives `{}`.
    """
    if not isinstance(schema, dict):
        return "emulated"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), "string") if isinstance(kind, list) else kind
    properties = schema.get("properties")
    if kind == "object" or (kind is None and isinstance(properties, dict)):
        fields = properties if isinstance(properties, dict) else {}
        return {name: sample_value(field) for name, field in fields.items()}
    simple = {"integer": 1, "number": 1.5, "boolean": True, "null": None}
    if kind == "array":
        return [sample_value(schema.get("items"))]
    return simple.get(str(kind), "emulated")


def json_document(requested: object, tokens: int) -> str | None:
    """The JSON text a `format` asks for: `"json"` gives `{"answer": "tok0 tok1 ..."}`.

    Args:
        requested: The native `format` value (`"json"`, a schema object, `""` or None).
        tokens: The configured answer length, for the `"json"` answer's text.

    Returns:
        The document, or None when no format was asked.

    Raises:
        ValueError: The value is neither `"json"` nor an object (`FORMAT_ERROR`).
    """
    if requested is None or requested == "":
        return None
    if requested == "json":
        return json.dumps({"answer": " ".join(f"tok{i}" for i in range(tokens))})
    if not isinstance(requested, dict):
        raise ValueError(FORMAT_ERROR)
    value = sample_value(requested)
    return json.dumps(value if isinstance(value, dict) else {"answer": value})


def choose_tool_call(
    tools: object, config: EmulatorConfig, seed: str, messages: object = None
) -> ToolCall | None:
    """The call to an offered tool when the `tool_call` knob is on, else None.

    The tool is the one named `config.tool_name` when it is offered, else the first. A
    conversation whose last message is a tool's result is answered with text, as a model
    answers once it has what it asked for: an agent's loop (call, result, answer) ends.

    Args:
        tools: The request's `tools` list (`{"type": "function", "function": {...}}` items).
        config: The request's config snapshot (`tool_call`, `tool_name`, `tool_arguments`).
        seed: Makes the call id deterministic per request.
        messages: The request's `messages`, when it has them (both faces name a tool result's
            role `tool`, §3.1).
    """
    if not config.tool_call or not isinstance(tools, list):
        return None
    if isinstance(messages, list) and messages:
        last = messages[-1]
        if isinstance(last, dict) and last.get("role") == "tool":
            return None
    functions = [
        tool["function"]
        for tool in tools
        if isinstance(tool, dict)
        and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
    ]
    named = [f for f in functions if f["name"] == config.tool_name]
    for function in named or functions[:1]:
        arguments = config.tool_arguments
        if arguments is None:
            sampled = sample_value(function.get("parameters") or {"type": "object"})
            arguments = sampled if isinstance(sampled, dict) else {}
        return ToolCall(id=call_id(seed), name=function["name"], arguments=dict(arguments))
    return None


def call_id(seed: str) -> str:
    """`call_` plus 8 lowercase alphanumerics (Ollama's `toolCallId()`), derived from `seed`."""
    number = int(hashlib.sha256(seed.encode()).hexdigest(), 16)
    chars = []
    for _ in range(8):
        number, index = divmod(number, len(_ID_ALPHABET))
        chars.append(_ID_ALPHABET[index])
    return "call_" + "".join(chars)


def plan(config: EmulatorConfig, limit: int | None, shape: Shape) -> tuple[Iterator[Piece], str]:
    """Lay out the chunks of one answer and its `done_reason` (`length` when cut by a limit).

    Thinking comes first (§2.3). A tool call comes after `tokens - 1` silent tokens, in one
    chunk, as Ollama's tool parser delivers it (§3.2); a JSON document is cut into `tokens`
    pieces; otherwise each token is `tok<i> `.

    The pieces are made as they are sent, not before the first byte: a 2,000,000-token answer
    used to take 7 s to build on a loaded machine before its first chunk, longer than a test
    waits (issue 16). Only the count is known in advance, for `done_reason`.
    """
    thinking = (Piece(thinking=f"think{i} ") for i in range(config.thinking_tokens))
    body: Iterable[Piece]
    if shape.tool_call is not None:
        silent = (Piece(silent=True) for _ in range(config.tokens - 1))
        body = itertools.chain(silent, [Piece(tool_call=shape.tool_call)])
        count = max(config.tokens - 1, 0) + 1
    elif shape.document is not None:
        parts = _split(shape.document, config.tokens)
        body, count = (Piece(content=part) for part in parts), len(parts)
    else:
        body = (Piece(content=f"tok{i} ") for i in range(config.tokens))
        count = max(config.tokens, 0)
    pieces: Iterator[Piece] = itertools.chain(thinking, body)
    reason = "stop"
    if limit is not None and 0 <= limit < max(config.thinking_tokens, 0) + count:
        pieces, reason = itertools.islice(pieces, limit), "length"
    if config.empty_first_chunk:
        pieces = itertools.chain([Piece(counted=False)], pieces)
    return pieces, reason


def _split(text: str, parts: int) -> list[str]:
    """Cut `text` into `parts` consecutive, nearly equal, non-empty pieces (fewer if short)."""
    parts = min(parts, len(text))
    bounds = [round(i * len(text) / parts) for i in range(parts + 1)] if parts > 0 else [0]
    return [text[start:end] for start, end in itertools.pairwise(bounds)]


def read_logprobs(body: dict[str, Any]) -> int | None:
    """Read `logprobs` / `top_logprobs`: None when off, else how many alternatives to send.

    Raises:
        ValueError: `top_logprobs` is outside 0..20 (`TOP_LOGPROBS_ERROR`, §2.1).
    """
    top = body.get("top_logprobs")
    top = top if isinstance(top, int) and not isinstance(top, bool) else 0
    if not 0 <= top <= 20:
        raise ValueError(TOP_LOGPROBS_ERROR)
    return top if body.get("logprobs") is True else None


def token_logprob(token: str, top: int) -> dict[str, Any]:
    """A deterministic logprob for one token, and `top` alternatives (the token first).

    Returns:
        `{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}...]}`.
    """
    value = -(int(hashlib.sha256(token.encode()).hexdigest()[:4], 16) % 1000 + 1) / 1000
    alternatives = [(token, value)] + [(f"alt{k}", value - k) for k in range(1, top)]
    entries = [
        {"token": text, "logprob": round(logprob, 6), "bytes": list(text.encode())}
        for text, logprob in alternatives[:top]
    ]
    entry = {"token": token, "logprob": value, "bytes": list(token.encode())}
    return {**entry, "top_logprobs": entries}

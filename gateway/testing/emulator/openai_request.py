"""The request side of the emulator's OpenAI face: which `/v1` body fields change the answer.

Owns `OpenAIAsk` and `parse_request`, which read a decoded `/v1/chat/completions` or
`/v1/completions` body the way Ollama's middleware converts it (reference §7.1, §7.2):
`stream` (default false), `stream_options.include_usage`, `max_tokens`, `logprobs` /
`top_logprobs`, `response_format` (`json_object` → `"json"`, `json_schema` → its schema) and
`tools`, and the requests that middleware refuses before the model runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.testing.emulator.content import read_logprobs


@dataclass(frozen=True)
class OpenAIAsk:
    """The parts of a `/v1` request body that change the emulator's answer (reference §7.1, §7.2).

    Attributes:
        model: The requested model name ("" when missing).
        stream: Whether to answer with SSE. `/v1` defaults to false, unlike `/api/*`.
        max_tokens: The output limit (`num_predict`), or None for no limit. There is no
            `max_completion_tokens`: Ollama silently ignores it.
        include_usage: `stream_options.include_usage`.
        logprobs: None, or how many `top_logprobs` to send with each token (chat only).
        format: The native `format` that `response_format` becomes: `"json"`, a schema, None.
        tools: The `tools` list as sent (chat only), or None.
    """

    model: str
    stream: bool
    max_tokens: int | None
    include_usage: bool
    logprobs: int | None = None
    format: object = None
    tools: object = None


def _native_format(response_format: object) -> object:
    """`FromChatRequest`: `json_object` → `"json"`, `json_schema` → its `schema`, else none."""
    if not isinstance(response_format, dict):
        return None
    kind = str(response_format.get("type", "")).strip().lower()
    if kind == "json_object":
        return "json"
    schema = response_format.get("json_schema")
    if kind == "json_schema" and isinstance(schema, dict):
        return schema.get("schema")
    return None


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
    try:
        logprobs = read_logprobs(body) if chat else None
    except ValueError as exc:
        return 400, str(exc)
    max_tokens = body.get("max_tokens")
    stream_options = body.get("stream_options")
    return OpenAIAsk(
        model=body.get("model") or "",
        stream=body.get("stream") is True,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        include_usage=isinstance(stream_options, dict)
        and stream_options.get("include_usage") is True,
        logprobs=logprobs,
        format=_native_format(body.get("response_format")) if chat else None,
        tools=body.get("tools") if chat else None,
    )

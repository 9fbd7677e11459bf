"""Build a `stream:false` answer from streamed chunks, as Ollama itself does.

Reference section 2.4: `response` and `thinking` are concatenated across chunks and every other
field is taken from the last chunk; for chat, `message.content`, `message.thinking` and
`message.tool_calls` are accumulated (section 3.2, `writeChatResponse`).
"""

from __future__ import annotations

from typing import Any

from gateway.upstream.dialect import Chunk


class Aggregator:
    """Folds chunks into the single non-streamed object."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._tool_calls: list[Any] = []
        self._last: dict[str, Any] = {}

    def add(self, chunk: Chunk) -> None:
        """Fold in one non-error chunk."""
        data = chunk.data
        message = data.get("message")
        source = message if isinstance(message, dict) else data
        self._text.append(str(source.get("content") or source.get("response") or ""))
        self._thinking.append(str(source.get("thinking") or ""))
        calls = source.get("tool_calls")
        if isinstance(calls, list):
            self._tool_calls.extend(calls)
        self._last = data

    def result(self) -> dict[str, Any]:
        """Return the aggregated object: the last chunk with the accumulated text fields."""
        result = dict(self._last)
        thinking = "".join(self._thinking)
        message = result.get("message")
        if isinstance(message, dict):
            message = dict(message)
            message["content"] = "".join(self._text)
            if thinking:
                message["thinking"] = thinking
            if self._tool_calls:
                message["tool_calls"] = self._tool_calls
            result["message"] = message
        else:
            result["response"] = "".join(self._text)
            if thinking:
                result["thinking"] = thinking
            if self._tool_calls:
                result["tool_calls"] = self._tool_calls
        return result

"""What every upstream dialect provides, the Ollama-shaped `Chunk` they yield, and line framing.

A dialect turns an app's Ollama-shaped request (`/v1/generate` or `/v1/chat`) into an upstream
`httpx.Request`, and the upstream's streamed answer back into Ollama-shaped chunks
(reference sections 2.3 and 3.2). The relay only ever sees `Chunk`s.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import httpx

Route = Literal["generate", "chat"]

#: Longest NDJSON or SSE line accepted from an upstream, in bytes. A generated token is a few
#: bytes; the final generate chunk carries `context` (a few ints per token), so allow a lot.
MAX_LINE_BYTES = 32 * 1024 * 1024


class StreamBrokenError(Exception):
    """The upstream's stream cannot be trusted any more: malformed, or ended without `done`.

    Reference section 9.2 item 1 and section 11: EOF without `done:true` is truncation, and a
    `/v1` stream without `data: [DONE]` hides a mid-stream error (section 4.4).
    """


@dataclass(slots=True)
class Chunk:
    r"""One Ollama-shaped streamed object.

    Attributes:
        data: The parsed object: a generate chunk (`response`, `thinking`), a chat chunk
            (`message.content`, `message.thinking`, `message.tool_calls`), the final chunk
            (`done: true` plus metrics in nanoseconds), or an error line `{"error": str}`.
        line: The NDJSON line sent to the client, ending in `\n`. For the Ollama dialect these
            are the upstream's own bytes, relayed unchanged.
    """

    data: dict[str, Any]
    line: bytes

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Chunk:
        """Build a chunk whose line is `data` serialized compactly, as Go's encoder does."""
        return cls(data, encode_json(data) + b"\n")

    @classmethod
    def error(cls, message: str) -> Chunk:
        """Build the final error line `{"error": message}` (reference section 4.3)."""
        return cls.from_data({"error": message})

    @property
    def is_error(self) -> bool:
        """True for an `{"error": ...}` line."""
        return "error" in self.data

    @property
    def is_done(self) -> bool:
        """True for the final chunk (`done: true`)."""
        return self.data.get("done") is True

    @property
    def generated_text(self) -> str:
        """The generated text this chunk carries: response or content, plus thinking.

        Thinking counts as generated output: those tokens are decoded like any other and are
        included in Ollama's `eval_count` (reference section 9.2 item 6).
        """
        message = self.data.get("message")
        source = message if isinstance(message, dict) else self.data
        text = source.get("response") or source.get("content") or ""
        thinking = source.get("thinking") or ""
        return f"{thinking}{text}" if isinstance(text, str) and isinstance(thinking, str) else ""

    @property
    def has_tool_calls(self) -> bool:
        """True when the chunk carries tool calls (they count as generated output too)."""
        message = self.data.get("message")
        return bool(isinstance(message, dict) and message.get("tool_calls")) or bool(
            self.data.get("tool_calls")
        )


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A model the upstream offers: `id` as clients name it, `created` as a Unix time (s)."""

    id: str
    created: int
    owned_by: str


class Dialect(Protocol):
    """The contract between the relay and one upstream protocol."""

    name: str
    readiness_path: str
    #: True when the upstream itself reports `eval_duration`/`prompt_eval_duration` (Ollama);
    #: False when the gateway synthesizes them from its own clock (OpenAI-compatible servers).
    reports_timings: bool

    def build_request(
        self, client: httpx.AsyncClient, route: Route, body: dict[str, Any], headers: dict[str, str]
    ) -> httpx.Request:
        """Translate an Ollama-shaped request body into the upstream request (always streaming)."""
        ...

    def chunks(
        self,
        response: httpx.Response,
        route: Route,
        body: dict[str, Any],
        started: float,
        sent: float,
    ) -> AsyncGenerator[Chunk, None]:
        """Yield the upstream's answer as Ollama chunks.

        Args:
            response: The upstream response, status 200, not read yet.
            route: Which app route this is.
            body: The client's request body (for the model name).
            started: `time.perf_counter()` when the gateway received the request (seconds).
            sent: `time.perf_counter()` when the upstream request was sent (seconds).

        Raises:
            StreamBrokenError: malformed data, or the stream ended without its final chunk.
            httpx.HTTPError: the connection failed mid-stream.
        """
        ...

    async def list_models(self, client: httpx.AsyncClient) -> list[ModelInfo]:
        """Return the upstream's model list.

        Raises:
            httpx.HTTPError: the upstream could not be asked.
            ValueError: the answer was not the expected shape.
        """
        ...


async def iter_lines(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    r"""Split a byte stream into lines, each ending in `\n` (the last one may not).

    A `bytearray` buffer keeps a long line's cost linear in its length.

    Raises:
        StreamBrokenError: a line grew beyond `MAX_LINE_BYTES`.
    """
    pending = bytearray()
    async for piece in stream:
        pending += piece
        if b"\n" not in piece:
            if len(pending) > MAX_LINE_BYTES:
                raise StreamBrokenError("upstream sent an over-long line")
            continue
        *lines, rest = bytes(pending).split(b"\n")
        pending = bytearray(rest)
        for line in lines:
            yield line + b"\n"
    if pending:
        yield bytes(pending)


async def drain(lines: AsyncIterator[bytes], limit: int = 64 * 1024) -> None:
    """Read what is left of a body, up to `limit` bytes, so its connection can be reused."""
    seen = 0
    async for line in lines:
        seen += len(line)
        if seen > limit:
            return


def encode_json(data: Any) -> bytes:
    r"""Serialize compactly as UTF-8, escaping to ASCII only if the text cannot be encoded.

    JSON parsers accept lone surrogate escapes (`"\\ud800"`) that UTF-8 cannot encode; such a
    value is re-escaped instead of failing the request.
    """
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


def rfc3339_now() -> str:
    """Return the current UTC time as RFC 3339 with a `Z` suffix, as Ollama's `created_at`."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")

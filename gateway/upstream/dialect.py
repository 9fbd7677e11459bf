"""What every upstream dialect provides, the Ollama-shaped `Chunk` they yield, and line framing.

A dialect turns an app's Ollama-shaped request (`/v1/generate` or `/v1/chat`) into an
`UpstreamCall`, and the upstream's streamed answer back into Ollama-shaped chunks
(reference sections 2.3 and 3.2) with a `StreamDecoder`. Decoders do no I/O: the relay reads
the body and feeds them the bytes it got (as h11 and wsproto do), so each read costs one
function call, not a stack of async generators (docs/performance.md). The relay only ever sees
`Chunk`s.
"""

from __future__ import annotations

import json
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

    Attributes:
        chunks: The good chunks the same `StreamDecoder.feed` call decoded before the fault;
            the relay sends them before it reports the fault.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.chunks: list[Chunk] = []


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


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """The upstream request of one generation: a POST of `content` (JSON bytes) to `path`.

    `headers` go on top of the upstream's defaults (`gateway.upstream.client`).
    """

    path: str
    content: bytes
    headers: dict[str, str]


class StreamDecoder(Protocol):
    """Turns one upstream answer body into Ollama chunks: bytes in, chunks out, no I/O.

    Attributes:
        finished: The final chunk (`done: true`) or an error chunk has been returned; it is the
            last chunk, and later bytes are ignored.
    """

    finished: bool

    def feed(self, data: bytes) -> list[Chunk]:
        """Return the chunks that `data` completes (often none, or one), in order.

        Raises:
            StreamBrokenError: malformed data, or a line over `MAX_LINE_BYTES`; its `chunks`
                are those `data` completed before the fault.
        """
        ...

    def end(self) -> list[Chunk]:
        """The body ended (EOF): return the chunks its unterminated last line completes.

        Raises:
            StreamBrokenError: the answer ended before its final chunk (reference section 9.2).
        """
        ...


class Dialect(Protocol):
    """The contract between the relay and one upstream protocol."""

    name: str
    readiness_path: str
    #: True when the upstream itself reports `eval_duration`/`prompt_eval_duration` (Ollama);
    #: False when the gateway synthesizes them from its own clock (OpenAI-compatible servers).
    reports_timings: bool

    def build_request(
        self, route: Route, body: dict[str, Any], headers: dict[str, str]
    ) -> UpstreamCall:
        """Translate an Ollama-shaped request body into the upstream request (always streaming)."""
        ...

    def decoder(
        self, route: Route, body: dict[str, Any], started: float, sent: float
    ) -> StreamDecoder:
        """Return a decoder for one answer (status 200) to the request `build_request` made.

        Args:
            route: Which app route this is.
            body: The client's request body (for the model name).
            started: `time.perf_counter()` when the gateway received the request (seconds).
            sent: `time.perf_counter()` when the upstream request was sent (seconds).
        """
        ...

    async def list_models(self, client: httpx.AsyncClient) -> list[ModelInfo]:
        """Return the upstream's model list.

        Raises:
            httpx.HTTPError: the upstream could not be asked.
            ValueError: the answer was not the expected shape.
        """
        ...


class LineSplitter:
    r"""Splits a byte stream into lines as its pieces arrive; each line keeps its `\n`.

    A `bytearray` holds an unfinished line, so a long line's cost stays linear in its length.
    """

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        r"""Return the lines `data` completes, each ending in `\n`.

        Raises:
            StreamBrokenError: an unfinished line grew beyond `MAX_LINE_BYTES`.
        """
        newline = data.find(b"\n")
        if newline < 0:
            self._pending += data
            if len(self._pending) > MAX_LINE_BYTES:
                raise StreamBrokenError("upstream sent an over-long line")
            return []
        if self._pending:
            self._pending += data
            data = bytes(self._pending)
            self._pending.clear()
        elif newline == len(data) - 1:
            return [data]  # the usual piece: one whole line (a token) per read
        *lines, rest = data.split(b"\n")
        if rest:
            self.feed(rest)
        return [line + b"\n" for line in lines]

    def rest(self) -> bytes:
        """Return (and forget) the unterminated last line, at the end of the stream."""
        rest = bytes(self._pending)
        self._pending.clear()
        return rest


_JSON = json.JSONDecoder()


def decode_object(line: bytes, what: str) -> dict[str, Any] | None:
    """Parse one JSON object from the upstream; None for a blank line.

    `JSONDecoder.raw_decode` on the stripped text, with a check that nothing follows the
    object: what `json.loads` does, without its two regular-expression scans (a third of a
    parse of a token's line).

    Args:
        line: UTF-8 bytes, the object and surrounding whitespace.
        what: Names the unit in errors: `NDJSON line`, `SSE event`.

    Raises:
        StreamBrokenError: not valid UTF-8 JSON, or not an object.
    """
    try:
        text = line.decode().strip()
        if not text:
            return None
        data, end = _JSON.raw_decode(text)
    except (ValueError, RecursionError) as exc:
        raise StreamBrokenError(f"upstream sent a malformed {what}") from exc
    if end != len(text):
        raise StreamBrokenError(f"upstream sent a malformed {what}")
    if not isinstance(data, dict):
        raise StreamBrokenError(f"upstream sent a non-object {what}")
    return data


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

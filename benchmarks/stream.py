"""One streamed request on the wire: what to send, how to read the answer, a lean HTTP client.

Owns `Spec` (the request, encoded once) and `Reader` (reads an NDJSON or SSE answer as it
arrives: chunks, tokens, time of the first text, the end). Three SSE event sets are read
(`EVENTS`): OpenAI chat/completions (`data:` events ended by `data: [DONE]`), OpenAI Responses
and Anthropic Messages (named events, `event:` then `data:`, ended by `response.completed` /
`message_stop`). The HTTP client, `Connection` (a
keep-alive HTTP/1.1 client on an asyncio protocol with httptools parsing the answer), lives in
`gateway.clients.bench.wire` and is re-exported here: `gateway bench` and this benchmark share one
load
generator, so a speed-up or a fix of the client reaches both.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.clients.bench.wire import Connection, request_bytes

__all__ = ["EVENTS", "Connection", "Reader", "Spec", "event_role", "event_text", "line_text"]

EVENTS = ("chat", "responses", "messages")
"""The SSE event sets a reader knows: OpenAI chat/completions, OpenAI Responses, Anthropic."""

_ENDS = {
    "responses": (b"response.completed", b"response.incomplete", b"response.failed"),
    "messages": (b"message_stop",),
}
_DELTAS = {"responses": (b".delta",), "messages": (b"content_block_delta",)}
_TEXT = {"responses": b"response.output_text.delta", "messages": b"content_block_delta"}


@dataclass(frozen=True)
class Spec:
    """What to send and how to read the answer.

    Attributes:
        host: Target host; port: its port.
        path: Request path on the target.
        body: The JSON request body, encoded once.
        headers: Request headers (the API key for the gateway).
        sse: The answer is server-sent events, else Ollama NDJSON.
        parse_all: Parse every line to count tokens (non-empty text) and decode rates; off, only
            lines up to the first text are parsed, so the generator stays cheap.
        events: With `sse`, the event set (`EVENTS`): `chat` (OpenAI chat/completions and
            completions), `responses` (`/v1/responses`) or `messages` (`/v1/messages`).
    """

    host: str
    port: int
    path: str
    body: bytes
    headers: dict[str, str]
    sse: bool
    parse_all: bool
    events: str = "chat"

    def request_bytes(self) -> bytes:
        """The whole HTTP/1.1 request, built once and sent as is on every stream."""
        return request_bytes("POST", self.host, self.port, self.path, self.body, self.headers)


def line_text(line: bytes, sse: bool) -> str:
    """The generated text in one answer line (NDJSON, or an SSE `data:` line).

    Raises:
        ValueError: the line is not JSON, or is an error line.
    """
    data = json.loads(line[5:] if sse else line)
    if "error" in data:
        raise ValueError(f"error line: {data['error']}")
    if sse:
        choice = (data.get("choices") or [{}])[0]
        return str(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return str(data.get("response") or (data.get("message") or {}).get("content") or "")


def event_role(event: bytes, events: str) -> str | None:
    """What a named SSE event (`responses`, `messages`) is to the reader.

    Returns:
        `delta` for an event carrying a piece of the answer (a Responses `*.delta`, an
        Anthropic `content_block_delta`): a chunk, like an NDJSON line; `end` for the last
        event (`response.completed`/`.incomplete`/`.failed`, `message_stop`): a chunk too, like
        the NDJSON `done` line; `error` for an `error` event; None for the rest of the API's
        framing (`response.created`, `message_start`, `ping`, block starts and stops, ...),
        which is read but not counted, so that a chunk is the same unit on every row.
    """
    if event == b"error":
        return "error"
    if event in _ENDS[events]:
        return "end"
    if event.endswith(_DELTAS[events]):
        return "delta"
    return None


def event_text(event: bytes, data: bytes, events: str) -> str:
    """The answer text in a `delta` event's data (empty for thinking and tool-call deltas)."""
    if event != _TEXT[events]:
        return ""
    delta = json.loads(data).get("delta")
    if events == "responses":
        return str(delta or "")
    return str((delta or {}).get("text") or "")


@dataclass
class Reader:
    """Reads one answer body as it arrives: chunks, tokens, first and last text, the end."""

    spec: Spec
    in_window: Callable[[float], bool]
    ready: asyncio.Event | None = None
    window_chunks: int = 0
    window_tokens: int = 0
    tokens: int = 0
    first: float | None = None
    last_token: float = 0.0
    done: bool = False
    buffer: bytes = b""
    event: bytes = b""
    chunk_count: int = 0
    last_chunk: float | None = None
    max_gap: float = 0.0
    gaps: list[float] = field(default_factory=list)

    def _arrived(self, count: int, now: float) -> None:
        """Note `count` chunks that arrived together at `now` (perf_counter seconds).

        The gap is the time since the previous piece that carried a chunk (none before the
        first chunk: that wait is the TTFT); gaps in the measured window are kept for the run's
        percentiles, and the longest of the answer for `benchmarks.load.Tally`'s hold rule.
        """
        if not count:
            return
        self.chunk_count += count
        if self.last_chunk is not None:
            gap = now - self.last_chunk
            self.max_gap = max(self.max_gap, gap)
            if self.in_window(now):
                self.gaps.append(gap)
        self.last_chunk = now

    def feed(self, piece: bytes) -> None:
        """Take the next piece of the (de-chunked) body.

        Raises:
            ValueError: an error line or `error` event (the request counts as failed).
        """
        now = time.perf_counter()
        *lines, self.buffer = (self.buffer + piece).split(b"\n")
        if self.spec.sse and self.spec.events != "chat":
            self._named(lines, now)
            return
        count = tokens = 0
        for raw in lines:
            line = raw.strip()
            if not line:
                continue
            if self.spec.sse:
                if not line.startswith(b"data:"):
                    continue
                if line == b"data: [DONE]":
                    self.done = True
                    continue
            elif b'"done":true' in line or b'"done": true' in line:
                self.done = True
            count += 1
            if (self.first is None or self.spec.parse_all) and line_text(line, self.spec.sse):
                tokens += 1
                self.last_token = now
                if self.first is None:
                    self.first = now
                    if self.ready is not None:
                        self.ready.set()
        self.tokens += tokens
        self._arrived(count, now)
        if self.in_window(now):
            self.window_chunks += count
            self.window_tokens += tokens

    def _named(self, lines: list[bytes], now: float) -> None:
        """`feed` for named SSE events (`event:` then `data:`): Responses, Anthropic Messages."""
        count = tokens = 0
        for raw in lines:
            line = raw.strip()
            if line.startswith(b"event:"):
                self.event = line[6:].strip()
                continue
            if not line.startswith(b"data:"):
                continue
            event, self.event = self.event, b""
            data = line[5:]
            if not event:  # no `event:` line: the data's own `type` names it
                event = str(json.loads(data).get("type", "")).encode()
            role = event_role(event, self.spec.events)
            if role is None:
                continue
            if role == "error":
                raise ValueError(f"error event: {data[:200]!r}")
            count += 1
            if role == "end":
                self.done = True
            elif (self.first is None or self.spec.parse_all) and event_text(
                event, data, self.spec.events
            ):
                tokens += 1
                self.last_token = now
                if self.first is None:
                    self.first = now
                    if self.ready is not None:
                        self.ready.set()
        self.tokens += tokens
        self._arrived(count, now)
        if self.in_window(now):
            self.window_chunks += count
            self.window_tokens += tokens

"""One streamed request on the wire: what to send, how to read the answer, a lean HTTP client.

Owns `Spec` (the request, encoded once) and `Reader` (reads an NDJSON or SSE answer as it
arrives: chunks, tokens, time of the first text, the end). The HTTP client, `Connection` (a
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
from dataclasses import dataclass

from gateway.clients.bench.wire import Connection, request_bytes

__all__ = ["Connection", "Reader", "Spec", "line_text"]


@dataclass(frozen=True)
class Spec:
    """What to send and how to read the answer.

    Attributes:
        host: Target host; port: its port.
        path: Request path on the target.
        body: The JSON request body, encoded once.
        headers: Request headers (the API key for the gateway).
        sse: The answer is OpenAI server-sent events (`data: {...}`), else Ollama NDJSON.
        parse_all: Parse every line to count tokens (non-empty text) and decode rates; off, only
            lines up to the first text are parsed, so the generator stays cheap.
    """

    host: str
    port: int
    path: str
    body: bytes
    headers: dict[str, str]
    sse: bool
    parse_all: bool

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

    def feed(self, piece: bytes) -> None:
        """Take the next piece of the (de-chunked) body."""
        now = time.perf_counter()
        *lines, self.buffer = (self.buffer + piece).split(b"\n")
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
        if self.in_window(now):
            self.window_chunks += count
            self.window_tokens += tokens

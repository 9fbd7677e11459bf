"""One streamed request on the wire: what to send, how to read the answer, a lean HTTP client.

Owns `Spec` (the request, encoded once), `Reader` (reads an NDJSON or SSE answer as it arrives:
chunks, tokens, time of the first text, the end) and `Connection`, a keep-alive HTTP/1.1 client
on an asyncio protocol with httptools (llhttp, C) parsing the answer. It exists because the load
generator must not be the bottleneck: on the benchmark machine httpx's streaming read costs
about four times as much CPU per chunk (`python -m bench.load --client httpx` to compare).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools


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
        head = [f"POST {self.path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        head += [f"{name}: {value}" for name, value in self.headers.items()]
        head.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + self.body


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


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time (httptools parser)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.sink: Callable[[bytes], None] = lambda _: None
        self.status = 0
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = cast(asyncio.Transport, transport)  # TCP; uvloop's is no subclass

    def data_received(self, data: bytes) -> None:  # noqa: D102
        try:
            if self.parser is not None:
                self.parser.feed_data(data)
        except (httptools.HttpParserError, ValueError) as exc:
            self.reusable = False
            self._finish(exc)

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self.reusable = False
        self._finish(exc or ConnectionResetError("connection closed by the server"))

    def on_headers_complete(self) -> None:  # noqa: D102 - httptools callbacks
        assert self.parser is not None  # noqa: S101
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:  # noqa: D102
        self.sink(body)

    def on_message_complete(self) -> None:  # noqa: D102
        assert self.parser is not None  # noqa: S101
        self.reusable = self.reusable and self.parser.should_keep_alive()
        self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None) if exc is None else waiter.set_exception(exc)

    async def send(self, request: bytes, sink: Callable[[bytes], None]) -> int:
        """Send `request`, feed its body to `sink` as it arrives; return the status."""
        assert self.transport is not None  # noqa: S101
        self.parser = httptools.HttpResponseParser(self)
        self.sink = sink
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        await self.waiter
        return self.status

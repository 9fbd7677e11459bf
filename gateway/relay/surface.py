"""What the engine needs of a client surface: parse a body, and write the answer back.

A surface (`gateway.api.ollama`, `gateway.api.openai`) implements these for each of its
generation endpoints; the engine (`gateway.relay.pipeline`) calls them and never imports a
surface. The codec runs once per streamed upstream read: keep it lean (docs/performance.md).
"""

from __future__ import annotations

from typing import Protocol

from gateway.neutral import Chunk, GenerationRequest
from gateway.settings import Settings
from gateway.upstream.dialects.base import TextEvent


class Codec(Protocol):
    """One request's answer in its client's format; built per request (it may keep state).

    Attributes:
        media_type: The `Content-Type` of a streamed answer (NDJSON, SSE).
        writes_raw: `encode` writes a chunk that has `raw` (the upstream's own bytes, set only
            by a decoder of the client's own format) as exactly those bytes, and nothing else
            for it: a decoder's lane may then write a read itself (`gateway.relay.push`).
        text_event: For a translated surface, the bytes `encode` writes for a chunk of text
            alone, in one call (`TextEvent`, for a decoder's lane); None: none.
    """

    media_type: bytes
    writes_raw: bool
    text_event: TextEvent | None

    def encode(self, chunks: list[Chunk]) -> bytes:
        """The bytes that send `chunks` (one upstream read's) to a streaming client.

        An error chunk ends the stream in the client's format (an NDJSON `{"error"}` line, an
        SSE error event); so does the final chunk (with `data: [DONE]` for SSE).
        """
        ...

    def add(self, chunk: Chunk) -> None:
        """Fold one non-error chunk into the non-streamed answer."""
        ...

    def result(self) -> bytes:
        """The non-streamed answer (one JSON object) from the chunks added."""
        ...


class Endpoint(Protocol):
    """A generation endpoint of a surface: its metrics route, its body parser, its codec."""

    @property
    def route(self) -> str:
        """The route label for metrics and the access log (its path, e.g. `/api/chat`)."""
        ...

    def parse(self, raw: bytes, settings: Settings) -> GenerationRequest:
        """Check a client body and return the neutral request.

        Raises:
            BadRequestError: not JSON, or JSON the gateway refuses to interpret (400).
            UnprocessableError: JSON of the wrong shape (422).
        """
        ...

    def codec(self, request: GenerationRequest) -> Codec:
        """A codec for the answer to `request`."""
        ...

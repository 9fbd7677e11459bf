"""What every upstream dialect provides: the contract between the relay and a dialect.

A dialect turns a neutral `GenerationRequest` (`gateway.neutral`), whichever client surface it
came through, into an `UpstreamCall`, and the upstream's answer back into neutral `Chunk`s with
a `StreamDecoder`. Decoders do no I/O: the relay reads the body and feeds them the bytes it got
(as h11 and wsproto do), so each read costs one function call, not a stack of async generators
(docs/performance.md). The relay only ever sees `Chunk`s.

The framing and JSON helpers the dialects share (line splitting, whole-body decoding, JSON
encoding) are in `gateway.upstream.dialects.framing`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httpx

from gateway.neutral import Chunk, GenerationRequest

#: Longest NDJSON or SSE line accepted from an upstream, in bytes. A generated token is a few
#: bytes; the final generate chunk carries `context` (a few ints per token), so allow a lot.
#: Also the longest whole answer (embeddings) and the most a `stream:false` answer collects.
MAX_LINE_BYTES = 32 * 1024 * 1024

#: Most bytes one embedding vector takes in a well-behaved answer: 32,768 dimensions (four
#: times the widest embedding models) written out at 24 characters each, rounded up. An answer
#: over `MAX_LINE_BYTES` is the request's doing when it asked for enough vectors of this size to
#: fill it (`requested_vectors`); with fewer, no model makes that much and the upstream is at
#: fault (docs/operations.md, "Whose fault is a failure").
MAX_VECTOR_BYTES = 1024 * 1024


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


class AnswerTooLongError(StreamBrokenError):
    """A line, an SSE event or a whole answer grew beyond `MAX_LINE_BYTES`.

    The upstream's fault, unless the request asked for that much (`requested_vectors`); the
    relay decides (`gateway.relay.exchange`).
    """


def requested_vectors(request: GenerationRequest) -> int:
    """How many embedding vectors `request` asks for (0 for a generation).

    An Ollama `input` or OpenAI `input` list holds one input per element, except OpenAI's
    single tokenized input (a list of integers); a string, or legacy `prompt`, is one.
    """
    if request.operation != "embed":
        return 0
    if request.legacy:
        return 1
    given = request.body.get("input")
    if isinstance(given, list):
        return 1 if given and isinstance(given[0], int) else len(given)
    return 1


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


Lane = Callable[[bytes], bool]
"""A decoder's fast path for one upstream read, `lane(piece) -> handled` (issue 27).

Given a read that is exactly one whole, in-between unit of the answer (an NDJSON line neither
final nor an error), it does in one call what decoding, metering, encoding and writing would:
calls `tick(time.perf_counter())` when the unit carries generated text, writes what the
client's codec would write for it, returns True. For any other read it changes nothing and
returns False: the caller then feeds the read to `StreamDecoder.feed`, whose checks and errors
apply (a lane never raises). It accepts only what `feed` accepts and writes only what the codec
would: the piece unchanged when the codec writes a chunk's `raw`, else the codec's `TextEvent`
for a unit that carries text alone; so the client gets the same bytes either way
(tests/upstream/test_lane.py).
"""

TextEvent = Callable[[str], bytes | None]
"""A codec's bytes for an in-between chunk that carries only `text` (no thinking, tool calls or
log probabilities), as `encode([Chunk(text=text)])` would write them now, with the codec's state
moved on as `encode` would move it; None when the codec's state asks for more (say, the
first delta's role): then nothing was changed, and the chunk goes the long way."""


class StreamDecoder(Protocol):
    """Turns one upstream answer body into neutral chunks: bytes in, chunks out, no I/O.

    Attributes:
        finished: The final chunk (`done`) or an error chunk has been returned; it is the
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

    def lane(
        self,
        tick: Callable[[float], None],
        write: Callable[[bytes], None],
        text_event: TextEvent | None = None,
    ) -> Lane | None:
        """A one-call relay of the usual read (`Lane`), or None when the decoder has none.

        Without `text_event` the client's codec writes each chunk's `raw` (the upstream's own
        bytes in the client's format: an Ollama line to an Ollama client); with it, a chunk of
        text alone is written as `text_event(text)` (a translated surface).
        """
        ...


class WithoutLane:
    """For a decoder with no lane: `StreamDecoder.lane` is None, every read takes the long way."""

    def lane(
        self,
        tick: Callable[[float], None],  # noqa: ARG002
        write: Callable[[bytes], None],  # noqa: ARG002
        text_event: TextEvent | None = None,  # noqa: ARG002
    ) -> Lane | None:
        """None (`StreamDecoder.lane`)."""
        return None


class Dialect(Protocol):
    """The contract between the relay and one upstream protocol."""

    name: str
    readiness_path: str
    #: True when the upstream itself reports `eval_duration`/`prompt_eval_duration` (Ollama);
    #: False when the gateway synthesizes them from its own clock (OpenAI-compatible servers).
    reports_timings: bool

    def build_request(self, request: GenerationRequest, headers: dict[str, str]) -> UpstreamCall:
        """Translate a neutral request into the upstream's request (generations always stream).

        Raises:
            ValueError: the request cannot be expressed in this dialect (the client's 422).
        """
        ...

    def decoder(self, request: GenerationRequest, started: float, sent: float) -> StreamDecoder:
        """Return a decoder for one answer (status 200) to the request `build_request` made.

        Args:
            request: The request (its operation and model name).
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

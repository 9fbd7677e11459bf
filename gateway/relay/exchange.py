"""One relayed generation: open the upstream stream, pull its chunks under deadlines, close it.

Timeouts (seconds, from `Settings`): the first-byte deadline covers connecting, sending and
waiting for the first chunk (Ollama sends its headers only with the first token, reference
section 1); the idle deadline covers each later read. A failure before the first chunk raises a
`GatewayError` (a real status for the client); a failure after it ends the stream with one
error chunk, which the client surface writes in its own format (an NDJSON `{"error": ...}` line,
reference section 4.3, or an SSE error event), and is kept in `failure`.

Every upstream error carries its `blame` (`gateway.errors.Blame`): the caller feeds the circuit
breaker from it, and only failures that are not the request's are retried (the rule by kind of
fault is `gateway.relay.retry`; docs/operations.md, "Retries and failover by kind of fault"). The
upstream request is built once, before any try, so a body the gateway cannot translate is the
client's 422, never an upstream fault.

The exchange reads the body itself and feeds each read to the dialect's decoder; the chunks one
read completes travel together as a batch, so the client gets them in one write. A large whole
answer (embeddings) is parsed in a worker thread at its end, so that the event loop goes on
serving every other request meanwhile (`gateway.upstream.dialects.json_codec.THREADED_JSON`).

An answer over `MAX_LINE_BYTES` is the request's fault when the request asked for that much
(embeddings of at least `MAX_LINE_BYTES // MAX_VECTOR_BYTES` inputs): the client gets 413
(`AnswerTooLargeError`), and the upstream is neither blamed nor tried again. Otherwise no
well-behaved upstream sends it, and it is the upstream's fault.

Over ~300 lines for one reason: `Exchange` is one upstream stream's life (`open` with its
`_attempt` retries, `batches` under the first-byte and idle deadlines, `_classify` of each
failure, `aclose`), and every step reads the same deadlines, response and failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

import anyio
import httpx

from gateway.errors import (
    AnswerTooLargeError,
    GatewayError,
    UntranslatableRequestError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamUnavailableError,
    parse_retry_after,
)
from gateway.metering.meter import RequestMeter
from gateway.neutral import Chunk, GenerationRequest, Outcome
from gateway.relay.deadline import IdleDeadline
from gateway.relay.push import (
    DRAIN_LIMIT,
    DRAIN_SECONDS,
    READ_SLICE,
    Pump,
    Writer,
    is_divertible,
)
from gateway.relay.retry import retryable, with_retries
from gateway.settings import Settings
from gateway.upstream.client import GenerationClient
from gateway.upstream.dialects.base import (
    MAX_LINE_BYTES,
    MAX_VECTOR_BYTES,
    AnswerTooLongError,
    Dialect,
    StreamBrokenError,
    StreamDecoder,
    TextEvent,
    requested_vectors,
)
from gateway.upstream.errors import (
    ERROR_BODY_LIMIT,
    error_message,
    log_status_error,
    status_kind,
    transport_error,
)
from gateway.wire.json import INLINE_PARSE_BYTES, json_thread_limiter

logger = logging.getLogger("gateway.relay")

E = TypeVar("E", bound=GatewayError)

#: The client's error when the upstream is silent mid-stream for `GATEWAY_IDLE_TIMEOUT`.
_IDLE_MESSAGE = "upstream sent nothing for {:g} s"

# Most bytes read after the final chunk to keep the connection (what Ollama sends after `done`
# is nothing at all), the longest wait for the body's end after it, and the most bytes of one
# read fed to the decoder in one turn of the event loop (`_next_batch`): one value each for the
# pull path here and the push path (`gateway.relay.push`).
_DRAIN_LIMIT = DRAIN_LIMIT
_DRAIN_SECONDS = DRAIN_SECONDS


class Exchange:
    """The upstream side of one request.

    Args:
        retry_server_error: Whether an upstream 500 (one not blamed on the request) may be
            tried once more on this upstream: only when the request has no other upstream
            left and saw no 500 before (`Generation.connect`).

    Attributes:
        outcome: None while running; then `completed`, `upstream_error` or `timeout`.
        failure: The error that ended the stream after its first chunk, if any.
        server_errors: Upstream 500s (and error first lines) not blamed on the request that
            this exchange's tries got; the caller's budget for them spans its failover.
        received: Bytes of the answer body read so far (the current try's).
    """

    def __init__(
        self,
        *,
        client: GenerationClient,
        dialect: Dialect,
        request: GenerationRequest,
        headers: dict[str, str],
        settings: Settings,
        meter: RequestMeter,
        retry_server_error: bool = False,
    ) -> None:
        self._client = client
        self._retry_server_error = retry_server_error
        self._dialect = dialect
        self._generation = request
        self._headers = headers
        self._settings = settings
        self._meter = meter
        self._metrics = meter.metrics
        self._response: httpx.Response | None = None
        self._reads: AsyncIterator[bytes] | None = None
        self._decoder: StreamDecoder | None = None
        self._first: list[Chunk] | None = None
        self._broken: StreamBrokenError | None = None  # held back until its good chunks are sent
        self._rest: memoryview | None = None  # what is left of a long read (`_next_batch`)
        self._request: httpx.Request | None = None
        self.outcome: Outcome | None = None
        self.failure: GatewayError | None = None
        self.server_errors = 0
        self.received = 0

    async def open(self) -> None:
        """Send the request and wait for the first chunk.

        Raises:
            UntranslatableRequestError: the gateway could not build the upstream request from
                this body (422); nothing was sent.
            UpstreamTimeoutError: no first chunk within `first_byte_timeout` (504).
            ServiceUnavailableError: no free connection in the upstream pool in time (503).
            UpstreamUnavailableError: connection refused, reset or dropped (502).
            UpstreamStatusError: the upstream answered an error status, or its first line was
                an error (Ollama before v0.12.6 sends errors as a 200 line; section 4.2).
        """
        if self._generation.body_bytes > INLINE_PARSE_BYTES:
            # Translating and writing a large body holds the loop as long as parsing it did.
            self._request = await anyio.to_thread.run_sync(
                self._build_request, limiter=json_thread_limiter()
            )
        else:
            self._request = self._build_request()
        phase = self._settings.first_byte_timeout
        timeout, message = self._deadline(phase, "upstream sent nothing within {:g} s")
        try:
            # The retries too: all before the first byte. asyncio's own timeout, not anyio's
            # fail_after: the same TimeoutError at the deadline for a third of the CPU (11 µs
            # against 28-32 µs an entry and exit on uvloop; anyio looks up the task and the
            # async library each time, 5 % of a request's own work under py-spy).
            async with asyncio.timeout(timeout):
                await with_retries(
                    self._attempt,
                    self._retryable,
                    attempts=self._settings.retry_attempts,
                    backoff=self._settings.retry_backoff,
                    metrics=self._metrics,
                )
        except BaseException as exc:
            await self.aclose()
            error = self._classify(exc, message, request_deadline=timeout < phase)
            if error is not None:
                raise error from exc
            if not isinstance(exc, Exception):
                raise  # cancellation: the client left, or the server is stopping
            # Anything else raised while reading the upstream's answer is still the upstream's
            # fault as far as the client can tell; the traceback goes to the log.
            logger.exception("unexpected upstream answer")
            message = "upstream sent an answer the gateway could not read"
            raise self._count(UpstreamUnavailableError(message), "stream") from exc

    def _build_request(self) -> httpx.Request:
        """The upstream request for this body, built once for every try.

        Raises:
            UntranslatableRequestError: the dialect or the HTTP client refused the body or the
                headers; a gateway-side failure caused by the request, so no upstream's fault.
        """
        try:
            call = self._dialect.build_request(self._generation, self._headers)
            return self._client.request(call.path, call.content, call.headers)
        except Exception as exc:
            logger.warning("cannot build the upstream request: %r", exc)
            message = f"the {self._dialect.name} upstream cannot take this request"
            raise UntranslatableRequestError(message) from exc

    async def _attempt(self) -> None:
        """One try: send, check the status, wait for the first chunk."""
        await self.aclose()  # what a failed earlier try left open
        assert self._request is not None  # noqa: S101 - built by open()
        sent = self._meter.sent_at = time.perf_counter()
        response = self._response = await self._client.send(self._request)
        if response.status_code != 200:
            raise await self._status_error(response)
        # The upstream is asked for `identity`. A compressed answer is refused, not inflated:
        # a few hundred KiB of gzip can expand to gigabytes, all parsed in one event-loop turn.
        encoding = response.headers.get("content-encoding", "identity").lower()
        if encoding != "identity":
            raise StreamBrokenError(f"upstream sent a compressed answer ({encoding})")
        self._decoder = self._dialect.decoder(self._generation, self._meter.arrival, sent)
        self.received, self._rest = 0, None
        # The transport's own byte stream, read directly: httpx's `aiter_raw` adds a generator
        # and a chunker per read and nothing this relay uses. A body a test transport has read
        # already comes from httpx's copy.
        stream = response.stream
        if isinstance(stream, httpx.AsyncByteStream) and not response.is_stream_consumed:
            self._reads = aiter(stream)
        else:
            self._reads = response.aiter_bytes()
        self._first = await self._next_batch()
        if self._first[0].error is not None:  # an error as the first line: a 500 (section 4.2)
            error = UpstreamStatusError(500, self._first[0].error)
            self._note_server_error(error)
            raise self._count(error, status_kind(error))

    async def _next_batch(self) -> list[Chunk]:
        """Read until the decoder completes a chunk; return those chunks (at least one).

        A read longer than `READ_SLICE` (an upstream faster than the relay, a large answer) is
        fed in slices, one per turn of the event loop: the chunks of a multi-megabyte read,
        decoded and encoded at once, held the loop for most of a second.

        Raises:
            StreamBrokenError: the body ended before the answer's final chunk.
            httpx.HTTPError: the connection failed.
        """
        assert self._reads is not None  # noqa: S101 - set with the response
        assert self._decoder is not None  # noqa: S101
        if self._broken is not None:
            raise self._broken
        data: bytes | None
        while True:
            if self._rest:
                await anyio.lowlevel.checkpoint()  # the rest of a long read: a turn each slice
                data = bytes(self._rest[:READ_SLICE])
                self._rest = self._rest[READ_SLICE:]
            else:
                data = await anext(self._reads, None)
                if data is None:
                    if self.received <= INLINE_PARSE_BYTES:
                        return self._decoder.end()
                    return await anyio.to_thread.run_sync(self._decoder.end)
                if len(data) > READ_SLICE:
                    self._rest = memoryview(data)[READ_SLICE:]
                    data = data[:READ_SLICE]
            self.received += len(data)
            try:
                chunks = self._decoder.feed(data)
            except StreamBrokenError as exc:
                if not exc.chunks:
                    raise
                self._broken = exc  # the good chunks of this read go first
                return exc.chunks
            if chunks:
                return chunks

    def _retryable(self, exc: BaseException) -> bool:
        """Whether a failed try may be repeated on this upstream (`gateway.relay.retry`)."""
        return retryable(
            exc, retry_server_error=self._retry_server_error, server_errors=self.server_errors
        )

    def _note_server_error(self, error: UpstreamStatusError) -> None:
        """Count a 500 that is not the request's fault (`server_errors`)."""
        if error.upstream_status == 500 and error.blame != "request":
            self.server_errors += 1

    def _deadline(self, phase_timeout: float, phase_message: str) -> tuple[float, str]:
        """The seconds to wait now and the message if they run out.

        The phase's own timeout (first byte or idle) applies, unless less than that is left of
        the whole request's `GATEWAY_REQUEST_TIMEOUT`.
        """
        seconds = self._wait_seconds(phase_timeout)
        return seconds, self._timeout_message(seconds, phase_timeout, phase_message)

    def _timeout_message(self, seconds: float, phase_timeout: float, phase_message: str) -> str:
        """What to tell the client when a wait of `seconds` (from `_wait_seconds`) ran out."""
        if seconds < phase_timeout:
            return f"request took longer than {self._settings.request_timeout:g} s"
        return phase_message.format(phase_timeout)

    def _wait_seconds(self, phase_timeout: float) -> float:
        """`phase_timeout`, or what is left of `GATEWAY_REQUEST_TIMEOUT` if that is less."""
        total = self._settings.request_timeout
        if total:
            left = self._meter.arrival + total - time.perf_counter()
            if left < phase_timeout:
                return max(left, 0.0)
        return phase_timeout

    async def batches(self) -> AsyncGenerator[list[Chunk], None]:
        """Yield the first batch of chunks, then the rest, each read within `idle_timeout`.

        A batch is what one read of the body completed, in order: usually one chunk. Ends
        after the final chunk, or after one error chunk that replaces a failure; never raises
        for an upstream fault. `open()` must have succeeded.
        """
        assert self._first is not None  # noqa: S101 - open() succeeded
        yield self._first
        if self._finished_by(self._first[-1]):  # the whole answer came in the first read
            await self._drain()
            return
        idle = self._settings.idle_timeout
        deadline = IdleDeadline()  # one timer for the stream, not one per chunk
        try:
            while True:
                seconds = self._wait_seconds(idle)
                try:
                    batch = await deadline.wait(self._next_batch(), seconds)
                except Exception as exc:
                    message = self._timeout_message(seconds, idle, _IDLE_MESSAGE)
                    error = self._classify(exc, message, request_deadline=seconds < idle)
                    self.failure = error or UpstreamError("upstream stream failed")
                    self.outcome = self.failure.outcome
                    logger.warning("upstream stream failed: %s", self.failure.message)
                    yield [Chunk.failure(self.failure.message)]
                    return
                yield batch
                # Only a batch's last chunk can end the answer: decoders stop there.
                if self._finished_by(batch[-1]):
                    await self._drain()
                    return
        finally:
            deadline.close()

    def divertible(self) -> bool:
        """Whether `push` can relay the rest.

        True when the body calls back (`gateway.relay.push`) and nothing of the first read is
        left to decode.
        """
        return (
            is_divertible(self._reads)
            and self._rest is None
            and self._broken is None
            and self._decoder is not None
        )

    async def push(
        self,
        deliver: Callable[[list[Chunk]], None],
        writer: Writer,
        client_idle: float,
        tick: Callable[[float], None] | None = None,
        text_event: TextEvent | None = None,
    ) -> None:
        """Deliver the first batch, then the rest from the upstream's callbacks (`Pump`).

        With `tick`, the caller says that `tick` is all its `deliver` does, beyond encoding
        and writing, with an in-between chunk that carries text, and that its codec writes
        each chunk's `raw` (`text_event` None) or writes a chunk of text alone as
        `text_event` does: the decoder's lane (`StreamDecoder.lane`) then relays such a read
        in one call, writing to `writer`.

        `divertible()` must be true and `open()` must have succeeded. Ends as `batches` does:
        after the final chunk (body drained), or after one error chunk that replaces a failure;
        never raises for an upstream fault.

        Raises:
            ClientStalledError: the client read nothing for `client_idle` seconds.
        """
        assert self._first is not None  # noqa: S101 - open() succeeded
        assert is_divertible(self._reads)  # noqa: S101 - divertible()
        assert self._decoder is not None  # noqa: S101 - divertible()
        deliver(self._first)
        if self._finished_by(self._first[-1]):
            await self._drain()
            return
        lane = None if tick is None else self._decoder.lane(tick, writer.write, text_event)
        pump = Pump(self._reads, self, deliver, writer, client_idle, lane)
        try:
            how = await pump.wait()
        finally:
            self.received += pump.received
        if how == "end":  # the body ended: the decoder says whether the answer was whole
            try:
                if self.received <= INLINE_PARSE_BYTES:
                    chunks = self._decoder_end()
                else:
                    chunks = await anyio.to_thread.run_sync(self._decoder_end)
            except Exception as exc:
                deliver([self.failed(exc, request_deadline=False)])
                return
            if chunks:
                deliver(chunks)
                if self._finished_by(chunks[-1]):
                    return
            message = "upstream closed the stream before the answer ended"
            deliver([self.failed(StreamBrokenError(message), request_deadline=False)])

    def _decoder_end(self) -> list[Chunk]:
        assert self._decoder is not None  # noqa: S101 - set with the response
        return self._decoder.end()

    # --- the push path's view of the exchange (`gateway.relay.push.Decoding`) ---------------

    def feed(self, data: bytes) -> list[Chunk]:
        """Decode one piece of the body (`Pump`'s callback).

        Raises:
            StreamBrokenError: the body is not the dialect's stream.
        """
        assert self._decoder is not None  # noqa: S101 - set with the response
        return self._decoder.feed(data)

    def finished_by(self, chunk: Chunk) -> bool:
        """Whether `chunk` ends the answer; sets the outcome (and the failure) if it does."""
        return self._finished_by(chunk)

    def idle_due(self, last: float) -> tuple[float, bool]:
        """When a wait after a read at loop time `last` must end (event-loop time).

        Also whether that is the rest of `GATEWAY_REQUEST_TIMEOUT` rather than the idle timeout.
        """
        loop = asyncio.get_running_loop()
        due = last + self._settings.idle_timeout
        total = self._settings.request_timeout
        if total:
            end = loop.time() + (self._meter.arrival + total - time.perf_counter())
            if end < due:
                return end, True
        return due, False

    def failed(self, exc: BaseException, *, request_deadline: bool) -> Chunk:
        """Record the mid-stream failure `exc` as `batches` does; the client's error chunk."""
        idle = self._settings.idle_timeout
        message = self._timeout_message(0.0 if request_deadline else idle, idle, _IDLE_MESSAGE)
        error = self._classify(exc, message, request_deadline=request_deadline)
        self.failure = error or UpstreamError("upstream stream failed")
        self.outcome = self.failure.outcome
        logger.warning("upstream stream failed: %s", self.failure.message)
        return Chunk.failure(self.failure.message)

    async def _drain(self) -> None:
        """Read the upstream's body to its end after the answer (`_DRAIN_LIMIT`, `_DRAIN_SECONDS`).

        A connection goes back to the pool only when its body was read to the end; closing a
        response earlier discards the connection, and the next request pays a new TCP
        connection (found by benchmarks/: one connection per request).
        """
        assert self._reads is not None  # noqa: S101
        seen = 0
        # The answer is complete: a failure here only costs the connection, and so does an
        # upstream that keeps the body open after `done` (the client must not wait for it).
        with anyio.move_on_after(_DRAIN_SECONDS), contextlib.suppress(Exception):
            async for data in self._reads:
                seen += len(data)
                if seen > _DRAIN_LIMIT:
                    return

    def _finished_by(self, chunk: Chunk) -> bool:
        if chunk.error is not None:
            # The model's own error text: a prompt may provoke it as well as a broken server.
            self.failure = UpstreamError(chunk.error, blame="either")
            self.outcome = "upstream_error"
            self._metrics.upstream_errors.labels("stream").inc()
            return True
        if chunk.done:
            self.outcome = "completed"
            return True
        return False

    async def aclose(self) -> None:
        """Close the upstream response at once; this is what frees the model server's slot.

        Safe to call more than once, and from a cancelled task (the close is shielded).
        """
        if self._reads is None and self._response is None:
            return
        with anyio.CancelScope(shield=True):
            reads, self._reads = self._reads, None
            close = getattr(reads, "aclose", None)  # httpx's body iterators are generators
            if close is not None:
                await close()
            response, self._response = self._response, None
            if response is not None:
                await response.aclose()

    async def _status_error(self, response: httpx.Response) -> UpstreamStatusError:
        """Read the upstream's error body (bounded) and build the client's error."""
        raw = b""
        async for part in response.aiter_bytes():
            raw += part
            if len(raw) >= ERROR_BODY_LIMIT:
                break
        message = error_message(raw)
        log_status_error(logger, response.status_code, message)
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        error = UpstreamStatusError(response.status_code, message, retry_after=retry_after)
        self._note_server_error(error)
        return self._count(error, status_kind(error))

    def _classify(
        self, exc: BaseException, deadline_message: str, *, request_deadline: bool = False
    ) -> GatewayError | None:
        """Map a transport exception to the client's error, counted; None for ones to re-raise.

        The classifier is `gateway.upstream.errors.transport_error`; only an over-long answer
        the request asked for is told apart here (it needs the request).

        Args:
            exc: What the try or the read raised.
            deadline_message: The client's message if `exc` is the relay's own deadline.
            request_deadline: That deadline was the rest of the request's total
                `GATEWAY_REQUEST_TIMEOUT`, not a phase's: running out of it is not the
                upstream's fault (it was never silent for a whole phase).
        """
        if isinstance(exc, GatewayError):
            return exc
        if isinstance(exc, AnswerTooLongError):
            inputs = requested_vectors(self._generation)
            if inputs * MAX_VECTOR_BYTES >= MAX_LINE_BYTES:  # the request asked for that much
                return AnswerTooLargeError(
                    f"the embeddings of these {inputs} inputs are larger than the gateway's "
                    f"{MAX_LINE_BYTES // 2**20} MiB limit for one answer: send fewer inputs "
                    "per request"
                )
        classified = transport_error(exc, deadline_message, request_deadline=request_deadline)
        if classified is None:
            return None
        return self._count(*classified)

    def _count(self, error: E, kind: str) -> E:
        self._metrics.upstream_errors.labels(kind).inc()
        return error

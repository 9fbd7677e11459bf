"""The push relay: an answer's chunks go from the upstream's socket to the client's in callbacks.

Why: on the pull path (`Exchange.batches` read by `RelayResponse`) each upstream read wakes the
response's task: a future set in the upstream protocol's callback, a task step one turn of the
event loop later, a generator and a chain of ASGI `send` coroutines per chunk. At today's token
rates that wake-up, not Python, is most of the relay's CPU per chunk (docs/performance.md, "Per
chunk: wake-ups, not Python"); an asyncio Protocol relay with no coroutine per chunk cost 29 %
less CPU per request than the same relay waking a coroutine per read ("Can a Python data plane
reach 2x nginx?"). Here, once the answer has started, each upstream read is decoded, metered,
encoded and written to the client inside the upstream protocol's `data_received`: the response's
task only waits for the end.

A read that is one whole in-between unit of the answer (a token's line) is first offered to the
decoder's lane (`gateway.upstream.dialects.base.Lane`), which decodes, meters, encodes and writes
it in one call; what it refuses takes the long way (the decoder, `deliver`).

Everything the pull path guarantees holds, each from a timer or a callback instead of an
`await`:

- the idle deadline (`GATEWAY_IDLE_TIMEOUT`, or the rest of `GATEWAY_REQUEST_TIMEOUT` if less):
  one timer, re-armed lazily when it fires before the deadline (the last read moved it);
- a client that reads nothing (its connection's write buffer over the high-water mark) pauses
  the upstream's reading, so nothing piles up in the gateway; the upstream's idle deadline does
  not run meanwhile, the client's does (`GATEWAY_IDLE_TIMEOUT`: `ClientStalledError`, as
  `IdleDeadline` raises `TimeoutError` on the pull path);
- a read longer than `READ_SLICE` is decoded one slice per turn of the event loop, with the
  upstream's reading paused, so that one fast upstream cannot hold the loop;
- after the final chunk the body is read to its end (bounded by `DRAIN_LIMIT` bytes and
  `DRAIN_SECONDS`), so the upstream connection is kept;
- a failure after the first chunk ends the stream with one error chunk (the error contract's
  mid-stream rule), classified and counted as on the pull path (`Exchange`'s classifier);
- the client leaving, or a shutdown's deadline, cancels the waiting task, which detaches the
  pump (`Pump.detach`): no callback writes after that.

The relay's modules hold the two ends only as the Protocols below: the upstream body
(`gateway.upstream.httptools_transport.ResponseBody`) and the client's connection
(`gateway.serve.writer.BodyWriter`, found in the ASGI scope's extensions under `WRITER`).

Over ~300 lines for one reason: `Pump` is one state machine over callbacks (the source's
pieces, end and failure, the client's flow, the idle, stall and drain timers, the slices), and
each of them reads the state the others set.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeGuard, runtime_checkable

from gateway.neutral import Chunk

WRITER = "gateway.body_writer"
"""The ASGI scope extension (`scope["extensions"]`) holding the client connection's `Writer`."""

READ_SLICE = 64 * 1024
"""Most bytes of one read decoded in one turn of the event loop."""

DRAIN_LIMIT = 64 * 1024
"""Most bytes read after the final chunk to keep the connection."""

DRAIN_SECONDS = 1.0
"""Longest wait, in seconds, for the body's end after the final chunk."""


class ClientStalledError(Exception):
    """The client read nothing for the idle timeout: its stream is closed."""


class BodySink(Protocol):
    """What an upstream body calls as it arrives, once diverted to a pump."""

    def body(self, piece: bytes) -> None:
        """A piece of the body (never empty)."""
        ...

    def end(self) -> None:
        """The body ended as its framing says; nothing follows."""
        ...

    def fail(self, exc: Exception) -> None:
        """The body failed (an `httpx.TransportError`); nothing follows."""
        ...


@runtime_checkable
class Divertible(Protocol):
    """An upstream body that can call a sink instead of being read (the push path's source)."""

    def divert(self, sink: BodySink | None) -> None:
        """Send what is buffered, then every later piece, to `sink`; None detaches it."""
        ...

    def pause_reading(self) -> None:
        """Stop reading the upstream's socket (backpressure)."""
        ...

    def resume_reading(self) -> None:
        """Read the upstream's socket again."""
        ...


_DIVERTIBLE_CLASSES: dict[type, bool] = {}


def is_divertible(source: object) -> TypeGuard[Divertible]:
    """`isinstance(source, Divertible)`, remembered per class.

    Why: a runtime-checkable Protocol's `isinstance` walks the class's MRO for every member on
    each call (about 10 µs, twice per streamed request, measured with py-spy); the answer is a
    property of the class, since `Divertible`'s members are methods.
    """
    kind = type(source)
    known = _DIVERTIBLE_CLASSES.get(kind)
    if known is None:
        known = _DIVERTIBLE_CLASSES[kind] = isinstance(source, Divertible)
    return known


class Writer(Protocol):
    """The client's connection, past the ASGI `send` chain (`gateway.serve.writer`)."""

    def ready(self) -> bool:
        """Whether body pieces may be written directly now (a chunked response under way)."""
        ...

    def write(self, body: bytes) -> None:
        """Write one piece of the response body, framed as the server frames it."""
        ...

    @property
    def paused(self) -> bool:
        """The connection's write buffer is over its high-water mark."""
        ...

    def watch(self, listener: Callable[[bool], None] | None) -> None:
        """Call `listener(True)` when writing pauses and `listener(False)` when it resumes."""
        ...


class Decoding(Protocol):
    """What the pump asks of the exchange it relays for (`gateway.relay.exchange.Exchange`)."""

    def feed(self, data: bytes) -> list[Chunk]:
        """Decode one piece; the chunks it completed, perhaps none.

        Raises:
            StreamBrokenError: the body is not the dialect's stream (with its good chunks).
        """
        ...

    def finished_by(self, chunk: Chunk) -> bool:
        """Whether `chunk` ends the answer (its outcome is then set)."""
        ...

    def idle_due(self, last: float) -> tuple[float, bool]:
        """The loop time the wait after a read at `last` must end by.

        Also whether that is the request's whole deadline rather than the idle one.
        """
        ...

    def failed(self, exc: BaseException, *, request_deadline: bool) -> Chunk:
        """Record the failure `exc` (classified, counted, logged); the error chunk to send."""
        ...


class Pump:
    """Relays one answer's body from a `Divertible` to a deliver callback; see the module doc.

    Args:
        source: The upstream body, already answering (its first batch was delivered).
        decoding: The exchange's decoder and rules.
        deliver: Called with each batch of chunks, in order; writes them to the client.
        writer: The client's connection (its flow control).
        client_idle: Seconds the client may read nothing (`GATEWAY_IDLE_TIMEOUT`).
        lane: The decoder's one-call relay of the usual read (`Lane` in
            `gateway.upstream.dialects.base`), tried first for a read that is neither sliced
            nor after the answer; None: none.

    `wait()` returns when the answer ended (completed, or ended by one error chunk) and its
    body was drained; it returns "end" when the body ended with bytes still undecoded, so that
    the caller runs the decoder's end (in a thread when large).

    Raises (from `wait`):
        ClientStalledError: the client read nothing for `client_idle` seconds.
    """

    def __init__(
        self,
        source: Divertible,
        decoding: Decoding,
        deliver: Callable[[list[Chunk]], None],
        writer: Writer,
        client_idle: float,
        lane: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._lane = lane
        self._source = source
        self._decoding = decoding
        self._deliver = deliver
        self._writer = writer
        self._client_idle = client_idle
        self._done: asyncio.Future[str] = self._loop.create_future()
        self._pending: deque[memoryview] = deque()  # an empty view: the body's end or failure
        self._failure: Exception | None = None  # the failure queued behind the slices
        self._answered = False  # the final chunk was delivered: the rest is drained
        self._drained = 0
        self._last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._client_paused = False
        self._slicing = False
        self.received = 0

    async def wait(self) -> str:
        """Divert the source to this pump and wait for the answer's end (see the class doc).

        Raises:
            ClientStalledError: the client stopped reading for the idle timeout.
        """
        self._writer.watch(self._flow)
        self._arm_idle()
        self._source.divert(self)
        if self._writer.paused and not self._done.done():
            self._flow(True)
        try:
            return await self._done
        finally:
            self.detach()

    def detach(self) -> None:
        """Stop every callback: no write to the client after this (idempotent)."""
        self._source.divert(None)
        self._writer.watch(None)
        for timer in (self._timer, self._stall):
            if timer is not None:
                timer.cancel()
        self._timer = self._stall = None
        self._pending.clear()

    # --- the source's callbacks (BodySink) -------------------------------------------------

    def body(self, piece: bytes) -> None:
        """Decode and deliver `piece` (a slice a turn when long), or count it as drained."""
        if self._done.done():
            return
        self._last = self._loop.time()
        self.received += len(piece)
        if self._answered:
            self._drained += len(piece)
            if self._drained > DRAIN_LIMIT:
                self._resolve("done")  # the connection is discarded, the answer is whole
            return
        if self._pending or len(piece) > READ_SLICE:
            self._pending.append(memoryview(piece))
            self._start_slicing()
            return
        lane = self._lane
        if lane is not None:
            try:
                if lane(piece):
                    return  # relayed in one call: never the final chunk, never a failure
            except Exception as exc:  # a bug: one error chunk ends the stream, as in `_decode`
                self._fail(exc, request_deadline=False)
                return
        self._decode(piece)

    def end(self) -> None:
        """The body ended: the answer is complete, or the decoder must say what is left."""
        if self._done.done():
            return
        if self._pending:  # decoded after the slices still queued
            self._pending.append(memoryview(b""))
            return
        self._resolve("done" if self._answered else "end")

    def fail(self, exc: Exception) -> None:
        """The upstream failed mid-stream: one error chunk ends the stream.

        Queued behind the slices of earlier reads, as the pull path reads them first: a read
        that held the final chunk, cut by a failure in the same callback, still completes.
        """
        if self._done.done():
            return
        if self._pending:
            self._failure = exc
            self._pending.append(memoryview(b""))
            return
        if self._answered:  # the answer is whole; only the connection is lost
            self._resolve("done")
            return
        self._fail(exc, request_deadline=False)

    # --- internals -------------------------------------------------------------------------

    def _decode(self, data: bytes) -> None:
        try:
            chunks = self._decoding.feed(data)
        except Exception as exc:  # StreamBrokenError (its good chunks first), or a bug
            good = getattr(exc, "chunks", None)
            if good:
                self._deliver(good)
            self._fail(exc, request_deadline=False)
            return
        if chunks:
            self._deliver(chunks)
            if self._decoding.finished_by(chunks[-1]):
                self._answer_complete()

    def _answer_complete(self) -> None:
        """The final chunk went out: wait (bounded) for the body's end to keep the connection.

        Unless the body's end (or failure) is queued already behind the slices: nothing is left
        to drain, and the client must not wait `DRAIN_SECONDS` for it.
        """
        self._answered = True
        ended = bool(self._pending) and not self._pending[-1]
        self._pending.clear()
        if ended:
            self._slicing = False
            self._source.resume_reading()  # left as found: no pause outlives the pump
            self._resolve("done")
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(DRAIN_SECONDS, self._resolve, "done")
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._client_paused:  # the drain must not wait for the client
            self._client_paused = False
            self._source.resume_reading()

    def _fail(self, exc: BaseException, *, request_deadline: bool) -> None:
        self._deliver([self._decoding.failed(exc, request_deadline=request_deadline)])
        self._resolve("done")

    def _resolve(self, how: str) -> None:
        if not self._done.done():
            self._done.set_result(how)
        self.detach()

    def _start_slicing(self) -> None:
        if not self._slicing:
            self._slicing = True
            self._source.pause_reading()
            self._loop.call_soon(self._next_slice)

    def _next_slice(self) -> None:
        """Decode one slice of the queued reads; the next slice waits for the next turn."""
        if self._done.done():
            return
        if not self._pending:
            self._slicing = False
            if not self._client_paused:
                self._source.resume_reading()
            return
        view = self._pending[0]
        if not view:  # the body's end or failure, queued behind the reads
            self._pending.popleft()
            failure, self._failure = self._failure, None
            if failure is not None and not self._answered:
                self._fail(failure, request_deadline=False)
            else:
                self._resolve("done" if self._answered else "end")
            return
        data = bytes(view[:READ_SLICE])
        if len(view) > READ_SLICE:
            self._pending[0] = view[READ_SLICE:]
        else:
            self._pending.popleft()
        self._decode(data)
        if not self._done.done():
            self._loop.call_soon(self._next_slice)

    def _arm_idle(self) -> None:
        due, _ = self._decoding.idle_due(self._last)
        self._timer = self._loop.call_at(due, self._idle_check)

    def _idle_check(self) -> None:
        """The idle timer fired: time out if no read came since, else wait the rest."""
        self._timer = None
        if self._done.done() or self._client_paused or self._answered:
            return
        due, whole_request = self._decoding.idle_due(self._last)
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._idle_check)
            return
        self._fail(TimeoutError(), request_deadline=whole_request)

    def _flow(self, paused: bool) -> None:
        """The client's connection paused or resumed writing."""
        if self._done.done() or self._answered or paused == self._client_paused:
            return  # once answered, only the drain is left: it does not wait for the client
        self._client_paused = paused
        if paused:
            self._source.pause_reading()
            self._stall = self._loop.call_later(self._client_idle, self._stalled)
            return
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self._last = self._loop.time()  # the upstream's idle wait starts again now
        if self._timer is None and not self._answered:
            self._arm_idle()
        if not self._slicing:
            self._source.resume_reading()

    def _stalled(self) -> None:
        self._stall = None
        if not self._done.done():
            self._done.set_exception(ClientStalledError())
            self.detach()

# ruff: noqa: T201 (a benchmark prints its table)
"""`python -m benchmarks.chunk_path`: the push path's Python per chunk, hot and with cold caches.

Issue 27's steady-state profile (`python -m benchmarks.cost_split --steady 1000`) puts the
gateway's CPU per relayed chunk at about twice the bare Protocol relay's, with the difference in
the interpreter (perf by shared object), although the push path runs about 20 Python calls per
chunk. This measures that chain in process, without sockets: httptools parses one chunked
upstream piece (an Ollama `/api/chat` line) and calls the real `gateway.relay.push.Pump`, which
decodes it (`NdjsonDecoder`), meters it (the meter's token clock), encodes it (`NdjsonCodec`) and
writes it through the real `gateway.serve.writer.BodyWriter` to a transport that drops it.
Three ways:

- **hot**: one chain, the same piece again and again: everything in the CPU's caches;
- **16 chains in turn**: 16 streams' objects, one chunk each in turn (as 16 streams arrive);
- **caches evicted**: the same, with a write to every cache line of 8 MiB before each chunk,
  as the kernel's network stack, the event loop and other processes leave the caches between
  two chunks of a real run;
- the same two with the decoder's lane (`NdjsonDecoder.lane`), as the gateway relays an
  Ollama client's answer from an Ollama upstream;
- and the same two for `collapsed_chain`, a prototype of the relay as one function per read.

    .venv/bin/python -m benchmarks.chunk_path          # about 20 s
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence

import httptools
import orjson

from gateway.api.ollama.codec import NdjsonCodec
from gateway.neutral import Chunk, GenerationRequest, TokenClock
from gateway.relay.push import Pump
from gateway.serve.writer import BodyWriter
from gateway.upstream.dialects.ollama import NdjsonDecoder

LINE = (
    orjson.dumps(
        {
            "model": "bench:latest",
            "created_at": "2026-12-07T14:00:00.000000Z",
            "message": {"role": "assistant", "content": "word "},
            "done": False,
        }
    )
    + b"\n"
)
PIECE = b"%x\r\n%b\r\n" % (len(LINE), LINE)
"""One upstream read: a token's NDJSON line in its HTTP/1.1 chunk."""

EVICT_BYTES = 8 * 1024 * 1024
"""Bytes written (one per cache line) before each chunk of the cold run: more than L2 and most
L3 caches of a VM's share."""


class _Transport:
    """The client connection's transport: counts the writes, keeps the last."""

    def __init__(self) -> None:
        self.writes = 0
        self.last = b""

    def write(self, data: bytes) -> None:
        """Count `data`, keep it as the last write."""
        self.writes += 1
        self.last = data

    def is_closing(self) -> bool:
        """Never closing."""
        return False


class _Flow:
    write_paused = False


class _Cycle:
    """What `BodyWriter` reads of uvicorn's `RequestResponseCycle`: a chunked response under way."""

    def __init__(self) -> None:
        self.response_started = True
        self.response_complete = False
        self.chunked_encoding = True
        self.disconnected = False
        self.transport = _Transport()
        self.flow = _Flow()


class _Source:
    """The upstream body: the pieces come from the parser below, not from `divert`."""

    def divert(self, sink: object) -> None:
        """Nothing buffered."""

    def pause_reading(self) -> None:
        """No socket."""

    def resume_reading(self) -> None:
        """No socket."""


class _Decoding:
    """`gateway.relay.push.Decoding` over the real NDJSON decoder (as `Exchange` is)."""

    def __init__(self) -> None:
        self.decoder = NdjsonDecoder()

    def feed(self, data: bytes) -> list[Chunk]:
        return self.decoder.feed(data)

    def finished_by(self, chunk: Chunk) -> bool:
        return chunk.error is not None or chunk.done

    def idle_due(self, last: float) -> tuple[float, bool]:
        return last + 3600.0, False

    def failed(self, exc: BaseException, *, request_deadline: bool) -> Chunk:  # noqa: ARG002
        return Chunk.failure("failed")


def chain(*, lane: bool = False) -> tuple[Callable[[bytes], None], _Transport]:
    """One stream's push path, from the upstream parser to the client's transport.

    With `lane`, the pump tries the decoder's lane first (`NdjsonDecoder.lane`), as the
    gateway does for an Ollama client of an Ollama upstream; without, every read is decoded,
    metered, encoded and written (as for a translated surface). Must be called in a running
    event loop (`Pump` takes it). Returns the parser's `feed_data` and the transport the
    client's bytes reach.
    """
    clock = TokenClock()
    request = GenerationRequest(surface="ollama", operation="chat", body={}, model="bench:latest")
    codec = NdjsonCodec(request)
    cycle = _Cycle()
    writer = BodyWriter(cycle)

    def deliver(batch: list[Chunk]) -> None:  # as `RelayResponse._relay` delivers
        for chunk in batch:
            if chunk.text or chunk.thinking or chunk.tool_calls:
                clock.tick(time.perf_counter())
        body = codec.encode(batch)
        if body:
            writer.write(body)

    decoding = _Decoding()
    fast = decoding.decoder.lane(clock.tick, writer.write) if lane else None
    pump = Pump(_Source(), decoding, deliver, writer, 3600.0, fast)

    class Parser:
        def on_body(self, body: bytes) -> None:
            pump.body(body)

    parser = httptools.HttpResponseParser(Parser())
    parser.feed_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    return parser.feed_data, cycle.transport


def collapsed_chain() -> tuple[Callable[[bytes], None], _Transport]:
    """A prototype, not the gateway's code: the same relay as one function per upstream piece.

    For an answer relayed as the upstream wrote it (an Ollama line to an Ollama client), one
    `on_body` notes the read's time, checks the piece is one JSON object line (orjson), meters
    a token, and writes the piece framed: what issue 27's next step could build. It keeps none
    of the push path's other duties (the idle and stall timers, the client's flow control, long
    reads in slices, the final chunk's stats), so it bounds what collapsing the chain can save.
    Must be called in a running event loop.
    """
    transport = _Transport()
    clock = TokenClock()
    loop_time = asyncio.get_running_loop().time
    loads = orjson.loads

    class Parser:
        last = 0.0

        def on_body(self, body: bytes) -> None:
            self.last = loop_time()
            if body.find(b"\n") != len(body) - 1:
                raise ValueError("the prototype takes one whole line a read")
            data = loads(body)
            if type(data) is not dict:
                raise ValueError("not a JSON object")
            message = data.get("message")
            done = data.get("done") is True or "error" in data
            if not done and isinstance(message, dict) and message.get("content"):
                clock.tick(time.perf_counter())
            transport.write(b"%x\r\n%b\r\n" % (len(body), body))

    parser = httptools.HttpResponseParser(Parser())
    parser.feed_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    return parser.feed_data, transport


def _timed(streams: list[Callable[[bytes], None]], chunks: int, evict: bool) -> float:
    """µs per chunk, the streams fed one piece each in turn (caches evicted before each)."""
    junk = bytearray(EVICT_BYTES) if evict else bytearray()
    fill = b"x" * (EVICT_BYTES // 64)
    spent = 0.0
    for n in range(chunks):
        if evict:
            junk[::64] = fill
        started = time.perf_counter()
        streams[n % len(streams)](PIECE)
        spent += time.perf_counter() - started
    return spent / chunks * 1e6


async def run(chunks: int) -> dict[str, float]:
    """µs per chunk, seven ways (the keys of the returned dict).

    `hot`, `in turn` and `evicted` for the push path without the lane (every read decoded);
    `lane, in turn` and `lane, evicted` with it; `one function, in turn` and `one function,
    evicted` for the prototype (`collapsed_chain`). `chunks` chunks hot and in turn; a quarter
    as many with the caches evicted (each eviction writes `EVICT_BYTES`).
    """
    one, _ = chain()
    started = time.perf_counter()
    for _ in range(chunks):
        one(PIECE)
    hot = time.perf_counter() - started
    streams = [chain()[0] for _ in range(16)]
    started = time.perf_counter()
    for n in range(chunks):
        streams[n % 16](PIECE)
    in_turn = time.perf_counter() - started
    junk = bytearray(EVICT_BYTES)
    fill = b"x" * (EVICT_BYTES // 64)
    evicted = 0.0
    cold = max(chunks // 4, 1)
    for n in range(cold):
        junk[::64] = fill
        started = time.perf_counter()
        streams[n % 16](PIECE)
        evicted += time.perf_counter() - started
    prototype = [collapsed_chain()[0] for _ in range(16)]
    laned = [chain(lane=True)[0] for _ in range(16)]
    return {
        "hot": hot / chunks * 1e6,
        "in turn": in_turn / chunks * 1e6,
        "evicted": evicted / cold * 1e6,
        "lane, in turn": _timed(laned, chunks, evict=False),
        "lane, evicted": _timed(laned, cold, evict=True),
        "one function, in turn": _timed(prototype, chunks, evict=False),
        "one function, evicted": _timed(prototype, cold, evict=True),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print µs per chunk, seven ways."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chunk_path", description=__doc__)
    parser.add_argument("--chunks", type=int, default=40000, help="chunks per way (40000)")
    args = parser.parse_args(argv)
    if args.chunks < 1:
        parser.error("--chunks must be at least 1")
    result = asyncio.run(run(args.chunks))
    print("push path, Python per chunk (µs): one /api/chat line, parse to write")
    print(f"  hot, one chain             {result['hot']:6.2f}")
    print(f"  16 chains in turn          {result['in turn']:6.2f}")
    print(f"  16 chains, caches evicted  {result['evicted']:6.2f}")
    print("the same with the decoder's lane (NdjsonDecoder.lane, as the gateway relays /api/chat)")
    print(f"  16 chains in turn          {result['lane, in turn']:6.2f}")
    print(f"  16 chains, caches evicted  {result['lane, evicted']:6.2f}")
    print("a prototype of one function per read (collapsed_chain: bounds the saving)")
    print(f"  16 chains in turn          {result['one function, in turn']:6.2f}")
    print(f"  16 chains, caches evicted  {result['one function, evicted']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m benchmarks.wire_throughput`: the answer chunks per second the load generator reads.

The load generator of `gateway bench` (`gateway.clients.bench.driver` over
`gateway.clients.bench.wire` and
`gateway.clients.bench.protocol`) must read a server's stream faster than any server it measures can
write one, or it measures itself. This drives it, exactly as a benchmark does
(`run_concurrency`), against a tiny NDJSON server in a process of its own that answers every
`/api/chat` at once with `--tokens` Ollama chunks (one HTTP chunk each, a final chunk with
counters). The generator is pinned to one core and the server to another (when there are two),
and the report gives chunks per second of wall time and per second of the generator's own CPU
time: the second is the generator's ceiling on one core.

Prints one JSON object: `chunks`, `seconds`, `chunks_per_second`, `cpu_seconds`,
`chunks_per_cpu_second`, `chunks_per_read` (lines per socket read), `requests`, `errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from gateway.clients.bench import wire
from gateway.clients.bench.driver import run_concurrency
from gateway.clients.bench.protocol import Target
from gateway.clients.bench.workload import Sampling, load_workload


def _chunk(line: bytes) -> bytes:
    return f"{len(line):x}\r\n".encode() + line + b"\r\n"


def answer_pieces(tokens: int) -> list[bytes]:
    """A chunked HTTP/1.1 answer of `tokens` Ollama chat chunks and a final chunk, in writes."""
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    body = []
    for index in range(tokens):
        line = {
            "model": "m",
            "created_at": "2026-12-02T15:40:00.123456789Z",
            "message": {"role": "assistant", "content": f"tok{index} "},
            "done": False,
        }
        body.append(_chunk(json.dumps(line, separators=(",", ":")).encode() + b"\n"))
    final = {
        "model": "m",
        "created_at": "2026-12-02T15:40:01.123456789Z",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "stop",
        "total_duration": 1_000_000,
        "prompt_eval_count": 10,
        "prompt_eval_duration": 100_000,
        "eval_count": tokens,
        "eval_duration": 900_000,
    }
    body.append(_chunk(json.dumps(final, separators=(",", ":")).encode() + b"\n"))
    return [head, *body, b"0\r\n\r\n"]


class _Server(asyncio.Protocol):
    """Answers each request (headers and a Content-Length body) with the same pieces.

    At once (one write: the generator gets many lines per read, as from a fast server on a
    busy link), or `paced`: one write per chunk with a turn of the event loop between them, so
    the generator gets about one line per read, its worst case.
    """

    def __init__(self, pieces: list[bytes], paced: bool, gap: float) -> None:
        self.gap = gap
        self.pieces = pieces
        self.whole = b"".join(pieces)
        self.paced = paced
        self.tasks: set[asyncio.Task[None]] = set()
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            assert self.transport is not None  # noqa: S101
            if not self.paced:
                self.transport.write(self.whole)
                continue
            task = asyncio.get_running_loop().create_task(self._paced(self.transport))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _paced(self, transport: asyncio.Transport) -> None:
        for piece in self.pieces:
            transport.write(piece)
            await asyncio.sleep(self.gap)


def serve(port: int, tokens: int, paced: bool, gap: float) -> None:
    """Run the answer server on 127.0.0.1:`port` until killed."""
    pieces = answer_pieces(tokens)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Server(pieces, paced, gap), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _pin(core: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, {cores[core % len(cores)]})


async def measure(url: str, concurrency: int, duration: float) -> dict[str, float]:
    """Drive the server at `url` for `duration` seconds; count chunks, wall and CPU time."""
    target = Target(url, "ollama")
    workload = load_workload("builtin:short", Sampling())
    reads = [0]
    receive = wire.Connection.data_received

    def counted(self: wire.Connection, data: bytes) -> None:  # how many lines come per read
        reads[0] += 1
        receive(self, data)

    wire.Connection.data_received = counted  # type: ignore[method-assign]
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        run = await run_concurrency(target, workload, "m", concurrency, duration=duration)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        wire.Connection.data_received = receive  # type: ignore[method-assign]
    chunks = sum(len(r.chunk_times) + 1 for r in run.records)  # + the final chunk
    return {
        "chunks": chunks,
        "seconds": wall,
        "chunks_per_second": chunks / wall,
        "cpu_seconds": cpu,
        "chunks_per_cpu_second": chunks / cpu,
        "chunks_per_read": chunks / max(reads[0], 1),
        "requests": len(run.records),
        "errors": sum(not r.ok for r in run.records),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Start the server process, measure, print the JSON report."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.wire_throughput", description=__doc__
    )
    parser.add_argument("--tokens", type=int, default=1000, help="chunks per answer")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--uvloop", action="store_true", help="run the generator on uvloop")
    parser.add_argument(
        "--paced", action="store_true", help="one write per chunk: about one line per read"
    )
    parser.add_argument(
        "--gap", type=float, default=0.0, help="paced: seconds between a stream's chunks"
    )
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        _pin(1)
        serve(args.serve, args.tokens, args.paced, args.gap)
        return 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "benchmarks.wire_throughput", "--serve", str(port)]
    command += ["--tokens", str(args.tokens), "--gap", str(args.gap)]
    command += ["--paced"] if args.paced else []
    server = subprocess.Popen(command)  # noqa: S603 - this very script
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        _pin(0)
        run = measure(f"http://127.0.0.1:{port}", args.concurrency, args.duration)
        if args.uvloop:
            import uvloop

            report = uvloop.run(run)
        else:
            report = asyncio.run(run)
    finally:
        server.terminate()
        server.wait(10)
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

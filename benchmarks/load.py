"""The load generator: N concurrent streaming requests from a process of its own, measured.

The benchmark spawns `python -m benchmarks.load` once per target and concurrency level, so the
generator's CPU time is its own and is reported next to its results: a generator near 100 % of a
core would be measuring itself, not the server. It runs on uvloop. Its default client is a
minimal keep-alive HTTP/1.1 client on an asyncio protocol with httptools (llhttp, C) parsing
the answer (`gateway.clients.bench.wire`, shared with `gateway bench`). `--client httpx`
(httpx.AsyncClient, the gateway's own upstream client), `--client httpx-aiohttp` (httpx over
aiohttp's transport, package httpx-aiohttp) and `--client aiohttp` (aiohttp.ClientSession)
measure the alternatives side by side: each report carries the generator's own CPU seconds,
so CPU per chunk compares the clients
(docs/performance.md). httpx costs about four times the raw client's CPU per chunk.

Each stream measures TTFT (request sent -> first line carrying non-empty text) and counts the
lines (chunks) it receives; for the named SSE events of `/v1/responses` and `/v1/messages`
(`--events`) a chunk is an event carrying a piece of the answer, or the last event
(`benchmarks.stream.event_role`). It also times the gap between pieces of the answer that carry
chunks (the client's view of the relay's pacing: a proxy that holds chunks back, or stalls its
event loop, widens it), kept as a histogram (`GAP_BIN`); with `--pace` each answer is judged: it
holds when it lost no chunk (`--expect-chunks`) and no gap exceeded `HOLD_FACTOR` times the
pace. In `--duration` mode the streams start spread over `--warmup`
seconds, then a window of `--duration` seconds is measured: chunks received in it, requests
finished in it, the TTFT of requests started in it; at the end of the window no new request
starts and those in flight finish. In `--requests` mode the whole run is the window.
`--hold` opens the streams, waits for each one's first chunk, prints `{"ready": N}` and keeps
them open: the benchmark samples the server's memory meanwhile.

Prints one JSON object on stdout (see `Tally.report`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import uvloop

from benchmarks.stream import EVENTS, Reader, Spec
from gateway.clients.bench.wire import Connection, connect

_EXAMPLES = 5  # error texts kept for the report

GAP_BIN = 1.02
"""Gaps between chunks are counted in bins 2 % wide (from 1 µs), so that the reports of several
load processes merge exactly and a run of 100,000s of chunks stays a few hundred numbers."""

_LOG_BIN = math.log(GAP_BIN)

HOLD_FACTOR = 10.0
"""A stream holds when no gap between its chunks exceeds this many times the pace (the open rig's
definition, docs/performance.md) and no chunk is lost."""


def gap_bin(seconds: float) -> int:
    """The histogram bin of a gap of `seconds` (bin k holds gaps up to `gap_seconds(k)`)."""
    return max(0, math.ceil(math.log(max(seconds, 1e-6) / 1e-6) / _LOG_BIN))


def gap_seconds(index: int) -> float:
    """The upper edge of bin `index`, in seconds (within 2 % of every gap it holds)."""
    return 1e-6 * GAP_BIN**index


@dataclass
class Tally:
    """What all streams of this process measured."""

    window_start: float
    window_end: float
    ttfts: list[float] = field(default_factory=list)
    decode_rates: list[float] = field(default_factory=list)
    tokens_per_request: list[int] = field(default_factory=list)
    chunks: int = 0
    tokens: int = 0
    requests: int = 0
    completed: int = 0
    errors: int = 0
    examples: list[str] = field(default_factory=list)
    last_end: float = 0.0
    pace: float | None = None
    expect_chunks: int | None = None
    gap_bins: dict[int, int] = field(default_factory=dict)
    held: int = 0
    judged: int = 0

    def in_window(self, moment: float) -> bool:
        """Whether `moment` (perf_counter) falls in the measured window."""
        return self.window_start <= moment <= self.window_end

    def error(self, text: str) -> None:
        """Count a failed request and keep the first few texts (it did not hold)."""
        self.errors += 1
        self.judged += 1
        if len(self.examples) < _EXAMPLES:
            self.examples.append(text[:200])

    def record(self, reader: Reader, start: float, end: float) -> None:
        """Record one request that ended without a transport error."""
        bins = self.gap_bins
        for gap in reader.gaps:
            index = gap_bin(gap)
            bins[index] = bins.get(index, 0) + 1
        if self.pace is not None and self.in_window(end):
            self.judged += 1
            lost = self.expect_chunks is not None and reader.chunk_count != self.expect_chunks
            if reader.done and not lost and reader.max_gap <= HOLD_FACTOR * self.pace:
                self.held += 1
        self.chunks += reader.window_chunks
        if reader.spec.parse_all:  # otherwise only each answer's first text is parsed
            self.tokens += reader.window_tokens
        self.last_end = max(self.last_end, end)
        if reader.first is None or not reader.done:
            self.error("stream ended without text" if reader.first is None else "ended early")
            return
        self.completed += 1
        if self.in_window(end):
            self.requests += 1
        if self.in_window(start):
            self.ttfts.append(reader.first - start)
            if reader.spec.parse_all:
                self.tokens_per_request.append(reader.tokens)
                if reader.tokens > 1 and reader.last_token > reader.first:
                    rate = (reader.tokens - 1) / (reader.last_token - reader.first)
                    self.decode_rates.append(rate)

    def report(self, concurrency: int, cpu_seconds: float) -> dict[str, Any]:
        """The JSON the benchmark reads: counts in the window, samples, own CPU."""
        end = self.window_end if math.isfinite(self.window_end) else self.last_end
        window = max(end - self.window_start, 1e-9)
        return {
            "concurrency": concurrency,
            "window_seconds": window,
            "requests": self.requests,
            "chunks": self.chunks,
            "tokens": self.tokens,
            "completed": self.completed,
            "errors": self.errors,
            "error_examples": self.examples,
            "ttft_seconds": self.ttfts,
            "decode_tokens_per_second": self.decode_rates,
            "tokens_per_request": self.tokens_per_request,
            "cpu_seconds": cpu_seconds,
            "cpu_fraction": cpu_seconds / window,
            "gap_bins": {str(k): n for k, n in sorted(self.gap_bins.items())},
            "held": self.held,
            "judged": self.judged if self.pace is not None else 0,
        }


class Worker:
    """One stream slot: sends requests one after another on its own connection."""

    def __init__(self, spec: Spec, tally: Tally, client: Any) -> None:
        self.spec = spec
        self.tally = tally
        self.client = client
        self.request = spec.request_bytes()
        self.connection: Connection | None = None

    async def stream_once(self, ready: asyncio.Event | None = None) -> None:
        """Send one request and read its answer to the end, recording what it measured."""
        reader = Reader(self.spec, self.tally.in_window, ready)
        error = bytearray()
        start = time.perf_counter()
        try:
            status = await self._send(reader, error)
        except Exception as exc:  # whatever the client raised: one failed request
            self.close()
            self.tally.error(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.05)  # a refused connection must not become a busy loop
            return
        if status != 200:
            self.tally.error(f"{status}: {bytes(error[:200])!r}")
            return
        self.tally.record(reader, start, time.perf_counter())

    async def _send(self, reader: Reader, error: bytearray) -> int:
        def sink(piece: bytes) -> None:
            if status_holder[0] == 200:
                reader.feed(piece)
            else:
                error.extend(piece[:200])

        status_holder = [200]
        if self.client is not None and not isinstance(self.client, httpx.AsyncClient):
            spec = self.spec  # an aiohttp.ClientSession
            url = f"http://{spec.host}:{spec.port}{spec.path}"
            async with self.client.post(url, data=spec.body, headers=spec.headers) as answer:
                status_holder[0] = answer.status
                async for piece in answer.content.iter_any():
                    sink(piece)
            return int(answer.status)
        if self.client is not None:
            spec = self.spec
            url = f"http://{spec.host}:{spec.port}{spec.path}"
            async with self.client.stream(
                "POST", url, content=spec.body, headers=spec.headers
            ) as answer:
                status_holder[0] = answer.status_code
                async for piece in answer.aiter_raw():
                    sink(piece)
            return answer.status_code
        if self.connection is None or not self.connection.reusable:
            self.close()
            self.connection = await connect(self.spec.host, self.spec.port)
        connection = self.connection

        def status_sink(piece: bytes) -> None:
            status_holder[0] = connection.status
            sink(piece)

        return await connection.send(self.request, status_sink)

    def close(self) -> None:
        """Drop the connection (after an error, or at the end)."""
        connection, self.connection = self.connection, None
        if connection is not None and connection.transport is not None:
            connection.transport.close()


async def run(args: argparse.Namespace, spec: Spec) -> dict[str, Any]:
    """Drive `args.concurrency` streams as the module docstring says; return the report."""
    n = args.concurrency
    client = _client(args.client, n, args.read_timeout)
    counted = args.requests is not None
    warmup = 0.0 if counted else args.warmup
    now = time.perf_counter()
    end = math.inf if counted else now + warmup + args.duration
    tally = Tally(
        window_start=now + warmup,
        window_end=end,
        pace=args.pace,
        expect_chunks=args.expect_chunks,
    )
    workers = [Worker(spec, tally, client) for _ in range(n)]
    try:
        if args.hold is not None:
            return await _hold(workers, args.hold)
        budget = [args.requests or 0]

        async def drive(worker: Worker, delay: float) -> None:
            await asyncio.sleep(delay)
            while time.perf_counter() < tally.window_end:
                if counted:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                try:
                    await asyncio.wait_for(worker.stream_once(), args.read_timeout)
                except TimeoutError:
                    worker.close()
                    tally.error(f"no end of answer within {args.read_timeout:g} s")

        tasks = [asyncio.ensure_future(drive(w, warmup * i / n)) for i, w in enumerate(workers)]
        await asyncio.sleep(warmup)
        begin = time.process_time()
        if counted:
            await asyncio.gather(*tasks)
        else:
            await asyncio.sleep(args.duration)
        cpu = time.process_time() - begin
        await asyncio.gather(*tasks)
        return tally.report(n, cpu)
    finally:
        for worker in workers:
            worker.close()
        if client is not None:
            await client.close() if hasattr(client, "closed") else await client.aclose()


def _client(name: str, n: int, read_timeout: float) -> Any:
    """The client `--client` names, with `n` keep-alive connections; None for the raw one."""
    if name == "raw":
        return None
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    if name == "aiohttp":
        import aiohttp  # optional: the bench extra

        connector = aiohttp.TCPConnector(limit=n)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=read_timeout)
        return aiohttp.ClientSession(connector=connector, timeout=timeout)
    transport = None
    if name == "httpx-aiohttp":
        from httpx_aiohttp import AiohttpTransport  # optional: the bench extra

        transport = AiohttpTransport(limits=limits, trust_env=False)
    timeout = httpx.Timeout(connect=10.0, read=read_timeout, write=10.0, pool=60.0)
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False, transport=transport)


async def _hold(workers: list[Worker], hold: float) -> dict[str, Any]:
    """Open one stream per worker, print `{"ready": k}` once each has text, keep them open."""
    events = [asyncio.Event() for _ in workers]
    tasks = [asyncio.ensure_future(w.stream_once(e)) for w, e in zip(workers, events, strict=True)]
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    await asyncio.wait(waiters, timeout=60.0)
    ready = sum(e.is_set() for e in events)
    sys.stdout.write(json.dumps({"ready": ready, "errors": workers[0].tally.errors}) + "\n")
    sys.stdout.flush()
    await asyncio.sleep(hold)
    for task in [*tasks, *waiters]:
        task.cancel()
    await asyncio.gather(*tasks, *waiters, return_exceptions=True)
    return {"ready": ready}


def build_parser() -> argparse.ArgumentParser:
    """The `python -m benchmarks.load` arguments."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__)
    parser.add_argument("--url", required=True, help="target base URL (http://host:port)")
    parser.add_argument("--path", default="/api/generate")
    parser.add_argument("--body", required=True, help="JSON request body")
    parser.add_argument("--key", help="API key, sent as Authorization: Bearer")
    parser.add_argument("--sse", action="store_true", help="server-sent events answer")
    parser.add_argument(
        "--events",
        choices=EVENTS,
        default="chat",
        help="with --sse, the event set: chat (OpenAI chat/completions, ended by [DONE]), "
        "responses (/v1/responses) or messages (/v1/messages)",
    )
    parser.add_argument("--parse-all", action="store_true", help="count tokens, decode rates")
    parser.add_argument(
        "--client", choices=["raw", "httpx", "httpx-aiohttp", "aiohttp"], default="raw"
    )
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="ramp-up seconds, unmeasured")
    parser.add_argument("--requests", type=int, help="measure this many requests instead")
    parser.add_argument("--hold", type=float, help="open the streams and hold them this long")
    parser.add_argument("--read-timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument(
        "--pace",
        type=float,
        help="seconds between the upstream's tokens: judge whether each stream holds "
        f"(no gap over {HOLD_FACTOR:g} times this, no chunk lost)",
    )
    parser.add_argument("--expect-chunks", type=int, help="chunks every answer must have")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the load generator; prints its JSON report on stdout."""
    args = build_parser().parse_args(argv)
    url = urlsplit(args.url)
    headers = {"Content-Type": "application/json"}
    if args.key:
        headers["Authorization"] = f"Bearer {args.key}"
    body = json.dumps(json.loads(args.body)).encode()
    spec = Spec(
        url.hostname or "127.0.0.1",
        url.port or 80,
        args.path,
        body,
        headers,
        sse=args.sse,
        parse_all=args.parse_all,
        events=args.events,
    )
    report = uvloop.run(run(args, spec))
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

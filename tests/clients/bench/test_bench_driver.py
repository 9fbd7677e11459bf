"""The driver over real loopback sockets: the emulator (in-thread, and a process of known
capacity for the truth tests) and a real gateway in front of it.

The truth tests run the emulator as a process of its own so the load generator and the server
do not share one interpreter lock, and compare the measured numbers against the truth computed
from the emulator's knobs (gateway.testing.emulator.capacity), within 3%. The knobs are chosen
so the closed loop runs in lockstep (C a multiple of P or at most P, requests a multiple of the
batch), which makes the truth exact rather than an average; the gaps are tens of milliseconds
summed over many tokens, so scheduling jitter on a loaded machine stays well below 3%. The one
cost the knobs leave out, the loopback's wake-up latency after a silence (tens of ms on some
VMs), is measured (the `wake` fixture) and added where a client pays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import itertools
import json
import math
import random
import statistics
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from gateway.clients.bench import wire
from gateway.clients.bench.driver import (
    CAP_REACHED,
    NOT_SENT_BACKOFF,
    BenchError,
    arrival_offsets,
    check_target,
    cold_load,
    run_concurrency,
    run_rate,
)
from gateway.clients.bench.exchange import Client
from gateway.clients.bench.protocol import Target
from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.shapes import ShapeOptions, search_knee
from gateway.clients.bench.stats import summarize
from gateway.clients.bench.workload import Sampling, Workload, load_workload
from gateway.testing.emulator.app import EmulatorConfig
from gateway.testing.stack import free_port
from tests.support.client import MODEL
from tests.support.emulator import emulator_process
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.anyio

WORKLOAD = load_workload("builtin", Sampling(max_tokens=64))
APIS = [("ollama", True), ("ollama", False), ("openai", True), ("openai", False)]


def fast(emulator: Emulator, **overrides) -> None:
    """Short answers: 4 tokens, 2 ms apart, after 5 ms."""
    emulator.state.config = EmulatorConfig(ttft=0.005, inter_token=0.002, tokens=4, **overrides)


# --- the closed loop -----------------------------------------------------------------------------


@pytest.mark.parametrize(("api", "chat"), APIS)
async def test_closed_loop_reads_both_apis(emulator, api, chat):
    fast(emulator)
    target = Target(emulator.url, api, chat=chat)
    run = await run_concurrency(target, WORKLOAD, MODEL, 2, requests=6, warmup=2)
    records = run.records
    assert len(records) == 8
    assert all(r.ok for r in records), [r.error for r in records]
    assert sum(r.warmup for r in records) == 2
    assert all(r.output_tokens == 4 and r.output_source != "client" for r in records)
    assert all(len(r.chunk_times) == 4 and r.ttft is not None for r in records)
    warm_ends = [r.end for r in records if r.warmup]
    counted = [r for r in records if not r.warmup]
    assert run.window_start >= max(warm_ends)
    assert run.window_end == max(r.end for r in counted)
    assert {r.prompt_id for r in records} == {p.id for p in WORKLOAD.prompts[:8]}
    paths = {rec.path for rec in emulator.state.records}
    assert len(paths) == 1
    summary = summarize(records, run.window_start, run.window_end)
    assert summary["requests"] == 6
    assert summary["errors"] == 0


def count_connections(monkeypatch) -> list:
    """Record every connection the driver opens (the list of `wire.connect` arguments)."""
    opened = []
    real = wire.connect

    async def counting(*args, **kwargs):
        opened.append(args)
        return await real(*args, **kwargs)

    monkeypatch.setattr(wire, "connect", counting)
    return opened


async def test_each_worker_keeps_one_connection(emulator, monkeypatch):
    fast(emulator)
    opened = count_connections(monkeypatch)
    run = await run_concurrency(Target(emulator.url, "ollama"), WORKLOAD, MODEL, 3, requests=12)
    assert all(r.ok for r in run.records)
    assert len(opened) == 3


async def test_a_dropped_connection_fails_the_request_and_is_reopened(emulator, monkeypatch):
    fast(emulator, fault="drop_midstream", fault_after=2)
    opened = count_connections(monkeypatch)
    run = await run_concurrency(Target(emulator.url, "ollama"), WORKLOAD, MODEL, 1, requests=3)
    assert [r.ok for r in run.records] == [False] * 3
    assert all(r.status == 200 and len(r.chunk_times) == 2 for r in run.records)
    assert all("closed" in (r.error or "") or "Reset" in (r.error or "") for r in run.records)
    assert len(opened) == 3


@pytest.mark.parametrize(
    ("fault", "status", "error"),
    [
        ("error_midstream", 200, "boom"),
        ("busy", 503, "HTTP 503: server busy, please try again.  maximum pending"),
        ("not_found", 404, "HTTP 404: model"),
        ("eof_without_done", 200, "answer ended without a final chunk"),
        ("malformed", 200, "answer line is not JSON"),
    ],
)
async def test_server_failures_become_failed_records(emulator, fault, status, error):
    fast(emulator, fault=fault, fault_after=1, fault_message="boom")
    run = await run_concurrency(Target(emulator.url, "ollama"), WORKLOAD, MODEL, 2, requests=4)
    assert len(run.records) == 4
    for record in run.records:
        assert not record.ok
        assert record.status == status
        assert (record.error or "").startswith(error), record.error


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_a_hanging_answer_times_out_and_the_connection_is_replaced(emulator):
    fast(emulator, fault="hang_midstream", fault_after=1)
    target = Target(emulator.url, "ollama", timeout=0.3)
    run = await run_concurrency(target, WORKLOAD, MODEL, 1, requests=2)
    assert [r.error for r in run.records] == ["no end of answer within 0.3 s"] * 2
    assert all(len(r.chunk_times) == 1 for r in run.records)
    emulator.state.config.fault = None
    again = await run_concurrency(target, WORKLOAD, MODEL, 1, requests=1)
    assert again.records[0].ok


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_duration_mode_stops_sending_at_the_end_and_keeps_answers_in_flight(emulator):
    emulator.state.config = EmulatorConfig(ttft=0.02, inter_token=0.02, tokens=5)
    seen = []
    run = await run_concurrency(
        Target(emulator.url, "openai"),
        WORKLOAD,
        MODEL,
        2,
        duration=0.6,
        warmup=2,
        progress=lambda done, total, _failed: seen.append((done, total)),
    )
    assert run.window_end - run.window_start == pytest.approx(0.6)
    counted = [r for r in run.records if not r.warmup]
    assert all(r.start < run.window_end for r in counted)
    assert any(r.end > run.window_end for r in counted)  # the last ones, awaited and kept
    assert all(r.ok for r in run.records)
    assert seen == [(k, 0) for k in range(1, len(counted) + 1)]


async def test_progress_counts_the_requests(emulator):
    fast(emulator)
    seen = []
    await run_concurrency(
        Target(emulator.url, "ollama"),
        WORKLOAD,
        MODEL,
        2,
        requests=5,
        warmup=1,
        progress=lambda done, total, _failed: seen.append((done, total)),
    )
    assert seen == [(k, 5) for k in range(1, 6)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"duration": 1.0, "requests": 2},
        {"requests": 0},
        {"duration": 0},
        {"requests": 1, "warmup": -1},
    ],
)
async def test_the_amount_must_be_one_of_duration_and_requests(kwargs):
    target = Target("http://127.0.0.1:9", "ollama")
    with pytest.raises(ValueError):  # noqa: PT011 - the messages differ per case
        await run_concurrency(target, WORKLOAD, MODEL, 1, **kwargs)
    with pytest.raises(ValueError):  # noqa: PT011
        await run_rate(target, WORKLOAD, MODEL, 1.0, **kwargs)


async def test_connection_refused_gives_failed_records_and_a_clear_check_error():
    url = f"http://127.0.0.1:{free_port()}"
    target = Target(url, "ollama")
    run = await run_concurrency(target, WORKLOAD, MODEL, 2, requests=3)
    assert len(run.records) == 3
    assert all(r.status is None and "ConnectionRefused" in (r.error or "") for r in run.records)
    with pytest.raises(BenchError, match=f"cannot reach {url}: connection refused"):
        await check_target(target, MODEL)


async def test_https_speaks_tls_and_a_plain_server_is_a_clear_error(emulator):
    # No TLS server here: the handshake against the plain emulator must fail cleanly.
    port = emulator.url.rsplit(":", 1)[1]
    target = Target(f"https://127.0.0.1:{port}", "ollama")
    with pytest.raises(BenchError, match=f"cannot reach https://127.0.0.1:{port}: "):
        await check_target(target, MODEL)
    run = await run_concurrency(target, WORKLOAD, MODEL, 1, requests=1)
    assert run.records[0].status is None
    assert "SSL" in (run.records[0].error or "")


# --- the checks before a run ---------------------------------------------------------------


async def test_check_target_describes_an_ollama_server(emulator):
    info = await check_target(Target(emulator.url, "ollama"), "llama3.2")
    async with httpx.AsyncClient() as client:
        tags = (await client.get(f"{emulator.url}/api/tags")).json()["models"]
    digest = next(m["digest"] for m in tags if m["name"] == MODEL)
    assert info == {
        "through_gateway": False,
        "server": {
            "api": "ollama",
            "version": emulator.config.version,
            "model": MODEL,
            "digest": digest,
            "quantization_level": "Q4_K_M",
            "parameter_size": "3.2B",
            "family": "llama",
            "format": "gguf",
        },
    }


async def test_check_target_describes_an_openai_server(emulator):
    info = await check_target(Target(emulator.url, "openai"), MODEL)
    assert info == {
        "through_gateway": False,
        "server": {"api": "openai", "id": MODEL, "owned_by": "library"},
    }


@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_a_name_without_its_tag_is_the_latest_on_both_apis(emulator, api):
    """`llama3.2` is `llama3.2:latest` (Ollama's rule, which its /v1 follows too)."""
    assert MODEL == "llama3.2:latest"
    info = await check_target(Target(emulator.url, api), "Llama3.2")
    assert info["server"].get("id", info["server"].get("model")) == MODEL


async def test_a_404_on_one_apis_path_suggests_the_other_api():
    """A server of the other API answers 404 on this one's paths: the error names --api."""

    async def not_found(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(not_found, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(BenchError, match=r"404.*--api openai"):
            await check_target(Target(f"http://127.0.0.1:{port}", "ollama"), MODEL)
    finally:
        server.close()


@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_check_target_refuses_an_unknown_model(emulator, api):
    with pytest.raises(BenchError, match=r"has no model 'mistral:7b' \(it lists: llama3.2:latest"):
        await check_target(Target(emulator.url, api), "mistral:7b")


@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_through_the_gateway_check_and_run(gateway: Gateway, emulator, api):
    fast(emulator)
    target = Target(gateway.url, api, key=gateway.key)
    info = await check_target(target, MODEL)
    assert info["through_gateway"] is True
    run = await run_concurrency(target, WORKLOAD, MODEL, 2, requests=4)
    assert all(r.ok for r in run.records), [r.error for r in run.records]


@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_a_refused_key_is_named_but_never_shown(gateway: Gateway, emulator, api):
    fast(emulator)
    wrong = "gw_nosuchkey_" + "s" * 32
    target = Target(gateway.url, api, key=wrong)
    with pytest.raises(
        BenchError, match=r"refused the key \(401\): check GATEWAY_BENCH_API_KEY"
    ) as caught:
        await check_target(target, MODEL)
    assert wrong not in str(caught.value)
    with pytest.raises(BenchError, match=r"wants an API key \(401\): set GATEWAY_BENCH_API_KEY"):
        await check_target(Target(gateway.url, api), MODEL)  # none sent: say so, not "refused"
    # Mid-run (a key revoked while the benchmark runs) the run stops at the first refusal.
    with pytest.raises(BenchError, match=r"refused the key during the run \(401\)") as caught:
        await run_concurrency(target, WORKLOAD, MODEL, 2, requests=50)
    assert wrong not in str(caught.value)
    assert wrong not in repr(target)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_errors_back_off_and_retry_after_is_honoured(emulator):
    fast(emulator, fault="status_before", fault_status=503)
    target = Target(emulator.url, "ollama")
    run = await run_concurrency(target, WORKLOAD, MODEL, 2, duration=1.0)
    # Without backoff two workers answered at once would send hundreds in a second; with
    # 50 ms doubling per failure each sends at most ~5 (0.05 + 0.1 + 0.2 + 0.4 + ...).
    assert 2 <= len(run.records) <= 14
    assert all(r.status == 503 for r in run.records)


def busy_server(retry_after: bytes) -> contextlib.AbstractAsyncContextManager:
    """`canned_server` answering 503 with `Retry-After: <retry_after>`."""
    body = b'{"error":"busy"}'
    return canned_server(
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: " + retry_after + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )


@contextlib.asynccontextmanager
async def canned_server(answer: bytes) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A keep-alive server answering every request with the bytes `answer`.

    Yields its URL and the list of requests it read (one item per request).
    """
    seen: list[bytes] = []

    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                await reader.readexactly(length)
                seen.append(head)
                writer.write(answer)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_retry_after_zero_does_not_turn_the_backoff_off():
    async with busy_server(b"0") as (url, seen):
        run = await run_concurrency(Target(url, "ollama"), WORKLOAD, MODEL, 1, duration=1.0)
    # Retry-After: 0 taken as given let one worker send thousands of requests a second; the
    # backoff (0.05 + 0.1 + 0.2 + 0.4 + ... s) lets it send about five.
    assert all(r.status == 503 for r in run.records)
    assert 2 <= len(seen) <= 10


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_the_open_loop_holds_arrivals_back_while_the_server_asks_to_wait():
    async with busy_server(b"30") as (url, seen):
        run = await run_rate(Target(url, "ollama"), WORKLOAD, MODEL, 20.0, requests=20)
    # Arrivals are 50 ms apart: the first answer asks for 30 s, so the rest are not sent.
    assert len(run.records) == 20
    assert len(seen) <= 3
    held = [r for r in run.records if r.status is None]
    assert len(held) == 20 - len(seen)
    assert {r.error for r in held} == {"not sent: the server asked to wait 30 s"}


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_the_open_loop_backs_off_after_failures_in_a_row(emulator):
    fast(emulator, fault="status_before", fault_status=500)
    run = await run_rate(Target(emulator.url, "ollama"), WORKLOAD, MODEL, 20.0, requests=40)
    sent = len(emulator.state.records)
    # Without the backoff all 40 arrivals (2 s) reach the failing server; with it three do,
    # then one after 0.2 s, 0.4 s, 0.8 s.
    assert len(run.records) == 40
    assert 3 <= sent <= 12
    held = [r for r in run.records if r.status is None]
    assert len(held) == 40 - sent
    assert {r.error for r in held} == {NOT_SENT_BACKOFF}


def ndjson_answer(*lines: dict) -> bytes:
    """A 200 answer whose body is `lines` as NDJSON."""
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


CHUNK = {"message": {"role": "assistant", "content": "a"}, "done": False}


async def test_nonsense_server_counts_fail_the_request_over_a_socket():
    done = {"message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 100_000}
    async with canned_server(ndjson_answer(CHUNK, done | {"eval_duration": 1e-300})) as (url, _):
        run = await run_concurrency(Target(url, "ollama"), WORKLOAD, MODEL, 1, requests=2)
    assert [r.ok for r in run.records] == [False, False]
    assert {r.error for r in run.records} == {
        "the server reported 100000 output tokens for at most 64 asked"
    }
    assert all(r.decode_seconds is None for r in run.records)  # 1e-300 ns is no duration


async def test_lines_after_the_final_chunk_fail_the_request_over_a_socket():
    first = {"message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 2}
    second = first | {"eval_count": 60}
    answer = ndjson_answer(CHUNK, CHUNK, first, CHUNK, second)
    async with canned_server(answer) as (url, _):
        run = await run_concurrency(Target(url, "ollama"), WORKLOAD, MODEL, 1, requests=1)
    (record,) = run.records
    assert (record.ok, record.error) == (False, "answer went on after its final chunk")
    assert (record.output_tokens, len(record.chunk_times)) == (2, 2)  # the first end's


def test_the_pause_follows_retry_after_then_doubles():
    client = Client(Target("http://127.0.0.1:1", "ollama"))
    failed = RequestRecord(0, 1, False, 429, "HTTP 429", None, (), 0, "client")
    ok = RequestRecord(0, 1, True, 200, None, 0.5, (0.5,), 1, "ollama")
    client.retry_after = 7.0
    assert client.pause(failed) == 7.0
    client.retry_after = 10_000.0
    assert client.pause(failed) == 60.0  # capped
    client.retry_after = None
    pauses = [client.pause(failed) for _ in range(10)]
    assert pauses[0] == pytest.approx(0.05 * 2**2)  # the third failure in a row
    assert pauses == sorted(pauses)
    assert max(pauses) == 5.0
    assert client.pause(ok) == 0.0
    assert client.pause(failed) == pytest.approx(0.05)  # a success resets the backoff
    client.retry_after = 0.0  # would turn the backoff off
    assert client.pause(failed) == pytest.approx(0.1)


async def test_cold_load_reports_the_servers_load_time(emulator):
    emulator.state.config = EmulatorConfig(ttft=0.01, inter_token=0.002, tokens=4, cold_load=0.3)
    loaded = await cold_load(Target(emulator.url, "ollama"), MODEL)
    assert loaded is not None
    assert loaded["ok"], loaded
    assert loaded["load_seconds"] == pytest.approx(0.3, abs=0.05)
    assert loaded["ttft_seconds"] >= 0.3
    unloads = [r for r in emulator.state.records if r.body and r.body.get("keep_alive") == 0]
    assert len(unloads) == 1
    assert await cold_load(Target(emulator.url, "openai"), MODEL) is None


# --- the open loop -------------------------------------------------------------------------------


def test_arrivals_follow_the_seeded_poisson_schedule():
    first = list(itertools.islice(arrival_offsets(10.0, 42), 6))
    generator = random.Random(42)  # noqa: S311
    expected = list(itertools.accumulate([0.0] + [generator.expovariate(10.0) for _ in range(5)]))
    assert first == pytest.approx(expected, abs=1e-12)
    assert first == list(itertools.islice(arrival_offsets(10.0, 42), 6))
    assert first != list(itertools.islice(arrival_offsets(10.0, 43), 6))
    many = list(itertools.islice(arrival_offsets(20.0, 1234), 5001))
    assert 5000 / many[-1] == pytest.approx(20.0, rel=0.05)
    with pytest.raises(ValueError, match="rate"):
        next(arrival_offsets(0.0))


async def test_open_loop_sends_on_the_schedule(emulator):
    fast(emulator)
    run = await run_rate(Target(emulator.url, "ollama"), WORKLOAD, MODEL, 40.0, requests=20, seed=7)
    assert len(run.records) == 20
    assert all(r.ok for r in run.records)
    schedule = list(itertools.islice(arrival_offsets(40.0, 7), 20))
    offsets = [r.start - run.window_start for r in run.records]
    # never early (a request may leave late on a busy machine, so no upper bound is asserted)
    assert all(o >= s - 0.005 for o, s in zip(offsets, schedule, strict=True))
    assert run.window_end == max(r.end for r in run.records)


async def test_open_loop_warmup_and_duration(emulator):
    fast(emulator)
    run = await run_rate(
        Target(emulator.url, "openai"), WORKLOAD, MODEL, 50.0, duration=0.4, warmup=3, seed=3
    )
    schedule = list(itertools.islice(arrival_offsets(50.0, 3), 400))
    assert sum(r.warmup for r in run.records) == 3
    assert run.window_end - run.window_start == pytest.approx(0.4)
    begin = run.window_start - schedule[3]
    expected = sum(1 for s in schedule if begin + s < run.window_end)
    assert len(run.records) == expected
    assert all(r.ok for r in run.records)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_arrivals_past_the_in_flight_cap_are_client_failures(emulator):
    emulator.state.config = EmulatorConfig(ttft=2.0, inter_token=0.01, tokens=2)
    run = await run_rate(
        Target(emulator.url, "ollama"), WORKLOAD, MODEL, 100.0, requests=10, max_in_flight=2
    )
    capped = [r for r in run.records if r.error == CAP_REACHED]
    assert len(capped) == 8
    assert all(r.status is None and r.start == r.end for r in capped)
    assert sum(r.ok for r in run.records) == 2
    assert len(emulator.state.records) == 2


# --- the truth: an emulator of known capacity --------------------------------------------------

P, K, TTFT, T_I, N = 3, 0.2, 0.3, 0.01, 30


@pytest.fixture(scope="module")
def capacity_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The emulator as a process: P slots, batch slowdown K, TTFT, inter-token T_I, N tokens."""
    log = tmp_path_factory.mktemp("capacity_url") / "emulator.log"
    with emulator_process(
        log,
        "--parallel",
        str(P),
        "--batch-slowdown",
        str(K),
        "--ttft",
        str(TTFT),
        "--inter-token",
        str(T_I),
        "--tokens",
        str(N),
    ) as emulator:
        yield emulator.url


@pytest.fixture(scope="module")
def wake(capacity_url: str) -> float:
    """Seconds a loopback round trip costs after `TTFT` seconds of silence on this machine.

    The truth is the emulator's own timing; what reaches the client is also late by the time
    the two processes take to wake up (25 ms after 0.3 s idle on a VM without halt polling,
    well under 1 ms elsewhere). A first token pays it once, after prefill's silence. Measured
    like that: the median of a few `GET /api/version` on one kept-alive connection, each after
    `TTFT` seconds of quiet.
    """
    host, port = capacity_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    trips = []
    try:
        for _ in range(5):
            time.sleep(TTFT)
            start = time.perf_counter()
            connection.request("GET", "/api/version", headers={"Host": host})
            connection.getresponse().read()
            trips.append(time.perf_counter() - start)
    finally:
        connection.close()
    return statistics.median(trips)


def truth(concurrency: int, wake: float = 0.0) -> dict[str, tuple[float, float]]:
    """The emulator's truth for a closed loop at `concurrency` (capacity's docstring),
    as (lowest, highest) per measure: one value when `wake` is 0.

    `wake` (the `wake` fixture) is the loopback's own latency after a silence, which the knobs
    leave out. A client that was idle through prefill sees its first token up to `wake` late
    (TTFT up to `wake` longer, the rest of the answer, measured from that token, up to `wake`
    shorter: ITL and TPOT up to wake / (N - 1) less) and, up to `P` workers, its cycle up to
    `wake` longer (throughput lower); past `P` requests queue and the server never idles. Whether
    a client pays it depends on whether it was idle (one worker always, more workers seldom),
    hence a range rather than a guess.
    """
    batch = min(concurrency, P)
    tpot = T_I * (1 + K * (batch - 1))
    service = TTFT + N * tpot
    spread = wake / (N - 1)
    ttft = TTFT + max(0.0, concurrency / P - 1) * service
    # TPOT over the answer is (end - first token) / (n - 1), and the emulator's answer ends
    # one gap after its last token (the final chunk): n gaps over n - 1 tokens.
    answer_tpot = tpot * N / (N - 1)
    throughput = batch * N / service
    slower = batch * N / (service + wake) if concurrency <= P else throughput
    return {
        "ttft": (ttft, ttft + wake),
        "itl": (tpot - spread, tpot),
        "tpot": (answer_tpot - spread, answer_tpot),
        "decode": (1 / tpot, 1 / tpot),  # the server's own counters: no loopback in them
        "throughput": (slower, throughput),
    }


def within(value: float, bounds: tuple[float, float], rel: float = 0.03) -> bool:
    """`value` lies in `bounds` widened by `rel` on each side."""
    low, high = bounds
    return low * (1 - rel) <= value <= high * (1 + rel)


def measured(repeat: dict) -> dict[str, float]:
    metrics = repeat["metrics"]
    return {
        "ttft": metrics["ttft_seconds"]["mean"],
        "itl": metrics["itl_seconds"]["mean"],
        "tpot": metrics["tpot_seconds"]["mean"],
        "decode": metrics["decode_tokens_per_second"]["p50"],
        "throughput": repeat["output_tokens_per_second"],
    }


def plan(concurrency: int) -> tuple[int, int]:
    """(warm-up, counted requests) for a closed loop at `concurrency` whose truth is exact.

    The window opens when the last warm-up answer ends, so a counted request already being
    served then brings tokens from before the window. A warm-up of whole server batches, at
    least one request per worker, leaves no counted request in a slot at that moment; counted
    requests in whole batches end the run with a full last batch (driver docstring).
    """
    batch = min(concurrency, P)
    warmup = batch * math.ceil(concurrency / batch)
    counted = batch * math.ceil(max(8, 4 * concurrency) / batch)
    return warmup, counted


@pytest.mark.processes
async def test_knee_search_finds_the_configured_capacity(capacity_url, wake):
    target = Target(capacity_url, "ollama", chat=True)
    workload = Workload("one", load_workload("builtin:short", Sampling()).prompts[:1], Sampling())

    async def measure(level: float):
        concurrency = int(level)
        warmup, counted = plan(concurrency)
        return await run_concurrency(
            target, workload, MODEL, concurrency, requests=counted, warmup=warmup
        )

    result = await search_knee(measure, maximum=2 * P, options=ShapeOptions())
    assert result.knee is not None
    assert result.knee["level"] == P, result.knee
    points = {int(p["level"]): p for p in result.points}
    assert {1, 2, P, P + 1, 2 * P} <= set(points)
    for level, point in points.items():
        repeat = point["repeats"][0]
        assert repeat["errors"] == 0
        got, want = measured(repeat), truth(level, wake)
        for name, bounds in want.items():
            assert within(got[name], bounds), (level, name, got, want)


@pytest.mark.processes
@pytest.mark.parametrize("chat", [True, False])
async def test_openai_measures_the_truth_too(capacity_url, wake, chat):
    target = Target(capacity_url, "openai", chat=chat)
    warmup, counted = plan(P)
    run = await run_concurrency(target, WORKLOAD, MODEL, P, requests=counted, warmup=warmup)
    repeat = summarize(run.records, run.window_start, run.window_end)
    assert repeat["errors"] == 0
    got, want = measured(repeat), truth(P, wake)
    for name in ("ttft", "itl", "tpot", "throughput"):  # /v1 carries no decode duration
        assert within(got[name], want[name]), (name, got, want)
    assert repeat["sources"]["output_tokens"] == "openai.usage"

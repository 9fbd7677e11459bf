"""`gateway bench` against hostile servers and files: memory and time stay bounded.

Each server here is a few lines of asyncio on a real socket that answers every request with
what a hostile or broken server might send: an SSE event that never ends, an endless header,
JSON nested past Python's recursion limit, an answer trickled forever. The benchmark must turn
each into a failed sample, a note or a one-line error, never a traceback, a hang or a heap that
grows with what the server sends.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.clients.bench import cli, document, driver, gateway_metrics, quality, reader, wire
from gateway.clients.bench.cli import detect_api, main
from gateway.clients.bench.dataset import DatasetOptions, build_workload
from gateway.clients.bench.document import SCHEMA, RunFileError, load_run
from gateway.clients.bench.driver import (
    ANSWER_CHARS_PER_TOKEN,
    BenchError,
    run_concurrency,
    run_rate,
)
from gateway.clients.bench.preflight import check_target
from gateway.clients.bench.protocol import Api, Target
from gateway.clients.bench.quality import probe_quality
from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.resources import ResourceMonitor
from gateway.clients.bench.runner import point_line
from gateway.clients.bench.workload import Sampling, load_workload
from tests.support.client import MODEL

pytestmark = pytest.mark.anyio

WORKLOAD = load_workload("builtin", Sampling(max_tokens=8))
#: The nesting that makes Python's `json` raise RecursionError (its limit is about 1000).
DEEP = b"[" * 100_000 + b"]" * 100_000

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def hostile(answer: Answer) -> AsyncIterator[str]:
    """A server on 127.0.0.1 that reads each request's head and body, then calls `answer`."""

    writers: set[asyncio.StreamWriter] = set()

    async def handle(reader_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            head = await reader_.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader_.readexactly(length)
            await answer(writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for writer in writers:  # a trickling handler would otherwise go on writing
            writer.transport.abort()


def body(content: bytes, ctype: bytes = b"application/x-ndjson", status: int = 200) -> Answer:
    """An answer with a `Content-Length`, closed after."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n"
            b"\r\n%s" % (status, ctype, len(content), content)
        )

    return answer


async def one_record(url: str, api: Api = "ollama", seconds: float = 60.0) -> RequestRecord:
    """One request of the closed loop against `url` (allowed `seconds`), its record."""
    target = Target(url, api, timeout=seconds)
    run = await run_concurrency(target, WORKLOAD, MODEL, 1, requests=1)
    (record,) = run.records
    return record


# --- 3: JSON nested past the recursion limit ------------------------------------------------------


@pytest.mark.parametrize("newline", [b"", b"\n"])
async def test_a_deeply_nested_answer_line_fails_the_sample(newline: bytes) -> None:
    async with hostile(body(DEEP + newline)) as url:
        record = await one_record(url)
    assert not record.ok
    assert (record.error or "").startswith("answer line is not JSON (JSON nested too deeply)")


async def test_a_deeply_nested_event_fails_the_sample() -> None:
    async with hostile(body(b"data: " + DEEP + b"\n\n", b"text/event-stream")) as url:
        record = await one_record(url, "openai")
    assert (record.error or "").startswith("event data is not JSON (JSON nested too deeply)")


async def test_a_deeply_nested_error_body_is_shown_as_text() -> None:
    async with hostile(body(DEEP, status=500)) as url:
        record = await one_record(url)
    assert (record.error or "").startswith("HTTP 500: [[[[")


# --- 1: memory bounded by limits, not by what the server sends ------------------------------------


async def test_data_lines_without_a_blank_line_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reader, "MAX_LINE", 4096)
    event = (b"data: " + b"x" * 100 + b"\n") * 2000  # 200 kB, no blank line: one event
    async with hostile(body(event, b"text/event-stream")) as url:
        record = await one_record(url, "openai")
    assert record.error == "answer event longer than 4096 bytes"


async def test_an_endless_stream_of_chunks_is_cut_at_max_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reader, "MAX_CHUNKS", 10)  # below the 16 chunks --max-tokens 8 allows
    chunk = b'{"message":{"role":"assistant","content":"a"},"done":false}\n'
    done = b'{"done":true,"eval_count":200}\n'
    async with hostile(body(chunk * 200 + done)) as url:
        record = await one_record(url)
    assert record.error == "answer exceeded 10 content chunks"
    assert len(record.chunk_times) == 10


def test_a_deeply_nested_workload_line_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "prompts.jsonl"
    workload.write_bytes(b'{"prompt": "fine"}\n' + DEEP + b"\n")
    code = main(
        ["run", "--target", "http://127.0.0.1:1", "--api", "ollama", "--model", MODEL,
         "--requests", "1", "--no-gpu", "--workload", str(workload), "--out",
         str(tmp_path / "run.json")]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert f"{workload}:2: not readable JSON (JSON nested too deeply)" in err
    assert "Traceback" not in err


async def test_a_deeply_nested_error_in_the_checks_is_a_bench_error() -> None:
    async with hostile(body(DEEP, status=500)) as url:
        with pytest.raises(BenchError, match=r"answered HTTP 500: \[\[\["):
            await check_target(Target(url, "ollama"), MODEL)


async def endless(writer: asyncio.StreamWriter, start: bytes, piece: bytes) -> None:
    """Write `start`, then `piece` again and again until the client goes away."""
    writer.write(start)
    while not writer.is_closing():
        writer.write(piece)
        await writer.drain()


@pytest.mark.parametrize("piece", [b"a" * 4096, b"\r\nX-Pad: " + b"b" * 100])
async def test_an_endless_response_head_fails_the_request(piece: bytes) -> None:
    async def answer(writer: asyncio.StreamWriter) -> None:
        await endless(writer, b"HTTP/1.1 200 OK\r\nX-Pad: ", piece)

    async with hostile(answer) as url:
        record = await one_record(url)
    assert record.error == f"HttpParserError: response head longer than {wire.MAX_HEAD} bytes"


async def test_auto_detection_reads_a_bounded_start_of_api_version() -> None:
    # A version padded past the bound: read whole (what an endless answer would be, in
    # memory) it is Ollama's; read up to MAX_VERSION_ANSWER it is no version, and /v1/models
    # answering 200 makes the target OpenAI.
    padded = b'{"version": "0.1"}' + b" " * (cli.MAX_VERSION_ANSWER + 1)
    async with hostile(body(padded, b"application/json")) as url:
        assert await detect_api(url, None, wait=60.0) == "openai"


# --- the quality probe: bounded in bytes and in time per question -------------------------------


async def test_a_quality_answer_past_max_answer_is_an_error() -> None:
    # Read whole, this is a right answer; the probe stops reading at MAX_ANSWER.
    padded = b'{"response": "Paris"}' + b" " * (quality.MAX_ANSWER + 1)
    async with hostile(body(padded, b"application/json")) as url:
        result = await probe_quality(url, MODEL, questions=quality.QUESTIONS[3:4])
    (answer,) = result["answers"]
    assert answer["error"] == f"ValueError: the answer is longer than {quality.MAX_ANSWER} bytes"


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_a_trickled_quality_answer_hits_the_per_question_deadline() -> None:
    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
        while not writer.is_closing():  # a byte well within httpx's per-read timeout
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with hostile(answer) as url:
        result = await probe_quality(
            url, MODEL, request_timeout=5.0, questions=quality.QUESTIONS[:2]
        )
    assert [a["error"] for a in result["answers"]] == [
        "no answer within 5 s",
        "not asked: an earlier question got no answer within 5 s",
    ]


# --- the gateway /metrics sampler: bounded in time and bytes per scrape --------------------------


async def drip(writer: asyncio.StreamWriter) -> None:
    """An answer that promises a megabyte and sends a byte every 50 ms."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
    while not writer.is_closing():
        writer.write(b"#")
        await writer.drain()
        await asyncio.sleep(0.05)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_a_trickled_metrics_scrape_is_a_note_not_a_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_metrics, "SCRAPE_DEADLINE", 1.0)
    async with hostile(drip) as url:
        monitor = ResourceMonitor(url, api="openai", through_gateway=True, gpu=False)
        await monitor.start()
        assert await monitor.stop() == []
    assert "gateway /metrics took more than 1 s: not sampled" in monitor.notes


async def test_a_metrics_text_past_max_text_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway_metrics, "MAX_TEXT", 1000)
    text = b"# TYPE gateway_requests_in_flight gauge\n" + b"gateway_requests_in_flight 1\n" * 100
    async with hostile(body(text, b"text/plain")) as url:
        monitor = ResourceMonitor(url, api="openai", through_gateway=True, gpu=False)
        await monitor.start()
        assert await monitor.stop() == []
    assert "gateway /metrics longer than 1000 bytes: not sampled" in monitor.notes


# --- run documents: values and depth bounded before they become Python objects -----------------


def test_a_run_file_of_many_tiny_values_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(document, "MAX_VALUES", 1000)
    run = {"schema": SCHEMA, "models": [], "padding": [{}] * 2000}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    with pytest.raises(RunFileError, match="more than 1000 JSON values"):
        load_run(path)
    assert main(["compare", str(path), str(path)]) == 2
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("more than 1000 JSON values") == 2
    assert "Traceback" not in err


def test_a_run_file_nested_past_max_depth_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    deep = "[" * (document.MAX_DEPTH + 1) + "]" * (document.MAX_DEPTH + 1)
    path.write_text(f'{{"schema": "{SCHEMA}", "models": [], "x": {deep}}}')
    with pytest.raises(RunFileError, match="nested too deeply"):
        load_run(path)


def test_a_real_run_file_is_far_within_the_bounds(tmp_path: Path) -> None:
    point = {"level": 1, "summary": {f"k{i}": {"median": 1.0, "min": 1.0} for i in range(50)}}
    run = {"schema": SCHEMA, "models": [{"model": "m", "points": [point] * 250}]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert len(load_run(path)["models"][0]["points"]) == 250


# --- answers that say nothing, or far more than asked ---------------------------------------


@pytest.mark.parametrize(
    ("api", "content"),
    [
        ("openai", b"data: [DONE]\n\n"),
        ("ollama", b'{"done":true}\n'),
        ("ollama", b'{"message":{"role":"assistant","content":""},"done":true,"eval_count":0}\n'),
    ],
)
async def test_an_answer_with_no_content_and_no_count_fails(api: Api, content: bytes) -> None:
    ctype = b"text/event-stream" if api == "openai" else b"application/x-ndjson"
    async with hostile(body(content, ctype)) as url:
        record = await one_record(url, api)
    assert (record.ok, record.error) == (False, "empty answer")


async def test_more_chunks_than_max_tokens_fail_without_a_server_count() -> None:
    event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    async with hostile(body(event * 5000 + b"data: [DONE]\n\n", b"text/event-stream")) as url:
        record = await one_record(url, "openai")
    allowance = reader.output_allowance(8)  # WORKLOAD asks 8 tokens
    assert record.error == f"answer streamed over {allowance} chunks for 8 tokens"
    assert len(record.chunk_times) == allowance


async def test_the_readers_first_error_ends_the_exchange_before_the_timeout() -> None:
    event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'

    async def answer(writer: asyncio.StreamWriter) -> None:
        await endless(
            writer,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            b"%x\r\n%s\r\n" % (len(event), event),
        )

    async with hostile(answer) as url:
        record = await one_record(url, "openai", seconds=3.0)
    assert (record.error or "").startswith("answer streamed over")  # not "no end of answer"


async def test_an_endless_error_body_ends_at_error_body_bytes() -> None:
    async def answer(writer: asyncio.StreamWriter) -> None:
        await endless(
            writer, b"HTTP/1.1 500 X\r\nContent-Length: 999999999999\r\n\r\n", b"x" * 4096
        )

    async with hostile(answer) as url:
        record = await one_record(url, "ollama", seconds=3.0)
    assert (record.error or "").startswith("HTTP 500: xxxx")


async def test_a_body_delimited_by_the_close_is_read_to_its_end() -> None:
    """No Content-Length, not chunked: the close ends the body (RFC 9112 section 6.3, item 8)."""
    content = (
        b'{"message":{"role":"assistant","content":"hi"},"done":false}\n'
        b'{"message":{"role":"assistant","content":""},"done":true,"eval_count":1}\n'
    )

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n" + content)

    async with hostile(answer) as url:
        record = await one_record(url)
    assert (record.ok, record.error, record.output_tokens) == (True, None, 1)


async def test_a_conversations_history_keeps_answers_to_their_token_allowance() -> None:
    """A server that answers 8 asked tokens with 100 kB: the next turn resends 128 characters."""
    bodies: list[bytes] = []
    huge = "x" * 100_000
    line = json.dumps({"message": {"role": "assistant", "content": huge}, "done": False})
    done = json.dumps({"message": {"role": "assistant", "content": ""}, "done": True})
    content = (line + "\n" + done + "\n").encode()

    async def handle(reader_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader_.readuntil(b"\r\n\r\n")
                length = 0
                for field in head.split(b"\r\n"):
                    if field.lower().startswith(b"content-length:"):
                        length = int(field.split(b":", 1)[1])
                bodies.append(await reader_.readexactly(length))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (
                    len(content), content))  # fmt: skip
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    workload = build_workload(
        "synthetic", Sampling(max_tokens=8), DatasetOptions(conversations=1, turns=2)
    )
    try:
        target = Target(f"http://127.0.0.1:{port}", "ollama", timeout=30.0)
        await run_concurrency(target, workload, MODEL, 1, requests=2)
    finally:
        server.close()
    second = json.loads(bodies[1])
    (answer,) = [m for m in second["messages"] if m["role"] == "assistant"]
    assert answer["content"] == "x" * (8 * ANSWER_CHARS_PER_TOKEN)


async def test_a_rate_the_client_falls_behind_on_ends_with_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Arrivals stop at the window's end by the clock, not after the whole schedule is sent.

    The clock is made to run 0.5 s per reading: a client as slow as that sends a few arrivals
    of a 2 s window, not the 2000 that `--rate 1000` schedules in it.
    """
    readings = itertools.count()
    monkeypatch.setattr(driver.time, "perf_counter", lambda: next(readings) * 0.5)
    answer = b'{"message":{"role":"assistant","content":"a"},"done":true,"eval_count":1}\n'
    async with hostile(body(answer)) as url:
        run = await run_rate(Target(url, "ollama"), WORKLOAD, MODEL, 1000.0, duration=2.0)
    assert len(run.records) < 20


def test_a_point_sent_below_its_rate_says_the_client_could_not_keep_up() -> None:
    def point(achieved: float) -> dict[str, object]:
        summary = {"achieved_rate": {"median": achieved}, "error_rate": {"median": 0.0}}
        return {"shape": "rate", "level": 200_000.0, "summary": summary}

    assert "the client could not keep up" in point_line("m", point(3_000.0))
    assert "keep up" not in point_line("m", point(199_000.0))

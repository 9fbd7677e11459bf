"""One key cannot starve the others through the Files and Batch APIs, over real sockets.

Before (bc17182): Files requests did not count against the key's RPM; checking a file and
ending a batch held the event loop for seconds (every other request waited); two trickled
uploads of one key took the process's two upload slots and every other key's uploads and
batch creations waited behind them without bound.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.db.tables import BatchLineRow, BatchRow, as_utc
from tests.support.batch import FAST, chat_line
from tests.support.stack import Gateway

#: The longest another request may wait on the event loop; the documented bound is 150 ms,
#: this one leaves room for a loaded machine (the old code held the loop for seconds).
STALL = 1.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _upload(gw: Gateway, key: str, content: bytes, timeout: float = 30) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/files",
        headers=gw.headers(key),
        files={"file": ("in.jsonl", io.BytesIO(content), "application/jsonl")},
        data={"purpose": "batch"},
        timeout=timeout,
    )


def _create(gw: Gateway, key: str, file_id: str, timeout: float = 60) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    return httpx.post(
        f"{gw.url}/v1/batches",
        headers=gw.headers(key),
        json={"completion_window": "24h", **body},
        timeout=timeout,
    )


@contextmanager
def _loop_probe(gw: Gateway) -> Iterator[list[float]]:
    """Time `GET /healthz` over and over while the block runs; yields the timings (s)."""
    timings: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                started = time.perf_counter()
                client.get(f"{gw.url}/healthz")
                timings.append(time.perf_counter() - started)
                stop.wait(0.02)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        yield timings
    finally:
        stop.set()
        thread.join(60)


def test_files_and_batch_creation_count_against_the_keys_rpm(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway(**FAST, batch_worker=False)
    _, key = gw.create_key("five-a-minute", rpm=5)
    file_id = _upload(gw, key, (chat_line("a") + "\n").encode()).json()["id"]  # 1
    headers = gw.headers(key)
    assert httpx.get(f"{gw.url}/v1/files", headers=headers).status_code == 200  # 2
    assert httpx.get(f"{gw.url}/v1/files/{file_id}", headers=headers).status_code == 200  # 3
    content = httpx.get(f"{gw.url}/v1/files/{file_id}/content", headers=headers)  # 4
    assert content.status_code == 200
    assert content.content == (chat_line("a") + "\n").encode()
    assert _create(gw, key, file_id).status_code == 200  # 5
    refused = [
        httpx.get(f"{gw.url}/v1/files", headers=headers),
        httpx.get(f"{gw.url}/v1/files/{file_id}", headers=headers),
        httpx.get(f"{gw.url}/v1/files/{file_id}/content", headers=headers),
        httpx.delete(f"{gw.url}/v1/files/{file_id}", headers=headers),
        _upload(gw, key, (chat_line("b") + "\n").encode()),
        _create(gw, key, file_id),
    ]
    for response in refused:
        assert response.status_code == 429, (response.request.url, response.text)
        assert "requests per minute" in response.json()["error"]["message"]
        assert int(response.headers["retry-after"]) >= 1
    # Another key is not touched.
    assert httpx.get(f"{gw.url}/v1/files", headers=gw.headers()).status_code == 200


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"\n" * (60 * 1024 * 1024) + (chat_line("one") + "\n").encode(), id="blank"),
        pytest.param(b"1\n" * (30 * 1024 * 1024), id="tiny-lines"),
    ],
)
def test_checking_a_file_never_stalls_the_event_loop(
    make_gateway: Callable[..., Gateway], content: bytes
) -> None:
    gw = make_gateway(**FAST, batch_worker=False)
    file_id = _upload(gw, gw.key, content, timeout=120).json()["id"]
    with _loop_probe(gw) as timings:
        created = _create(gw, gw.key, file_id, timeout=120)
    assert created.status_code == 200, created.text
    assert created.json()["status"] in ("in_progress", "failed")
    assert timings
    assert max(timings) < STALL, f"the event loop stalled {max(timings):.2f} s"


async def _insert_finished_batch(database_url: str, key_id: str, lines: int) -> str:
    """A batch of `lines` succeeded lines with large answers, as the runner leaves them."""
    vector = [0.123456789 * i for i in range(1000)]
    now = as_utc(None)
    batch_id = "batch_" + "ab" * 12
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                insert(BatchRow).values(
                    id=batch_id,
                    key_id=key_id,
                    endpoint="/v1/embeddings",
                    input_file_id="file-" + "cd" * 12,
                    completion_window="24h",
                    status="in_progress",
                    total=lines,
                    created_at=now,
                    expires_at=now + timedelta(hours=1),
                    in_progress_at=now,
                )
            )
            for start in range(0, lines, 200):
                rows = []
                for n in range(start + 1, min(start + 200, lines) + 1):
                    answer = {"object": "list", "data": [{"embedding": vector, "index": n}]}
                    rows.append(
                        {
                            "batch_id": batch_id,
                            "line_no": n,
                            "custom_id": f"line-{n}",
                            "model": "nomic",
                            "body": b"{}",
                            "state": "succeeded",
                            "attempts": 1,
                            "request_id": f"req-{n}",
                            "status_code": 200,
                            "result": json.dumps(answer, indent=1).encode(),  # with newlines
                        }
                    )
                await conn.execute(insert(BatchLineRow), rows)
    finally:
        await engine.dispose()
    return batch_id


def test_ending_a_large_batch_never_stalls_the_event_loop(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway(**{**FAST, "batch_poll_seconds": 0.5})
    with _loop_probe(gw) as timings:
        batch_id = asyncio.run(_insert_finished_batch(gw.database_url, gw.key_id, 2000))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            batch = httpx.get(f"{gw.url}/v1/batches/{batch_id}", headers=gw.headers(), timeout=60)
            if batch.json()["status"] == "completed":
                break
            time.sleep(0.2)
    assert batch.json()["status"] == "completed", batch.text
    assert max(timings) < STALL, f"the event loop stalled {max(timings):.2f} s"
    output = httpx.get(
        f"{gw.url}/v1/files/{batch.json()['output_file_id']}/content",
        headers=gw.headers(),
        timeout=60,
    )
    lines = output.content.splitlines()
    assert len(lines) == 2000
    for n, raw in enumerate(lines, 1):
        item = json.loads(raw)
        assert item["custom_id"] == f"line-{n}"
        assert item["response"]["status_code"] == 200
        assert item["response"]["body"]["data"][0]["index"] == n
        assert item["error"] is None


class _Trickle:
    """A `POST /v1/files` whose body comes a few bytes at a time, on a raw socket."""

    def __init__(self, gw: Gateway, key: str) -> None:
        url = urlsplit(gw.url)
        self.sock = socket.create_connection((url.hostname or "", url.port or 80))
        self.sock.settimeout(0.2)
        part = (
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
            b"Content-Type: application/jsonl\r\n\r\n"
        )
        head = (
            f"POST /v1/files HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 1000000\r\n\r\n"
        )
        self.sock.sendall(head.encode() + part)
        self.answer = b""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self.answer:
            try:
                self.sock.sendall(b"{")
                self.answer = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
        if not self.answer:  # the server closed first: read what it said
            self.sock.settimeout(5)
            with suppress(OSError):
                self.answer = self.sock.recv(4096)

    def status(self, timeout: float) -> int:
        self.thread.join(timeout)
        self.sock.close()
        return int(self.answer.split(b" ")[1]) if self.answer else 0


def test_trickled_uploads_hold_their_own_keys_slot_not_everyones(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway(**FAST, batch_worker=False, body_timeout=3.0)
    _, slow = gw.create_key("trickler")
    first = _Trickle(gw, slow)
    time.sleep(0.5)
    second = _Trickle(gw, slow)
    # Every other key uploads and creates batches meanwhile, promptly.
    for n in range(2):
        uploaded = _upload(gw, gw.key, (chat_line(f"q{n}") + "\n").encode(), timeout=10)
        assert uploaded.status_code == 200, uploaded.text
        created = _create(gw, gw.key, uploaded.json()["id"], timeout=10)
        assert created.status_code == 200, created.text
    assert second.status(timeout=10) == 429  # the key's one upload is in progress
    # The trickle ends: it fell below the pace after the grace (408), its slot free again.
    assert first.status(timeout=30) == 408
    assert _upload(gw, slow, (chat_line("now") + "\n").encode()).status_code == 200


def test_a_download_nobody_reads_is_closed_and_frees_its_slot(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway(**FAST, batch_worker=False, idle_timeout=2.0)
    content = os.urandom(40 * 1024 * 1024)  # far more than the sockets' buffers hold
    file_id = _upload(gw, gw.key, content, timeout=120).json()["id"]
    url = f"{gw.url}/v1/files/{file_id}/content"
    with ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=60))
        unread = [
            stack.enter_context(client.stream("GET", url, headers=gw.headers())) for _ in range(4)
        ]
        time.sleep(8)  # nothing read for longer than GATEWAY_IDLE_TIMEOUT
        for response in unread:
            with pytest.raises(httpx.RemoteProtocolError):  # closed short of Content-Length
                response.read()
    # Their slots are free again: the key downloads the whole file.
    whole = httpx.get(url, headers=gw.headers(), timeout=60)
    assert whole.status_code == 200
    assert whole.content == content

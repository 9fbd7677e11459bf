"""The Files and Batch APIs in bounded memory: a real `gateway serve`, its peak RSS measured.

Before (bc17182): listing files, reading one file's metadata or deleting one loaded every
listed file's bytes (ten listings of 10 x 20 MiB files: 7.2 GB), a download held its whole
file however slowly it was read, and checking a 100 MiB file of blank lines took ~1 GB. The
peak (VmHWM) is reset before each step (`/proc/<pid>/clear_refs`), so each bound is the step's
own; the bounds are generous, far below what the old code took.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from gateway.testing.stack import ManagedProcess, create_key, gateway_process
from tests.support.batch import chat_line
from tests.support.stack import Emulator

MIB = 1024 * 1024
#: What one step may add to the process's peak RSS.
BOUND = 50 * MIB

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


def _status(pid: int, field: str) -> int:
    """A `/proc/<pid>/status` figure, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def _reset_peak(pid: int) -> int:
    """Reset the process's peak RSS to its RSS now; return that RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status(pid, "VmRSS")


def _peak_growth(pid: int, before: int) -> int:
    return _status(pid, "VmHWM") - before


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "directory"]
)
def served(
    request: pytest.FixtureRequest, emulator: Emulator, tmp_path: Path
) -> Iterator[tuple[ManagedProcess, dict[str, str]]]:
    """A `gateway serve` keeping files in SQLite, in PostgreSQL, or in a directory."""
    env = {"GATEWAY_UPSTREAM_URL": emulator.url, "GATEWAY_LOG_LEVEL": "warning"}
    if request.param == "postgres":
        env["GATEWAY_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    if request.param == "directory":
        env["GATEWAY_BATCH_STORAGE_DIR"] = str(tmp_path / "files")
    with gateway_process(tmp_path, env) as gateway:
        key = str(create_key(gateway.extra_env, "files")["key"])
        yield gateway, {"Authorization": f"Bearer {key}"}


def _upload(url: str, headers: dict[str, str], content: bytes) -> str:
    response = httpx.post(
        f"{url}/v1/files",
        headers=headers,
        files={"file": ("in.jsonl", io.BytesIO(content), "application/jsonl")},
        data={"purpose": "batch"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def test_listing_reading_and_deleting_files_never_load_their_bytes(served) -> None:
    gateway, headers = served
    assert gateway.process is not None
    pid = gateway.process.pid
    ids = [_upload(gateway.url, headers, os.urandom(20 * MIB)) for _ in range(10)]
    before = _reset_peak(pid)
    for _ in range(10):
        listed = httpx.get(f"{gateway.url}/v1/files", headers=headers, timeout=60)
        assert listed.status_code == 200
        assert {f["id"] for f in listed.json()["data"]} == set(ids)
        assert {f["bytes"] for f in listed.json()["data"]} == {20 * MIB}
    for file_id in ids:
        one = httpx.get(f"{gateway.url}/v1/files/{file_id}", headers=headers, timeout=60)
        assert one.json()["bytes"] == 20 * MIB
    paged = httpx.get(f"{gateway.url}/v1/files", params={"after": ids[3]}, headers=headers)
    assert paged.status_code == 200
    for file_id in ids[:5]:
        gone = httpx.delete(f"{gateway.url}/v1/files/{file_id}", headers=headers, timeout=60)
        assert gone.json()["deleted"] is True
    assert _peak_growth(pid, before) < BOUND


def test_a_download_holds_a_chunk_not_its_file_and_each_key_has_a_few(served) -> None:
    gateway, headers = served
    assert gateway.process is not None
    pid = gateway.process.pid
    contents = [os.urandom(20 * MIB) for _ in range(5)]
    ids = [_upload(gateway.url, headers, content) for content in contents]
    before = _reset_peak(pid)
    with ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=60))
        # Four downloads started and never read: the server sends what the sockets take.
        for file_id in ids[:4]:
            response = stack.enter_context(
                client.stream("GET", f"{gateway.url}/v1/files/{file_id}/content", headers=headers)
            )
            assert response.status_code == 200
            assert response.headers["content-length"] == str(20 * MIB)
        assert _peak_growth(pid, before) < BOUND
        fifth = httpx.get(f"{gateway.url}/v1/files/{ids[4]}/content", headers=headers)
        assert fifth.status_code == 429, fifth.status_code  # the key's share of downloads
        assert fifth.headers["retry-after"]
    # Released once they end: a whole download, byte for byte.
    whole = httpx.get(f"{gateway.url}/v1/files/{ids[4]}/content", headers=headers, timeout=60)
    assert whole.status_code == 200
    assert hashlib.sha256(whole.content).digest() == hashlib.sha256(contents[4]).digest()


def test_checking_a_file_of_blank_lines_takes_bounded_memory(served) -> None:
    gateway, headers = served
    assert gateway.process is not None
    pid = gateway.process.pid
    # Blank lines, then lines across the 1 MiB pieces the file is read in, then blanks.
    padded = [chat_line(f"line-{n}").replace('"hi"', f'"{"h" * 900}"') for n in range(3000)]
    content = b"\n" * (60 * MIB) + ("\n".join(padded) + "\n").encode() + b" \r\n" * (10 * MIB)
    file_id = _upload(gateway.url, headers, content)
    before = _reset_peak(pid)
    created = httpx.post(
        f"{gateway.url}/v1/batches",
        headers=headers,
        json={
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        timeout=120,
    )
    assert created.status_code == 200, created.text
    assert created.json()["status"] == "in_progress"
    assert created.json()["request_counts"]["total"] == 3000
    assert _peak_growth(pid, before) < BOUND

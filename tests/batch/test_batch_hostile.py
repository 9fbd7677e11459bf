"""Hostile input to the Batch API, on SQLite and PostgreSQL: clear 4xx answers, never a 500.

PostgreSQL refuses a NUL in a text parameter with an error (not a miss), so ids, cursors,
custom_ids, models, metadata and file names holding one must be answered before the database
sees them.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import httpx
import pytest

from gateway.cli import main
from tests.support.batch import FAST, batch_line, chat_line
from tests.support.stack import Gateway


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def gw(request: pytest.FixtureRequest) -> Gateway:
    # The database first, so that it is dropped after the gateway stopped, not under it.
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    make_gateway: Callable[..., Gateway] = request.getfixturevalue("make_gateway")
    return make_gateway(**FAST, **({"database_url": url} if url else {}))


def _upload(gw: Gateway, content: bytes, filename: str = "in.jsonl") -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/files",
        headers=gw.headers(),
        files={"file": (filename, io.BytesIO(content), "application/jsonl")},
        data={"purpose": "batch"},
    )


def _create(gw: Gateway, file_id: str, **extra: object) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    return httpx.post(
        f"{gw.url}/v1/batches",
        headers=gw.headers(),
        json={"completion_window": "24h", **body, **extra},
    )


@pytest.mark.parametrize(
    "path",
    [
        "/v1/files/file-a%00b",
        "/v1/files/file-a%00b/content",
        "/v1/batches/batch_%00",
        "/v1/batches/batch_%00/events",
        "/v1/files/..%2f..%2fetc%2fpasswd",
    ],
)
@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_malformed_id_is_a_404(gw: Gateway, path: str) -> None:
    response = httpx.get(f"{gw.url}{path}", headers=gw.headers())
    assert response.status_code == 404, response.text
    assert response.json()["error"]["message"]


@pytest.mark.parametrize("listing", ["/v1/files", "/v1/batches"])
def test_a_malformed_cursor_is_a_400(gw: Gateway, listing: str) -> None:
    response = httpx.get(f"{gw.url}{listing}", params={"after": "x\x00"}, headers=gw.headers())
    assert response.status_code == 400, response.text
    assert "after" in response.json()["error"]["message"]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_nul_in_lines_metadata_and_file_name_is_refused_or_dropped(gw: Gateway) -> None:
    body = {"model": "llama3.2\x00x", "messages": [{"role": "user", "content": "hi"}]}
    lines = [batch_line("a\x00b", json.loads(chat_line("x"))["body"]), batch_line("ok", body)]
    uploaded = _upload(gw, ("\n".join(lines) + "\n").encode(), filename="in\x00\x1b[2J.jsonl")
    assert uploaded.status_code == 200, uploaded.text
    stored = uploaded.json()["filename"]  # httpx sends the NUL as %00; ESC is dropped
    assert "\x00" not in stored
    assert "\x1b" not in stored
    assert stored.endswith("[2J.jsonl")
    file_id = uploaded.json()["id"]
    created = _create(gw, file_id)
    assert created.status_code == 200, created.text
    batch = created.json()
    assert batch["status"] == "failed"
    errors = {(e["line"], e["message"]) for e in batch["errors"]["data"]}
    assert errors == {
        (1, "custom_id must not contain NUL"),
        (2, "model must not contain NUL"),
    }
    good = _upload(gw, (chat_line("fine") + "\n").encode()).json()["id"]
    refused = _create(gw, good, metadata={"job": "a\x00"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("metadata:")


@pytest.mark.parametrize(
    "window",
    ["²s", "1²s", "9" * 5000 + "s", "\u0661\u0662s", "0s", "25h", "24"],
)
def test_odd_completion_windows_are_a_400(gw: Gateway, window: str) -> None:
    file_id = _upload(gw, (chat_line("x") + "\n").encode()).json()["id"]
    response = _create(gw, file_id, completion_window=window)
    assert response.status_code == 400, response.text
    assert "completion_window" in response.json()["error"]["message"]


def test_the_cli_escapes_what_the_server_sends_and_checks_ids(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    monkeypatch.setenv("GATEWAY_API_KEY", gw.key)
    file_id = _upload(gw, (chat_line("x\u009b2J\u202e") + "\n").encode()).json()["id"]
    batch = _create(gw, file_id, metadata={"note": "\u009b31m red \u202e"}).json()
    assert main(["batch", "show", batch["id"], "--url", gw.url]) == 0
    out = capsys.readouterr().out
    assert "\u009b" not in out
    assert "\u202e" not in out
    assert "\\x9b31m red \\u202e" in out
    assert main(["batch", "download", "../../x", "--url", gw.url, "--out", str(tmp_path)]) == 2
    assert "not a batch id" in capsys.readouterr().err


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_per_key_quotas_on_stored_bytes_and_queued_lines(
    make_gateway: Callable[..., Gateway],
) -> None:
    """One key cannot fill the shared disk or queue: its own quotas, others unaffected."""
    gw = make_gateway(
        **FAST,
        batch_max_stored_bytes_per_key=4096,
        batch_max_queued_lines_per_key=5,
        batch_worker=False,  # nothing runs: the queued lines stay queued
    )
    lines = ("\n".join(chat_line(f"q{i}") for i in range(3)) + "\n").encode()
    first = _upload(gw, lines).json()["id"]
    assert _create(gw, first).json()["status"] == "in_progress"  # 3 queued
    second = _upload(gw, lines).json()["id"]
    refused = _create(gw, second)  # 3 + 3 > 5
    assert refused.status_code == 429, refused.text
    assert "3 batch lines waiting" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "60"
    big = _upload(gw, b" " * 3700 + (chat_line("x") + "\n").encode())
    assert big.status_code == 400
    assert "over its 4096" in big.json()["error"]["message"]
    _, other = gw.create_key("other")
    theirs = httpx.post(
        f"{gw.url}/v1/files",
        headers=gw.headers(other),
        files={"file": ("in.jsonl", io.BytesIO(lines), "application/jsonl")},
        data={"purpose": "batch"},
    )
    assert theirs.status_code == 200
    httpx.delete(f"{gw.url}/v1/files/{second}", headers=gw.headers())
    assert _upload(gw, lines).status_code == 200  # room again

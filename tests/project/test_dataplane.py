"""The data plane benchmark's evidence holds: its relays relay, and its check catches a cheat.

`benchmarks.dataplane` ranks bare relays by CPU per request; a relay that dropped or merged
lines would rank well and prove nothing, so each relay is run here over real sockets in front of
the emulator and must hand over the answer the emulator gives, and the benchmark's delivery
check must flag a run that lost a line, a request, or had an error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks.dataplane import LINES_PER_ANSWER, delivery_problems
from gateway.testing.stack import ManagedProcess, free_port
from tests.support.stack import Emulator

BODY = {"model": "llama3.2", "prompt": "Why is the sky blue?", "stream": True}
CHAT = {"model": "llama3.2", "messages": [{"role": "user", "content": "Why?"}], "stream": True}


def _run(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {"target": "protocols", "concurrency": 16, "round": 0}
    row |= {"expected_requests": 32, "completed": 32, "errors": 0, "error_examples": []}
    row["chunks"] = 32 * LINES_PER_ANSWER
    return row | changes


def test_a_run_that_lost_a_line_a_request_or_had_an_error_is_reported() -> None:
    assert delivery_problems([_run()]) == []
    lost_line = _run(chunks=32 * LINES_PER_ANSWER - 1)
    lost_request = _run(completed=31, chunks=31 * LINES_PER_ANSWER)
    failed = _run(errors=1, error_examples=["502: b''"])
    problems = delivery_problems([lost_line, lost_request, failed])
    assert len(problems) == 3
    assert "lines for 32 answers" in problems[0]
    assert "31/32 completed" in problems[1]
    assert "1 errors" in problems[2]


def _relay(variant: str, upstream: str, tmp_path: Path) -> ManagedProcess:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "benchmarks.relays", variant, "--port", str(port)]
    argv += ["--upstream", upstream]
    log = tmp_path / f"{variant}.log"
    return ManagedProcess(variant, argv, url, f"{url}/api/version", log_path=log)


def _lines(url: str, path: str, body: dict[str, object]) -> tuple[str, list[bytes]]:
    with httpx.stream("POST", url + path, json=body, timeout=30.0) as answer:
        assert answer.status_code == 200
        content = b"".join(answer.iter_raw())
    return answer.headers["content-type"], [line for line in content.split(b"\n") if line]


def _texts(lines: list[bytes]) -> list[str]:
    return [json.loads(line).get("response", "") for line in lines]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("variant", ["floor", "uvicorn-raw", "protocols"])
def test_each_relay_hands_over_the_emulators_answer_line_for_line(
    variant: str, emulator: Emulator, tmp_path: Path
) -> None:
    _, direct = _lines(emulator.url, "/api/generate", BODY)
    with _relay(variant, emulator.url, tmp_path) as relay:
        content_type, relayed = _lines(relay.url, "/api/generate", BODY)
        _, again = _lines(relay.url, "/api/generate", BODY)  # on a kept-alive upstream link
    assert content_type == "application/x-ndjson"
    assert len(relayed) == len(again) == len(direct) == emulator.config.tokens + 1
    assert _texts(relayed) == _texts(again) == _texts(direct)
    assert json.loads(relayed[-1])["done"] is True


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_translating_relay_writes_one_sse_event_per_line_then_done(
    emulator: Emulator, tmp_path: Path
) -> None:
    with _relay("protocols-sse", emulator.url, tmp_path) as relay:
        content_type, events = _lines(relay.url, "/api/chat", CHAT)
    assert content_type == "text/event-stream"
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(event.removeprefix(b"data: ")) for event in events[:-1]]
    assert len(chunks) == emulator.config.tokens + 1
    texts = [chunk["choices"][0]["delta"].get("content", "") for chunk in chunks]
    assert texts[:-1] == [f"tok{i} " for i in range(emulator.config.tokens)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

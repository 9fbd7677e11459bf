"""Batch lines under upstream faults, cancellation, expiry and interactive priority.

The real `openai` SDK against a real gateway in front of the emulator (Ollama dialect). The
relay's own pre-first-byte retries are off (`retry_attempts=1`) so every fault reaches the
batch runner, whose retries, failures and preemptions the tests count.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from gateway.testing.emulator.state import ReceivedRequest
from tests.support.batch import (
    FAST,
    TEXT,
    batch_line,
    chat_line,
    read_jsonl,
    upload_lines,
    wait_batch,
)
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

BASE = {**FAST, "upstream_dialect": "ollama", "retry_attempts": 1, "circuit_cooldown": 1.0}


@pytest.fixture
def sdk() -> Iterator[Callable[[Gateway], openai.OpenAI]]:
    clients: list[openai.OpenAI] = []

    def make(gw: Gateway) -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def _submit(client: openai.OpenAI, ids: list[str], window: str = "24h") -> str:
    file_id = upload_lines(client, [chat_line(i) for i in ids])
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window=window
    )
    assert batch.status == "in_progress", batch
    return batch.id


def _chats(emulator: Emulator) -> list[ReceivedRequest]:
    return [r for r in emulator.state.records if r.path.endswith("/chat")]


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def _faulted(emulator: Emulator) -> int:
    return sum(1 for r in _chats(emulator) if r.status not in (None, 200) or r.outcome == "fault")


def _each_once(client: openai.OpenAI, batch: openai.types.Batch, ids: list[str]) -> tuple:
    output = read_jsonl(client, batch.output_file_id)
    errors = read_jsonl(client, batch.error_file_id)
    seen = [o["custom_id"] for o in output] + [e["custom_id"] for e in errors]
    assert sorted(seen) == sorted(ids)
    return output, errors


def _assert_full_text(output: list[dict]) -> None:
    for item in output:
        assert item["response"]["status_code"] == 200
        assert item["response"]["body"]["choices"][0]["message"]["content"] == TEXT


@pytest.mark.parametrize(
    ("fault", "status"), [("busy", 503), ("status_before", 429)], ids=["busy", "429"]
)
@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_transient_faults_are_retried_until_every_line_succeeds(
    make_gateway: Callable[..., Gateway],
    emulator: Emulator,
    sdk: Callable[[Gateway], openai.OpenAI],
    fault: str,
    status: int,
) -> None:
    gw = make_gateway(**BASE, batch_max_attempts=50)
    client = sdk(gw)
    emulator.config.fault_status = status
    emulator.config.fault = fault  # type: ignore[assignment]
    ids = [f"t-{i}" for i in range(6)]
    batch_id = _submit(client, ids)
    _wait_for(lambda: _faulted(emulator) >= 3)
    time.sleep(0.5)
    emulator.config.fault = None
    done = wait_batch(client, batch_id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (6, 0)
    output, errors = _each_once(client, done, ids)
    assert errors == []
    assert done.error_file_id is None
    _assert_full_text(output)
    assert any(r.status == status for r in _chats(emulator))
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="retried") > 0
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="succeeded") == 6
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="failed") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_persistent_500_fails_every_line_once_after_max_attempts(
    make_gateway: Callable[..., Gateway],
    emulator: Emulator,
    sdk: Callable[[Gateway], openai.OpenAI],
) -> None:
    gw = make_gateway(**BASE, batch_max_attempts=2)
    client = sdk(gw)
    emulator.config.fault = "status_before"
    emulator.config.fault_status = 500
    emulator.config.fault_message = "the GPU caught fire"
    ids = [f"p-{i}" for i in range(4)]
    batch_id = _submit(client, ids)
    done = wait_batch(client, batch_id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.failed) == (4, 4)
    assert done.request_counts.completed == 0
    output, errors = _each_once(client, done, ids)
    assert output == []
    assert done.output_file_id is None
    for item in errors:
        response = item["response"]
        if response is not None:
            assert response["status_code"] == 502
            assert "GPU caught fire" in response["body"]["error"]["message"]
        else:
            assert "GPU caught fire" in item["error"]["message"]
    # Two attempts per line reached the upstream: no more, no fewer.
    assert len(_chats(emulator)) == 2 * len(ids)
    events = httpx.get(f"{gw.url}/v1/batches/{batch_id}/events", headers=gw.headers()).json()
    failed = [e for e in events["data"] if e["event"] == "line_failed"]
    assert sorted(e["custom_id"] for e in failed) == sorted(ids)
    assert all(e["attempt"] == 2 for e in failed)
    assert sum(e["event"] == "retry" for e in events["data"]) == len(ids)
    assert events["data"][-1]["event"] == "completed"
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="failed") == 4
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="retried") == 4


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_hung_upstream_times_out_and_the_lines_succeed_on_retry(
    make_gateway: Callable[..., Gateway],
    emulator: Emulator,
    sdk: Callable[[Gateway], openai.OpenAI],
) -> None:
    gw = make_gateway(**BASE, first_byte_timeout=0.5, batch_max_attempts=4)
    client = sdk(gw)
    emulator.config.fault = "hang_before"
    ids = [f"h-{i}" for i in range(3)]
    batch_id = _submit(client, ids)
    _wait_for(lambda: len(_chats(emulator)) >= 1)
    time.sleep(0.7)  # past the first-byte timeout: the hung attempts were given up
    emulator.config.fault = None
    done = wait_batch(client, batch_id)
    assert done.status == "completed", done
    output, errors = _each_once(client, done, ids)
    assert errors == []
    _assert_full_text(output)
    hung = [r for r in _chats(emulator) if r.first_byte_at is None]
    assert hung, "no attempt hung"
    assert metric_value(gw.metrics_text(), "gateway_batch_lines_total", outcome="retried") > 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_dropped_stream_is_retried_and_the_output_is_whole(
    make_gateway: Callable[..., Gateway],
    emulator: Emulator,
    sdk: Callable[[Gateway], openai.OpenAI],
) -> None:
    # Four attempts: the drops open the circuit breaker, and a line retried sooner than the
    # gateway's Retry-After would spend them all on 503 "no upstream is available".
    gw = make_gateway(**BASE, batch_max_attempts=4)
    client = sdk(gw)
    emulator.config.fault = "drop_midstream"
    emulator.config.fault_after = 3
    ids = [f"d-{i}" for i in range(4)]
    batch_id = _submit(client, ids)
    _wait_for(lambda: sum(r.outcome == "fault" for r in _chats(emulator)) >= 2)
    emulator.config.fault = None
    done = wait_batch(client, batch_id)
    assert done.status == "completed", done
    output, errors = _each_once(client, done, ids)
    assert errors == []
    _assert_full_text(output)  # never the 3 tokens sent before the drop
    assert metric_value(gw.metrics_text(), "gateway_batch_lines_total", outcome="retried") > 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_cancel_keeps_finished_lines_and_marks_the_rest_cancelled(
    make_gateway: Callable[..., Gateway],
    emulator: Emulator,
    sdk: Callable[[Gateway], openai.OpenAI],
) -> None:
    gw = make_gateway(**BASE, batch_max_concurrent=1)
    client = sdk(gw)
    emulator.config.inter_token = 0.03
    ids = [f"c-{i}" for i in range(20)]
    batch_id = _submit(client, ids)

    def one_done() -> bool:
        counts = client.batches.retrieve(batch_id).request_counts
        return counts is not None and counts.completed >= 1

    _wait_for(one_done)
    cancelling = client.batches.cancel(batch_id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_batch(client, batch_id)
    assert done.status == "cancelled", done
    assert done.cancelled_at is not None
    output, errors = _each_once(client, done, ids)
    assert 1 <= len(output) < len(ids)
    _assert_full_text(output)
    assert errors
    assert all(e["error"]["code"] == "batch_cancelled" for e in errors)
    assert len(_chats(emulator)) == len(output)  # no cancelled line reached the upstream
    finished = {o["custom_id"] for o in output}
    assert finished == {f"c-{i}" for i in range(len(output))}  # lines run in order


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_batch_past_its_window_expires_with_its_finished_lines(
    make_gateway: Callable[..., Gateway],
    emulator: Emulator,
    sdk: Callable[[Gateway], openai.OpenAI],
) -> None:
    gw = make_gateway(**BASE, batch_max_concurrent=1)
    client = sdk(gw)
    emulator.config.inter_token = 0.03  # ~0.5 s a line: a few fit in the window
    ids = [f"e-{i}" for i in range(12)]
    batch_id = _submit(client, ids, window="2s")
    done = wait_batch(client, batch_id, timeout=10)
    assert done.status == "expired", done
    assert done.expired_at is not None
    output, errors = _each_once(client, done, ids)
    assert 1 <= len(output) < len(ids)
    _assert_full_text(output)
    assert errors
    assert all(e["error"]["code"] == "batch_expired" for e in errors)
    assert len(_chats(emulator)) == len(output)


def _max_overlap(records: list[ReceivedRequest]) -> int:
    points = []
    for r in records:
        points.append((r.started_at, 1))
        points.append((r.ended_at if r.ended_at is not None else float("inf"), -1))
    best = current = 0
    for _, step in sorted(points):
        current += step
        best = max(best, current)
    return best


def _interactive(gw: Gateway) -> dict:
    response = httpx.post(
        f"{gw.url}/v1/chat/completions",
        headers=gw.headers(),
        json={"model": "llama3.2", "messages": [{"role": "user", "content": "now"}]},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_batch_lines_leave_the_reserved_slot_to_interactive_requests(
    make_gateway: Callable[..., Gateway],
    emulator: Emulator,
    sdk: Callable[[Gateway], openai.OpenAI],
) -> None:
    gw = make_gateway(
        **BASE, upstream_max_concurrent=2, batch_reserved_slots=1, batch_max_concurrent=4
    )
    client = sdk(gw)
    emulator.config.inter_token = 0.02
    ids = [f"r-{i}" for i in range(5)]
    batch_id = _submit(client, ids)
    in_use: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            in_use.append(metric_value(gw.metrics_text(), "gateway_upstream_slots_in_use"))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        _wait_for(lambda: len(_chats(emulator)) >= 2)
        before = len(_chats(emulator))
        answer = _interactive(gw)
        interactive = [r for r in _chats(emulator) if r.body["messages"][0]["content"] == "now"]
        done = wait_batch(client, batch_id)
    finally:
        stop.set()
        watcher.join()
    assert answer["choices"][0]["message"]["content"] == TEXT
    assert done.status == "completed", done
    _each_once(client, done, ids)
    batch_records = [r for r in _chats(emulator) if r not in interactive]
    assert len(batch_records) == len(ids)
    assert _max_overlap(batch_records) == 1  # one batch line at a time: one slot is reserved
    assert max(in_use) <= 2
    assert 1 in in_use
    # The interactive request ran beside a batch line, which it did not preempt.
    (mine,) = interactive
    assert any(r.started_at < mine.started_at < (r.ended_at or 0) for r in batch_records)
    assert before < len(ids)
    assert metric_value(gw.metrics_text(), "gateway_batch_lines_total", outcome="preempted") == 0


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_an_interactive_request_preempts_a_running_batch_line(
    make_gateway: Callable[..., Gateway],
    emulator: Emulator,
    sdk: Callable[[Gateway], openai.OpenAI],
) -> None:
    gw = make_gateway(
        **BASE, upstream_max_concurrent=1, batch_reserved_slots=0, batch_max_concurrent=4
    )
    client = sdk(gw)
    # ~2.5 s a line: wide enough that the line seen running is still running when the
    # interactive request arrives, even on a loaded machine.
    emulator.config.inter_token = 0.15
    ids = [f"q-{i}" for i in range(3)]
    batch_id = _submit(client, ids)
    _wait_for(lambda: any(r.tokens_sent >= 2 and r.ended_at is None for r in _chats(emulator)))
    running = next(r for r in _chats(emulator) if r.ended_at is None)
    answer = _interactive(gw)
    assert answer["choices"][0]["message"]["content"] == TEXT
    # The batch line was cut off (the client left) before its end, then run again.
    assert running.wait_ended(5)
    assert running.outcome == "client_disconnect"
    (mine,) = [r for r in _chats(emulator) if r.body["messages"][0]["content"] == "now"]
    assert running.ended_at is not None
    assert running.ended_at <= mine.ended_at
    done = wait_batch(client, batch_id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert done.request_counts.completed == len(ids)
    output, errors = _each_once(client, done, ids)
    assert errors == []
    _assert_full_text(output)
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="preempted") >= 1
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="failed") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_key_held_back_by_its_own_rpm_does_not_hold_back_another_keys_batch(
    make_gateway: Callable[..., Gateway], emulator: Emulator, sdk
) -> None:
    """Keys take turns, and a limited key's lines wait for its Retry-After, not in line."""
    emulator.config.tokens = 2
    gw = make_gateway(**BASE)
    # Four a minute: the upload and the batch's creation take two (Files and Batch API
    # requests count against RPM), two lines run, and then the key's RPM holds the rest back.
    _, slow_key = gw.create_key("four-a-minute", rpm=4)
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=slow_key, max_retries=0) as slow:
        hog = _submit(slow, [f"hog-{i}" for i in range(300)])
        _wait_for(lambda: slow.batches.retrieve(hog).request_counts.completed >= 2)
        client = sdk(gw)
        ids = ["mine-1", "mine-2"]
        mine = wait_batch(client, _submit(client, ids), timeout=20)
        assert mine.status == "completed"
        assert mine.request_counts.completed == 2
        _each_once(client, mine, ids)
        # The held key's batch waits for its window without a line failed or counted as tried.
        hogged = slow.batches.retrieve(hog)
        assert hogged.status == "in_progress"
        assert hogged.request_counts.failed == 0
        assert hogged.request_counts.completed == 2
        # Its lines were tried about once per Retry-After, not in a loop.
        deferred = metric_value(gw.metrics_text(), "gateway_batch_lines_total", outcome="deferred")
        assert 1 <= deferred <= 40
        slow.batches.cancel(hog)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_line_that_can_never_pass_the_keys_tpm_fails_at_once(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    gw = make_gateway(**BASE)
    _, key = gw.create_key("small-tpm", tpm=100)
    # A prompt of ~200 tokens: no window of a 100-token key can hold it. (A large `max_tokens`
    # alone no longer refuses: the bound sent is lowered to what a window holds.)
    body = {"model": "llama3.2", "messages": [{"role": "user", "content": "x" * 800}]}
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0) as client:
        file_id = upload_lines(client, [batch_line("huge", body), chat_line("fits")])
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_batch(client, batch.id, timeout=20)
        assert done.status == "completed"
        output, errors = _each_once(client, done, ["huge", "fits"])
    [error] = errors
    assert error["custom_id"] == "huge"
    assert error["response"]["status_code"] == 413
    assert "can never be admitted" in error["response"]["body"]["error"]["message"]
    assert [o["custom_id"] for o in output] == ["fits"]
    [tried] = [
        r for r in _chats(emulator) if r.body and "x" * 800 in json.dumps(r.body["messages"])
    ] or [None]
    assert tried is None  # never sent upstream

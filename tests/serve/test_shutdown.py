"""Graceful shutdown of a real `gateway serve` process: drain, finish, end what is left, exit."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway.testing.stack import ManagedProcess, create_key, gateway_process
from tests.support.client import MODEL, stream_generation
from tests.support.stack import Emulator

pytestmark = pytest.mark.processes


def _generate_in_background(url: str, key: str) -> tuple[threading.Thread, list[httpx.Response]]:
    """POST one generation from a started thread; its response lands in the returned list."""
    result: list[httpx.Response] = []
    reader = threading.Thread(
        target=lambda: result.append(
            httpx.post(
                f"{url}/v1/generate",
                json={"model": MODEL, "prompt": "x"},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
        )
    )
    reader.start()
    return reader, result


def _sigterm_and_exit(
    gateway: ManagedProcess, reader: threading.Thread, *, after: float, signals: int = 1
) -> None:
    """After `after` seconds send SIGTERM (`signals` times, 0.2 s apart); the client's thread
    ends and the process exits (uvicorn re-raises the signal it caught: exit by SIGTERM)."""
    time.sleep(after)
    assert gateway.process is not None
    for i in range(signals):
        if i:
            time.sleep(0.2)
        gateway.process.send_signal(signal.SIGTERM)
    reader.join(15)
    assert gateway.process.wait(15) in (0, -signal.SIGTERM)


def test_sigterm_drains_then_ends_streams_with_an_error_line(
    emulator: Emulator, tmp_path: Path, serve_env: dict[str, str]
):
    emulator.config.ttft = 0.05
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 200  # a 10 s answer: longer than drain + deadline
    env = {
        **serve_env,
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_SHUTDOWN_DRAIN": "1",
        "GATEWAY_SHUTDOWN_TIMEOUT": "2",
    }
    with gateway_process(tmp_path, env) as gateway:
        key = str(create_key(gateway.extra_env, "k")["key"])
        headers = {"Authorization": f"Bearer {key}"}
        lines: list[dict] = []
        reader = threading.Thread(target=stream_generation, args=(gateway.url, key, lines))
        reader.start()
        time.sleep(0.5)
        assert gateway.process is not None
        started = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        # Every process has begun its drain (workers get the signal from their supervisor,
        # which looks at its signals every half second).
        workers = int(serve_env.get("GATEWAY_WORKERS", "1"))
        deadline = time.monotonic() + 5
        while gateway.log_tail(200).count("draining for 1 s") < workers:
            assert time.monotonic() < deadline, gateway.log_tail(50)
            time.sleep(0.02)
        # Draining: still listening, but unready and refusing new work.
        ready = httpx.get(f"{gateway.url}/readyz")
        assert ready.status_code == 503
        assert ready.json()["status"] == "draining"
        refused = httpx.post(
            f"{gateway.url}/v1/generate", json={"model": MODEL, "prompt": "x"}, headers=headers
        )
        assert refused.status_code == 503
        assert refused.json() == {"error": "gateway is shutting down"}
        assert refused.headers["retry-after"]
        reader.join(15)
        ended = time.monotonic() - started
        # uvicorn re-raises the signal it caught once it has shut down (exit by SIGTERM).
        assert gateway.process.wait(15) in (0, -signal.SIGTERM)
    # The stream ran through the drain (1 s) and the deadline (2 s), then got one error line.
    assert 2.5 < ended < 6
    assert len(lines) > 40
    assert lines[-1] == {"error": "gateway is shutting down"}
    assert not any(line.get("done") for line in lines)
    [record] = [r for r in emulator.state.records if r.path == "/api/generate"]
    assert record.wait_ended(2)
    assert record.outcome == "client_disconnect"  # the upstream request was closed


def test_a_stream_that_ends_within_the_deadline_completes(
    emulator: Emulator, tmp_path: Path, serve_env: dict[str, str]
):
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 30  # 1.5 s
    env = {
        **serve_env,
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_SHUTDOWN_DRAIN": "0.5",
        "GATEWAY_SHUTDOWN_TIMEOUT": "5",
    }
    with gateway_process(tmp_path, env) as gateway:
        key = str(create_key(gateway.extra_env, "k")["key"])
        reader, result = _generate_in_background(gateway.url, key)
        _sigterm_and_exit(gateway, reader, after=0.3)
    lines = [json.loads(line) for line in result[0].text.splitlines()]
    assert lines[-1]["done"] is True
    assert len(lines) == 31


def test_a_request_still_waiting_for_its_first_byte_gets_503(
    emulator: Emulator, tmp_path: Path, serve_env: dict[str, str]
):
    emulator.config.ttft = 20.0  # a model load longer than drain + deadline
    env = {
        **serve_env,
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_SHUTDOWN_DRAIN": "0.5",
        "GATEWAY_SHUTDOWN_TIMEOUT": "1",
        "GATEWAY_FIRST_BYTE_TIMEOUT": "60",
    }
    with gateway_process(tmp_path, env) as gateway:
        key = str(create_key(gateway.extra_env, "k")["key"])
        reader, result = _generate_in_background(gateway.url, key)
        _sigterm_and_exit(gateway, reader, after=0.5)
        log = gateway.log_tail(50)
    [response] = result
    assert response.status_code == 503
    assert response.json() == {"error": "gateway is shutting down"}
    assert response.headers["retry-after"] == "1"
    assert '"outcome":"shutdown"' in log
    [record] = [r for r in emulator.state.records if r.path == "/api/generate"]
    assert record.wait_ended(2)
    assert record.outcome == "client_disconnect"  # the upstream request was closed


def test_a_second_signal_skips_the_drain_but_still_ends_streams_cleanly(
    emulator: Emulator, tmp_path: Path
):
    # One worker only: with workers, a signal within 2 s of the first is taken as the same one
    # delivered twice (tests/serve/test_workers.py tests a later second signal to the supervisor).
    emulator.config.ttft = 0.05
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 400  # 20 s
    env = {
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_SHUTDOWN_DRAIN": "30",  # would outlast the test if the second signal did not
        "GATEWAY_SHUTDOWN_TIMEOUT": "1",
    }
    with gateway_process(tmp_path, env) as gateway:
        key = str(create_key(gateway.extra_env, "k")["key"])
        lines: list[dict] = []
        reader = threading.Thread(target=stream_generation, args=(gateway.url, key, lines))
        reader.start()
        _sigterm_and_exit(gateway, reader, after=0.5, signals=2)
    assert lines[-1] == {"error": "gateway is shutting down"}
    assert not any(line.get("done") for line in lines)


def test_a_stream_whose_client_reads_nothing_is_still_recorded_at_shutdown(
    emulator: Emulator, tmp_path: Path, serve_env: dict[str, str]
):
    # A fast, long answer to a client that reads only the head: the gateway's writes to it
    # back up, so the shutdown's error line cannot be written. The request must be recorded
    # anyway (its access line names its outcome) and the process must still exit.
    emulator.config.ttft = 0.01
    emulator.config.inter_token = 0.0
    emulator.config.tokens = 2_000_000
    env = {
        **serve_env,
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_IDLE_TIMEOUT": "60",  # the client's stall alone must not end the stream
        "GATEWAY_SHUTDOWN_DRAIN": "0.5",
        "GATEWAY_SHUTDOWN_TIMEOUT": "1",
    }
    with gateway_process(tmp_path, env) as gateway:
        key = str(create_key(gateway.extra_env, "k")["key"])
        body = json.dumps({"model": MODEL, "prompt": "x"}).encode()
        host, port = gateway.url.removeprefix("http://").split(":")
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect((host, int(port)))
        try:
            client.sendall(
                b"POST /v1/generate HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert client.recv(12) == b"HTTP/1.1 200"
            time.sleep(4)  # megabytes written and not read: the connection is backed up
            assert gateway.process is not None
            gateway.process.send_signal(signal.SIGTERM)
            # uvicorn re-raises the signal it caught once it has shut down (exit by SIGTERM).
            assert gateway.process.wait(30) in (0, -signal.SIGTERM)
        finally:
            client.close()
        log = gateway.log_tail(200)
    [access] = [x for x in log.splitlines() if "gateway.access" in x and "/v1/generate" in x]
    assert json.loads(access[access.index("{") :])["outcome"] == "shutdown", log

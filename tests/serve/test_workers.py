"""`gateway serve --workers 2`: limits, in-flight counts, metrics and drain across two processes.

Each test runs a real `gateway serve` subprocess (a supervisor and two spawned workers on one
socket) with Redis limit storage under a key prefix of its own, in front of the emulator.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.serve.workers import SIGNAL_GRACE, refusal, share, worker_settings
from gateway.settings import Settings, UpstreamSpec
from gateway.testing.stack import ManagedProcess, create_key, gateway_process
from tests.support.batch import chat_line, read_jsonl, upload_lines, wait_batch
from tests.support.client import MODEL, stream_generation
from tests.support.metrics import metric_value
from tests.support.servers import REDIS_URL
from tests.support.stack import Emulator

DEADLINE = 30.0  # seconds any awaited state may take on a loaded machine


def _until(condition: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    """Poll `condition` until it returns something true; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def worker_pids(gateway: ManagedProcess) -> set[int]:
    """The pids of the supervisor's worker children (not its resource tracker)."""
    assert gateway.process is not None
    parent = gateway.process.pid
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    pids = set()
    for pid in map(int, children):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # it just exited
            continue
        if b"spawn_main" in command:
            pids.add(pid)
    return pids


def _completed(gateway: ManagedProcess) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=DEADLINE).text
    return metric_value(text, "gateway_requests_total", outcome="completed")


def generate(url: str, key: str) -> httpx.Response:
    """One short generation on a connection of its own (so the kernel picks the worker)."""
    return httpx.post(
        f"{url}/v1/generate",
        json={"model": MODEL, "prompt": "x"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=DEADLINE,
    )


@pytest.fixture
def two_workers(
    emulator: Emulator, tmp_path: Path, redis_prefix: str
) -> Iterator[Callable[..., tuple[ManagedProcess, str]]]:
    """Start `gateway serve --workers 2`; keyword arguments are extra `GATEWAY_*` variables.

    Returns the process (both workers up) and a key.
    """
    started: list[ManagedProcess] = []

    def start(**env: str) -> tuple[ManagedProcess, str]:
        full_env = {
            "GATEWAY_UPSTREAM_URL": emulator.url,
            "GATEWAY_RATE_LIMIT_STORAGE": REDIS_URL,
            "GATEWAY_RATE_LIMIT_KEY_PREFIX": redis_prefix,
            "GATEWAY_UPSTREAM_POLL_INTERVAL": "60",
            # A slow Redis on a loaded machine must fail the test, not admit requests unlimited.
            "GATEWAY_RATE_LIMIT_TIMEOUT": "5",
            "GATEWAY_RATE_LIMIT_FAIL_OPEN": "false",
            **{f"GATEWAY_{name.upper()}": value for name, value in env.items()},
        }
        gateway = gateway_process(tmp_path, full_env, ["--workers", "2"])
        gateway.__enter__()
        started.append(gateway)
        _until(lambda: len(worker_pids(gateway)) == 2, "two workers")
        # Both started: each logs its share of the upstream gate once its server is built.
        _until(lambda: gateway.log_tail(500).count("Application startup complete") >= 2, "ready")
        key = str(create_key(gateway.extra_env, "k")["key"])
        return gateway, key

    yield start
    for gateway in started:
        gateway.stop()


# --- the plan: shares and refusals (no processes) ---------------------------------------------


def test_shares_add_up_to_the_total_and_differ_by_at_most_one():
    for total in (2, 3, 7, 64):
        for workers in (2, 3):
            parts = [share(total, workers, index) for index in range(workers)]
            assert sum(parts) == total
            assert max(parts) - min(parts) <= 1


def test_each_worker_gets_its_share_of_every_gate():
    upstreams = [
        UpstreamSpec(url="http://a:1", max_concurrent=5),  # type: ignore[arg-type]
        UpstreamSpec(url="http://b:1"),  # type: ignore[arg-type]
        UpstreamSpec(url="http://c:1", max_concurrent=0),  # type: ignore[arg-type]
    ]
    settings = Settings(
        upstream_max_concurrent=3, upstream_queue_size=64, upstreams=upstreams, _env_file=None
    )
    first, second = (worker_settings(settings, 2, index) for index in (0, 1))
    assert (first.upstream_max_concurrent, second.upstream_max_concurrent) == (2, 1)
    assert (first.upstream_queue_size, second.upstream_queue_size) == (32, 32)
    assert [s.max_concurrent for s in first.upstream_specs] == [3, None, 0]
    assert [s.max_concurrent for s in second.upstream_specs] == [2, None, 0]


def test_workers_without_redis_or_with_an_indivisible_gate_are_refused():
    memory = Settings(_env_file=None)
    assert "GATEWAY_RATE_LIMIT_STORAGE" in str(refusal(memory, 2))
    gated = Settings(rate_limit_storage=REDIS_URL, upstream_max_concurrent=1, _env_file=None)
    assert "GATEWAY_UPSTREAM_MAX_CONCURRENT=1" in str(refusal(gated, 2))
    assert refusal(gated, 1) is None


def _refused_serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `gateway serve ARGS` with only `env` set (no GATEWAY_* or PROMETHEUS_* inherited)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PROMETHEUS_"))}
    clean["GATEWAY_DATABASE_URL"] = f"sqlite+aiosqlite:///{tmp_path}/gateway.db"
    return subprocess.run(  # noqa: S603 - our own command
        [sys.executable, "-m", "gateway", "serve", *args],
        env={**clean, **env},
        cwd=tmp_path,  # no .env there
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.processes
def test_serve_with_two_workers_and_memory_limits_exits_with_a_clear_error(tmp_path: Path):
    done = _refused_serve(tmp_path, "--workers", "2")
    assert done.returncode == 2
    assert "GATEWAY_RATE_LIMIT_STORAGE=redis://" in done.stderr
    assert not (tmp_path / "gateway.db").exists()  # refused before touching anything


@pytest.mark.processes
def test_an_inherited_multiprocess_directory_is_refused(tmp_path: Path):
    """One process would write there and read a previous run's counters back as its own."""
    done = _refused_serve(tmp_path, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "stale"))
    assert done.returncode == 2
    assert "PROMETHEUS_MULTIPROC_DIR is set; unset it" in done.stderr
    assert not (tmp_path / "gateway.db").exists()


# --- two real workers ---------------------------------------------------------------------


@pytest.mark.processes
def test_metrics_count_every_request_whichever_worker_served_it(two_workers, emulator):
    emulator.config.tokens = 3
    gateway, key = two_workers()
    for _ in range(12):
        assert generate(gateway.url, key).status_code == 200
    # A request is recorded just after its last byte went out: wait for the last one.
    _until(lambda: _completed(gateway) == 12, "12 requests in the metrics")
    # Each scrape lands on either worker; every one must report the totals of both.
    for _ in range(6):
        text = httpx.get(f"{gateway.url}/metrics").text
        assert metric_value(text, "gateway_requests_total", outcome="completed") == 12
        assert metric_value(text, "gateway_output_tokens_total") == 36
        assert metric_value(text, "gateway_requests_in_flight") == 0
        assert metric_value(text, "gateway_request_duration_seconds_count") == 12
        assert metric_value(text, "gateway_route_decisions_total", reason="only") == 12
    assert len([r for r in emulator.state.records if r.path == "/api/generate"]) == 12


@pytest.mark.processes
def test_rpm_limit_holds_across_workers(two_workers, emulator):
    emulator.config.tokens = 1
    gateway, key = two_workers(default_rpm="5")
    statuses = [generate(gateway.url, key).status_code for _ in range(8)]
    assert statuses == [200] * 5 + [429] * 3
    text = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(text, "gateway_rate_limited_total", kind="rpm") == 3


@pytest.mark.processes
def test_in_flight_limit_holds_across_workers(two_workers, emulator, redis_prefix):
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 100  # 5 s
    gateway, key = two_workers(default_max_concurrent="2")
    streams: list[list[dict]] = [[], []]
    readers = [
        threading.Thread(target=stream_generation, args=(gateway.url, key, lines))
        for lines in streams
    ]
    for reader in readers:
        reader.start()
    _until(lambda: all(streams), "both streams to start")
    client = redis.Redis.from_url(REDIS_URL)

    def in_flight() -> int:
        names = client.scan_iter(f"{redis_prefix}:inflight/*")  # one leased member a request
        return sum(int(client.zcard(name)) for name in names)

    assert in_flight() == 2  # the count both workers share
    refused = [generate(gateway.url, key) for _ in range(4)]
    assert [r.status_code for r in refused] == [429] * 4
    assert "in flight" in refused[0].json()["error"]
    for reader in readers:
        reader.join(DEADLINE)
    assert all(lines[-1].get("done") for lines in streams)
    # Each worker gives its request's place back just after the last byte: wait for both.
    _until(lambda: in_flight() == 0, "the key's in-flight count back at 0")
    client.close()
    emulator.config.tokens = 1
    assert generate(gateway.url, key).status_code == 200


@pytest.mark.processes
def test_sigterm_drains_every_worker_then_exits_0(two_workers, emulator):
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 30  # 1.5 s: ends within the drain plus the deadline
    gateway, key = two_workers(shutdown_drain="1", shutdown_timeout="3")
    streams: list[list[dict]] = [[] for _ in range(4)]
    readers = [
        threading.Thread(target=stream_generation, args=(gateway.url, key, lines))
        for lines in streams
    ]
    for reader in readers:
        reader.start()
    _until(lambda: all(streams), "the streams to start")
    assert gateway.process is not None
    gateway.process.send_signal(signal.SIGTERM)
    ready = _until(
        lambda: (r := httpx.get(f"{gateway.url}/readyz")).status_code == 503 and r, "draining"
    )
    assert ready.json()["status"] == "draining"
    for reader in readers:
        reader.join(DEADLINE)
    assert gateway.process.wait(DEADLINE) == 0
    assert all(lines[-1].get("done") for lines in streams)
    assert all(len(lines) == 31 for lines in streams)
    assert gateway.log_tail(500).count("draining for 1 s before shutting down") == 2


@pytest.mark.processes
def test_a_stream_past_the_deadline_ends_with_the_error_line(two_workers, emulator):
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 400  # 20 s: longer than drain + deadline
    gateway, key = two_workers(shutdown_drain="0.5", shutdown_timeout="1")
    lines: list[dict] = []
    reader = threading.Thread(target=stream_generation, args=(gateway.url, key, lines))
    reader.start()
    _until(lambda: lines, "the stream to start")
    assert gateway.process is not None
    gateway.process.send_signal(signal.SIGTERM)
    reader.join(DEADLINE)
    assert gateway.process.wait(DEADLINE) == 0
    assert lines[-1] == {"error": "gateway is shutting down"}


@pytest.mark.processes
def test_a_killed_worker_is_replaced_and_its_counts_stay(two_workers, emulator):
    emulator.config.tokens = 1
    gateway, key = two_workers()
    for _ in range(4):
        assert generate(gateway.url, key).status_code == 200
    _until(lambda: _completed(gateway) == 4, "the 4 requests recorded before the kill")
    before = worker_pids(gateway)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)

    def replaced() -> set[int] | None:
        pids = worker_pids(gateway)
        return pids if len(pids) == 2 and victim not in pids else None

    after = _until(replaced, "a replacement worker")
    assert len(after - before) == 1
    _until(lambda: "died (exit code -9); starting another" in gateway.log_tail(500), "the log")
    _until(lambda: gateway.log_tail(500).count("Application startup complete") >= 3, "its start")
    for _ in range(4):
        assert generate(gateway.url, key).status_code == 200
    # The dead worker's counters are still in the totals; its live gauges are gone.
    _until(lambda: _completed(gateway) == 8, "all 8 requests in the metrics")
    text = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(text, "gateway_requests_in_flight") == 0


@pytest.mark.processes
def test_a_replacement_that_fails_to_start_is_retried_while_the_other_worker_serves(
    two_workers, emulator, tmp_path: Path
):
    """A worker dying during a short database outage must not take the whole gateway down."""
    emulator.config.tokens = 1
    database = tmp_path / "db"
    database.mkdir()
    gateway, key = two_workers(database_url=f"sqlite+aiosqlite:///{database}/gw.db")
    database.rename(tmp_path / "db.away")
    database.write_text("not a directory")  # the replacement cannot open its database
    victim = min(worker_pids(gateway))
    os.kill(victim, signal.SIGKILL)
    _until(lambda: "failed to start; trying again in" in gateway.log_tail(2000), "a retry")
    assert gateway.process is not None
    assert gateway.process.poll() is None  # still serving
    # The surviving worker still answers (its database is away too: liveness, not a key).
    assert httpx.get(f"{gateway.url}/healthz", timeout=10).status_code == 200
    database.unlink()
    (tmp_path / "db.away").rename(database)
    _until(lambda: len(worker_pids(gateway)) == 2 and victim not in worker_pids(gateway), "back")
    for _ in range(4):
        assert generate(gateway.url, key).status_code == 200


@pytest.mark.processes
def test_the_upstream_gate_is_divided_between_the_workers(two_workers, emulator):
    emulator.config.tokens = 1
    gateway, _ = two_workers(upstream_max_concurrent="3", upstream_queue_size="10")
    log = gateway.log_tail(500)
    name = emulator.url.removeprefix("http://")
    assert f"upstream slots {name}=2 (0: no gate), queue 5" in log
    assert f"upstream slots {name}=1 (0: no gate), queue 5" in log


@pytest.mark.processes
def test_a_signal_to_the_whole_process_group_still_drains(two_workers, emulator):
    """Ctrl-C (or `kill -- -PGID`) reaches each worker directly and again from the supervisor:
    one signal, so the drain is not cut short as a second signal would."""
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 40  # 2 s: past the drain, within drain + deadline
    gateway, key = two_workers(shutdown_drain="1", shutdown_timeout="5")
    lines: list[dict] = []
    reader = threading.Thread(target=stream_generation, args=(gateway.url, key, lines))
    reader.start()
    _until(lambda: lines, "the stream to start")
    assert gateway.process is not None
    os.killpg(gateway.process.pid, signal.SIGINT)
    reader.join(DEADLINE)
    assert gateway.process.wait(DEADLINE) == 0
    assert lines[-1].get("done") is True
    assert "second signal" not in gateway.log_tail(500)


@pytest.mark.processes
def test_a_second_signal_to_the_supervisor_ends_every_drain(two_workers, emulator):
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 400  # 20 s
    gateway, key = two_workers(shutdown_drain="20", shutdown_timeout="1")
    lines: list[dict] = []
    reader = threading.Thread(target=stream_generation, args=(gateway.url, key, lines))
    reader.start()
    _until(lambda: lines, "the stream to start")
    assert gateway.process is not None
    gateway.process.send_signal(signal.SIGTERM)
    _until(lambda: gateway.log_tail(500).count("draining for 20 s") == 2, "both to drain")
    time.sleep(SIGNAL_GRACE + 0.5)  # past the window in which a signal counts as the same one
    second = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)
    reader.join(DEADLINE)
    assert gateway.process.wait(DEADLINE) == 0
    assert time.monotonic() - second < 10  # not the 20 s drain
    assert lines[-1] == {"error": "gateway is shutting down"}
    assert gateway.log_tail(500).count("second signal") == 2


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_a_batch_runs_each_line_once_with_two_workers_on_one_sqlite_file(two_workers, emulator):
    """Both workers' batch runners claim lines from one SQLite file: leases keep them apart."""
    lines = 200
    emulator.config.tokens, emulator.config.inter_token = 4, 0.01
    gateway, key = two_workers(batch_poll_seconds="0.1", batch_max_concurrent="8")
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=2, timeout=30)
    with client:
        ids = [f"req-{i}" for i in range(lines)]
        file_id = upload_lines(client, [chat_line(custom_id) for custom_id in ids])
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_batch(client, batch.id, timeout=120.0)
        assert done.status == "completed", done
        output = read_jsonl(client, done.output_file_id)
    assert sorted(str(item["custom_id"]) for item in output) == sorted(ids)

    def succeeded() -> float:
        text = httpx.get(f"{gateway.url}/metrics", timeout=DEADLINE).text
        return metric_value(text, "gateway_batch_lines_total", outcome="succeeded")

    _until(lambda: succeeded() == lines, f"{lines} lines succeeded in the metrics")
    assert len([r for r in emulator.state.records if r.path == "/api/chat"]) == lines


@pytest.mark.processes
def test_tpm_limit_holds_across_workers(two_workers, emulator, redis_prefix):
    """Each request reserves 11 tokens (num_predict 10, a 1-token prompt) and uses 22 (the
    emulator counts 12 prompt tokens): 22 + 11 and 44 + 11 against 50 per minute, whichever
    worker holds the window's count."""
    emulator.config.tokens = 10
    gateway, key = two_workers(default_tpm="50")
    client = redis.Redis.from_url(REDIS_URL)

    def window() -> int:
        return sum(int(client.get(name) or 0) for name in client.scan_iter(f"{redis_prefix}*tpm*"))

    def post() -> int:
        return httpx.post(
            f"{gateway.url}/v1/generate",
            json={"model": MODEL, "prompt": "x", "stream": False, "options": {"num_predict": 10}},
            headers={"Authorization": f"Bearer {key}"},
            timeout=DEADLINE,
        ).status_code

    statuses = []
    for used in (22, 44, 44, 44):
        statuses.append(post())
        # The worker settles the reservation just after the answer: wait for it.
        _until(lambda used=used: window() == used, f"{used} tokens in the window")
    client.close()
    assert statuses == [200, 200, 429, 429]
    text = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(text, "gateway_rate_limited_total", kind="tpm") == 2


def test_auto_counts_the_cpus_this_process_may_use(tmp_path, monkeypatch):
    """A pod limited to 2 CPUs on a 32-core node starts 2 workers, not 32."""
    from gateway.serve import workers

    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(workers, "CGROUP_CPU_MAX", str(cpu_max))
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _pid: set(range(32)))
    cpu_max.write_text("150000 100000\n")
    assert workers.worker_count("auto") == 2  # 1.5 CPUs of quota, rounded up
    cpu_max.write_text("max 100000\n")
    assert workers.worker_count("auto") == workers.AUTO_WORKERS_MAX  # 32 usable, capped
    cpu_max.unlink()  # no cgroup v2: the affinity alone
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _pid: {0, 1, 2})
    assert workers.worker_count("auto") == 3
    assert workers.worker_count("5") == 5

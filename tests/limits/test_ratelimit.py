"""Per-key limits and the upstream gate, over real sockets (F-09, F-20, F-22, F-24, F-25, F-26)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from limits.aio.storage import MemoryStorage

from gateway.auth.principal import Principal
from gateway.errors import RateLimitedError
from gateway.limits.limiter import KeyLimiter
from gateway.limits.storage import (
    HousekeptMemoryStorage,
    MemoryCounters,
    StorageCounters,
    build_storage,
)
from gateway.metering.metrics import Metrics
from gateway.policies import LimitPolicy
from gateway.settings import Settings
from gateway.testing.stack import create_key, gateway_process
from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.servers import REDIS_URL
from tests.support.stack import Emulator, Gateway

GENERATION_PATHS = ("/api/generate", "/api/chat")


def _generations(emulator: Emulator) -> list:
    return [r for r in emulator.state.records if r.path in GENERATION_PATHS]


def _post(gw: Gateway, key: str | None = None, **body) -> httpx.Response:
    payload = {"model": MODEL, "prompt": "x", "stream": False, **body}
    return httpx.post(f"{gw.url}/v1/generate", json=payload, headers=gw.headers(key), timeout=30)


def _redis_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_rpm_refuses_the_excess_with_429_and_no_upstream_call(make_gateway, emulator: Emulator):
    """F-26: rpm 2, 5 requests: 2 x 200, 3 x 429, exactly 2 upstream calls."""
    gw = make_gateway(default_rpm=2)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    statuses = [_post(gw).status_code for _ in range(5)]
    assert statuses == [200, 200, 429, 429, 429]
    assert len(_generations(emulator)) == 2
    refused = _post(gw)
    assert refused.status_code == 429
    assert "rate limit" in refused.json()["error"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.headers["x-ratelimit-limit"] == "2"
    assert refused.headers["x-ratelimit-remaining"] == "0"
    assert int(refused.headers["x-ratelimit-reset"]) <= 60
    text = gw.metrics_text()
    assert metric_value(text, "gateway_rate_limited_total", kind="rpm") == 4
    assert metric_value(text, "gateway_requests_total", outcome="rate_limited") == 4


def test_limited_responses_carry_ratelimit_headers(make_gateway, emulator: Emulator):
    gw = make_gateway(default_rpm=10)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    first = _post(gw)
    assert first.headers["x-ratelimit-limit"] == "10"
    assert first.headers["x-ratelimit-remaining"] == "9"
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/generate",
        json={"model": MODEL, "prompt": "x"},
        headers=gw.headers(),
    ) as streamed:
        assert streamed.headers["x-ratelimit-remaining"] == "8"
        streamed.read()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_stream_under_a_limit_completes_then_the_next_gets_429(make_gateway, emulator: Emulator):
    """F-09: limiting never breaks a stream that was admitted."""
    gw = make_gateway(default_rpm=1)
    emulator.config.tokens = 30
    response = httpx.post(
        f"{gw.url}/v1/generate", json={"model": MODEL, "prompt": "x"}, headers=gw.headers()
    )
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert response.status_code == 200
    assert lines[-1]["done"] is True
    assert len(lines) == 31
    assert _post(gw).status_code == 429


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_each_key_is_limited_on_its_own_and_spoofed_addresses_do_not_help(
    make_gateway, emulator: Emulator
):
    """F-20: the limit follows the key, not the client address or X-Forwarded-For."""
    gw = make_gateway(default_rpm=2)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    _, other = gw.create_key("other")
    assert [_post(gw).status_code for _ in range(2)] == [200, 200]
    spoofed = httpx.post(
        f"{gw.url}/v1/generate",
        json={"model": MODEL, "prompt": "x", "stream": False},
        headers={**gw.headers(), "X-Forwarded-For": "203.0.113.9", "X-Real-IP": "203.0.113.9"},
    )
    assert spoofed.status_code == 429
    assert [_post(gw, other).status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_key_own_limit_overrides_the_default(make_gateway, emulator: Emulator):
    gw = make_gateway(default_rpm=1)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    _, roomy = gw.create_key("roomy", rpm=3)
    _, unlimited = gw.create_key("unlimited", rpm=0)
    assert [_post(gw, roomy).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert {_post(gw, unlimited).status_code for _ in range(5)} == {200}


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_tpm_charges_what_a_stream_used_and_refuses_the_next(make_gateway, emulator: Emulator):
    """F-24: tpm 100; an answer the model would make 150 tokens long is served, bounded by
    what one window holds (100 less the 1-token prompt: the gateway sends `num_predict` 99
    where the client set none), ~111 tokens charged, the next is refused."""
    gw = make_gateway(default_tpm=100)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    emulator.config.tokens = 150
    emulator.config.prompt_eval_count = 12
    first = httpx.post(
        f"{gw.url}/v1/generate", json={"model": MODEL, "prompt": "x"}, headers=gw.headers()
    )
    assert first.status_code == 200
    assert first.headers["x-ratelimit-tokens-limit"] == "100"
    assert first.headers["x-ratelimit-tokens-remaining"] == "100"
    assert [r.body["options"]["num_predict"] for r in _generations(emulator)] == [99]
    refused = _post(gw)
    assert refused.status_code == 429
    assert refused.headers["x-ratelimit-tokens-remaining"] == "0"
    assert "tokens per minute" in refused.json()["error"]
    assert metric_value(gw.metrics_text(), "gateway_rate_limited_total", kind="tpm") == 1


@pytest.mark.parametrize("stream", [True, False])
def test_tpm_counts_non_streamed_and_cut_streams(make_gateway, emulator: Emulator, stream):
    gw = make_gateway(default_tpm=1000)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    emulator.config.tokens = 40
    emulator.config.prompt_eval_count = 10
    _post(gw, stream=stream)
    left = _post(gw).headers["x-ratelimit-tokens-remaining"]
    assert int(left) == 1000 - 50
    # A stream cut after 7 tokens: no final chunk, so only the 7 relayed tokens are charged.
    emulator.config.fault = "drop_midstream"
    emulator.config.fault_after = 7
    _post(gw, stream=True)
    emulator.config.fault = None
    assert int(_post(gw).headers["x-ratelimit-tokens-remaining"]) == 1000 - 50 - 50 - 7


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_max_concurrent_caps_requests_in_flight_per_key(make_gateway, emulator: Emulator):
    gw = make_gateway(default_max_concurrent=1)
    emulator.config.tokens = 10
    emulator.config.inter_token = 0.1
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(_post, gw)
        time.sleep(0.4)
        assert _post(gw).status_code == 429
        assert slow.result().status_code == 200
    emulator.config.inter_token = 0.001
    assert _post(gw).status_code == 200
    assert metric_value(gw.metrics_text(), "gateway_rate_limited_total", kind="concurrency") == 1


def _wait_metric(gw, name: str, value: float, within: float = 10.0) -> None:
    """Wait (polling `/metrics`) until the gauge `name` reads `value`, or fail after `within` s."""
    deadline = time.monotonic() + within
    while metric_value(gw.metrics_text(), name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.02)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_upstream_gate_queues_then_refuses_when_full_or_too_slow(make_gateway, emulator: Emulator):
    gw = make_gateway(upstream_max_concurrent=1, upstream_queue_size=1, upstream_queue_timeout=3)
    emulator.config.tokens = 40
    emulator.config.inter_token = 0.1  # ~4 s per answer: longer than the queue's 3 s
    with ThreadPoolExecutor(2) as pool:
        holder = pool.submit(_post, gw)
        _wait_metric(gw, "gateway_upstream_slots_in_use", 1)
        waiter = pool.submit(_post, gw)
        _wait_metric(gw, "gateway_upstream_queue_length", 1)
        full = _post(gw)
        assert full.status_code == 503
        assert full.headers["retry-after"]
        timed_out = waiter.result()
        assert timed_out.status_code == 503
        assert "capacity" in timed_out.json()["error"]
        assert holder.result().status_code == 200
    text = gw.metrics_text()
    assert metric_value(text, "gateway_rate_limited_total", kind="queue_full") == 1
    assert metric_value(text, "gateway_rate_limited_total", kind="queue_timeout") == 1
    assert metric_value(text, "gateway_upstream_slots_in_use") == 0
    assert metric_value(text, "gateway_upstream_queue_length") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_queued_request_gets_the_slot_when_it_frees(make_gateway, emulator: Emulator):
    gw = make_gateway(upstream_max_concurrent=1, upstream_queue_size=4, upstream_queue_timeout=10)
    emulator.config.tokens = 5
    emulator.config.inter_token = 0.05
    with ThreadPoolExecutor(3) as pool:
        results = [f.result() for f in [pool.submit(_post, gw) for _ in range(3)]]
    assert [r.status_code for r in results] == [200, 200, 200]
    starts = sorted(r.started_at for r in _generations(emulator))
    ends = sorted(r.ended_at for r in _generations(emulator))
    assert starts[1] >= ends[0] - 0.01  # one at a time upstream
    assert metric_value(gw.metrics_text(), "gateway_upstream_slots_in_use") == 0


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_client_leaving_the_queue_gives_its_place_back(make_gateway, emulator: Emulator):
    gw = make_gateway(upstream_max_concurrent=1, upstream_queue_size=1, upstream_queue_timeout=10)
    emulator.config.tokens = 10
    emulator.config.inter_token = 0.1
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(_post, gw)
        time.sleep(0.3)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{gw.url}/v1/generate",
                json={"model": MODEL, "prompt": "x", "stream": False},
                headers=gw.headers(),
                timeout=0.3,
            )
        time.sleep(0.2)
        assert metric_value(gw.metrics_text(), "gateway_upstream_queue_length") == 0
        assert holder.result().status_code == 200
    emulator.config.inter_token = 0.001
    assert _post(gw).status_code == 200
    assert len(_generations(emulator)) == 2


@pytest.mark.processes
@pytest.mark.skipif(not _redis_up(), reason="Redis is not running on 127.0.0.1:6379")
def test_two_gateway_processes_share_one_limit_through_redis(emulator: Emulator, tmp_path: Path):
    """F-22: 2 replicas on one Redis, rpm 5, 10 alternating requests: 5 x 200, 5 x 429."""
    emulator.config.ttft = emulator.config.inter_token = 0.001
    env = {
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_RATE_LIMIT_STORAGE": REDIS_URL,
        "GATEWAY_RATE_LIMIT_KEY_PREFIX": f"test-{uuid.uuid4().hex}",
        "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/shared.db",
    }
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with gateway_process(tmp_path / "a", env) as a, gateway_process(tmp_path / "b", env) as b:
        key = str(create_key(a.extra_env, "shared", "--rpm", "5")["key"])
        statuses = []
        for i in range(10):
            replica = (a, b)[i % 2]
            response = httpx.post(
                f"{replica.url}/v1/generate",
                json={"model": MODEL, "prompt": "x", "stream": False},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
            statuses.append(response.status_code)
    assert sorted(statuses) == [200] * 5 + [429] * 5
    assert statuses[:5] == [200] * 5
    assert len(_generations(emulator)) == 5


@pytest.mark.processes
@pytest.mark.skipif(not _redis_up(), reason="Redis is not running on 127.0.0.1:6379")
def test_a_killed_replicas_in_flight_requests_stop_counting_within_a_lease(
    emulator: Emulator, tmp_path: Path
):
    """A replica killed with SIGKILL mid-stream cannot give its in-flight slot back: its lease
    lapses instead, and the key's next request on another replica is admitted."""
    emulator.config.tokens = 10_000
    emulator.config.inter_token = 0.05  # a stream that outlives the test
    env = {
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_RATE_LIMIT_STORAGE": REDIS_URL,
        "GATEWAY_RATE_LIMIT_KEY_PREFIX": f"test-{uuid.uuid4().hex}",
        "GATEWAY_RATE_LIMIT_LEASE_SECONDS": "3",
        "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/shared.db",
    }
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with gateway_process(tmp_path / "a", env) as a, gateway_process(tmp_path / "b", env) as b:
        key = str(create_key(a.extra_env, "one-at-a-time", "--max-concurrent", "1")["key"])
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": MODEL, "prompt": "x"}
        with httpx.stream(
            "POST", f"{a.url}/v1/generate", json=body, headers=headers, timeout=30
        ) as held:
            assert held.status_code == 200
            lines = held.iter_lines()  # kept: a dropped iterator would close the stream
            next(lines)  # the stream runs on replica a
            refused = httpx.post(f"{b.url}/v1/generate", json=body, headers=headers, timeout=30)
            assert refused.status_code == 429
            assert "at most 1 in flight" in refused.json()["error"]
            assert a.process is not None
            os.killpg(a.process.pid, signal.SIGKILL)
            a.process.wait(30)
        quick = {**body, "stream": False, "options": {"num_predict": 1}}
        deadline = time.monotonic() + 30  # far above the 3 s lease, for a loaded machine
        while True:
            answer = httpx.post(f"{b.url}/v1/generate", json=quick, headers=headers, timeout=30)
            if answer.status_code == 200 or time.monotonic() > deadline:
                break
            assert answer.status_code == 429
            time.sleep(0.2)
        assert answer.status_code == 200


class _SilentServer:
    """Accepts TCP connections and never answers: a Redis that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("failure", ["down", "hanging"])
def test_limiter_storage_failure_fails_open_by_default(make_gateway, emulator: Emulator, failure):
    """F-25: no 500s, the policy is followed, /healthz stays up, the loop is never blocked."""
    silent = _SilentServer()
    port = 1 if failure == "down" else silent.port
    try:
        gw = make_gateway(
            default_rpm=1, rate_limit_storage=f"redis://127.0.0.1:{port}/0", rate_limit_timeout=0.3
        )
        emulator.config.ttft = emulator.config.inter_token = 0.001
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(_post, gw) for _ in range(4)]
            health_start = time.perf_counter()
            health = httpx.get(f"{gw.url}/healthz", timeout=5)
            health_time = time.perf_counter() - health_start
            statuses = [f.result().status_code for f in futures]
        assert statuses == [200] * 4  # fail open: served without limits
        assert health.status_code == 200
        # A blocking client would hold the event loop for 4 x 0.3 s here; /healthz shows it was
        # free (the bound is loose on purpose: it tells blocking from scheduling noise).
        assert health_time < 1.0
        assert metric_value(gw.metrics_text(), "gateway_rate_limit_storage_errors_total") >= 4
    finally:
        silent.close()


def test_limiter_storage_failure_can_fail_closed(make_gateway, emulator: Emulator):
    gw = make_gateway(
        default_rpm=5,
        rate_limit_storage="redis://127.0.0.1:1/0",
        rate_limit_timeout=0.3,
        rate_limit_fail_open=False,
    )
    response = _post(gw)
    assert response.status_code == 503
    assert response.headers["retry-after"]
    assert "rate limiting is unavailable" in response.json()["error"]
    assert _generations(emulator) == []


@pytest.mark.anyio
async def test_the_memory_storage_prunes_at_most_once_a_second_and_stays_exact(monkeypatch):
    """The override of limits' private pruning hook is still wired (limits 5.x), and RPM is
    still exact with pruning throttled."""
    assert hasattr(MemoryStorage, "_MemoryStorage__schedule_expiry")
    calls: list[int] = []
    original = MemoryStorage._MemoryStorage__schedule_expiry  # type: ignore[attr-defined]

    async def counting(self: MemoryStorage) -> None:
        calls.append(1)
        await original(self)

    monkeypatch.setattr(MemoryStorage, "_MemoryStorage__schedule_expiry", counting)
    settings = Settings(upstream_url="http://127.0.0.1:1")
    limiter = KeyLimiter(
        build_storage(LimitPolicy.of(settings)), LimitPolicy.of(settings), Metrics()
    )
    principal = Principal("k1", "app", None, rpm=40)
    for _ in range(40):
        await limiter.release(await limiter.admit(principal), 0)
    assert len(calls) == 1
    with pytest.raises(RateLimitedError):
        await limiter.admit(principal)


@pytest.mark.anyio
async def test_the_in_place_counters_answer_as_limits_own_memory_storage(monkeypatch):
    """The in-process counters (read in place, the moving window a deque) give, call for call,
    the answers `limits`' own strategies give on its own in-memory storage, windows ending
    included."""
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    ours = MemoryCounters(HousekeptMemoryStorage())
    theirs = StorageCounters(MemoryStorage())
    steps = [("hit", 3)] * 4 + [("tick", 20), ("hit", 3), ("tick", 41), ("hit", 3), ("hit", 3)]
    steps += [("add", 5), ("add", 6), ("add", -11), ("add", 2), ("tick", 61), ("add", 1)]
    counted = []
    for what, n in steps:
        if what == "tick":
            clock[0] += n
            continue
        if what == "hit":
            answers = [await c.hit_moving("rpm", "k1", n) for c in (ours, theirs)]
            counted.append(answers[0][0])
        else:
            answers = [
                (await c.add("tpm", "k1", 10, n), await c.fixed("tpm", "k1", 10))
                for c in (ours, theirs)
            ]
            answers += [await c.expiry("tpm", "k1", 10) for c in (ours, theirs)]
            assert answers[2] == answers[3], (what, n)
            answers = answers[:2]
        assert answers[0] == answers[1], (what, n)
    # The fourth hit and the one 20 s later found 3 in the window; 61 s on, two fit again.
    assert counted == [True, True, True, False, False, True, True]


# --- a storage stall does not hold a one-at-a-time key's slot (issue 29) ------------------------

#: Busies Redis for ARGV[1] ms: a real stall of its one thread, as `DEBUG SLEEP` would be (that
#: command is off by default since Redis 7, `enable-debug-command no`).
_STALL = """
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1]) * 1000
while true do
  t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop then return 1 end
end
"""


def _stall_redis(ms: int) -> threading.Thread:
    """Stall Redis for `ms` from a thread of its own; return once the stall has begun."""
    import redis

    def stall() -> None:
        with redis.Redis.from_url(REDIS_URL, socket_timeout=ms / 1000 + 30) as client:
            client.eval(_STALL, 0, ms)

    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    probe = redis.Redis.from_url(REDIS_URL, socket_timeout=0.05)
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            try:
                probe.ping()
            except redis.TimeoutError:
                return thread
            time.sleep(0.01)
        raise AssertionError("Redis never stalled")
    finally:
        probe.close()


class _RedisLink:
    """A TCP relay to Redis that a test can cut (every connection dropped, new ones refused
    until `heal`): a network partition between the gateway and Redis."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.cut_off = False
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.cut_off:
                client.close()
                continue
            server = socket.create_connection(("127.0.0.1", 6379))
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()

    def cut(self) -> None:
        self.cut_off = True
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self.conns.clear()

    def heal(self) -> None:
        self.cut_off = False

    def close(self) -> None:
        self.cut()
        self.sock.close()


def _stall_gateway(make_gateway, redis_prefix: str, url: str = REDIS_URL) -> Gateway:
    """One at a time per key, leases of a minute, in Redis behind `url`."""
    return make_gateway(
        default_max_concurrent=1,
        rate_limit_storage=url,
        rate_limit_key_prefix=redis_prefix,
        rate_limit_timeout=0.3,
        rate_limit_lease_seconds=60,  # far longer than the test waits: a lapse cannot pass it
    )


def _served_again_soon(gw: Gateway) -> None:
    """One request at a time gets its slot again well within the 60 s lease."""
    deadline = time.monotonic() + 15
    while (status := _post(gw).status_code) != 200:
        assert status == 429
        assert time.monotonic() < deadline, "the key's slot stayed taken after the stall"
        time.sleep(0.2)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_request_admitted_during_a_redis_stall_leaves_no_slot_behind(
    make_gateway, emulator: Emulator, redis_prefix: str
):
    """Before: its acquire timed out, the request was served (fail open), and Redis ran the
    acquire once it woke: a member nobody renewed or released held the key's one slot for a
    whole lease (~30 s by default)."""
    gw = _stall_gateway(make_gateway, redis_prefix)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    assert _post(gw).status_code == 200
    stall = _stall_redis(2000)
    assert _post(gw).status_code == 200  # fail open while Redis is stalled
    stall.join(30)
    _served_again_soon(gw)
    # ...and the limit still holds afterwards.
    emulator.config.inter_token = 0.1
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(_post, gw)
        deadline = time.monotonic() + 10
        while len(_generations(emulator)) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _post(gw).status_code == 429
        assert slow.result().status_code == 200


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_release_lost_to_a_cut_connection_is_retried_once_redis_answers(
    make_gateway, emulator: Emulator, redis_prefix: str
):
    """Before: the request ended while Redis could not be reached; its release was lost, and the
    key's one slot stayed taken for a whole lease."""
    link = _RedisLink()
    try:
        gw = _stall_gateway(make_gateway, redis_prefix, f"redis://127.0.0.1:{link.port}/0")
        emulator.config.ttft = 0.001
        emulator.config.inter_token = 0.001
        assert _post(gw).status_code == 200
        emulator.config.tokens, emulator.config.inter_token = 20, 0.05  # ~1 s in flight
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(_post, gw)
            deadline = time.monotonic() + 10
            while len(_generations(emulator)) < 2:  # admitted: its lease is in Redis
                assert time.monotonic() < deadline
                time.sleep(0.01)
            link.cut()
            assert running.result().status_code == 200
        deadline = time.monotonic() + 10
        while not metric_value(gw.metrics_text(), "gateway_rate_limit_storage_errors_total"):
            assert time.monotonic() < deadline, "the release never failed"
            time.sleep(0.05)
        link.heal()
        emulator.config.inter_token = 0.001
        _served_again_soon(gw)
    finally:
        link.close()

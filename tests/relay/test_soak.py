"""Soak: hundreds of concurrent streams through a real gateway process while the upstream fails
and recovers at random. Every request must end in a complete answer or an explicit error, the
gateway's metrics must match what the clients saw, and nothing may be left behind (F-15).

`GATEWAY_SOAK_SECONDS` (default 60) and `GATEWAY_SOAK_STREAMS` (default 200) size it.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import anyio
import httpx
import pytest

from gateway.testing.stack import create_key, gateway_process
from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.stack import Emulator

SECONDS = float(os.environ.get("GATEWAY_SOAK_SECONDS", "60"))
STREAMS = int(os.environ.get("GATEWAY_SOAK_STREAMS", "200"))
FAULTS = [None, None, None, "error_midstream", "drop_midstream", "busy", "status_before"]

pytestmark = [pytest.mark.soak, pytest.mark.timeout(SECONDS + 180)]


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


async def _one(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> str:
    """One request; returns what the client saw: completed, error_line, status_<code>, or
    truncated (no done and no error: must never happen)."""
    stream = random.random() < 0.8  # noqa: S311 - load shape, not security
    body = {"model": MODEL, "prompt": "x", "stream": stream}
    async with client.stream("POST", f"{url}/v1/generate", json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            assert "error" in r.json()
            return f"status_{r.status_code}"
        last = None
        async for line in r.aiter_lines():
            if line:
                last = json.loads(line)
    if last is None:
        return "truncated"
    if "error" in last:
        return "error_line"
    return "completed" if last.get("done") else "truncated"


def test_soak_with_a_flapping_upstream(emulator: Emulator, tmp_path: Path):
    emulator.config.ttft = 0.05
    emulator.config.inter_token = 0.05
    emulator.config.tokens = 20
    env = {
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_RETRY_BACKOFF": "0.01",
        "GATEWAY_LOG_LEVEL": "warning",
    }
    stop = threading.Event()

    def flap() -> None:
        rng = random.Random(7)  # noqa: S311
        while not stop.is_set():
            emulator.config.fault = rng.choice(FAULTS)
            emulator.config.fault_after = rng.randint(0, 10)
            stop.wait(0.5)
        emulator.config.fault = None

    with gateway_process(tmp_path, env) as gateway:
        assert gateway.process is not None
        pid = gateway.process.pid
        key = str(create_key(gateway.extra_env, "soak")["key"])
        headers = {"Authorization": f"Bearer {key}"}
        seen: Counter[str] = Counter()

        async def worker(client: httpx.AsyncClient, deadline: float) -> None:
            while time.monotonic() < deadline:
                try:
                    seen[await _one(client, gateway.url, headers)] += 1
                except httpx.TransportError as exc:  # counted, and must stay at zero
                    seen[f"transport_{type(exc).__name__}"] += 1

        async def load(seconds: float) -> None:
            # No client keep-alive: a pooled connection idle past uvicorn's keep-alive timeout
            # can be closed by the server just as the client reuses it, a client-side race that
            # would look like a dropped answer. Each request gets a fresh connection instead.
            limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                deadline = time.monotonic() + seconds
                async with anyio.create_task_group() as group:
                    for _ in range(STREAMS):
                        group.start_soon(worker, client, deadline)

        # A short first round fills the pools (upstream connections, executor threads); what
        # the process holds after it is the baseline the long round must come back to.
        anyio.run(load, 3.0)
        time.sleep(1.0)
        fds_before, threads_before, rss_before = _open_fds(pid), _threads(pid), _rss_kib(pid)
        flapper = threading.Thread(target=flap, daemon=True)
        flapper.start()
        try:
            anyio.run(load, SECONDS)
        finally:
            stop.set()
            flapper.join(5)
        time.sleep(1.0)
        text = httpx.get(f"{gateway.url}/metrics").text
        fds_after, threads_after, rss_after = _open_fds(pid), _threads(pid), _rss_kib(pid)

    total = sum(seen.values())
    assert total > STREAMS  # every worker finished several requests
    assert seen["truncated"] == 0, seen
    assert not [k for k in seen if k.startswith("transport_")], seen
    assert seen["completed"] > 0, seen
    assert seen["error_line"] + sum(n for k, n in seen.items() if k.startswith("status_")), seen
    # The gateway counted exactly what the clients saw.
    assert metric_value(text, "gateway_requests_total", route="/v1/generate") == total
    assert metric_value(text, "gateway_requests_total", outcome="completed") == seen["completed"]
    assert metric_value(text, "gateway_requests_in_flight") == 0
    # Nothing left behind: sockets and threads back to the baseline (a little slack for the
    # upstream keep-alive pool).
    assert fds_after <= fds_before + 10, (fds_before, fds_after)
    assert threads_after <= threads_before + 2, (threads_before, threads_after)
    # Memory plateaus: thousands more requests after the warm-up round add little.
    assert rss_after - rss_before < 32 * 1024, (rss_before, rss_after)

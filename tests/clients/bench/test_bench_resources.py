"""Resources on the benchmark's timeline: GPUs (fake NVML), /api/ps and the gateway's /metrics."""

from __future__ import annotations

import asyncio
import sys
import time
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.clients.bench.gateway_metrics import GatewayMetricsSampler, parse_totals
from gateway.clients.bench.gpu import GpuSampler
from gateway.clients.bench.resources import (
    ResourceMonitor,
    disk_size,
    gpu_inventory,
    loaded_memory,
    model_matches,
)
from gateway.testing.emulator.catalog import listing
from gateway.testing.server import LoopbackServer
from gateway.testing.stack import free_port

pytestmark = pytest.mark.anyio

GIB = 1024**3


class FakeNVMLError(Exception):
    pass


def fake_nvml(*, fail_init: bool = False, gpus: int = 2) -> ModuleType:
    """A stand-in for nvidia-ml-py's `pynvml`: `gpus` GPUs whose readings change per call."""
    nvml = ModuleType("pynvml")
    calls = {"n": 0, "shutdown": 0}

    def init() -> None:
        if fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def memory(handle: int) -> SimpleNamespace:
        calls["n"] += 1
        return SimpleNamespace(total=(16 + 8 * handle) * GIB, used=calls["n"] * GIB, free=0)

    def shutdown() -> None:
        calls["shutdown"] += 1

    nvml.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: gpus  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    # Old bindings return bytes, new ones str: one of each.
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA L4" if h == 0 else "NVIDIA A100"  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(  # type: ignore[attr-defined]
        gpu=10 * calls["n"] + h, memory=0
    )
    nvml.nvmlSystemGetDriverVersion = lambda: "550.54.15"  # type: ignore[attr-defined]
    nvml.calls = calls  # type: ignore[attr-defined]
    return nvml


# --- GPUs ------------------------------------------------------------------------------------


def test_gpu_inventory_lists_each_gpu_with_memory_and_driver() -> None:
    nvml = fake_nvml()
    assert gpu_inventory(nvml) == [
        {"index": 0, "name": "NVIDIA L4", "memory_bytes": 16 * GIB, "driver": "550.54.15"},
        {"index": 1, "name": "NVIDIA A100", "memory_bytes": 24 * GIB, "driver": "550.54.15"},
    ]
    assert nvml.calls["shutdown"] == 1


def test_gpu_samples_follow_the_changing_readings() -> None:
    sampler = GpuSampler(fake_nvml())
    assert sampler.open()
    first, second = sampler.sample(0.5), sampler.sample(1.0)
    sampler.close()
    assert [row["gpu"] for row in first] == [0, 1]
    assert {row["source"] for row in first + second} == {"gpu"}
    assert [row["t"] for row in first + second] == [0.5, 0.5, 1.0, 1.0]
    assert [row["memory_total_bytes"] for row in second] == [16 * GIB, 24 * GIB]
    used = [row["memory_used_bytes"] for row in first + second]
    assert used == sorted(used)
    assert len(set(used)) == 4
    assert second[0]["utilization_percent"] > first[0]["utilization_percent"]


def test_nvml_failing_at_init_means_cpu_only_with_a_note() -> None:
    notes: list[str] = []
    assert gpu_inventory(fake_nvml(fail_init=True), notes) == []
    assert notes == [
        "no GPU visible (nvidia-ml-py: NVML Shared Library Not Found): CPU-only, GPU columns empty"
    ]


def test_no_devices_means_cpu_only() -> None:
    notes: list[str] = []
    assert gpu_inventory(fake_nvml(gpus=0), notes) == []
    assert notes == ["no GPU visible (NVML reports 0 devices): CPU-only, GPU columns empty"]


def test_missing_nvidia_ml_py_means_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    notes: list[str] = []
    assert gpu_inventory(notes=notes) == []
    assert len(notes) == 1
    assert notes[0].startswith("no GPU visible (nvidia-ml-py not installed")


def test_real_import_path_degrades_on_this_machine() -> None:
    """Whatever this machine has (no package, no driver, or a GPU), no exception escapes."""
    notes: list[str] = []
    gpus = gpu_inventory(notes=notes)
    if gpus:
        assert all(gpu["name"] and gpu["memory_bytes"] for gpu in gpus)
        assert notes == []
    else:
        assert len(notes) == 1
        assert notes[0].startswith("no GPU visible (")


# --- /api/ps and /api/tags -------------------------------------------------------------------


def test_model_names_match_like_ollama() -> None:
    assert model_matches("llama3.2:latest", "llama3.2")
    assert model_matches("Llama3.2:Latest", "llama3.2:latest")
    assert model_matches("library/qwen:7b", "library/qwen:7b")
    assert not model_matches("qwen2.5:7b", "qwen2.5")
    assert not model_matches("llama3.2:1b", "llama3.2")


async def test_loaded_memory_and_disk_size_from_the_emulator(emulator: Any) -> None:
    expected = listing("llama3.2:latest")["size"]
    async with httpx.AsyncClient(base_url=emulator.url) as client:
        assert await loaded_memory(client, "llama3.2") == {
            "size_bytes": expected,
            "size_vram_bytes": expected,
            "source": "/api/ps",
        }
        assert await disk_size(client, "llama3.2") == expected
        assert await loaded_memory(client, "mistral") is None
        assert await disk_size(client, "mistral") is None
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{free_port()}") as client:
        assert await loaded_memory(client, "llama3.2") is None
        assert await disk_size(client, "llama3.2") is None


async def test_monitor_samples_ps_and_gpus_on_one_timeline(emulator: Any) -> None:
    monitor = ResourceMonitor(emulator.url, interval=0.05, nvml=fake_nvml())
    await monitor.start()
    await asyncio.sleep(0.4)
    rows = await monitor.stop()
    assert monitor.notes == []
    ps = [row for row in rows if row["source"] == "ps"]
    gpu = [row for row in rows if row["source"] == "gpu"]
    ticks = sorted({row["t"] for row in ps})
    assert len(ticks) >= 3  # start, at least one tick, stop
    assert ticks[0] < 0.2
    assert [row["t"] for row in rows] == sorted(row["t"] for row in rows)
    assert {row["t"] for row in gpu} == set(ticks)  # same instants for every sampler
    size = listing("qwen2.5:7b")["size"]
    assert {"t": ticks[0], "source": "ps", "model": "qwen2.5:7b", "size_bytes": size,
            "size_vram_bytes": size} in ps  # fmt: skip
    assert {row["model"] for row in ps} == {"llama3.2:latest", "qwen2.5:7b"}


async def test_monitor_origin_is_the_runs_start(emulator: Any) -> None:
    origin = time.perf_counter() - 10.0
    monitor = ResourceMonitor(emulator.url, gpu=False, origin=origin)
    await monitor.start()
    rows = await monitor.stop()
    assert rows
    assert all(10.0 <= row["t"] < 20.0 for row in rows)
    assert await monitor.stop() == rows  # idempotent: no sample on a closed client


async def test_monitor_goes_on_without_gpu_or_ps() -> None:
    monitor = ResourceMonitor(
        f"http://127.0.0.1:{free_port()}", interval=0.05, nvml=fake_nvml(fail_init=True)
    )
    await monitor.start()
    await asyncio.sleep(0.15)
    assert await monitor.stop() == []
    assert monitor.notes == [
        "no GPU visible (nvidia-ml-py: NVML Shared Library Not Found): CPU-only, GPU columns empty",
        "upstream /api/ps unreadable (ConnectError): memory not sampled",
    ]


async def test_openai_targets_have_no_ps(emulator: Any) -> None:
    monitor = ResourceMonitor(emulator.url, api="openai", nvml=fake_nvml())
    await monitor.start()
    rows = await monitor.stop()
    assert {row["source"] for row in rows} == {"gpu"}
    assert monitor.notes == ["upstream memory not sampled: the openai API has no /api/ps"]
    assert not [r for r in emulator.state.records if r.path == "/api/ps"]


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        ResourceMonitor("http://127.0.0.1:1", interval=0)


# --- the gateway's /metrics ------------------------------------------------------------------

METRICS_TEXT = """\
# TYPE gateway_requests_total counter
gateway_requests_total{route="/api/generate"} 5
gateway_requests_total{route="/v1/chat/completions"} 2
gateway_requests_total{route="/api/ps"} 40
# TYPE gateway_requests_in_flight gauge
gateway_requests_in_flight{model="a"} 2
gateway_requests_in_flight{model="b"} 1
# TYPE gateway_queue_wait_seconds histogram
gateway_queue_wait_seconds_bucket{model="a",le="+Inf"} 4
gateway_queue_wait_seconds_sum{model="a"} 1.5
gateway_queue_wait_seconds_count{model="a"} 4
# TYPE gateway_upstream_queue_length gauge
"""


def test_parse_totals_sums_labels_and_keeps_generation_routes() -> None:
    totals = parse_totals(METRICS_TEXT)
    assert totals["gateway_requests_total"] == 7
    assert totals["gateway_requests_in_flight"] == 3
    assert totals["gateway_queue_wait_seconds_sum"] == 1.5
    assert totals["gateway_queue_wait_seconds_count"] == 4
    assert totals["gateway_upstream_queue_length"] == 0  # declared, no series yet
    assert "gateway_upstream_slots_in_use" not in totals


async def test_gateway_rows_report_gauges_and_increases() -> None:
    texts = [METRICS_TEXT, METRICS_TEXT.replace("} 5", "} 9").replace("} 1.5", "} 2.5")]
    texts.append(texts[1].replace("} 9", "} 1"))  # the gateway restarted

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=texts.pop(0))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        sampler = GatewayMetricsSampler(client, "http://gw")
        first, _ = await sampler.sample(0.0)
        second, _ = await sampler.sample(1.0)
        third, _ = await sampler.sample(2.0)
    assert first is not None
    assert second is not None
    assert third is not None
    assert first["in_flight"] == 3
    assert first["requests"] is None
    assert first["queue_length"] == 0
    assert first["slots_in_use"] is None  # not exported by this text
    assert second["requests"] == 4
    assert second["queue_wait_seconds_sum"] == pytest.approx(1.0)
    assert second["queue_wait_count"] == 0
    assert second["queue_wait_seconds_mean"] is None
    assert third["requests"] == 3  # after a reset the new total is the increase


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_stop_during_a_sample_loses_no_increase() -> None:
    """stop() lets the sample in progress finish: cancelling it after the gateway's counters were
    read (the slow /api/ps still pending) lost that sample's increase (a CI failure, stop 37)."""
    scrapes = {"n": 0}

    async def metrics(request: Any) -> PlainTextResponse:
        scrapes["n"] += 1  # one more request per scrape
        return PlainTextResponse(
            f'gateway_requests_total{{route="/api/generate"}} {scrapes["n"]}\n'
        )

    async def ps(request: Any) -> PlainTextResponse:
        await asyncio.sleep(0.3)
        return PlainTextResponse('{"models": []}', media_type="application/json")

    app = Starlette(routes=[Route("/metrics", metrics), Route("/api/ps", ps)])
    with LoopbackServer(app) as server:
        monitor = ResourceMonitor(server.url, through_gateway=True, gpu=False, interval=0.05)
        await monitor.start()
        await asyncio.sleep(0.15)  # the second sample has read /metrics and waits on /api/ps
        rows = await monitor.stop()
    assert scrapes["n"] >= 3
    assert [row["requests"] for row in rows][1:] == [1] * (scrapes["n"] - 1)


@pytest.fixture
def one_slot_gateway(make_gateway: Any) -> Any:
    """A gateway letting one request at a time reach the upstream (the rest queue)."""
    return make_gateway(upstream_max_concurrent=1)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
async def test_monitor_through_the_gateway_sees_in_flight_queue_and_waits(
    one_slot_gateway: Any, emulator: Any
) -> None:
    emulator.config.inter_token = 0.02
    emulator.config.tokens = 10
    gw = one_slot_gateway
    monitor = ResourceMonitor(
        gw.url, key=gw.key, through_gateway=True, interval=0.05, nvml=fake_nvml(fail_init=True)
    )
    await monitor.start()
    body = {"model": "llama3.2", "prompt": "hi", "stream": False}
    async with httpx.AsyncClient(base_url=gw.url, headers=gw.headers(), timeout=30) as client:
        answers = await asyncio.gather(*(client.post("/api/generate", json=body) for _ in range(4)))
        assert [a.status_code for a in answers] == [200] * 4
        # The gateway records a request just after its last byte: wait for the records, so the
        # last sample (taken by stop) has all four.
        for _ in range(100):
            totals = parse_totals((await client.get("/metrics")).text)
            if totals.get("gateway_requests_total") == 4 and not totals.get(
                "gateway_requests_in_flight"
            ):
                break
            await asyncio.sleep(0.05)
    rows = await monitor.stop()
    gateway = [row for row in rows if row["source"] == "gateway"]
    assert len(gateway) >= 3
    assert gateway[0]["requests"] is None
    assert sum(row["requests"] or 0 for row in gateway) == 4  # the ps polls are not counted
    assert sum(row["queue_wait_count"] or 0 for row in gateway) == 4
    # One slot: three requests waited at least one generation (~0.25 s) between them.
    assert sum(row["queue_wait_seconds_sum"] or 0 for row in gateway) > 0.3
    assert max(row["in_flight"] for row in gateway) >= 2
    assert max(row["queue_length"] for row in gateway) >= 1
    assert max(row["slots_in_use"] for row in gateway) == 1
    assert gateway[0]["in_flight"] == 0
    assert gateway[-1]["in_flight"] == 0
    assert [row for row in rows if row["source"] == "ps"]  # /api/ps through the gateway, keyed
    assert monitor.notes == [
        "no GPU visible (nvidia-ml-py: NVML Shared Library Not Found): CPU-only, GPU columns empty"
    ]
    assert gw.key not in repr(rows) + repr(monitor.notes)


async def test_unauthorised_or_missing_metrics_is_a_note() -> None:
    async def refuse(request: Any) -> PlainTextResponse:
        return PlainTextResponse("no", status_code=401)

    async def ps(request: Any) -> PlainTextResponse:
        return PlainTextResponse('{"models": []}', media_type="application/json")

    app = Starlette(routes=[Route("/metrics", refuse), Route("/api/ps", ps)])
    with LoopbackServer(app) as server:
        monitor = ResourceMonitor(server.url, key="gw_secret", through_gateway=True, gpu=False)
        await monitor.start()
        rows = await monitor.stop()
    assert rows == []  # nothing loaded, /metrics refused
    assert monitor.notes == ["gateway /metrics answered 401: not sampled"]

    monitor = ResourceMonitor(
        f"http://127.0.0.1:{free_port()}", api="openai", through_gateway=True, gpu=False
    )
    await monitor.start()
    assert await monitor.stop() == []
    assert "gateway /metrics unreachable (ConnectError): not sampled" in monitor.notes

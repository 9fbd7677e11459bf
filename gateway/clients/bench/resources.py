"""Resources on the benchmark's timeline: GPUs, the upstream's loaded models, the gateway's gauges.

Owns `ResourceMonitor` (a background task sampling every `interval` seconds while a benchmark
runs), `loaded_memory` and `disk_size` (the matrix's memory and size columns) and re-exports
`gpu_inventory` (the fingerprint's `hardware.gpus`). Three samplers share one clock, seconds since
the run's start on `time.perf_counter()` (the clock of `RequestRecord`), so a latency spike can be
read against memory and queue length at the same moment:

- `gpu` (`gateway.clients.bench.gpu`): per GPU, memory used/total and utilization, through NVML.
- `ps`: per loaded model, Ollama's `GET /api/ps` `size` (total resident bytes) and `size_vram`
  (the part on the GPU; `size_vram < size` is a partial CPU offload, 0 is CPU only). Ollama
  dialect only: the OpenAI API has no such route.
- `gateway` (`gateway.clients.bench.gateway_metrics`): the gateway's own `/metrics`, when the
  benchmark runs through it.

A sampler that cannot run (no GPU, no `/api/ps`, `/metrics` refused) adds one line to `notes`
and the others go on: a missing resource never fails a benchmark.

Over ~300 lines for one reason: the three samplers share one clock and one failure rule (a note,
never an error), and `loaded_memory` and `disk_size` read the same `/api/ps` and `/api/tags` answers
through the same bounded `get_json` and `model_matches` as the `ps` sampler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

import httpx

from gateway.clients.bench.gateway_metrics import GatewayMetricsSampler
from gateway.clients.bench.gpu import GpuSampler, gpu_inventory

__all__ = ["ResourceMonitor", "disk_size", "gpu_inventory", "loaded_memory", "model_matches"]


def model_matches(reported: str, wanted: str) -> bool:
    """Tell whether a name Ollama reports is the model asked for (`llama3.2` is `llama3.2:latest`).

    Ollama resolves a name without a tag to `:latest` and compares case-insensitively.
    """

    def canonical(name: str) -> str:
        name = name.strip().lower()
        return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"

    return canonical(reported) == canonical(wanted)


async def _models(client: httpx.AsyncClient, path: str) -> list[dict[str, Any]]:
    """The `models` list of `/api/ps` or `/api/tags`.

    Raises:
        httpx.HTTPError: Unreachable, or an error status.
        ValueError: The answer is not `{"models": [...]}`.
    """
    body = await get_json(client, path)
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, list):
        raise ValueError(f"{path} answered no models list")
    return [entry for entry in models if isinstance(entry, dict)][:MAX_MODELS]


#: The most bytes a sampled answer may have, and the most models a sample keeps.
MAX_ANSWER = 4 * 1024 * 1024
MAX_MODELS = 64
#: Seconds one sampled request may take in all, however slowly the server trickles it.
SAMPLE_DEADLINE = 10.0


async def get_json(client: httpx.AsyncClient, path: str) -> object:
    """GET `path` and parse its JSON, within `SAMPLE_DEADLINE` seconds and `MAX_ANSWER` bytes.

    A resource sample must never hold the run: a server that trickles an answer, sends a huge
    one, or nests it past Python's recursion limit fails the sample, not the benchmark.

    Raises:
        httpx.HTTPError: Unreachable, or an error status.
        ValueError: Too slow, too large, or not JSON.
    """
    try:
        async with asyncio.timeout(SAMPLE_DEADLINE), client.stream("GET", path) as response:
            response.raise_for_status()
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > MAX_ANSWER:
                    raise ValueError(f"{path} answered more than {MAX_ANSWER} bytes")
    except TimeoutError:
        raise ValueError(f"{path} took more than {SAMPLE_DEADLINE:g} s") from None
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError(f"{path} answered JSON nested too deep") from None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _find(models: list[dict[str, Any]], model: str) -> dict[str, Any] | None:
    for entry in models:
        names = (entry.get("name"), entry.get("model"))
        if any(isinstance(name, str) and model_matches(name, model) for name in names):
            return entry
    return None


async def loaded_memory(client: httpx.AsyncClient, model: str) -> dict[str, Any] | None:
    """Read a loaded model's memory from Ollama's `GET /api/ps` (the run's `memory` object).

    Args:
        client: A client whose `base_url` is the Ollama server or the gateway (with the key in
            its headers).
        model: The model name as benchmarked (`llama3.2` matches `llama3.2:latest`).

    Returns:
        `{"size_bytes", "size_vram_bytes", "source": "/api/ps"}` (a size the server omits is
        None), or None when the model is not loaded or `/api/ps` cannot be read.
    """
    try:
        entry = _find(await _models(client, "/api/ps"), model)
    except (httpx.HTTPError, ValueError):
        return None
    if entry is None:
        return None
    return {
        "size_bytes": _int(entry.get("size")),
        "size_vram_bytes": _int(entry.get("size_vram")),
        "source": "/api/ps",
    }


async def disk_size(client: httpx.AsyncClient, model: str) -> int | None:
    """Read a model's size on disk, bytes, from Ollama's `GET /api/tags` (`size`).

    Args:
        client: As for `loaded_memory`.
        model: The model name.

    Returns:
        The size, or None when the model is not listed or `/api/tags` cannot be read.
    """
    try:
        entry = _find(await _models(client, "/api/tags"), model)
    except (httpx.HTTPError, ValueError):
        return None
    return None if entry is None else _int(entry.get("size"))


class ResourceMonitor:
    """Samples GPUs, `/api/ps` and the gateway's `/metrics` in the background during a run.

    Use: `await monitor.start()` before the load, `rows = await monitor.stop()` after it. A
    sample is taken at start, every `interval` seconds, and at stop; a tick that overruns the
    next one skips it rather than queueing.

    Args:
        url: The benchmark target's base URL (the upstream, or the gateway).
        api: The target's API: `ollama` samples `/api/ps`, `openai` cannot.
        key: The gateway key, sent as `Authorization: Bearer` (never stored in a row or note).
        through_gateway: The target is the gateway: sample its `/metrics`.
        interval: Seconds between samples.
        gpu: Sample the local GPUs.
        nvml: The `pynvml` module; None imports nvidia-ml-py's (tests pass a fake).
        origin: perf_counter seconds of the run's start, t = 0 of the timeline; None: `start()`.
        clock: The clock (`time.perf_counter`; tests may pass another).
        timeout: Seconds allowed for each HTTP sample.

    Attributes:
        notes: Why a sampler is missing or failed, each note once, for the run's `notes`.
        timeline: The rows so far, in time order: `{"t", "source": "gpu"|"ps"|"gateway", ...}`
            (see `GpuSampler.sample`, `GatewayMetricsSampler.sample` and `sample_ps`).

    Raises:
        ValueError: `interval` is not positive.
    """

    def __init__(
        self,
        url: str,
        *,
        api: Literal["ollama", "openai"] = "ollama",
        key: str | None = None,
        through_gateway: bool = False,
        interval: float = 1.0,
        gpu: bool = True,
        nvml: ModuleType | None = None,
        origin: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        timeout: float = 5.0,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.interval = interval
        self.notes: list[str] = []
        self.timeline: list[dict[str, Any]] = []
        self._api = api
        self._origin = origin
        self._clock = clock
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(timeout)
        )
        self._gpu = GpuSampler(nvml) if gpu else None
        self._gateway = GatewayMetricsSampler(self._client, url) if through_gateway else None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def note(self, text: str) -> None:
        """Add a note once."""
        if text not in self.notes:
            self.notes.append(text)

    def _now(self) -> float:
        assert self._origin is not None  # noqa: S101 - set by start()
        return round(self._clock() - self._origin, 6)

    async def start(self) -> None:
        """Open the samplers, take the first sample, and start sampling in the background.

        Raises:
            RuntimeError: Already started.
        """
        if self._task is not None:
            raise RuntimeError("the monitor is already running")
        if self._origin is None:
            self._origin = self._clock()
        if self._gpu is not None and not await asyncio.to_thread(self._gpu.open):
            self.note(self._gpu.note or "no GPU visible: CPU-only")
            self._gpu = None
        if self._api != "ollama":
            self.note(f"upstream memory not sampled: the {self._api} API has no /api/ps")
        try:
            await self.sample()
        except Exception as exc:  # as in `_run`: a failed sample never fails the benchmark
            self.note(f"resource sample failed ({type(exc).__name__}: {exc})")
        self._task = asyncio.create_task(self._run(), name="bench-resource-monitor")

    async def _run(self) -> None:
        next_tick = self._clock() + self.interval
        while True:
            # Wait for the tick or for stop(), never inside a sample: a sample cancelled half-way
            # would lose the rows of samplers that had already moved their baseline (the
            # gateway's counters are increases since the previous sample).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._stopping.wait(), timeout=max(0.0, next_tick - self._clock())
                )
            if self._stopping.is_set():
                return
            try:
                await self.sample()
            except Exception as exc:  # a sampler's bug must not end the monitoring
                self.note(f"resource sample failed ({type(exc).__name__}: {exc})")
            # Skip ticks a slow sample overran, so samples never bunch up.
            while next_tick <= self._clock():
                next_tick += self.interval

    async def sample(self) -> None:
        """Take one sample from every sampler at the same t, and add the rows to `timeline`."""
        t = self._now()
        parts: list[Any] = []
        if self._gpu is not None:
            parts.append(asyncio.to_thread(self._gpu.sample, t))  # NVML calls block briefly
        if self._api == "ollama":
            parts.append(self.sample_ps(t))
        if self._gateway is not None:
            parts.append(self._sample_gateway(t))
        for rows in await asyncio.gather(*parts):
            self.timeline.extend(rows)

    async def sample_ps(self, t: float) -> list[dict[str, Any]]:
        """Read `/api/ps` once.

        Returns:
            Rows `{"t", "source": "ps", "model", "size_bytes", "size_vram_bytes"}`, one per
            loaded model (none when none is loaded, or on failure, which adds a note).
        """
        try:
            models = await _models(self._client, "/api/ps")
        except httpx.HTTPStatusError as exc:
            self.note(f"upstream /api/ps answered {exc.response.status_code}: memory not sampled")
            return []
        except (httpx.HTTPError, ValueError) as exc:
            self.note(f"upstream /api/ps unreadable ({type(exc).__name__}): memory not sampled")
            return []
        return [
            {
                "t": t,
                "source": "ps",
                "model": entry.get("name") or entry.get("model"),
                "size_bytes": _int(entry.get("size")),
                "size_vram_bytes": _int(entry.get("size_vram")),
            }
            for entry in models
        ]

    async def _sample_gateway(self, t: float) -> list[dict[str, Any]]:
        assert self._gateway is not None  # noqa: S101 - only scheduled when set
        row, problem = await self._gateway.sample(t)
        if problem is not None:
            self.note(problem)
        return [] if row is None else [row]

    async def stop(self) -> list[dict[str, Any]]:
        """Stop sampling, take a last sample, close everything.

        Returns:
            The timeline rows, in time order. A second call only returns them again.
        """
        task, self._task = self._task, None
        if task is not None:
            self._stopping.set()
            await task  # ends after the sample in progress, if any (bounded by `timeout`)
            await self.sample()
        await self._client.aclose()
        if self._gpu is not None:
            self._gpu.close()
        return self.timeline

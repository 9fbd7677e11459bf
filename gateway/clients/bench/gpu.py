"""The GPUs of the benchmarking machine through NVML: inventory and memory/utilization samples.

Owns `GpuSampler` and `gpu_inventory`. NVML comes from NVIDIA's own bindings, `nvidia-ml-py`
(module `pynvml`; the optional extra `llm-gateway[gpu]`), which wrap the driver's
`libnvidia-ml` with no compiled part, so the package installs anywhere and fails only when used
on a machine without the driver. A machine without the package, the library or a GPU is a
CPU-only machine: the sampler says so in one note and yields nothing, never a traceback.

The GPUs are those of the machine the benchmark runs on, so they are the server's only when both
run on one host (the usual self-hosted set-up).
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from types import ModuleType
from typing import Any

CPU_ONLY = "CPU-only, GPU columns empty"


def load_nvml() -> tuple[ModuleType | None, str | None]:
    """Import `pynvml` from nvidia-ml-py.

    Returns:
        `(module, None)`, or `(None, reason)` when it is not installed.
    """
    try:
        with warnings.catch_warnings():
            # The unofficial `pynvml` wrapper package warns on import that it is deprecated in
            # favour of nvidia-ml-py; that is no reason to fail a benchmark.
            warnings.simplefilter("ignore")
            return importlib.import_module("pynvml"), None
    except ImportError:
        return None, "nvidia-ml-py not installed; pip install 'llm-gateway[gpu]'"


def _text(value: object) -> str:
    """NVML strings are `bytes` in bindings before 11.5 and `str` after."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuSampler:
    """Reads every visible GPU's memory and utilization through NVML.

    Args:
        nvml: The `pynvml` module to use; None imports nvidia-ml-py's. Tests pass a fake.

    Attributes:
        note: Why no GPU is sampled (None while GPUs are sampled), in the run document's words:
            `"no GPU visible (<reason>): CPU-only, GPU columns empty"`.
    """

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._handles: list[Any] = []
        self._open = False
        self.note: str | None = None

    def open(self) -> bool:
        """Initialise NVML and find the GPUs.

        Returns:
            True when at least one GPU is visible; otherwise False with `note` set.
        """
        nvml, reason = (self._nvml, None) if self._nvml is not None else load_nvml()
        if nvml is None:
            return self._give_up(reason or "no NVML")
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError and its subclasses; any failure means no GPU
            return self._give_up(f"nvidia-ml-py: {exc}")
        self._nvml, self._open = nvml, True
        try:
            count = int(nvml.nvmlDeviceGetCount())
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # an NVMLError from a driver in a bad state
            self.close()
            return self._give_up(f"nvidia-ml-py: {exc}")
        if not self._handles:
            self.close()
            return self._give_up("NVML reports 0 devices")
        return True

    def _give_up(self, reason: str) -> bool:
        self.note = f"no GPU visible ({reason}): {CPU_ONLY}"
        self._handles = []
        return False

    def inventory(self) -> list[dict[str, Any]]:
        """Describe each GPU for the run's fingerprint.

        Returns:
            One `{"index", "name", "memory_bytes", "driver"}` per GPU (`memory_bytes` total,
            `driver` the driver version or None), `[]` when none is open.
        """
        if not self._handles:
            return []
        nvml = self._nvml
        assert nvml is not None  # noqa: S101 - handles exist only after open()
        try:
            driver: str | None = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:  # the version is a nicety; the GPUs are still there
            driver = None
        gpus = []
        for index, handle in enumerate(self._handles):
            try:
                name = _text(nvml.nvmlDeviceGetName(handle))
                total: int | None = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            except Exception:  # one lost GPU must not hide the others
                name, total = "unknown", None
            gpus.append({"index": index, "name": name, "memory_bytes": total, "driver": driver})
        return gpus

    def sample(self, t: float) -> list[dict[str, Any]]:
        """Read each GPU now.

        Args:
            t: The sample's time on the run's timeline, seconds.

        Returns:
            Timeline rows `{"t", "source": "gpu", "gpu", "memory_used_bytes",
            "memory_total_bytes", "utilization_percent"}`, one per GPU; a GPU whose reading
            fails gets `None` values (and `error`) rather than no row.
        """
        nvml = self._nvml
        rows: list[dict[str, Any]] = []
        for index, handle in enumerate(self._handles):
            row: dict[str, Any] = {"t": t, "source": "gpu", "gpu": index}
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)  # type: ignore[union-attr]
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)  # type: ignore[union-attr]
                row |= {
                    "memory_used_bytes": int(memory.used),
                    "memory_total_bytes": int(memory.total),
                    "utilization_percent": float(rates.gpu),
                }
            except Exception as exc:  # NVMLError: GPU lost, or a query it does not support
                row |= {
                    "memory_used_bytes": None,
                    "memory_total_bytes": None,
                    "utilization_percent": None,
                    "error": str(exc) or type(exc).__name__,
                }
            rows.append(row)
        return rows

    def close(self) -> None:
        """Shut NVML down (once; safe to call when it never opened)."""
        if self._open and self._nvml is not None:
            self._open = False
            with contextlib.suppress(Exception):  # nothing to do about a failed shutdown
                self._nvml.nvmlShutdown()


def gpu_inventory(
    nvml: ModuleType | None = None, notes: list[str] | None = None
) -> list[dict[str, Any]]:
    """List the machine's GPUs for the run's fingerprint (`hardware.gpus`).

    Args:
        nvml: The `pynvml` module; None imports nvidia-ml-py's (tests pass a fake).
        notes: When given, the CPU-only note is appended to it (once).

    Returns:
        `[{"index", "name", "memory_bytes", "driver"}, ...]`; `[]` on a CPU-only machine.
    """
    sampler = GpuSampler(nvml)
    try:
        if not sampler.open():
            if notes is not None and sampler.note and sampler.note not in notes:
                notes.append(sampler.note)
            return []
        return sampler.inventory()
    finally:
        sampler.close()

"""The run's fingerprint: what was measured, on what, with what; and what differs between two.

Owns `collect_fingerprint` (a plain dict saved in the run document) and `mismatches` (the
fields that differ between two fingerprints and make their numbers incomparable). Two runs are
comparable when the same model build (digest, quantization) ran on the same runtime (kind,
version) and hardware (CPU, GPUs, driver), through the same gateway version (or both directly),
with the same workload (its digest, which covers prompts and sampling) and the same load shape.
The repeat count is left out on purpose: more repeats only narrow the noise, which `compare`
accounts for. The host's OS and Python are recorded for the reader but do not refuse a
comparison: they rarely move a model server's numbers, and a refused comparison after an OS
update would teach users to pass `--allow-mismatch` always.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gateway
from gateway.clients.bench.document import mapping, nested

#: The runtime kind an OpenAI-compatible server names in `/v1/models` `owned_by`.
_OWNERS = {"llamacpp": "llama.cpp", "vllm": "vllm", "sglang": "sglang", "ollama": "ollama"}
#: `parameters` keys that describe the load (the target URL is left out: the same server may
#: be reached under another name, and the fingerprint says what answered, not where).
_LOAD = ("api", "shape", "levels", "duration", "requests", "warmup", "slo", "knee_gain")


def collect_fingerprint(
    target_info: Mapping[str, Mapping[str, Any]],
    parameters: Mapping[str, Any],
    gpus: Sequence[Mapping[str, Any]],
    *,
    proc: Path = Path("/proc"),
) -> dict[str, Any]:
    """Describe a run for later comparison.

    Args:
        target_info: Per model name, `driver.check_target`'s result
            (`{"through_gateway": bool, "server": {...}}`); the server's fields are read
            leniently (`digest`, `quantization_level`, `parameter_size`, `format`, `family`,
            `version`, `owned_by`, flat or under `details`), and a missing one is None.
        parameters: The run document's `parameters`.
        gpus: `resources.gpu_inventory()` (`[{"name", "memory_bytes", "driver"}, ...]`).
        proc: Where `cpuinfo` and `meminfo` are read (tests pass a directory of their own).

    Returns:
        `{"models": {name: {digest, quantization, parameter_size, format, family}},
        "runtime": {kind, version}, "hardware": {cpu, cores, memory_bytes, gpus},
        "gateway": {version, through}, "host": {os, python}, "parameters": {...}}`.
    """
    servers = {name: dict(info.get("server") or {}) for name, info in target_info.items()}
    through = bool(parameters.get("through_gateway")) or any(
        bool(info.get("through_gateway")) for info in target_info.values()
    )
    return {
        "models": {name: _model(server) for name, server in servers.items()},
        # Behind the gateway, /api/version and /v1/models are the gateway's answers, not the
        # model server's: recording them as its runtime would be a claim nobody checked.
        "runtime": (
            {"kind": "behind the gateway", "version": None}
            if through
            else _runtime(parameters.get("api"), list(servers.values()))
        ),
        "hardware": {
            "cpu": _cpu_model(proc / "cpuinfo"),
            "cores": os.cpu_count(),
            "memory_bytes": _memory_bytes(proc / "meminfo"),
            "gpus": [
                {
                    "name": gpu.get("name"),
                    "memory_bytes": gpu.get("memory_bytes"),
                    "driver": gpu.get("driver"),
                }
                for gpu in gpus
            ],
        },
        "gateway": {"version": gateway.__version__, "through": through},
        "host": {
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
        },
        "parameters": {
            **{key: parameters.get(key) for key in _LOAD},
            "workload": {
                "name": nested(parameters, "workload", "name"),
                "digest": nested(parameters, "workload", "digest"),
                "sampling": nested(parameters, "workload", "sampling"),
            },
        },
    }


def _field(server: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        for source in (server, server.get("details")):
            # An empty string (the gateway lists an OpenAI upstream's digest as '') is unknown.
            if isinstance(source, Mapping) and source.get(name) not in (None, ""):
                return source[name]
    return None


def _model(server: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "digest": _field(server, "digest"),
        "quantization": _field(server, "quantization_level", "quantization"),
        "parameter_size": _field(server, "parameter_size"),
        "format": _field(server, "format"),
        "family": _field(server, "family"),
    }


def _runtime(api: object, servers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    versions = [v for v in (_field(s, "version") for s in servers) if v is not None]
    if api == "ollama":
        kind: str | None = "ollama"
    elif api == "openai":
        owners = {str(_field(s, "owned_by")).lower() for s in servers if _field(s, "owned_by")}
        known = [_OWNERS[o] for o in owners if o in _OWNERS]
        kind = known[0] if len(known) == 1 else "openai-compatible"
    else:
        kind = None
    return {"kind": kind, "version": versions[0] if versions else None}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux, or /proc hidden: the platform module's answer will do
        return ""


def _cpu_model(path: Path) -> str | None:
    for line in _read(path).splitlines():
        key, _, value = line.partition(":")
        # x86 says "model name"; ARM kernels say "Processor" or only "CPU part".
        if key.strip().lower() in ("model name", "processor") and not value.strip().isdigit():
            return value.strip() or None
    return platform.processor() or platform.machine() or None


def _memory_bytes(path: Path) -> int | None:
    for line in _read(path).splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024  # /proc/meminfo counts KiB
    return None


def _at(*keys: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda fp: nested(fp, *keys)


#: The fields that make two runs incomparable: label -> reader over a fingerprint.
_FIELDS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "runtime kind": _at("runtime", "kind"),
    "runtime version": _at("runtime", "version"),
    "CPU": _at("hardware", "cpu"),
    "GPUs": lambda fp: _gpus(fp, "name"),
    "GPU driver": lambda fp: _gpus(fp, "driver"),
    "gateway version": _at("gateway", "version"),
    "through the gateway": _at("gateway", "through"),
    "workload digest": _at("parameters", "workload", "digest"),
    "sampling": _at("parameters", "workload", "sampling"),
    **{f"parameter {key}": _at("parameters", key) for key in _LOAD},
}
_MODEL_FIELDS = ("digest", "quantization")


def _gpus(fp: Mapping[str, Any], key: str) -> list[Any] | None:
    gpus = nested(fp, "hardware", "gpus")
    if not isinstance(gpus, list):
        return None
    # A CPU-only machine has no GPU and no driver: [] on both sides is equal, not unknown.
    values = [gpu.get(key) if isinstance(gpu, Mapping) else None for gpu in gpus]
    return sorted(values, key=repr)


def mismatches(base_fp: object, new_fp: object) -> list[str]:
    """Name each field that differs between two fingerprints and matters for the numbers.

    A field unknown (None) on both sides is no mismatch (a server that never reports its
    version cannot be held against itself); unknown on one side only is one, since nothing
    shows the two are the same ("runtime version: unknown in BASE, '0.5.1' in NEW"). Models are
    matched by name; a model of BASE missing from NEW is a mismatch, and so is a model whose
    digest or quantization differs. What NEW measured beyond BASE (another model, more levels
    of a sweep) is no mismatch: every point of BASE still has its counterpart, and `compare`
    notes the rest. A fingerprint (or its `models`) that is no object counts as empty.

    Returns:
        One sentence per mismatch, in a fixed order; `[]` when the runs are comparable. The
        values are `repr`s of what the files hold, not escaped: escape them before printing.
    """
    found: list[str] = []
    base, new = mapping(base_fp), mapping(new_fp)
    for label, read in _FIELDS.items():
        if label == "parameter levels" and _covers(read(new), read(base)):
            continue
        _differ(found, label, read(base), read(new))
    # A hand-edited `models` that is no object (a list) holds no model: as good as none.
    base_models = mapping(nested(base, "models"))
    new_models = mapping(nested(new, "models"))
    for name in sorted(set(base_models) | set(new_models), key=str):
        if name not in new_models:
            found.append(f"model {name!r}: only in BASE")
        elif name in base_models:
            for key in _MODEL_FIELDS:
                label = f"model {name!r} {key}"
                _differ(found, label, nested(base_models, name, key), nested(new_models, name, key))
    return found


def _covers(new: Any, base: Any) -> bool:
    """NEW's sweep levels include every one of BASE's (both lists of numbers)."""
    if not (isinstance(new, list) and isinstance(base, list)):
        return False
    try:
        return set(base) <= set(new)
    except TypeError:  # a hand-edited list holding objects
        return False


def _differ(found: list[str], label: str, base: Any, new: Any) -> None:
    if base == new:
        return
    if base is None:
        found.append(f"{label}: unknown in BASE, {new!r} in NEW")
    elif new is None:
        found.append(f"{label}: {base!r} in BASE, unknown in NEW")
    else:
        found.append(f"{label}: {base!r} in BASE, {new!r} in NEW")

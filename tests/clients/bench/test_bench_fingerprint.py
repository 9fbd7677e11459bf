"""`gateway.clients.bench.fingerprint`: what a run records about itself, and which differences
refuse."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import gateway
from gateway.clients.bench.fingerprint import collect_fingerprint, mismatches
from tests.clients.bench.bench_docs import GPUS, run_doc

PARAMETERS: dict[str, Any] = {
    "target": "http://10.0.0.7:11434",
    "api": "ollama",
    "through_gateway": False,
    "shape": "knee",
    "levels": [1, 64],
    "repeat": 3,
    "duration": 30.0,
    "requests": None,
    "warmup": 4,
    "workload": {"name": "builtin", "prompts": 12, "digest": "abc", "sampling": {"seed": 1}},
    "slo": None,
    "knee_gain": 0.1,
}


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD Ryzen 9 7950X 16-Core\n"
    )
    (tmp_path / "meminfo").write_text("MemTotal:       65536000 kB\nMemFree: 1 kB\n")
    return tmp_path


def _ollama(digest: str | None = "sha256:1") -> dict[str, Any]:
    details = {"quantization_level": "Q4_K_M", "parameter_size": "8B", "family": "llama"}
    return {
        "through_gateway": False,
        "server": {"version": "0.5.7", "digest": digest, "details": {**details, "format": "gguf"}},
    }


def test_behind_the_gateway_the_runtime_is_not_claimed(proc: Path) -> None:
    """The gateway answers /api/version itself: that is not the model server's version."""
    info = {**_ollama(), "through_gateway": True}
    fp = collect_fingerprint({"m": info}, PARAMETERS, [], proc=proc)
    assert fp["runtime"] == {"kind": "behind the gateway", "version": None}
    assert fp["gateway"]["through"] is True
    direct = collect_fingerprint({"m": _ollama()}, PARAMETERS, [], proc=proc)
    assert "through the gateway: False in BASE, True in NEW" in mismatches(direct, fp)


def test_an_empty_digest_is_unknown(proc: Path) -> None:
    fp = collect_fingerprint({"m": _ollama(digest="")}, PARAMETERS, [], proc=proc)
    assert fp["models"]["m"]["digest"] is None


def test_the_fingerprint_holds_model_runtime_hardware_gateway_and_load(proc: Path) -> None:
    fp = collect_fingerprint({"llama3.1:8b": _ollama()}, PARAMETERS, GPUS, proc=proc)
    assert fp["models"] == {
        "llama3.1:8b": {
            "digest": "sha256:1",
            "quantization": "Q4_K_M",
            "parameter_size": "8B",
            "format": "gguf",
            "family": "llama",
        }
    }
    assert fp["runtime"] == {"kind": "ollama", "version": "0.5.7"}
    hardware = fp["hardware"]
    assert hardware["cpu"] == "AMD Ryzen 9 7950X 16-Core"
    assert hardware["memory_bytes"] == 65536000 * 1024
    assert hardware["gpus"] == [
        {"name": "NVIDIA GeForce RTX 4090", "memory_bytes": 25_757_220_864, "driver": "550.54"}
    ]
    assert fp["gateway"] == {"version": gateway.__version__, "through": False}
    assert set(fp["host"]) == {"os", "python"}
    # The target's address is where, not what: it stays out of the fingerprint.
    assert "target" not in fp["parameters"]
    assert fp["parameters"]["workload"]["digest"] == "abc"
    assert fp["parameters"]["shape"] == "knee"


@pytest.mark.parametrize(
    ("owners", "kind"),
    [
        (["llamacpp"], "llama.cpp"),
        (["vllm"], "vllm"),
        (["me"], "openai-compatible"),
        ([], "openai-compatible"),
    ],
)
def test_an_openai_compatible_runtime_is_named_by_its_owner(
    proc: Path, owners: list[str], kind: str
) -> None:
    info = {
        f"m{i}": {"through_gateway": False, "server": {"id": f"m{i}", "owned_by": owner}}
        for i, owner in enumerate(owners)
    }
    fp = collect_fingerprint(info, {**PARAMETERS, "api": "openai"}, [], proc=proc)
    assert fp["runtime"] == {"kind": kind, "version": None}


def test_a_machine_without_proc_still_names_its_cpu(tmp_path: Path) -> None:
    fp = collect_fingerprint({}, PARAMETERS, [], proc=tmp_path / "missing")
    assert fp["hardware"]["memory_bytes"] is None
    assert fp["hardware"]["gpus"] == []
    assert fp["models"] == {}


def test_arm_cpuinfo_names_the_processor_not_its_number(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text("Processor\t: AArch64 Processor rev 4\nprocessor\t: 0\n")
    fp = collect_fingerprint({}, PARAMETERS, [], proc=tmp_path)
    assert fp["hardware"]["cpu"] == "AArch64 Processor rev 4"


def test_identical_fingerprints_have_no_mismatch() -> None:
    fp = run_doc()["fingerprint"]
    assert mismatches(fp, copy.deepcopy(fp)) == []


def test_each_difference_that_moves_the_numbers_is_named(proc: Path) -> None:
    base = collect_fingerprint({"m": _ollama()}, PARAMETERS, GPUS, proc=proc)
    new = copy.deepcopy(base)
    new["models"]["m"]["digest"] = "sha256:2"
    new["runtime"]["version"] = "0.6.0"
    new["hardware"]["gpus"][0]["driver"] = "560.1"
    new["parameters"]["workload"]["digest"] = "def"
    new["parameters"]["levels"] = [1, 32]
    found = mismatches(base, new)
    assert found == [
        "runtime version: '0.5.7' in BASE, '0.6.0' in NEW",
        "GPU driver: ['550.54'] in BASE, ['560.1'] in NEW",
        "workload digest: 'abc' in BASE, 'def' in NEW",
        "parameter levels: [1, 64] in BASE, [1, 32] in NEW",
        "model 'm' digest: 'sha256:1' in BASE, 'sha256:2' in NEW",
    ]


def test_unknown_on_both_sides_is_no_mismatch_but_on_one_side_it_is(proc: Path) -> None:
    base = collect_fingerprint({"m": _ollama(digest=None)}, PARAMETERS, [], proc=proc)
    assert mismatches(base, copy.deepcopy(base)) == []
    new = copy.deepcopy(base)
    new["models"]["m"]["digest"] = "sha256:9"
    assert mismatches(base, new) == ["model 'm' digest: unknown in BASE, 'sha256:9' in NEW"]
    assert mismatches(new, base) == ["model 'm' digest: 'sha256:9' in BASE, unknown in NEW"]


def test_repeats_host_and_target_do_not_refuse_a_comparison(proc: Path) -> None:
    base = collect_fingerprint({"m": _ollama()}, PARAMETERS, GPUS, proc=proc)
    moved = {**PARAMETERS, "target": "http://elsewhere:11434", "repeat": 5}
    new = collect_fingerprint({"m": _ollama()}, moved, GPUS, proc=proc)
    new["host"] = {"os": "Linux 6.12", "python": "3.13.1"}
    assert mismatches(base, new) == []


def test_a_base_model_missing_from_new_is_a_mismatch_and_one_more_in_new_is_not(
    proc: Path,
) -> None:
    base = collect_fingerprint({"a": _ollama(), "b": _ollama()}, PARAMETERS, [], proc=proc)
    new = collect_fingerprint({"a": _ollama(), "c": _ollama()}, PARAMETERS, [], proc=proc)
    assert mismatches(base, new) == ["model 'b': only in BASE"]
    more = collect_fingerprint(
        {"a": _ollama(), "b": _ollama()} | {"c": _ollama()}, PARAMETERS, [], proc=proc
    )
    assert mismatches(base, more) == []


def test_more_sweep_levels_in_new_are_no_mismatch_but_fewer_or_others_are(proc: Path) -> None:
    def levels(*values: int) -> dict[str, Any]:
        return collect_fingerprint(
            {"m": _ollama()}, {**PARAMETERS, "levels": list(values)}, [], proc=proc
        )

    assert mismatches(levels(1, 4), levels(1, 2, 4)) == []
    assert mismatches(levels(1, 2, 4), levels(1, 4)) == [
        "parameter levels: [1, 2, 4] in BASE, [1, 4] in NEW"
    ]
    assert mismatches(levels(1, 4), levels(2, 8)) != []


def test_cpu_only_machines_match_and_a_gpu_appearing_does_not(proc: Path) -> None:
    base = collect_fingerprint({}, PARAMETERS, [], proc=proc)
    assert mismatches(base, collect_fingerprint({}, PARAMETERS, [], proc=proc)) == []
    found = mismatches(base, collect_fingerprint({}, PARAMETERS, GPUS, proc=proc))
    assert found[0] == "GPUs: [] in BASE, ['NVIDIA GeForce RTX 4090'] in NEW"


def test_an_empty_fingerprint_is_unknown_everywhere() -> None:
    # An old run without a fingerprint against a new one: every known field is a mismatch.
    found = mismatches({}, run_doc()["fingerprint"])
    assert "runtime kind: unknown in BASE, 'ollama' in NEW" in found
    assert mismatches({}, {}) == []


def test_a_fingerprint_whose_models_is_no_object_counts_as_no_model() -> None:
    good = {"models": {"m": {"digest": "d", "quantization": "Q4"}}}
    assert mismatches({"models": [{}]}, {"models": [{}]}) == []
    assert mismatches(good, {"models": [{}]}) == ["model 'm': only in BASE"]
    assert mismatches([1], "x") == []

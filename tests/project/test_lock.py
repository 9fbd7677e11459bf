"""The lock files in requirements/: in sync with pyproject.toml, every package hashed, and the
hash really checked by pip; the SBOM made from them (docs/security.md#verifying-what-you-installed).

Offline and fast: the lock is read as text, pip checks a wheel made here against a wrong hash in
dry-run mode from a local folder, and the SBOM is made from the lock alone.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
REGENERATE = "the lock is out of date with pyproject.toml: run scripts/lock"

PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)"
    r"(?: ; (?P<marker>[^\\]+?))?(?P<hashes>(?: --hash=sha256:[0-9a-f]{64})+)$"
)


@dataclass(frozen=True)
class Pin:
    """One entry of a lock: a release, its marker, its hashes and what it was locked for."""

    name: str
    version: str
    marker: str | None
    hashes: frozenset[str]
    via: tuple[str, ...]


def read_lock(path: Path) -> list[Pin]:
    """Parse a lock written by `uv pip compile --generate-hashes`; fails on any other line."""
    entries: list[tuple[str, list[str]]] = []  # (requirement with its options, its `via` lines)
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            continue  # the header
        if line[0].isalnum():
            entries.append((line.rstrip("\\").strip(), []))
        elif line.lstrip().startswith("--hash="):
            entries[-1] = (entries[-1][0] + " " + line.strip().rstrip("\\").strip(), entries[-1][1])
        elif line.lstrip().startswith("#"):
            comment = line.strip().lstrip("#").strip()
            entries[-1][1].append(comment.removeprefix("via").strip())
        else:
            pytest.fail(f"{path.name}: a line that is not a hashed pin: {line!r}")
    pins = []
    for text, via in entries:
        match = PIN.match(text)
        assert match, f"{path.name}: not an exact pin with sha256 hashes: {text[:120]!r}"
        hashes = frozenset(re.findall(r"sha256:([0-9a-f]{64})", match["hashes"]))
        pins.append(
            Pin(
                canonicalize_name(match["name"]),
                match["version"],
                match["marker"],
                hashes,
                tuple(v for v in via if v),
            )
        )
    return pins


def versions(pins: list[Pin]) -> dict[str, set[str]]:
    """Each locked project's versions (two where a marker splits them)."""
    found: dict[str, set[str]] = {}
    for pin in pins:
        found.setdefault(pin.name, set()).add(pin.version)
    return found


RUNTIME = read_lock(LOCKS / "runtime.txt")
BUILD = read_lock(LOCKS / "build.txt")
DEV = read_lock(LOCKS / "dev.txt")
LLAMA = read_lock(LOCKS / "llama-cpp-python.txt")
LLAMA_BUILD = read_lock(LOCKS / "llama-build.txt")


def _requirements(*extras: str) -> list[Requirement]:
    listed = PROJECT["dependencies"] + [
        r for e in extras for r in PROJECT["optional-dependencies"][e]
    ]
    return [Requirement(r) for r in listed]


def _assert_pins_satisfy(requirements: list[Requirement], pins: list[Pin]) -> None:
    locked = versions(pins)
    for req in requirements:
        name = canonicalize_name(req.name)
        assert name in locked, f"{req} is not in the lock: {REGENERATE}"
        for version in locked[name]:
            assert req.specifier.contains(version, prereleases=True), (
                f"{name}=={version} is outside {req}: {REGENERATE}"
            )


def _inputs(path: Path) -> list[str]:
    """The requirement lines of a scripts/lock input file (`.in`)."""
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def _direct(pins: list[Pin]) -> set[str]:
    return {pin.name for pin in pins if "llm-gateway (pyproject.toml)" in pin.via}


@pytest.mark.parametrize(
    ("lock", "extras"),
    [("runtime", ()), ("dev", ("dev", "model"))],
)
def test_lock_pins_exactly_pyprojects_dependencies_within_their_ranges(lock, extras):
    pins = {"runtime": RUNTIME, "dev": DEV + LLAMA}[lock]
    requirements = _requirements(*extras)

    _assert_pins_satisfy(requirements, pins)
    # A dependency removed from pyproject.toml leaves the lock holding it for nothing.
    assert _direct(pins) == {canonicalize_name(r.name) for r in requirements}, REGENERATE


def test_build_lock_pins_the_build_backend_pyproject_names():
    requires = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    assert _inputs(LOCKS / "build.in") == PYPROJECT["build-system"]["requires"], REGENERATE
    _assert_pins_satisfy(requires, BUILD)
    # The editable install of scripts/bootstrap builds without isolation, on dev.txt alone.
    editable = [Requirement(r) for r in _inputs(LOCKS / "editable.in")]
    _assert_pins_satisfy(requires + editable, DEV)


#: The environments the locks serve (scripts/lock: Linux x86_64 and aarch64, CPython 3.11 on).
_ENVIRONMENTS = [
    {
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "python_version": version,
        "python_full_version": f"{version}.0",
    }
    for machine in ("x86_64", "aarch64")
    for version in ("3.11", "3.12", "3.13", "3.14")
]


def _installed(pins: list[Pin], environment: dict[str, str]) -> dict[str, str]:
    """Name -> version of what a lock installs in `environment` (its markers evaluated)."""
    return {
        pin.name: pin.version
        for pin in pins
        if pin.marker is None or Marker(pin.marker).evaluate(environment)
    }


def test_the_image_runs_the_versions_ci_tests():
    # The same versions, wherever the image installs them. The markers may differ in text: a
    # dev-only dependency can widen one to platforms no lock serves (selenium's trio wants cffi
    # on Windows too: `(... os_name == 'nt') or platform_python_implementation != 'PyPy'`).
    for environment in _ENVIRONMENTS:
        dev = _installed(DEV, environment)
        for name, version in _installed(RUNTIME + BUILD, environment).items():
            assert dev.get(name) == version, f"{name}: {REGENERATE}"


def test_llama_cpp_python_is_locked_as_an_sdist_apart_from_the_hashed_install():
    # Its wheel is built here and matches no PyPI hash: were it in dev.txt, the hash-checked
    # install would refuse the cached wheel (scripts/bootstrap installs it in a step of its own).
    assert "llama-cpp-python" not in versions(DEV)
    [llama] = LLAMA
    assert llama.name == "llama-cpp-python"
    assert len(llama.hashes) == 1  # the sdist: PyPI has no wheel of it
    _assert_pins_satisfy([Requirement(r) for r in _inputs(LOCKS / "llama-build.in")], LLAMA_BUILD)


@pytest.mark.parametrize(
    "lock", ["runtime", "build", "dev", "llama-cpp-python", "llama-build", "oidc-mock"]
)
def test_every_locked_release_has_a_sha256_and_one_version_per_marker(lock):
    pins = read_lock(LOCKS / f"{lock}.txt")  # fails on any line that is not a hashed pin

    assert pins
    assert all(pin.hashes for pin in pins)
    assert len({(p.name, p.marker) for p in pins}) == len(pins)


def _wheel(folder: Path, name: str, version: str) -> Path:
    """Write a minimal valid pure-Python wheel (no build backend, no network)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{p},sha256={digest(d)},{len(d)}\n" for p, d in files.items())
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
        archive.writestr(f"{dist}/RECORD", record + f"{dist}/RECORD,,\n")
    return path


def _pip_install_dry_run(lock: Path, links: Path) -> subprocess.CompletedProcess[str]:
    # The way scripts/bootstrap installs (--require-hashes -r LOCK), from a local folder only,
    # with no pip configuration of this machine (its extra indexes) in the way.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index"]
    command += ["--find-links", str(links), "--require-hashes", "-r", str(lock)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)  # noqa: S603 (our own interpreter)


@pytest.mark.tools
def test_pip_refuses_a_file_whose_sha256_differs_from_the_lock(tmp_path):
    wheel = _wheel(tmp_path, "gw_lock_probe", "1.0")
    good = hashlib.sha256(wheel.read_bytes()).hexdigest()
    tampered = f"{int(good[0], 16) ^ 1:x}{good[1:]}"  # one hex digit off
    lock = tmp_path / "lock.txt"

    lock.write_text(f"gw-lock-probe==1.0 \\\n    --hash=sha256:{tampered}\n")
    refused = _pip_install_dry_run(lock, tmp_path)
    lock.write_text(f"gw-lock-probe==1.0 \\\n    --hash=sha256:{good}\n")
    accepted = _pip_install_dry_run(lock, tmp_path)

    assert refused.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in refused.stderr
    assert f"Expected sha256 {tampered}" in refused.stderr
    assert f"Got        {good}" in refused.stderr
    assert accepted.returncode == 0, accepted.stderr
    assert re.search(r"Would install gw[-_]lock[-_]probe-1\.0", accepted.stdout)


@pytest.mark.tools
def test_pip_refuses_a_pin_without_a_hash_among_hashed_ones(tmp_path):
    _wheel(tmp_path, "gw_lock_probe", "1.0")
    _wheel(tmp_path, "gw_lock_other", "1.0")
    good = hashlib.sha256((tmp_path / "gw_lock_probe-1.0-py3-none-any.whl").read_bytes())
    lock = tmp_path / "lock.txt"
    lock.write_text(f"gw-lock-probe==1.0 --hash=sha256:{good.hexdigest()}\ngw-lock-other==1.0\n")

    refused = _pip_install_dry_run(lock, tmp_path)

    assert refused.returncode != 0
    assert "Hashes are required in --require-hashes mode" in refused.stderr


@pytest.mark.tools
def test_sbom_lists_every_runtime_release_with_its_hashes():
    venv_bin = Path(sys.executable).parent
    if not (ROOT / ".venv").exists() and shutil.which("cyclonedx-py", path=str(venv_bin)) is None:
        pytest.skip("cyclonedx-py (the dev extra) is not installed")
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}

    run = subprocess.run(  # noqa: S603 (our own script)
        ["/bin/sh", str(ROOT / "scripts" / "sbom")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )

    assert run.returncode == 0, run.stderr
    sbom = json.loads(run.stdout)
    assert sbom["bomFormat"] == "CycloneDX"
    # Reproducible: nothing in it but what the lock says (no time, no random serial number).
    assert "serialNumber" not in sbom
    assert "timestamp" not in sbom["metadata"]
    root = sbom["metadata"]["component"]
    assert (root["name"], root["version"]) == (PROJECT["name"], PROJECT["version"])
    components = {
        c["purl"]: {
            h["content"] for r in c.get("externalReferences", []) for h in r.get("hashes", [])
        }
        for c in sbom["components"]
    }
    for pin in RUNTIME:
        purl = f"pkg:pypi/{pin.name}@{pin.version}"
        assert purl in components
        assert pin.hashes <= components[purl], pin.name

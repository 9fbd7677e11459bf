"""The layers of `gateway/` (docs/architecture.md#layers): imports point only down, no circle.

The contracts live in pyproject.toml (`[tool.importlinter]`); `scripts/check` runs them in CI
with `lint-imports`, and this file runs the same command so the README's test command fails on
an upward import too. Offline and quick: import-linter reads the source, it imports nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = {
    contract["id"]: contract
    for contract in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
}
#: On top of the server, or beside it: placed by their own contracts, not in the layers.
OUTSIDE_THE_LAYERS = {"gateway.clients", "gateway.testing"}
#: What the client tools may not import: the server, from `serve` down to `db`.
SERVER_PACKAGES = "serve app api deps batch relay limits tracing auth keys upstream metering db"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the `gateway` package and pyproject.toml found in `root`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def layer_modules(*, optional: bool = True) -> set[str]:
    """Every module named in the layers contract; with `optional=False`, not the `(optional)`."""
    names = set()
    for layer in CONTRACTS["layers"]["layers"]:
        for part in layer.replace("|", ":").split(":"):
            name = part.strip()
            if optional or not name.startswith("("):
                names.add(name.strip("()"))
    return names


def test_imports_point_only_down_the_layers() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_top_level_module_is_placed() -> None:
    """A new module or package at the root of `gateway/` must be given its layer."""
    gateway = ROOT / "gateway"
    children = {f"gateway.{path.stem}" for path in gateway.glob("*.py")} | {
        f"gateway.{path.parent.name}" for path in gateway.glob("*/__init__.py")
    }
    children.discard("gateway.__init__")
    layers = layer_modules()
    assert children - OUTSIDE_THE_LAYERS <= layers, "not in a layer: see docs/architecture.md"
    # The server (every layer) imports nothing of gateway.testing, and the client tools none
    # of the server: the two forbidden contracts name the same modules as the layers.
    assert layer_modules(optional=False) <= set(CONTRACTS["testing"]["source_modules"])
    forbidden = set(CONTRACTS["clients"]["forbidden_modules"])
    server = {f"gateway.{name}" for name in SERVER_PACKAGES.split()}
    assert forbidden == server | {"gateway.testing"}


def test_an_upward_import_fails_the_check(tmp_path: Path) -> None:
    """Not a vacuous check: a type-only import from `wire` up into `api` breaks it."""
    shutil.copytree(ROOT / "gateway", tmp_path / "gateway", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    module = tmp_path / "gateway" / "wire" / "json.py"
    source = module.read_text()
    upward = "\nimport typing\n\nif typing.TYPE_CHECKING:\n    import gateway.api.auth\n"
    module.write_text(source + upward)
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "gateway.wire is not allowed to import gateway.api" in result.stdout

"""The emulator as its own tests configure it."""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.testing.emulator.app import EmulatorConfig
from gateway.testing.stack import ManagedProcess, free_port


def fast_config(**changes: object) -> EmulatorConfig:
    """A config with a short TTFT and pace and 6 tokens; `changes` override any field."""
    return EmulatorConfig(**{"ttft": 0.01, "inter_token": 0.002, "tokens": 6, **changes})


def emulator_process(log_path: Path, *options: str, name: str = "emulator") -> ManagedProcess:
    """`python -m gateway.testing.emulator OPTIONS` on a free loopback port, as a process.

    For tests that need the emulator outside their own event loop (its timing is the truth a
    benchmark is checked against, or it is killed mid-run). Use it as a context manager: it
    waits until `/api/version` answers and stops the process group on exit.

    Args:
        log_path: File receiving the process's output.
        options: Emulator command-line options (`--ttft 0.05`, ...).
        name: For messages.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "gateway.testing.emulator", "--port", str(port)]
    argv += ["--log-level", "warning", *options]
    return ManagedProcess(name, argv, url, f"{url}/api/version", log_path=log_path)

"""What a test sends as a client: the model name, generations (streamed or not), checks on them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx

MODEL = "llama3.2:latest"
"""The model the emulator serves, by its full name."""

MODEL_ALIAS = "llama3.2"
"""The same model by the name a user types (the gateway completes the `:latest` tag)."""

DIALECTS = ["ollama", "openai"]
"""The upstream dialects a client test runs against, a gateway each (tests/clients/conftest.py)."""

opened = ExitStack()
"""The real client packages' clients a test opened: closed after each test of `tests/clients/`
by its conftest (an unclosed socket fails the run: ResourceWarning)."""


@contextmanager
def open_generation(
    url: str, key: str, *, path: str = "/v1/generate", prompt: str = "x", timeout: float = 30
) -> Iterator[httpx.Response]:
    """A streamed generation of `MODEL` at `url` + `path` as `key`, open for reading."""
    with httpx.stream(
        "POST",
        f"{url}{path}",
        json={"model": MODEL, "prompt": prompt},
        headers={"Authorization": f"Bearer {key}"},
        timeout=timeout,
    ) as response:
        yield response


def stream_generation(url: str, key: str, lines: list[dict[str, Any]]) -> int:
    """Stream one generation of `MODEL` from the gateway at `url` as `key`; return its status.

    Each NDJSON line is parsed and appended to `lines` as it arrives, so a caller whose stream
    is cut keeps what came before the cut.
    """
    with open_generation(url, key) as response:
        lines.extend(json.loads(line) for line in response.iter_lines() if line)
        return response.status_code


def worst_stream_gap(url: str, key: str, attack: Callable[[], list[int]]) -> tuple:
    """Stream a generation as `key` (a victim) while `attack` runs in a thread.

    Returns the worst pause between the stream's lines (seconds) and the statuses `attack`
    returned. The stream is flowing before the attack starts; reading stops when it ends.
    """
    statuses: list[int] = []
    attacking = threading.Event()

    def run() -> None:
        try:
            statuses.extend(attack())
        finally:
            attacking.clear()

    gaps: list[float] = []
    with open_generation(url, key, path="/api/generate", prompt="victim", timeout=60) as stream:
        lines = stream.iter_lines()
        next(lines)  # the stream is flowing before the attack starts
        attacking.set()
        attacker = threading.Thread(target=run)
        attacker.start()
        last = time.perf_counter()
        for line in lines:
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            if not attacking.is_set() or json.loads(line)["done"]:
                break
        attacker.join()
    return max(gaps), statuses


def parse_ollama(
    raw: bytes, operation: str, *, max_depth: int = 64, max_values: int = 100_000
) -> dict[str, Any]:
    """Check an Ollama generate or chat body as the gateway does; return the checked body."""
    from gateway.api.ollama.schema import parse_generation
    from gateway.settings import Settings

    settings = Settings(max_json_depth=max_depth, max_json_values=max_values)
    return parse_generation(raw, operation, settings).body  # type: ignore[arg-type]


#: Seconds a loopback hop may add after a silence. Some VMs (this project's CI among them)
#: wake a process tens of milliseconds late after 0.3 s idle, which a TTFT measured across a
#: hop pays and the emulator's knobs leave out (tests/clients/bench/test_bench_driver.py
#: measures it).
LOOPBACK_WAKE = 0.06


def assert_ttft(exported: float, client: float | None, truth: float | None) -> None:
    """The gateway's TTFT agrees with the client's and with the emulator's `truth` (seconds;
    None: not checked).

    The client's clock starts before the gateway's and stops after it, so it may read up to
    `LOOPBACK_WAKE` more; both may exceed the truth by that much, never fall short of it.
    """
    if client is not None:
        assert client - 0.02 - LOOPBACK_WAKE <= exported <= client * 1.05 + 0.02, (exported, client)
    if truth is not None:
        assert truth * 0.85 <= exported <= truth * 1.15 + LOOPBACK_WAKE, (exported, truth)

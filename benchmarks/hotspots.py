"""Where the gateway's CPU goes under load: py-spy samples, summed by library and by function.

Owns `profile_gateway`: while one load run drives the gateway, `py-spy record --format raw`
samples it (non-blocking, 100 Hz, idle threads left out, so the samples are CPU time), and the
collapsed stacks are summed two ways: self time by library (httpx, json, SQLAlchemy, ...) and
inclusive time by gateway function. The raw file opens in speedscope (https://www.speedscope.app)
or `flamegraph.pl`. py-spy is optional: `.venv/bin/pip install py-spy`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.measure import LoadPlan, measure
from benchmarks.servers import Target

_LIBRARIES = (
    ("/asyncio/runners.py", "event loop (uvloop's C code: epoll, socket I/O, callbacks, timers)"),
    ("/httpcore/", "httpx + httpcore + h11 (upstream HTTP client)"),
    ("/httpx/", "httpx + httpcore + h11 (upstream HTTP client)"),
    ("/h11/", "httpx + httpcore + h11 (upstream HTTP client)"),
    ("/aiohttp/", "aiohttp (upstream wire, under httpx)"),
    ("/multidict/", "aiohttp (upstream wire, under httpx)"),
    ("/yarl/", "aiohttp (upstream wire, under httpx)"),
    ("/gateway/upstream/transport.py", "aiohttp (upstream wire, under httpx)"),
    ("/httptools/", "httptools (llhttp: uvicorn's server side, the upstream wire's client side)"),
    ("/gateway/upstream/http1.py", "gateway's HTTP/1.1 client (upstream wire, under httpx)"),
    (
        "/gateway/upstream/httptools_transport.py",
        "gateway's HTTP/1.1 client (upstream wire, under httpx)",
    ),
    ("/json/", "json (stdlib)"),
    ("/sqlalchemy/", "SQLAlchemy + aiosqlite (key store)"),
    ("/aiosqlite/", "SQLAlchemy + aiosqlite (key store)"),
    ("/sqlite3/", "SQLAlchemy + aiosqlite (key store)"),
    ("/prometheus_client/", "prometheus_client (metrics)"),
    ("/uvicorn/", "uvicorn (server side HTTP/1.1, socket writes)"),
    ("/starlette/", "starlette + fastapi"),
    ("/fastapi/", "starlette + fastapi"),
    ("/pydantic", "pydantic"),
    ("/anyio/", "anyio (cancel scopes, task groups, deadlines)"),
    ("/limits/", "limits (rate limiter)"),
    ("/tenacity/", "tenacity (retries)"),
    ("/asyncio/", "asyncio (Python parts)"),
    ("/concurrent/futures/thread.py", "thread pool (mostly idle workers waiting for a job)"),
    ("/concurrent/futures/", "thread pool (mostly idle workers waiting for a job)"),
    ("/threading.py", "thread pool (mostly idle workers waiting for a job)"),
    ("/gateway/", "gateway (own code)"),
    ("/logging/", "logging"),
)
"""Library of a frame, by a fragment of its file path; first match wins, else "other"."""


_ENTRY_POINTS = {"/gateway/__main__.py", "/gateway/cli.py", "/gateway/serve/server.py"}


def py_spy_binary() -> str | None:
    """The py-spy executable next to this Python, or on PATH; None when not installed."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _path(frame: str) -> str:
    """The file of a py-spy frame, `name (path:line)`, with a leading `/` to match on."""
    inside = frame[frame.rfind("(") + 1 :]
    return "/" + inside.rpartition(":")[0]


def _function(frame: str) -> str | None:
    """`name (path)` of a gateway frame without its line.

    None for other frames and for the entry points, which are on every stack.
    """
    path = _path(frame)
    if not path.startswith("/gateway/") or path in _ENTRY_POINTS:
        return None
    return f"{frame[: frame.rfind('(')].strip()} ({path[1:]})"


def _library(frame: str) -> str:
    path = _path(frame)
    for fragment, name in _LIBRARIES:
        if fragment in path:
            return name
    return "other"


def summarise_collapsed(path: Path, top: int = 15) -> dict[str, Any]:
    """Sum a py-spy raw (collapsed stacks) file: self share by library, inclusive by function."""
    by_library: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        by_library[_library(frames[-1])] += count
        self_time[frames[-1]] += count
        for function in {_function(frame) for frame in frames}:
            if function is not None:
                inclusive[function] += count
    if not total:
        return {"samples": 0}

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, count / total) for name, count in counter.most_common(top)]

    return {
        "samples": total,
        "self_by_library": shares(by_library),
        "self_by_function": shares(self_time),
        "inclusive_gateway_functions": shares(inclusive),
    }


def profile_gateway(
    target: Target, concurrency: int, plan: LoadPlan, upstream_pid: int, out: Path
) -> dict[str, Any]:
    """Run one load at `concurrency` against the gateway while py-spy samples it.

    Args:
        target: The gateway target; its first pid is the process sampled.
        concurrency: Streams during the profile.
        plan: The load (its duration is the sampling time).
        upstream_pid: The emulator, for the row's CPU share.
        out: Collapsed-stacks file to write.

    Returns:
        The load row and the summary (`summarise_collapsed`), or why there is none.
    """
    binary = py_spy_binary()
    if binary is None:
        return {"skipped": "py-spy is not installed (.venv/bin/pip install py-spy)"}
    out.parent.mkdir(parents=True, exist_ok=True)
    seconds = max(1, int(plan.duration))
    argv = [binary, "record", "-p", str(target.pids[0]), "-d", str(seconds), "-r", "100"]
    argv += ["--nonblocking", "--format", "raw", "-o", str(out)]
    row: dict[str, Any] = {}
    loader = threading.Thread(
        target=lambda: row.update(measure(target, concurrency, plan, upstream_pid))
    )
    loader.start()
    # Start sampling once the streams have ramped up (the warm-up of the load plan).
    loader.join(timeout=plan.warmup)
    spy = subprocess.run(argv, capture_output=True, check=False, timeout=seconds + 60)  # noqa: S603
    loader.join()
    if spy.returncode != 0 or not out.exists():
        return {"skipped": f"py-spy failed: {spy.stderr.decode(errors='replace')[-500:]}"}
    return {"row": row, "file": str(out), **summarise_collapsed(out)}

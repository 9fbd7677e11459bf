# ruff: noqa: T201 (a developer's tool prints its result)
"""`python -m benchmarks.request_path`: which gateway modules one streamed request passes.

Starts the emulator (a subprocess), makes a key with `gateway keys create`, builds the app
in-process (`gateway.app.create_app`) on uvicorn, and sends one streamed `POST /api/chat` (or
`--path /v1/chat/completions`) after a warm-up request. A profile hook (`sys.setprofile`) records
every call into a `gateway.*` module (the emulator's `gateway.testing` excepted) made from another
module while the request runs (a call, not a suspended coroutine going on: `await` resumes the
same call), in the tasks the request started (not in the lifespan's
background loops), and prints:

- the modules touched, in the order first entered, and their count;
- per module, how often it was entered from another module on the way in (before the first
  chunk reached the client) and in all;
- per package, the same.

`gateway serve`'s own connection plumbing (`gateway/serve/`) is not in the in-process server, so
it is left out on both sides of a comparison. Runs against any tree of the gateway (issue 25's
before and after): `PYTHONPATH=DIR PYTHONSAFEPATH=1 python -m benchmarks.request_path` from
this checkout measures the tree at DIR, since the tool only uses names both trees have.
"""

from __future__ import annotations

import argparse
import asyncio
import dis
import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import httpx
import uvicorn

MODEL = "llama3.2:latest"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _module(frame: FrameType | None) -> str:
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


_SUSPENDABLE = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
_FIRST_RESUME: dict[CodeType, int] = {}


def _resumed(frame: FrameType) -> bool:
    """Whether a `call` event is a coroutine or generator going on, not a new call.

    `sys.setprofile` reports each resumption of a suspended frame as a `call` (Python 3.11,
    "sys.setprofile"); a new frame stands at its first `RESUME` instruction, a resumed one
    further on.
    """
    code = frame.f_code
    if not code.co_flags & _SUSPENDABLE:
        return False
    first = _FIRST_RESUME.get(code)
    if first is None:
        first = next(
            (i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"),
            0,
        )
        _FIRST_RESUME[code] = first
    return frame.f_lasti > first


def _ours(module: str) -> bool:
    return module.startswith("gateway.") and not module.startswith("gateway.testing")


class PathRecorder:
    """A `sys.setprofile` hook: the cross-module calls into the gateway's modules, in order."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, bool]] = []  # (module entered, before the first chunk)
        self.way_in = True
        # Tasks running before the request (the lifespan's poll loops, the batch runner, the
        # usage sink, the client itself) are not the request's path.
        self.before = asyncio.all_tasks()

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        """Record a call into one of our modules from another module."""
        if event != "call":
            return
        module = _module(frame)
        if (
            _ours(module)
            and _module(frame.f_back) != module
            and not _resumed(frame)
            and asyncio.current_task() not in self.before
        ):
            self.entries.append((module, self.way_in))


async def _request(url: str, key: str, path: str, recorder: PathRecorder | None) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as client,
        client.stream("POST", path, json=body, headers=headers) as response,
    ):
        response.raise_for_status()
        async for _ in response.aiter_raw():
            if recorder is not None:
                recorder.way_in = False


async def _measure(env: dict[str, str], key: str, path: str) -> PathRecorder:
    os.environ.update(env)
    from gateway.app import create_app
    from gateway.settings import Settings

    port = _free_port()
    config = uvicorn.Config(create_app(Settings()), port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn's flag has no event to await
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    try:
        await _request(url, key, path, None)  # warm: caches, lazy imports, pooled connection
        recorder = PathRecorder()
        sys.setprofile(recorder)
        try:
            await _request(url, key, path, recorder)
            await asyncio.sleep(0.2)  # the finish step after the last chunk (usage, log)
        finally:
            sys.setprofile(None)
    finally:
        server.should_exit = True
        await task
    return recorder


def _report(recorder: PathRecorder) -> dict[str, Any]:
    order: list[str] = []
    for module, _ in recorder.entries:
        if module not in order:
            order.append(module)
    way_in = Counter(module for module, inward in recorder.entries if inward)
    total = Counter(module for module, _ in recorder.entries)

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages_in = Counter(package(m) for m, inward in recorder.entries if inward)
    packages_total = Counter(package(m) for m, _ in recorder.entries)
    return {
        "modules": order,
        "module_count": len(order),
        "way_in_module_count": len(way_in),
        "entries_way_in": dict(way_in),
        "entries_total": dict(total),
        "packages_way_in": dict(packages_in),
        "packages_total": dict(packages_total),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure one request's path; print it (and write `--json`)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.request_path", description=__doc__)
    parser.add_argument("--path", default="/api/chat", help="/api/chat or /v1/chat/completions")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        emulator = subprocess.Popen(  # noqa: S603 - fixed argv
            [sys.executable, "-m", "gateway.testing.emulator", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            env = {
                "GATEWAY_UPSTREAM_URL": f"http://127.0.0.1:{port}",
                "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp}/gateway.db",
                "GATEWAY_LOG_LEVEL": "warning",
            }
            created = subprocess.run(
                [sys.executable, "-m", "gateway", "keys", "create", "--name", "path", "--json"],
                env={**os.environ, **env},
                capture_output=True,
                check=True,
                timeout=60,
            )
            key = str(json.loads(created.stdout)["key"])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/api/version", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            recorder = asyncio.run(_measure(env, key, args.path))
        finally:
            emulator.terminate()
            emulator.wait(timeout=10)
    report = _report(recorder)
    print(f"{args.path}: {report['module_count']} modules touched, ", end="")
    print(f"{report['way_in_module_count']} before the first chunk")
    print("entered from another module (way in / all):")
    for module in report["modules"]:
        inward = report["entries_way_in"].get(module, 0)
        print(f"  {inward:3d} / {report['entries_total'][module]:3d}  {module}")
    print("per package (way in / all):")
    for name, count in sorted(report["packages_total"].items()):
        print(f"  {report['packages_way_in'].get(name, 0):3d} / {count:3d}  {name}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

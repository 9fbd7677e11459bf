"""`gateway.testing.server.LoopbackServer` stops promptly yet as gracefully as uvicorn's own server.

Its `PromptServer` replaces uvicorn's waiting on stop (a 0.1 s tick and a fixed 0.1 s sleep):
these prove the rest of uvicorn's shutdown is kept, an answer in flight finishing and the app's
lifespan shutdown running.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from starlette.applications import Starlette

from gateway.testing.emulator.app import create_emulator_app
from gateway.testing.server import LoopbackServer
from tests.support.emulator import fast_config


def _refuses(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.connect(("127.0.0.1", port))
        except (ConnectionRefusedError, ConnectionResetError):
            # Reset: the connection reached the listener's backlog as the listener closed (seen
            # in a fast-tier run); either way the listener is gone.
            return True
    return False


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_stream_in_flight_when_the_server_stops_is_answered_whole() -> None:
    tokens = 10
    server = LoopbackServer(create_emulator_app(fast_config(tokens=tokens, inter_token=0.05)))
    server.start()
    port = server.port
    stopper = threading.Thread(target=server.stop)
    body = {"model": "llama3.2", "prompt": "hi"}
    try:
        with httpx.stream("POST", f"{server.url}/api/generate", json=body, timeout=30) as answer:
            lines = answer.iter_lines()
            first = next(lines)  # the stream has begun
            stopper.start()
            deadline = time.monotonic() + 30
            while not _refuses(port):  # the listener is closed: the shutdown has begun
                assert time.monotonic() < deadline, "the server never closed its listener"
                time.sleep(0.01)
            chunks = [json.loads(line) for line in [first, *lines] if line]
    finally:
        if stopper.ident is None:  # failed before the stop
            server.stop()
        else:
            stopper.join(30)
    assert not stopper.is_alive()
    assert [chunk["done"] for chunk in chunks] == [False] * tokens + [True]


def test_the_apps_lifespan_shutdown_runs_on_stop() -> None:
    events: list[str] = []

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        events.append("startup")
        yield
        events.append("shutdown")

    with LoopbackServer(Starlette(lifespan=lifespan)) as server:
        assert httpx.get(f"{server.url}/", timeout=30).status_code == 404
        assert events == ["startup"]
    assert events == ["startup", "shutdown"]

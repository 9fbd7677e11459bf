"""`DrainingServer.main_loop`: a tick a second instead of uvicorn's ten; an exit acted on at once.

In process (uvicorn in a thread, as `gateway.testing.server` runs it; no signal handlers there),
over a real listening socket, with a trivial app.
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest
import uvicorn

from gateway.lifecycle import Lifecycle
from gateway.serve import server as server_module
from gateway.serve.server import DrainingServer


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


class Counting(DrainingServer):
    """Counts `on_tick` calls; notes the loop for the test."""

    ticks: list[int]

    async def on_tick(self, counter: int) -> bool:
        self.ticks.append(counter)
        return await super().on_tick(counter)


def started(
    tick_seconds: float, monkeypatch: pytest.MonkeyPatch
) -> tuple[Counting, threading.Thread]:
    monkeypatch.setattr(server_module, "TICK_SECONDS", tick_seconds)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = Counting(config, Lifecycle(), drain=0.0, stream_deadline=0.0)
    server.ticks = []
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    return server, thread


def test_an_idle_server_ticks_once_a_second_and_keeps_the_date_header_fresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, thread = started(0.3, monkeypatch)  # a third of a second here, to keep it short
    port = server.servers[0].sockets[0].getsockname()[1]
    time.sleep(1.0)
    # uvicorn's loop would have ticked about ten times; a busy machine only ticks fewer.
    assert 1 <= len(server.ticks) <= 5
    # Each tick counts as ten of uvicorn's, so every one renews the `Date` header.
    assert all(counter % 10 == 0 for counter in server.ticks)
    assert httpx.get(f"http://127.0.0.1:{port}/").headers["date"].endswith("GMT")
    assert server._loop is not None
    server._loop.call_soon_threadsafe(server._shut_down, signal.SIGTERM, None)
    thread.join(10)
    assert not thread.is_alive()


def test_an_exit_wakes_the_loop_at_once_not_at_its_next_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, thread = started(600.0, monkeypatch)  # no tick would come within the test
    assert server._loop is not None
    server._loop.call_soon_threadsafe(server._shut_down, signal.SIGTERM, None)
    thread.join(10)  # without the wake: ten minutes
    assert not thread.is_alive()
    assert len(server.ticks) == 2  # the first tick, then the one the exit woke


def test_a_second_exit_signal_wakes_it_too(monkeypatch: pytest.MonkeyPatch) -> None:
    server, thread = started(600.0, monkeypatch)
    assert server._loop is not None
    server.shutting_down = True  # as after a first signal: the next is uvicorn's own
    server.handle_exit(signal.SIGTERM, None)  # as from a signal handler, off the loop
    thread.join(10)
    assert not thread.is_alive()

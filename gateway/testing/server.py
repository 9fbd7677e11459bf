"""A real uvicorn server on a loopback port, run in a background thread, for tests and benchmarks.

Owns `LoopbackServer`. `httpx.ASGITransport` buffers whole bodies, so streaming, timeout and
disconnect behaviour needs real sockets (STYLE §9). The pattern follows httpx's
`tests/conftest.py` `serve_in_thread`: `uvicorn.Server.run` in a thread with its own event loop,
wait for `started`, and set `should_exit` to stop. uvicorn installs signal handlers only in the
main thread, so nothing needs overriding for them.

uvicorn's own server notices `should_exit` on a 0.1 s tick and then sleeps a fixed 0.1 s before
its graceful wait: 0.15 s a stop, which a test with a gateway and an emulator paid twice, about a
minute of the fast test tier. `PromptServer` is woken by `stop` instead and waits only as long as
connections take to close; the graceful wait and the lifespan shutdown are uvicorn's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from types import TracebackType
from typing import Literal, Self

import uvicorn
from starlette.types import ASGIApp

logger = logging.getLogger(__name__)

#: What uvicorn gives connections asked to shut down before its graceful wait (its fixed sleep).
_CONNECTIONS_CLOSE = 0.1
#: Seconds between looks at the connections while they close.
_POLL = 0.005


class PromptServer(uvicorn.Server):
    """uvicorn's server that stops as soon as `wake` is called, not on its next 0.1 s tick.

    Only the waiting changes (uvicorn 0.55's `Server.main_loop` and `Server.shutdown`, whose
    fixed `asyncio.sleep(0.1)` becomes a wait of at most that long for the connections to
    close); the graceful wait for requests in flight and the lifespan shutdown are uvicorn's own.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken = asyncio.Event()  # bound to a loop at its first wait, in the server's

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Note the loop `wake` reaches (before `started`), then start up as uvicorn does."""
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def wake(self) -> None:
        """Have the main loop look at `should_exit` now; callable from any thread."""
        if self._loop is None:  # not started: uvicorn reads `should_exit` before its loop
            return
        with contextlib.suppress(RuntimeError):  # the loop has already closed: nothing to wake
            self._loop.call_soon_threadsafe(self._woken.set)

    async def main_loop(self) -> None:
        """Tick as uvicorn does (default headers once a second), cut short by `wake`."""
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await self._woken.wait()
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Shut down as uvicorn does, waiting for closed connections instead of a fixed 0.1 s."""
        # asyncio makes an accepted connection's transport in a task of its own
        # (`_accept_connection2`), which fails once the listener is closed and leaves the socket
        # open: stop accepting first (cancelling an accept queued on this turn), then let the
        # tasks already queued make their transports, and only then close the listener.
        loop = asyncio.get_running_loop()
        for server in self.servers:
            for listener in server.sockets:
                loop.remove_reader(listener.fileno())
        await asyncio.sleep(0)
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        # An idle connection closes on the loop's next turns; a busy one finishes its answer in
        # uvicorn's graceful wait below, as without this class. The first pause also lets the
        # connections just accepted be made (and counted), so none is open when the loop ends.
        # No event marks a closed connection: poll.
        deadline = time.monotonic() + _CONNECTIONS_CLOSE
        await asyncio.sleep(_POLL)
        while self.server_state.connections and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_POLL)
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                await self._wait_tasks_to_complete()
        except TimeoutError:
            logger.error(
                "cancelling %s running task(s): graceful shutdown timed out",
                len(self.server_state.tasks),
            )
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()


class LoopbackServer:
    """Serve an ASGI app on `127.0.0.1` at a free port in a background thread.

    Use it as a context manager (`with LoopbackServer(app) as server: ... server.url`) or call
    `start()` and `stop()`.

    Args:
        app: The ASGI app to serve.
        http: uvicorn's HTTP implementation, or a protocol class (as `gateway serve` passes).
        port: The loopback port to listen on; 0 (the default) lets the OS pick a free one. A
            test that must know the URL before the app is built (a setting naming it) picks
            one with `gateway.testing.stack.free_port` first.
        startup_timeout: Seconds to wait for the server to listen.
        shutdown_timeout: Seconds uvicorn gives open requests to finish on stop
            (`timeout_graceful_shutdown`); then it cancels them. A hanging emulator request only
            ends this way or when its client leaves.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        http: Literal["h11", "httptools"] | type[asyncio.Protocol] = "httptools",
        port: int = 0,
        startup_timeout: float = 10.0,
        shutdown_timeout: int = 2,
    ) -> None:
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,  # 0: the OS picks a free port; `port` reads it back after startup
            log_level="warning",
            # No dictConfig of the process's logging: records propagate to whatever the
            # test runner or benchmark configured.
            log_config=None,
            lifespan="auto",
            loop="asyncio",
            http=http,
            ws="none",
            proxy_headers=False,  # as `gateway serve`: GATEWAY_TRUSTED_PROXIES decides alone
            timeout_graceful_shutdown=shutdown_timeout,
        )
        self._server = PromptServer(config)
        self._thread = threading.Thread(
            target=self._server.run, name="loopback-uvicorn", daemon=True
        )
        self._startup_timeout = startup_timeout
        self._shutdown_timeout = shutdown_timeout
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The bound port.

        Raises:
            RuntimeError: The server is not running.
        """
        if self._port is None:
            raise RuntimeError("the server is not running")
        return self._port

    @property
    def url(self) -> str:
        """The base URL without a trailing slash, e.g. `http://127.0.0.1:43123`."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start serving and wait until the socket listens.

        Raises:
            RuntimeError: The server stopped during startup or did not start in time.
        """
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("uvicorn stopped during startup (see its log)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"uvicorn did not start within {self._startup_timeout} s")
            time.sleep(0.001)
        self._port = self._server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Ask uvicorn to exit, and join its thread (forcing the exit if it lingers)."""
        if self._thread.ident is None:  # never started
            return
        self._server.should_exit = True
        self._server.wake()
        self._thread.join(self._shutdown_timeout + 2.0)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(2.0)
        if self._thread.is_alive():
            logger.warning("loopback uvicorn on port %s did not stop", self._port)
        self._port = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

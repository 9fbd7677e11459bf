"""`gateway serve` in one process: the app under uvicorn, with a drain before shutting down."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import os
import resource
import time
from types import FrameType

import uvicorn

from gateway.app import create_app
from gateway.db.engine import masked_url
from gateway.db.migrate import DatabaseSchemaError
from gateway.keys.store import KeyStore
from gateway.lifecycle import Lifecycle
from gateway.metering.metrics import Metrics
from gateway.serve.coalesce import CoalescingHttpToolsProtocol
from gateway.serve.door import DoorLimits
from gateway.serve.logs import configure_logging
from gateway.settings import Settings, unknown_variables

logger = logging.getLogger("gateway.server")

#: uvicorn's `on_tick` counts ticks of 0.1 s (it updates the `Date` header every tenth).
TICKS_PER_SECOND = 10

#: Seconds between two ticks of `DrainingServer.main_loop` (uvicorn's: 0.1).
TICK_SECONDS = 1.0

#: File descriptors kept for everything but client connections: the listener, the event loop,
#: the key store, Redis, log files (the upstream pools are counted from the settings).
RESERVED_FDS = 64


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain phase before its own graceful shutdown (gateway.lifecycle).

    Args:
        config: The uvicorn configuration; its `timeout_graceful_shutdown` should exceed
            `stream_deadline` so the app ends its streams itself, with an error line.
        lifecycle: The drain state the app reads.
        drain: Seconds to keep listening, refusing new work, after the first signal.
        stream_deadline: Seconds in-flight streams may run once the listener is closed.
        signal_grace: Seconds after a signal during which another one is the same signal,
            not a second: a worker (`gateway.serve.workers`) gets Ctrl-C or a process-group
            SIGTERM both directly and forwarded by its supervisor. 0: every signal counts.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        lifecycle: Lifecycle,
        drain: float,
        stream_deadline: float,
        *,
        signal_grace: float = 0.0,
    ) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.drain = drain
        self.stream_deadline = stream_deadline
        self.signal_grace = signal_grace
        self.shutting_down = False
        self._last_signal = -math.inf
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: asyncio.Event | None = None

    async def main_loop(self) -> None:
        """Uvicorn's main loop, ticking once a second instead of ten times; an exit wakes it.

        Why: uvicorn wakes every 0.1 s to look at `should_exit`, and those wakeups were most of
        an idle gateway's CPU (docs/performance.md, "Idle CPU"). What a tick does once a second
        (the `Date` header) is unchanged; `handle_exit` sets `should_exit` and wakes the loop,
        so a signal is acted on at once, as before.
        """
        self._loop = asyncio.get_running_loop()
        woken = self._woken = asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + TICKS_PER_SECOND) % 864000  # on_tick's count of 0.1 s ticks
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_SECONDS):
                    await woken.wait()
            should_exit = await self.on_tick(counter)

    def _wake(self) -> None:
        """Have `main_loop` look at `should_exit` now (from a signal handler or the loop)."""
        if self._loop is not None and self._woken is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to wake
                self._loop.call_soon_threadsafe(self._woken.set)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: drain, then shut down; a second one ends the drain at once.

        Once the shutdown has begun, a further signal is uvicorn's: SIGINT forces the exit.
        """
        now = time.monotonic()
        if now - self._last_signal < self.signal_grace:
            return  # the same signal, delivered twice
        self._last_signal = now
        if self.shutting_down:
            super().handle_exit(sig, frame)
            self._wake()
            return
        loop = asyncio.get_event_loop()
        if self.lifecycle.draining:
            logger.info("second signal: shutting down without waiting for the drain")
            loop.call_soon_threadsafe(self._shut_down, sig, frame)
            return
        self.lifecycle.draining = True
        logger.info("draining for %g s before shutting down", self.drain)
        loop.call_soon_threadsafe(loop.call_later, self.drain, self._shut_down, sig, frame)

    def _shut_down(self, sig: int, frame: FrameType | None) -> None:
        """Close the listener; end the streams left after `stream_deadline` seconds (once)."""
        if self.shutting_down:
            return
        self.shutting_down = True
        super().handle_exit(sig, frame)
        self._wake()
        asyncio.get_event_loop().call_later(self.stream_deadline, self.lifecycle.stop_streams)


def serve(settings: Settings, *, host: str | None = None, port: int | None = None) -> int:
    """Serve the gateway in this one process until SIGINT/SIGTERM; returns the exit code.

    `gateway serve --workers N` runs N of these under `gateway.serve.workers` instead. uvloop and
    httptools are used when installed (`uvicorn[standard]`).

    Args:
        settings: Configuration.
        host: Bind address; default `GATEWAY_HOST` (127.0.0.1).
        port: Port; default `GATEWAY_PORT` (8080).
    """
    configure_process_logging(settings)
    code = start_up(settings)
    if code:
        return code
    server = build_server(settings, host or settings.host, port or settings.port)
    # What exists now (modules, classes, the app: about 100,000 objects) lives as long as the
    # process. Out of the collector's reach, a full collection walks only what requests made
    # since: a pause of well under a millisecond instead of tens of milliseconds for every
    # open stream (docs/performance.md; Python's `gc.freeze`).
    gc.freeze()
    server.run()
    return 0


def configure_process_logging(settings: Settings) -> None:
    """The gateway's log format and levels, in this process (each worker calls it too)."""
    configure_logging(
        settings.log_level
    )  # every message escaped: no forged lines (gateway.serve.logs)
    # httpx logs every request at INFO, which would be the upstream monitor's probes every few
    # seconds; the gateway's own access log already has one line per request.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("aiohttp").setLevel(logging.WARNING)


def start_up(settings: Settings) -> int:
    """Warn about unknown variables and bring the database up to date; 0 or an exit code."""
    for name in unknown_variables(os.environ):
        logger.warning("%s is not a setting and is ignored (docs/configuration.md)", name)
    try:
        asyncio.run(prepare_schema(settings))
    except DatabaseSchemaError as exc:
        # One clear line instead of uvicorn's start-up traceback around the same message.
        logger.error("%s: %s", masked_url(settings.database_url), exc)
        return 1
    return 0


def build_server(
    settings: Settings, host: str, port: int, *, signal_grace: float = 0.0
) -> DrainingServer:
    """The app and its uvicorn server, draining on the first signal (`DrainingServer`).

    Args:
        settings: Configuration.
        host: Bind address (a worker is handed the socket instead and only logs it).
        port: Port.
        signal_grace: See `DrainingServer`.
    """
    lifecycle = Lifecycle()
    limits = door_limits(settings, raise_open_files_limit())
    metrics = Metrics()
    door_refused = metrics.door_refused

    def count_refusal(reason: str) -> None:
        door_refused.labels(reason).inc()

    config = uvicorn.Config(
        create_app(settings, lifecycle=lifecycle, metrics=metrics),
        host=host,
        port=port,
        loop="auto",
        http=CoalescingHttpToolsProtocol.with_limits(limits, count_refusal),
        workers=1,
        access_log=False,
        log_level=settings.log_level,
        # uvicorn cancels what is left a little after the app ended its streams itself.
        timeout_graceful_shutdown=int(settings.shutdown_timeout) + 2,
        server_header=False,
        # The client's address is the gateway's to judge
        # (`gateway.wire.address.client_address`,
        # GATEWAY_TRUSTED_PROXIES). uvicorn's own proxy headers, on by default and trusting
        # 127.0.0.1, would let any client arriving over loopback (a sidecar, a TCP proxy)
        # set the address the access log and the audit trail record.
        proxy_headers=False,
        # Annotated int, but only handed to `loop.call_later`: a float works.
        timeout_keep_alive=settings.keepalive_timeout,  # type: ignore[arg-type]
    )
    return DrainingServer(
        config,
        lifecycle,
        settings.shutdown_drain,
        settings.shutdown_timeout,
        signal_grace=signal_grace,
    )


async def prepare_schema(settings: Settings) -> None:
    """Bring the database to this code's schema before serving (the lifespan checks it again).

    Raises:
        gateway.db.migrate.DatabaseSchemaError: the database is newer than the code, or behind
            with `GATEWAY_DATABASE_AUTO_UPGRADE=false`.
    """
    store = KeyStore.from_url(settings.database_url)
    try:
        await store.create_schema(auto_upgrade=settings.database_auto_upgrade)
    finally:
        await store.close()


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files to the hard one; returns the soft limit now in force.

    Each client connection is a file descriptor; Linux's usual soft limit (1024) would reset
    clients long before `GATEWAY_MAX_CLIENT_CONNECTIONS` refuses them cleanly.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # a sandbox may refuse; the old limit stays
            logger.warning("could not raise the open-files limit from %d: %s", soft, exc)
    logger.info("open-files limit: %d (hard %d)", soft, hard)
    return soft


def door_limits(settings: Settings, open_files: int) -> DoorLimits:
    """The client-connection limits, the connection cap fitted to `open_files` descriptors.

    A cap the descriptors cannot hold would end in failed `accept` calls (clients reset)
    instead of 503s, so it is lowered, with a warning, to what is left after the upstream
    pools and `RESERVED_FDS`; that room is also the cap when `max_client_connections` is 0.
    Unset, an address's share is a quarter of the cap (at least 1): one client address can
    never hold more than that, and a quarter still exceeds an ordinary client's pool.
    """
    cap = settings.max_client_connections
    if open_files != resource.RLIM_INFINITY:
        upstream = settings.max_connections * len(settings.upstream_specs)
        room = max(open_files - upstream - RESERVED_FDS, 1)
        if cap == 0:  # no cap of its own: still refuse before `accept` runs out of descriptors
            cap = room
        elif cap > room:
            logger.warning(
                "GATEWAY_MAX_CLIENT_CONNECTIONS=%d does not fit %d open files (%d for upstream "
                "connections): using %d",
                cap,
                open_files,
                upstream,
                room,
            )
            cap = room
    share = settings.max_client_connections_per_address
    if share is None:
        share = max(cap // 4, 1) if cap else 0
    return DoorLimits(
        header_timeout=settings.header_timeout,
        body_timeout=settings.body_timeout,
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
        max_connections=cap,
        max_connections_per_address=share,
        trusted_proxies=tuple(settings.trusted_proxy_networks),
    )

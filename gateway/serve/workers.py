"""`gateway serve --workers N`: N gateway processes behind one listening socket.

The parent binds the socket, then runs uvicorn's own supervisor (`uvicorn.supervisors.
Multiprocess`): it starts the workers (spawned: fresh interpreters), pings each every half
second and replaces one that died or hangs. Each worker runs the gateway exactly as
`gateway serve` does in one process, `DrainingServer` included, so on SIGTERM or SIGINT the
supervisor signals every worker, each drains and finishes its own streams, and the parent
exits 0 once all have ended (a second signal is forwarded: it ends the drain at once).

What the workers share, and where (docs/operations.md, "Scaling up and out"):

* Per-key limits (RPM, TPM, requests in flight) live in the limits storage, which must be
  Redis: with `memory://` every worker would count its own, so more than one worker is
  refused with a message naming `GATEWAY_RATE_LIMIT_STORAGE`.
* The upstream gate (`GATEWAY_UPSTREAM_MAX_CONCURRENT`, an upstream's `max_concurrent`,
  `GATEWAY_UPSTREAM_QUEUE_SIZE`) is in each process: it is divided, worker `i` of `N` getting
  `total // N`, plus one if `i < total % N` (logged at start), so the host's totals stay what
  was configured. A gate smaller than the number of workers cannot be divided and is refused.
* Metrics: prometheus-client's multiprocess mode, in a fresh directory made before the
  workers start and removed when the parent exits; a dead worker's live gauges are dropped
  (`mark_process_dead`), its counters stay in the totals (gateway.metering.metrics).
* The database (keys, usage, batches) is shared as it is between replicas.

Over ~300 lines for one reason: everything `--workers N` changes is here: the count
(`worker_count`), what may run with it (`refusal`), each worker's share of the upstream gate
(`share`, `worker_settings`), and the `Worker` and `Supervisor` that start the processes with those
settings and keep the metrics directory right.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from socket import socket

import uvicorn
from prometheus_client.multiprocess import mark_process_dead
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from gateway.serve.server import build_server, configure_process_logging, start_up
from gateway.settings import Settings

logger = logging.getLogger("gateway.workers")

#: Seconds after a signal during which a worker takes another one as the same signal: Ctrl-C
#: reaches it directly and again from the supervisor, at most half a second later.
SIGNAL_GRACE = 2.0


#: Seconds a worker may take to answer the supervisor's ping before it is killed and replaced.
WORKER_HEALTHCHECK_SECONDS = 30

#: Longest wait, in seconds, between two tries to start a replacement that fails at start.
REPLACEMENT_BACKOFF_MAX = 60.0

#: The most workers `auto` starts: each holds its own pools and about 125 MB.
AUTO_WORKERS_MAX = 16

#: The cgroup v2 CPU quota (`<quota> <period>` in microseconds, or `max <period>`).
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def worker_count(workers: int | str) -> int:
    """The number of workers `workers` names: a number, or `auto`.

    `auto` is the CPUs this process may use: its affinity mask, and the cgroup's CPU quota
    (`cpu.max`, cgroup v2) when one is set, as in a container with a CPU limit: a pod limited
    to 2 CPUs on a 32-core node gets 2 workers, not 32. At most `AUTO_WORKERS_MAX`.
    """
    if workers != "auto":
        return int(workers)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = _cgroup_cpus()
    count = min(usable or 1, quota) if quota is not None else usable or 1
    return max(1, min(count, AUTO_WORKERS_MAX))


def _cgroup_cpus() -> int | None:
    """CPUs the cgroup v2 quota allows (rounded up), or None when there is no quota."""
    try:
        with open(CGROUP_CPU_MAX, encoding="ascii") as handle:
            quota, period = handle.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def share(total: int, workers: int, index: int) -> int:
    """Worker `index`'s part of `total` split into `workers` parts that add up to it."""
    return total // workers + (1 if index < total % workers else 0)


def refusal(settings: Settings, workers: int) -> str | None:
    """Why `settings` cannot run with `workers` workers, or None when they can."""
    if settings.rate_limit_storage.startswith("memory://"):
        return (
            f"{workers} workers need shared limit storage: set GATEWAY_RATE_LIMIT_STORAGE="
            "redis://host:6379/0 (with memory:// each worker would count per-key limits and "
            "requests in flight on its own), or run one worker per replica"
        )
    gates = [("GATEWAY_UPSTREAM_MAX_CONCURRENT", settings.upstream_max_concurrent)]
    gates += [
        (f"max_concurrent of upstream {spec.name}", spec.max_concurrent or 0)
        for spec in settings.upstreams or []
    ]
    for name, total in gates:
        if 0 < total < workers:
            return (
                f"{name}={total} cannot be divided among {workers} workers (each takes a "
                "share of the upstream slots): raise it or run fewer workers"
            )
    return None


def worker_settings(settings: Settings, workers: int, index: int) -> Settings:
    """`settings` with worker `index`'s share of every upstream slot gate and queue."""
    upstreams = None
    if settings.upstreams:
        upstreams = [
            spec.model_copy(update={"max_concurrent": share(spec.max_concurrent, workers, index)})
            if spec.max_concurrent
            else spec
            for spec in settings.upstreams
        ]
    return settings.model_copy(
        update={
            "upstream_max_concurrent": share(settings.upstream_max_concurrent, workers, index),
            "upstream_queue_size": share(settings.upstream_queue_size, workers, index),
            "upstreams": upstreams,
        }
    )


def serve_workers(settings: Settings, host: str, port: int, workers: int) -> int:
    """Serve with `workers` processes until SIGINT/SIGTERM; returns the exit code.

    2 when the settings cannot run with that many workers (`refusal`), 1 when the database
    is refused or a worker fails to start, else 0.
    """
    configure_process_logging(settings)
    problem = refusal(settings, workers)
    if problem is not None:
        logger.error("%s", problem)
        return 2
    code = start_up(settings)  # once, in the parent: the workers find the schema up to date
    if code:
        return code
    metrics_dir = tempfile.mkdtemp(prefix="gateway-metrics-")
    # Read by prometheus-client when a worker imports it, and by `gateway.metering.metrics.Metrics`.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        # The app is built in each worker (`Worker.target`); this config only binds the socket
        # and carries the supervisor's settings (health-check timeout) to the workers.
        config = uvicorn.Config(
            "gateway.app:create_app",
            host=host,
            port=port,
            workers=workers,
            log_level=settings.log_level,
            factory=True,
            # A worker answers pings from a thread of its own once it has imported the app;
            # uvicorn's 5 s would kill and restart workers still importing on a loaded host.
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
        )
        sock = config.bind_socket()
        supervisor = Supervisor(config, [sock], settings, metrics_dir)
        try:
            supervisor.run()
        finally:
            sock.close()
    finally:
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 1 if supervisor.failed else 0


class Worker(Process):
    """One gateway process under the supervisor, with its share of the upstream gate.

    Args:
        config: The supervisor's uvicorn config (host and port for the log line).
        sockets: The listening socket the parent bound.
        settings: The settings, already divided for this worker (`worker_settings`).
        index: Which worker it is, 0 to `workers - 1`; a replacement keeps the index.
        workers: How many there are.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        sockets: list[socket],
        settings: Settings,
        index: int,
        workers: int,
    ) -> None:
        self.settings = settings
        self.index = index
        self.workers = workers
        super().__init__(config, sockets)

    def target(self, sockets: list[socket] | None = None) -> None:  # pragma: no cover
        """Run in the child: build the app and its `DrainingServer`, answer pings, serve."""
        configure_process_logging(self.settings)
        server = build_server(
            self.settings, self.config.host, self.config.port, signal_grace=SIGNAL_GRACE
        )
        self._server = server  # what the supervisor's pings report on (`Process.pong`)
        specs = self.settings.upstream_specs
        slots = [
            self.settings.upstream_max_concurrent
            if spec.max_concurrent is None
            else spec.max_concurrent
            for spec in specs
        ]
        logger.info(
            "worker %d of %d (pid %d): upstream slots %s (0: no gate), queue %d",
            self.index + 1,
            self.workers,
            os.getpid(),
            ", ".join(f"{spec.name}={n}" for spec, n in zip(specs, slots, strict=True)),
            self.settings.upstream_queue_size,
        )
        threading.Thread(target=self.always_pong, daemon=True).start()
        gc.freeze()  # as `gateway.serve.server.serve` does, for the same reason
        server.run(sockets)


class Supervisor(Multiprocess):
    """uvicorn's supervisor, starting `Worker`s and keeping the metrics directory right.

    Args:
        config: The uvicorn config (`workers` is the count).
        sockets: The listening socket.
        settings: The undivided settings.
        metrics_dir: prometheus-client's multiprocess directory.

    Attributes:
        failed: A worker failed before serving (its app, database or socket is broken).
    """

    def __init__(
        self, config: uvicorn.Config, sockets: list[socket], settings: Settings, metrics_dir: str
    ) -> None:
        super().__init__(config, sockets)
        self.settings = settings
        self.metrics_dir = metrics_dir
        self.failed = False
        self._replacements: set[int] = set()  # slots whose worker is not the first one
        self._due: dict[int, float] = {}  # slot -> monotonic time its next start may be tried
        self._delay: dict[int, float] = {}  # slot -> seconds before the next try after that

    def _start(self, index: int) -> Worker:
        count = self.processes_num
        worker = Worker(
            self.config, self.sockets, worker_settings(self.settings, count, index), index, count
        )
        worker.start()
        return worker

    def init_processes(self) -> None:
        """Start the workers."""
        self.processes = [self._start(index) for index in range(self.processes_num)]

    def keep_subprocess_alive(self) -> None:
        """Replace a worker that died or stopped answering (uvicorn's rule, plus the metrics)."""
        if self.should_exit.is_set():
            return
        for index, process in enumerate(self.processes):
            if index in self._due:
                if time.monotonic() < self._due[index]:
                    continue  # a replacement failed to start: wait before the next try
                del self._due[index]
                self.processes[index] = self._start(index)
                continue
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung: kill it
            process.join()
            if process.pid is not None:
                mark_process_dead(process.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
            if process.exitcode == STARTUP_FAILURE and index not in self._replacements:
                # A first worker broken before it served: the settings, the database or the
                # socket are wrong, and every other worker fails the same way.
                logger.error("worker [%s] failed to start; stopping", process.pid)
                self.failed = True
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            self._replacements.add(index)
            if process.exitcode == STARTUP_FAILURE:
                # A replacement that failed to start (the database away for a moment): the
                # other workers go on serving, and this slot is tried again, backing off.
                delay = self._delay.get(index, 1.0)
                self._delay[index] = min(delay * 2, REPLACEMENT_BACKOFF_MAX)
                self._due[index] = time.monotonic() + delay
                logger.error(
                    "worker [%s] failed to start; trying again in %.0f s", process.pid, delay
                )
                continue
            self._delay.pop(index, None)
            logger.warning(
                "worker [%s] died (exit code %s); starting another", process.pid, process.exitcode
            )
            self.processes[index] = self._start(index)

    def join_all(self) -> None:
        """Wait for every worker to drain and exit; forward a further signal (ends the drain)."""
        for process in self.processes:
            while process.process.is_alive():
                process.process.join(0.25)
                if self.signal_queue:
                    self.signal_queue.clear()
                    logger.info("another signal: the workers stop without waiting for the drain")
                    for other in self.processes:
                        if other.process.is_alive() and other.pid is not None:
                            os.kill(other.pid, signal.SIGTERM)

    def handle_hup(self) -> None:
        """Ignored: restart the service instead (the supervisor keeps the workers it has)."""
        logger.warning("SIGHUP ignored: restart `gateway serve` to replace the workers")

    def handle_ttin(self) -> None:
        """Ignored: the upstream slots are divided by the worker count set at start."""
        logger.warning("SIGTTIN ignored: the worker count is fixed at start (--workers)")

    def handle_ttou(self) -> None:
        """Ignored, like SIGTTIN."""
        logger.warning("SIGTTOU ignored: the worker count is fixed at start (--workers)")

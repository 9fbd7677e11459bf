"""The processes a benchmark run measures: the Ollama emulator, the gateway, nginx as the floor.

Owns starting each one as a `ManagedProcess` (its own process group on a free loopback port,
stopped with everything it started) and the `Target` record the runs are driven against. The
gateway runs as shipped (auth on with a real key in SQLite, metrics on, in-memory limits) with
`GATEWAY_LOG_LEVEL=warning` and no shutdown drain, so stopping it takes no 5 s.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from gateway.testing.stack import ManagedProcess, create_key, free_port, gateway_process

MODEL = "bench:latest"
"""The one model the emulator serves; requests ask for it as `bench`."""


@dataclass(frozen=True)
class Target:
    """Where the load generator sends its requests, and what the benchmark watches.

    Attributes:
        name: The table's row name: `direct`, `gateway`, `nginx`, `direct-chat`, `gw-sse`, ...
        url: Base URL.
        path: Request path (`/api/generate`, `/v1/generate`, `/api/chat`, `/v1/responses`, ...).
        body: The JSON request body.
        key: API key to send, if any.
        sse: The answer is server-sent events.
        events: With `sse`, the event set (`benchmarks.stream.EVENTS`): `chat`, `responses`,
            `messages`.
        pids: Processes whose CPU is the proxy's cost (empty for direct).
        baseline: The row this one's added TTFT and share of chunks/s are taken against, at the
            same concurrency (`benchmarks.report.add_relative`); None for a baseline row itself.
    """

    name: str
    url: str
    path: str
    body: dict[str, object]
    key: str | None = None
    sse: bool = False
    events: str = "chat"
    pids: tuple[int, ...] = ()
    baseline: str | None = "direct"


def emulator_process(
    workdir: Path,
    *,
    ttft: float,
    inter_token: float,
    tokens: int,
    tag: str = "emulator",
    extra: tuple[str, ...] = (),
) -> ManagedProcess:
    """`python -m gateway.testing.emulator` with the given timing, on a free port.

    `extra` are more emulator flags, e.g. `("--parallel", "4")` for a server with 4 slots.
    """
    port = free_port()
    argv = [sys.executable, "-m", "gateway.testing.emulator", "--port", str(port)]
    argv += ["--models", MODEL, "--ttft", str(ttft), "--inter-token", str(inter_token)]
    argv += ["--tokens", str(tokens), "--log-level", "warning", *extra]
    url = f"http://127.0.0.1:{port}"
    return ManagedProcess(
        tag, argv, url, f"{url}/api/version", log_path=workdir / f"{tag}.log", start_timeout=30.0
    )


def gateway_env(workdir: Path, upstream_url: str, *, dialect: str = "ollama") -> dict[str, str]:
    """The `GATEWAY_*` variables of a benchmarked gateway (also used to create its key)."""
    return {
        "GATEWAY_UPSTREAM_URL": upstream_url,
        "GATEWAY_UPSTREAM_DIALECT": dialect,
        "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{workdir}/gateway.db",
        "GATEWAY_LOG_LEVEL": "warning",
        "GATEWAY_SHUTDOWN_DRAIN": "0",
        "GATEWAY_SHUTDOWN_TIMEOUT": "1",
    }


def gateway_with_key(
    workdir: Path,
    upstream_url: str,
    *,
    dialect: str = "ollama",
    limits: bool = True,
    extra_env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> tuple[ManagedProcess, str]:
    """A `gateway serve` process in front of `upstream_url`, and a fresh API key for it.

    Args:
        workdir: Holds the key store and the log; one gateway per directory.
        upstream_url: The model server (emulator or llama-cpp-python).
        dialect: `GATEWAY_UPSTREAM_DIALECT`.
        limits: Give the key RPM, TPM and concurrency limits far above the load, so the
            limiter does its full work on every request without refusing any.
        extra_env: More `GATEWAY_*` variables (a variant, e.g. another upstream HTTP client).
        args: More `gateway serve` arguments (`--workers 2`).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    env = gateway_env(workdir, upstream_url, dialect=dialect) | (extra_env or {})
    extra = ["--rpm", "1000000000", "--tpm", "2000000000", "--max-concurrent", "100000"]
    created = create_key(env, "bench", *(extra if limits else []))
    return gateway_process(workdir, env, args), str(created["key"])


def nginx_binary() -> str | None:
    """The `nginx` executable (Debian's `nginx` package), or None when it is not installed."""
    return shutil.which("nginx") or next(
        (path for path in ("/usr/sbin/nginx",) if Path(path).exists()), None
    )


NGINX_CONF = """\
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream emulator {{
        server 127.0.0.1:{upstream_port};
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://emulator;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # The emulator, like Ollama, refuses a non-loopback Host (reference section 6.8).
            proxy_set_header Host 127.0.0.1:{upstream_port};
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""
"""One worker process, like the gateway's one uvicorn worker; unbuffered, keep-alive upstream."""


def nginx_process(workdir: Path, binary: str, upstream_port: int) -> ManagedProcess:
    """Run nginx in the foreground (`daemon off`) as a reverse proxy to the emulator."""
    directory = workdir / "nginx"
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)  # workers may run as an unprivileged user when started by root
    port = free_port()
    conf = directory / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=directory, upstream_port=upstream_port, port=port))
    argv = [binary, "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(conf)]
    argv += ["-g", "daemon off;"]
    url = f"http://127.0.0.1:{port}"
    return ManagedProcess(
        "nginx", argv, url, f"{url}/api/version", log_path=directory / "stdout.log"
    )


def otlp_sink_process(workdir: Path) -> ManagedProcess:
    """`python -m benchmarks.otlp_sink`: an OTLP/HTTP endpoint that drops what it gets."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "benchmarks.otlp_sink", "--port", str(port)]
    return ManagedProcess(
        "otlp-sink",
        argv,
        url,
        f"{url}/spans",
        log_path=workdir / "otlp-sink.log",
        start_timeout=30.0,
    )


def floor_process(workdir: Path, upstream_url: str) -> ManagedProcess:
    """`python -m benchmarks.floor`: the bare uvicorn + aiohttp relay (the stack's floor row)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "benchmarks.floor",
        "--port",
        str(port),
        "--upstream",
        upstream_url,
    ]
    return ManagedProcess(
        "floor", argv, url, f"{url}/api/version", log_path=workdir / "floor.log", start_timeout=30.0
    )
